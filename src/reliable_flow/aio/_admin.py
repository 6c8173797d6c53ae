"""The operator's actions, awaited: ``AsyncProducer.admin`` and
``AsyncConsumer.admin``.

Each method runs the sync :class:`~reliable_flow.ProducerAdmin` /
:class:`~reliable_flow.ConsumerAdmin` method of the same name on its
owner's store thread: the same checks, records and errors.  A cancelled
call either did not start (nothing recorded) or finishes on the thread
(the action is taken and recorded) with its result dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from .._consumer import ConsumerAdmin
from .._producer import Producer
from .._producer_admin import ProducerAdmin
from .._retention import DEFAULT_PRUNE_BATCH
from ..records import ConsumerEntry, OperatorAction, PruneResult

_T = TypeVar("_T")


class Run(Protocol):
    """How an admin runs a call of its sync admin: its owner's ``run_sync``."""

    def __call__(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Awaitable[_T]: ...

__all__ = ["AsyncConsumerAdmin", "AsyncProducerAdmin"]


class AsyncProducerAdmin:
    """``ProducerAdmin``, awaited (``await producer.admin.skip(...)``)."""

    def __init__(self, owner: object, run: Run, admin: ProducerAdmin) -> None:
        self._owner, self._run, self._admin = owner, run, admin

    async def redeliver(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Like ``ProducerAdmin.redeliver``; awaited."""
        return await self._run(self._admin.redeliver, event_id, consumer=consumer, actor=actor, reason=reason)

    async def skip(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Like ``ProducerAdmin.skip``; awaited."""
        return await self._run(self._admin.skip, event_id, consumer=consumer, actor=actor, reason=reason)

    async def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Like ``ProducerAdmin.operator_actions``; awaited."""
        return await self._run(self._admin.operator_actions, event_id)

    async def consumers(self) -> list[ConsumerEntry]:
        """Like ``ProducerAdmin.consumers``; awaited."""
        return await self._run(self._admin.consumers)

    async def register_consumer(
        self, name: str, from_now: bool = False, *, actor: str, reason: str
    ) -> OperatorAction:
        """Like ``ProducerAdmin.register_consumer``; awaited."""
        return await self._run(self._admin.register_consumer, name, from_now, actor=actor, reason=reason)

    async def remove_consumer(self, name: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ProducerAdmin.remove_consumer``; awaited."""
        return await self._run(self._admin.remove_consumer, name, actor=actor, reason=reason)

    async def registry_actions(self, name: str | None = None) -> list[OperatorAction]:
        """Like ``ProducerAdmin.registry_actions``; awaited."""
        return await self._run(self._admin.registry_actions, name)

    async def prune(
        self, older_than: float, *, now: float | None = None, batch_size: int = DEFAULT_PRUNE_BATCH,
        limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Like ``ProducerAdmin.prune``; awaited.  Cancelled, the prune still
        runs to its end on the thread."""
        return await self._run(self._admin.prune, older_than, now=now, batch_size=batch_size, limit=limit,
                            forget_after=forget_after)

    def __repr__(self) -> str:
        return f"{self._owner!r}.admin"


class AsyncConsumerAdmin:
    """``ConsumerAdmin``, awaited (``await consumer.admin.skip_event(...)``)."""

    def __init__(self, owner: object, run: Run, admin: ConsumerAdmin) -> None:
        self._owner, self._run, self._admin = owner, run, admin

    async def skip_event(self, event_id: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.skip_event``; awaited."""
        return await self._run(self._admin.skip_event, event_id, actor=actor, reason=reason)

    async def replace_event(
        self, event_id: str, corrected_envelope: dict[str, Any] | str | bytes, *, actor: str, reason: str
    ) -> OperatorAction:
        """Like ``ConsumerAdmin.replace_event``; awaited."""
        return await self._run(self._admin.replace_event, event_id, corrected_envelope, actor=actor, reason=reason)

    async def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Like ``ConsumerAdmin.operator_actions``; awaited."""
        return await self._run(self._admin.operator_actions, event_id)

    async def retry_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.retry_effect``; awaited."""
        return await self._run(self._admin.retry_effect, key, actor=actor, reason=reason)

    async def resolve_effect(self, key: str, *, result: Any = None, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.resolve_effect``; awaited."""
        return await self._run(self._admin.resolve_effect, key, result=result, actor=actor, reason=reason)

    async def cancel_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Like ``ConsumerAdmin.cancel_effect``; awaited."""
        return await self._run(self._admin.cancel_effect, key, actor=actor, reason=reason)

    async def amend_effect(self, key: str, *, result: Any = None, failure: bool = False, actor: str, reason: str,
                           producer: Producer | None = None) -> OperatorAction:
        """Like ``ConsumerAdmin.amend_effect``; awaited (``producer``, if
        given, is a sync ``Producer``: it is used on the consumer's thread)."""
        return await self._run(self._admin.amend_effect, key, result=result, failure=failure, actor=actor,
                               reason=reason, producer=producer)

    async def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        """Like ``ConsumerAdmin.effect_actions``; awaited."""
        return await self._run(self._admin.effect_actions, key)

    async def prune(
        self, older_than: float, *, now: float | None = None, batch_size: int = DEFAULT_PRUNE_BATCH,
        limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Like ``ConsumerAdmin.prune``; awaited.  Cancelled, the prune still
        runs to its end on the thread."""
        return await self._run(self._admin.prune, older_than, now=now, batch_size=batch_size, limit=limit,
                            forget_after=forget_after)

    def __repr__(self) -> str:
        return f"{self._owner!r}.admin"
