"""Records: the frozen dataclasses the library answers with.

Results say what one call did (``AdvanceResult``, ``ApplyResult``, ...);
records describe a row as it stands (``OutboxEntry``, ``InboxEntry``,
``ScheduledEffect``, ...); operator actions are the audit trail of what an
operator changed.  None of them is built by user code; compare a result's
``status`` with the enums in :mod:`reliable_flow.statuses`::

    from reliable_flow import Producer, AdvanceStatus
    from reliable_flow.records import AdvanceResult

Names used for the same kind of thing: an *applied event* is an event a
consumer applied (``AppliedEvent``, from ``Consumer.effects``); a *scheduled
effect* is a row of the effect outbox (``ScheduledEffect``, from
``Consumer.effect`` / ``Consumer.effect_outbox``); the *effect registry*
(``reliable_flow.EffectRegistry``) maps an effect's name to its function.
"""

from __future__ import annotations

from ._executor import ExecutorStats
from ._operations import (
    ConsumerEntry,
    InboxAction,
    InboxRow,
    PruneResult,
    RegistryAction,
    StuckFlow,
)
from ._worker import WorkerStats
from .statuses import (
    AdvanceResult,
    AppliedEvent,
    ApplyResult,
    DeliveryRecord,
    DrainResult,
    EffectAction,
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
    "EffectAction",
    "ExecutorStats",
    "InboxAction",
    "InboxEntry",
    "InboxRow",
    "OperatorAction",
    "OutboxEntry",
    "PruneResult",
    "ReceiveResult",
    "RegistryAction",
    "RelayBatchResult",
    "RelayResult",
    "ScheduledEffect",
    "StuckFlow",
    "WorkerStats",
]
