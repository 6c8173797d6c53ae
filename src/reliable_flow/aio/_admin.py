"""The operator's actions, awaited: ``AsyncProducer.admin`` and
``AsyncConsumer.admin``.

Each method runs the sync :class:`~reliable_flow.ProducerAdmin` /
:class:`~reliable_flow.ConsumerAdmin` method of the same name on its
owner's store thread: the same checks, records and errors.  A cancelled
call either did not start (nothing recorded) or finishes on the thread
(the action is taken and recorded) with its result dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._retention import DEFAULT_PRUNE_BATCH
from ..records import ConsumerEntry, OperatorAction, PruneResult

if TYPE_CHECKING:
    from ._consumer import AsyncConsumer
    from ._producer import AsyncProducer

__all__ = ["AsyncConsumerAdmin", "AsyncProducerAdmin"]


class AsyncProducerAdmin:
    """``ProducerAdmin``, awaited (``await producer.admin.skip(...)``)."""

    def __init__(self, producer: AsyncProducer) -> None:
        self._producer = producer

    async def redeliver(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Like ``ProducerAdmin.redeliver``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.redeliver, event_id, consumer=consumer, actor=actor, reason=reason)

    async def skip(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Like ``ProducerAdmin.skip``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.skip, event_id, consumer=consumer, actor=actor, reason=reason)

    async def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Like ``ProducerAdmin.operator_actions``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.operator_actions, event_id)

    async def consumers(self) -> list[ConsumerEntry]:
        """Like ``ProducerAdmin.consumers``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.consumers)

    async def register_consumer(
        self, name: str, from_now: bool = False, *, actor: str, reason: str
    ) -> OperatorAction:
        """Like ``ProducerAdmin.register_consumer``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.register_consumer, name, from_now, actor=actor, reason=reason)

    async def remove_consumer(self, name: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ProducerAdmin.remove_consumer``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.remove_consumer, name, actor=actor, reason=reason)

    async def registry_actions(self, name: str | None = None) -> list[OperatorAction]:
        """Like ``ProducerAdmin.registry_actions``; awaited."""
        p = self._producer
        return await p._run(p.sync.admin.registry_actions, name)

    async def prune(
        self, older_than: float, *, now: float | None = None, batch_size: int = DEFAULT_PRUNE_BATCH,
        limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Like ``ProducerAdmin.prune``; awaited.  Cancelled, the prune still
        runs to its end on the thread."""
        p = self._producer
        return await p._run(p.sync.admin.prune, older_than, now=now, batch_size=batch_size, limit=limit,
                            forget_after=forget_after)

    def __repr__(self) -> str:
        return f"{self._producer!r}.admin"


class AsyncConsumerAdmin:
    """``ConsumerAdmin``, awaited (``await consumer.admin.skip_event(...)``)."""

    def __init__(self, consumer: AsyncConsumer) -> None:
        self._consumer = consumer

    async def skip_event(self, event_id: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.skip_event``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.skip_event, event_id, actor=actor, reason=reason)

    async def replace_event(
        self, event_id: str, corrected_envelope: dict[str, Any] | str | bytes, *, actor: str, reason: str
    ) -> OperatorAction:
        """Like ``ConsumerAdmin.replace_event``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.replace_event, event_id, corrected_envelope, actor=actor, reason=reason)

    async def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Like ``ConsumerAdmin.operator_actions``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.operator_actions, event_id)

    async def retry_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.retry_effect``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.retry_effect, key, actor=actor, reason=reason)

    async def resolve_effect(self, key: str, *, result: Any = None, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.resolve_effect``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.resolve_effect, key, result=result, actor=actor, reason=reason)

    async def cancel_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.cancel_effect``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.cancel_effect, key, actor=actor, reason=reason)

    async def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        """Like ``ConsumerAdmin.effect_actions``; awaited."""
        c = self._consumer
        return await c._run(c.sync.admin.effect_actions, key)

    async def prune(
        self, older_than: float, *, now: float | None = None, batch_size: int = DEFAULT_PRUNE_BATCH,
        limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Like ``ConsumerAdmin.prune``; awaited.  Cancelled, the prune still
        runs to its end on the thread."""
        c = self._consumer
        return await c._run(c.sync.admin.prune, older_than, now=now, batch_size=batch_size, limit=limit,
                            forget_after=forget_after)

    def __repr__(self) -> str:
        return f"{self._consumer!r}.admin"
