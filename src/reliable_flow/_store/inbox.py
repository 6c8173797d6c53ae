"""What the consumer side asks of its storage (:class:`InboxStore`).

``receive``, ``apply_next`` and the reads of a consumer work through these
methods alone.  The contract suite (``tests/contract/test_inbox_store.py``)
holds each engine to every promise written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .._envelope import Envelope
from ..records import AppliedEvent, OperatorAction
from ..statuses import BlockReason
from .base import Store
from .effects import EffectReads, EffectUnit
from .records import (
    FlowState,
    InboxCounts,
    NextRow,
    PruneStep,
    StoredRow,
    Tombstone,
    WaitingSummary,
)
from .schedules import ScheduleReads, ScheduleUnit

__all__ = ["InboxReads", "InboxStore", "InboxUnit"]


class InboxReads(EffectReads, ScheduleReads, Protocol):
    """Reads of the consumer side; inside :meth:`InboxStore.read` they share one snapshot."""

    def meta(self) -> dict[str, str]:
        """The store's identity: ``protocol``, ``name``, ``uid`` (and
        ``protocol_path`` once recorded)."""

    def meta_value(self, key: str) -> str | None:
        """The store's ``meta`` row ``key``, or None."""

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "last_seq", **view}`` as applied, or None."""

    def effects(self, flow_id: str) -> list[AppliedEvent]:
        """The flow's effect records in apply order."""

    def flows(self) -> list[str]:
        """Every flow with an inbox row, sorted."""

    def projected_flows(self) -> list[str]:
        """Every flow with a projection (applied, or skipped past, at least
        once), sorted; still listed after its inbox rows were pruned."""

    def open_flows(self) -> list[str]:
        """Flows with a row still waiting (pending or blocked), sorted."""

    def tombstone(self, event_id: str) -> Tombstone | None:
        """What stays of ``event_id`` if its row was pruned (flow, seq, body
        hash), else None.  Tombstones are never removed."""

    def inbox_rows(self, flow_id: str, from_seq: int = 1) -> list[StoredRow]:
        """The flow's rows at or after ``from_seq`` in full, with their
        bodies, by seq (a replaced row just before its replacement)."""

    def inbox_row(self, event_id: str) -> StoredRow | None:
        """The row of ``event_id`` (in any state) in full, with its body, or
        None.  In a unit, the event id is held until it ends (see the engine)."""

    def inbox_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Recorded skips and replacements (target ``inbox``), oldest first; with ``event_id``,
        those of that event or naming it as the replacement."""

    def retention_actions(self) -> list[OperatorAction]:
        """Recorded prunes (target ``retention``), oldest first."""

    def prunable(self, horizon: float, limit: int) -> PruneStep:
        """What a prune to ``horizon`` would remove now, read only: events
        (producer) or inbox rows and finished effect rows (consumer), each
        counted up to ``limit``; the rows that go with them are not counted."""

    def tombstones_before(self, before: float, limit: int) -> int:
        """Tombstones stamped before ``before`` (what ``forget_after`` would
        remove now), counted up to ``limit``."""

    def inbox_counts(self) -> InboxCounts:
        """Rows per state, blocked rows per reason, flows stopped at a gap;
        for metrics, one pass over the inbox."""

    # -- the console's bounded reads (issue 31, item 5): each from an index, never a walk

    def waiting_flows(self, received_before: float, after: str, limit: int) -> list[str]:
        """Up to ``limit`` flows after ``after`` (in flow order) with a row
        still waiting that is blocked, or arrived at or before
        ``received_before`` (or at an unknown time): every flow that may
        need attention, sorted (``why_waiting`` decides)."""

    def flows_by_correlation(self, correlation_id: str, limit: int) -> list[str]:
        """Up to ``limit`` flows, sorted, with an inbox row whose event's
        ``meta["correlation_id"]`` is ``correlation_id``."""

    def waiting_summary(self, cap: int) -> WaitingSummary:
        """Pending and blocked rows counted (together up to ``cap``), and the
        earliest arrival among them."""

    def applies_recorded(self) -> int:
        """How many applies the store has recorded, ever (pruning does not
        lower it; on PostgreSQL an apply rolled back may count too): read
        from the last apply record, not counted."""


class InboxUnit(InboxReads, EffectUnit, ScheduleUnit, Protocol):
    """One write transaction on the consumer side: all of it commits, or none."""

    def add_meta(self, key: str, value: str) -> str:
        """Record ``meta`` row ``key`` = ``value`` unless the store holds
        ``key`` already (that row stays as it is); the value held after."""

    def insert_new(self, env: Envelope, received_at: float | None = None) -> bool:
        """Store the event as pending, received at ``received_at``, unless its
        id or (flow, seq) is taken (by a row not replaced), its id has a
        tombstone, or its seq is at or before the flow's last applied seq;
        True if stored."""

    def insert_new_many(self, envs: Sequence[Envelope], received_at: float | None = None) -> list[bool]:
        """:meth:`insert_new` of each event, in order; for events with
        distinct ids and distinct (flow, seq) only (so that none of them
        decides another's fate), which an engine may store by a few
        set-based statements."""

    def insert(self, env: Envelope, received_at: float | None = None) -> None:
        """Store the event as pending, received at ``received_at``; a taken id
        or (flow, seq) raises the engine's integrity error."""

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id holding (flow, seq) (a replaced row no longer does), or None."""

    def unapplied(self, cap: int) -> int:
        """Rows still waiting (pending or blocked), counted up to ``cap``."""

    def flow_state(self, flow_id: str) -> FlowState | None:
        """The flow's applied state, last seq and data, or None."""

    def next_row(self, flow_id: str, seq: int) -> NextRow | None:
        """The flow's first row at or after ``seq`` that is not replaced, or None."""

    def flow_and_next_row(self, flow_id: str) -> tuple[FlowState | None, NextRow | None]:
        """``flow_state(flow_id)`` and then ``next_row(flow_id, its last seq +
        1)``: an apply asks both, and an engine may answer them in one statement."""

    def newest_waiting(self, flow_id: str) -> NextRow | None:
        """The flow's row still waiting (pending or blocked) with the highest
        seq, holding its slot, or None (what a ``latest`` consumer applies)."""

    def oldest_pending(self, flow_id: str) -> NextRow | None:
        """The flow's pending row with the lowest seq, holding its slot, or
        None (what an ``any`` consumer applies next)."""

    def supersede(self, flow_id: str, below: int, detail: str) -> int:
        """Mark the flow's rows still waiting (pending or blocked) with a seq
        below ``below`` superseded, with ``detail`` (reason cleared); how many."""

    def block(self, event_id: str, reason: BlockReason, detail: str | None = None,
              now: float | None = None) -> None:
        """Mark the row blocked for ``reason`` with ``detail`` (writing nothing
        if it already is, for the same reason and detail); ``blocked_at``
        becomes ``now`` only when the row was not blocked before."""

    def set_skipped(self, event_id: str) -> None:
        """Mark the row skipped (an operator moved its flow past it)."""

    def set_replaced(self, event_id: str) -> None:
        """Mark the row replaced: it keeps its id and body, and gives up its
        (flow, seq) slot to a replacement stored next."""

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        """Create or replace the flow's projection."""

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones stamped before ``before``; how
        many.  The step is recorded (at ``now``, ``before`` as its horizon,
        no event removed), even when it found none."""

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        """Remove up to ``limit`` of the oldest inbox rows received before the
        first row received after ``horizon`` (rows without a time count as
        old) that are applied, skipped or replaced and at or before their
        flow's last applied seq, each leaving a tombstone stamped ``now``,
        with their effect records; and up to ``limit`` effect-outbox rows in
        a final state (succeeded, expired, superseded, cancelled; fed if
        feedback was asked) last written at or before ``horizon``.  Never a
        pending or blocked row, a projection, or an unfinished effect.  The
        step is recorded, even when it removed nothing."""

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record and its row marked applied (reason and
        detail cleared); a second effect for the event or (flow, seq) raises
        the engine's integrity error."""


class InboxStore(Store[InboxReads, InboxUnit], Protocol):
    """A consumer's storage: see :class:`~reliable_flow._store.base.Store`."""
