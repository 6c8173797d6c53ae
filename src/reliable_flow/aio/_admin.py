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
from typing import Any

from .._consumer import ConsumerAdmin
from .._producer_admin import ProducerAdmin
from ._face import awaited

__all__ = ["AsyncConsumerAdmin", "AsyncProducerAdmin"]

Run = Callable[..., Awaitable[Any]]  # how an admin runs a call of its sync admin: its owner's ``run_sync``
_PRUNE = "Cancelled, the prune still runs to its end on the thread."


class _Admin:
    """An owner's sync admin, whose calls ``run`` runs on the owner's store thread."""

    def __init__(self, owner: object, run: Run, admin: ProducerAdmin | ConsumerAdmin) -> None:
        self._owner, self._run, self._sync = owner, run, admin

    def __repr__(self) -> str:
        return f"{self._owner!r}.admin"


class AsyncProducerAdmin(_Admin):
    """``ProducerAdmin``, awaited (``await producer.admin.skip(...)``)."""

    redeliver = awaited(ProducerAdmin.redeliver)
    skip = awaited(ProducerAdmin.skip)
    operator_actions = awaited(ProducerAdmin.operator_actions)
    consumers = awaited(ProducerAdmin.consumers)
    register_consumer = awaited(ProducerAdmin.register_consumer)
    remove_consumer = awaited(ProducerAdmin.remove_consumer)
    subscribe = awaited(ProducerAdmin.subscribe)
    registry_actions = awaited(ProducerAdmin.registry_actions)
    prune = awaited(ProducerAdmin.prune, _PRUNE)
    retention_actions = awaited(ProducerAdmin.retention_actions)


class AsyncConsumerAdmin(_Admin):
    """``ConsumerAdmin``, awaited (``await consumer.admin.skip_event(...)``)."""

    skip_event = awaited(ConsumerAdmin.skip_event)
    replace_event = awaited(ConsumerAdmin.replace_event)
    operator_actions = awaited(ConsumerAdmin.operator_actions)
    retry_effect = awaited(ConsumerAdmin.retry_effect)
    resolve_effect = awaited(ConsumerAdmin.resolve_effect)
    cancel_effect = awaited(ConsumerAdmin.cancel_effect)
    amend_effect = awaited(ConsumerAdmin.amend_effect, "``producer``, if given, is a sync "
                           "``Producer``: it is used on the consumer's thread.")
    effect_actions = awaited(ConsumerAdmin.effect_actions)
    schedules = awaited(ConsumerAdmin.schedules)
    pause_schedule = awaited(ConsumerAdmin.pause_schedule)
    resume_schedule = awaited(ConsumerAdmin.resume_schedule)
    remove_schedule = awaited(ConsumerAdmin.remove_schedule)
    schedule_actions = awaited(ConsumerAdmin.schedule_actions)
    prune = awaited(ConsumerAdmin.prune, _PRUNE)
    retention_actions = awaited(ConsumerAdmin.retention_actions)
