"""The storage contract of the producer side: an outbox store and its unit of work.

An engine implements :class:`OutboxStore`; the decision code in
:mod:`reliable_flow._core` sees only these methods, never SQL or a driver.
Every promise below is checked, through this interface, by the contract
suite in ``tests/contract/`` for every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from .._envelope import Envelope
from ..delivery import Retry
from ..records import ConsumerEntry, OperatorAction, OutboxEntry
from ..statuses import DeliveryState
from .base import Store
from .records import (
    FlowState,
    Keep,
    OutboxCounts,
    PendingSummary,
    PruneStep,
    SetAside,
    StoredEvent,
    Tombstone,
)
from .watch import Signal

__all__ = ["OutboxReads", "OutboxStore", "OutboxUnit"]


class OutboxReads(Protocol):
    """Reads of the producer side; inside :meth:`OutboxStore.read` they share one snapshot."""

    def protocol_name(self) -> str | None:
        """The protocol the store was created for."""

    def meta_value(self, key: str) -> str | None:
        """The store's ``meta`` row ``key`` (e.g. ``protocol_path``), or None."""

    def flow_state(self, flow_id: str) -> FlowState | None:
        """The flow's committed state, seq and data, or None before its first
        event.  In a unit, the flow is held until it ends (see the engine)."""

    def flows(self) -> list[str]:
        """Every flow with a flow row (written by ``put_flow``), sorted."""

    def find_event(self, event_id: str) -> StoredEvent | None:
        """Position, seq and canonical body of ``event_id``, or None (never
        stored, or pruned: see :meth:`tombstone`)."""

    def tombstone(self, event_id: str) -> Tombstone | None:
        """What stays of ``event_id`` if it was pruned (flow, seq, body hash),
        else None.  Tombstones are never removed."""

    def outbox(self, flow_id: str | None = None, consumer: str | None = None) -> list[OutboxEntry]:
        """Events in commit order with their delivery state per consumer."""

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Recorded redelivers and skips (target ``delivery``, no
        ``previous_state``), oldest first."""

    def consumers(self) -> list[ConsumerEntry]:
        """Every registered consumer, by name, with its pending and set-aside delivery counts."""

    def registry_actions(self, consumer: str | None = None) -> list[OperatorAction]:
        """Recorded registrations and removals (target ``registry``; of one name
        if given), oldest first."""

    def retention_actions(self) -> list[OperatorAction]:
        """Recorded prunes (target ``retention``), oldest first."""

    def prunable(self, horizon: float, limit: int) -> PruneStep:
        """What a prune to ``horizon`` would remove now, read only: events
        (producer) or inbox rows and finished effect rows (consumer), each
        counted up to ``limit``; the rows that go with them are not counted."""

    def tombstones_before(self, before: float, limit: int) -> int:
        """Tombstones stamped before ``before`` (what ``forget_after`` would
        remove now), counted up to ``limit``."""

    def next_due(self, consumer: str, horizon: float, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` of the oldest pending deliveries to ``consumer``
        due at ``horizon``, oldest first: each the event's position and its
        body, in one read (so a picked event always has its body: one pruned
        meanwhile is simply not picked).  In a unit the engine may lock
        them, skipping those another unit holds (a relay's claim)."""

    def event_for(self, event_id: str, consumer: str) -> tuple[int, str, bool] | None:
        """``event_id``'s position, the body a relay sends ``consumer`` (with
        its delivery's prev_seq, if it has one) and whether the event is for
        it (False: it subscribes to topics and has no delivery of it); None
        when the outbox has no such event."""

    def next_due_at(self, consumer: str) -> float | None:
        """The earliest due time of a pending delivery to ``consumer`` (new:
        at once; leased: when the lease ends; failed: after its backoff), or
        None when nothing is pending for it (accepted, set aside and skipped
        deliveries wait for nothing)."""

    def outbox_counts(self, now: float) -> OutboxCounts:
        """Events, flows, bound consumers, and deliveries counted per consumer
        and state (leases judged at ``now``); for metrics, one pass over the
        deliveries."""

    # -- the console's bounded reads (issue 31, item 5): each from an index, never a walk

    def set_aside(self, limit: int) -> list[SetAside]:
        """Up to ``limit`` set-aside deliveries, by consumer name, then in
        commit order."""

    def pending_summary(self, consumer: str, now: float, cap: int) -> PendingSummary:
        """The pending deliveries to ``consumer`` counted up to ``cap``, the
        leased ones among them (at ``now``), and the oldest one's commit time."""

    def sizes(self, cap: int) -> tuple[int, int]:
        """Events and flows, each counted up to ``cap`` (``cap``: at least that many)."""


