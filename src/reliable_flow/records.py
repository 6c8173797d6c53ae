"""Records: the frozen dataclasses the library answers with.

Results say what one call did (``AdvanceResult``, ``ApplyResult``, ...);
records describe a row as it stands (``OutboxEntry``, ``InboxEntry``,
``ScheduledEffect``, ...); operator actions are the audit trail of what an
operator changed, each an ``OperatorAction`` (its ``target``, a
:class:`~reliable_flow.statuses.ActionTarget`, says what it acted on).  None of them is built by user code; compare a result's
``status`` with the enums in :mod:`reliable_flow.statuses`::

    from reliable_flow import Producer, AdvanceStatus
    from reliable_flow.records import AdvanceResult

Names used for the same kind of thing: an *applied event* is an event a
consumer applied (``AppliedEvent``, from ``Consumer.applied``); a *scheduled
effect* is a row of the effect outbox (``ScheduledEffect``, from
``Consumer.scheduled_effect`` / ``Consumer.scheduled_effects``), and each
step of its durable history an ``EffectTransition`` (from
``Consumer.effect_history``); the *effect
registry* (``reliable_flow.EffectRegistry``) maps an effect's name to its function.
"""

from __future__ import annotations

from typing import Any

from ._effects.executor import ExecutorStats
from ._operations import (
    ConsumerEntry,
    InboxRow,
    PruneResult,
    StuckFlow,
)
from ._worker import WorkerStats
from .statuses import (
    AdvanceResult,
    AppliedEvent,
    ApplyResult,
    DeliveryRecord,
    DrainResult,
    EffectTransition,
    InboxEntry,
    OperatorAction,
    OutboxEntry,
    ReceiveResult,
    RelayBatchResult,
    RelayResult,
    ScheduledEffect,
)

__all__ = [
    "AdvanceResult",
    "AppliedEvent",
    "ApplyResult",
    "ConsumerEntry",
    "DeliveryRecord",
    "DrainResult",
    "EffectTransition",
    "ExecutorStats",
    "InboxEntry",
    "InboxRow",
    "OperatorAction",
    "OutboxEntry",
    "PruneResult",
    "ReceiveResult",
    "RelayBatchResult",
    "RelayResult",
    "ScheduledEffect",
    "StuckFlow",
    "WorkerStats",
]


def __getattr__(name: str) -> Any:
    # InboxAction, RegistryAction, EffectAction: deprecated, for one release
    from ._deprecated import old_name

    return old_name(__name__, name)