class OutboxUnit(OutboxReads, Protocol):
    """One write transaction on the producer side: all of it commits, or none.

    ``lost`` is set when the engine dropped the transaction under a
    :meth:`step` (nothing of it will commit).
    """

    lost: BaseException | None

    def add_meta(self, key: str, value: str) -> str:
        """Record ``meta`` row ``key`` = ``value`` unless the store holds
        ``key`` already (that row stays as it is); the value held after."""

    def find_event_and_flow(self, event_id: str, flow_id: str) -> tuple[StoredEvent | None, FlowState | None]:
        """``(find_event(event_id), flow_state(flow_id))``, read (and on an
        engine that locks, locked) in that order: advance asks both of every
        event, and an engine may answer them in one statement."""

    def backlog(self, cap: int) -> int:
        """Pending deliveries over all consumers (events, before any consumer), up to ``cap``."""

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        """Create or replace the flow row."""

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """Store the event, committed at ``committed_at`` (its age for
        pruning), pending for every bound consumer.  A taken event id or
        (flow, seq) raises the engine's integrity error."""

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones stamped before ``before``; how
        many.  The step is recorded (at ``now``, ``before`` as its horizon,
        no event removed), even when it found none."""

    def prune_step(self, horizon: float, now: float, limit: int, keep: Keep | None = None,
                   after: int = 0) -> PruneStep:
        """Remove up to ``limit`` of the oldest events committed before the
        first event committed after ``horizon`` (events without a commit
        time count as old) that no registered consumer still waits for
        (every delivery accepted or skipped), with their deliveries; each
        leaves a tombstone stamped ``now``, and the step is recorded, even
        when it removed nothing.  Only events after position ``after``; a
        candidate ``keep(pos, body)`` answers True for stays (its topic keeps
        it longer): the step says how many it looked at and the last one's
        position, where the next step goes on (``PruneStep.looked`` / ``last_pos``).
        Never a pending or set-aside event, never a flow row; nothing at
        all while no consumer is registered."""

    def step(self) -> AbstractContextManager[None]:
        """A nested step: its writes vanish if it raises; the rest stays."""

    def bound_uid(self, name: str) -> str | None:
        """The uid of the consumer file bound to ``name``, or None (not
        registered, or registered and not bound yet)."""

    def has_consumers(self) -> bool:
        """True if any consumer name is registered (bound or not)."""

    def is_registered(self, name: str) -> bool:
        """True if ``name`` is registered (bound or not)."""

    def register_consumer(self, name: str, now: float, from_now: bool, every_event: bool = True) -> None:
        """Register ``name``, bound to no file yet, at ``now``.  Every event
        committed before becomes pending for it, or, with ``from_now``, none
        of them (it gets the events appended afterwards, like every
        registered name).  ``every_event=False`` (a subscriber to topics,
        subscribed next in the same unit): no delivery is written here.
        A taken name raises the engine's integrity error."""

    # -- topics and subscriptions (issue 32) -----------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        """Create or replace ``meta`` row ``key`` (a setting that may change: the declared topics)."""

    def subscriptions(self) -> list[tuple[str, tuple[str, ...]]]:
        """Every consumer subscribed to topics, by name, with its topic names
        (a consumer of every event is not listed)."""

    def flow_heads(self, flow_id: str) -> dict[str, int]:
        """The seq of the flow's last event routed to each subscriber to topics."""

    def deliver(self, event_id: str, routes: Sequence[tuple[str, int | None]], flow_id: str, seq: int) -> None:
        """The stored event's deliveries to these subscribers, each
        ``(name, prev_seq)`` (None: seq - 1), pending; their heads of the
        flow move to ``seq``."""

    def deliver_all(self, name: str, routes: Sequence[tuple[int, int | None]], heads: dict[str, int]) -> None:
        """Deliveries to ``name`` of stored events, each ``(pos, prev_seq)``,
        pending; its head of each flow in ``heads`` set."""

    def subscribe(self, name: str, topics: tuple[str, ...], after: int | None) -> int:
        """Record ``name``'s subscription to ``topics``, holding for the events
        after outbox position ``after`` (None: the last one committed now,
        read under the registry lock); that position."""

    def first_after(self, when: float) -> int | None:
        """The position of the first event committed after ``when`` (by
        position; events without a commit time count as older), or None."""

    def event_bodies(self) -> list[tuple[int, str, int, str]]:
        """Every stored event as (pos, flow, seq, canonical body), in commit order."""

    def bind_consumer(self, name: str, uid: str) -> None:
        """Bind a registered name that has no file yet to ``uid``."""

    def remove_consumer(self, name: str) -> None:
        """Forget ``name``: its registration and every delivery to it."""

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        """Lease these deliveries to ``owner``: due again only at ``until``."""

    def pending_failures(self, consumer: str, pos: int) -> int | None:
        """Consecutive failures of a still-pending delivery, else None."""

    def set_retry(self, consumer: str, pos: int, retry: Retry, now: float) -> None:
        """Record a failed send: one more attempt, the failure count, due time and error; no lease."""

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` accepted, ``conflicts`` set aside (an accepted one stays accepted)."""

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        """Position and delivery state of ``event_id`` towards ``consumer``, or None."""

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        """Set a delivery's state by an operator's decision: due at once, no failures, no lease."""

    def record_action(self, action: OperatorAction) -> None:
        """Append an operator action to its record, by its target: a
        redeliver or skip (``delivery``), a registration or removal
        (``registry``), a prune (``retention``); any other target raises
        ``ValueError``."""


class OutboxStore(Store[OutboxReads, OutboxUnit], Protocol):
    """A producer's storage: see :class:`~reliable_flow._store.base.Store`, plus
    what the relay needs to know about the connection and bindings."""

    def in_transaction(self) -> bool:
        """True while a unit of work or snapshot is open on this object (e.g. a batch)."""

    def known_binding(self, name: str, uid: str) -> bool:
        """True once this object has seen ``name`` bound to ``uid``."""

    def remember_binding(self, name: str, uid: str) -> None:
        """Remember that ``name`` is bound to ``uid``."""

    def forget_binding(self, name: str) -> None:
        """Forget what this object remembered about ``name`` (it was removed)."""

    def watch(self) -> Signal:
        """A :class:`~reliable_flow._store.watch.Signal` on a connection of its
        own, opened on the calling thread, which alone uses it (any thread may
        call this: it reads only where the store lives): how ``wait`` hears
        of commits, from any process, without reading the flow in a loop."""
