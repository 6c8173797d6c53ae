"""The producer side's methods that every engine runs the same way, written once.

Each picks its statement from the engine's table (its ``outbox_sql``, an
:class:`~.statements.OutboxSql` with the shared texts) and runs it through the engine's
:class:`~.dialect.Dialect`.  The locks are the engine's: on PostgreSQL the
registry reads and changes take the schema's ``registry`` advisory lock and
the guarding reads of a unit lock their rows; on SQLite a unit holds the
file's write lock, so both are nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from ... import _envelope as envelope
from ...delivery import Retry
from ...records import ConsumerEntry, OperatorAction, OutboxEntry
from ...statuses import ActionTarget, DeliveryState
from .. import rows
from ..records import OutboxCounts, PendingSummary, PruneStep, SetAside
from .dialect import Dialect
from .statements import OutboxSql

__all__ = ["REGISTRY_LOCK", "OutboxRepository"]

#: The advisory lock that orders registrations against appends and pruning.
REGISTRY_LOCK = "registry"


class OutboxRepository(Dialect):
    """The producer side's reads and writes that need no engine of their own."""

    _SQL: ClassVar[type[OutboxSql]]

    def protocol_name(self) -> str | None:
        return self.meta_value("protocol")

    def flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows(self._SQL.FLOWS)]

    def outbox(self, flow_id: str | None = None, consumer: str | None = None) -> list[OutboxEntry]:
        """Outbox entries with their delivery state; call inside a read transaction."""
        if flow_id is None:
            events, deliveries = self._rows(self._SQL.EVENTS), self._rows(self._SQL.DELIVERIES)
        else:
            events = self._rows(self._SQL.EVENTS_OF_FLOW, (flow_id,))
            deliveries = self._rows(self._SQL.DELIVERIES_OF_FLOW, (flow_id,))
        return rows.outbox_entries(events, deliveries, consumer)

    def outbox_counts(self, now: float) -> OutboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        groups = rows.delivery_counts(self._rows(self._SQL.DELIVERY_COUNTS, (now,)))
        events, flows = self._one(self._SQL.COUNT_EVENTS), self._one(self._SQL.COUNT_FLOWS)
        return OutboxCounts(
            0 if events is None else int(events[0]), 0 if flows is None else int(flows[0]),
            tuple(str(r[0]) for r in self._rows(self._SQL.CONSUMER_NAMES)), groups,
        )

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        found = (self._rows(self._SQL.OPERATOR_ACTIONS) if event_id is None
                 else self._rows(self._SQL.OPERATOR_ACTIONS_OF_EVENT, (event_id,)))
        return [rows.delivery_action(r) for r in found]

    def record_action(self, action: OperatorAction) -> None:
        if action.target is ActionTarget.REGISTRY:
            topics = None if action.topics is None else json.dumps(list(action.topics))
            self._run(self._SQL.RECORD_REGISTRY_ACTION,
                      (action.at, action.consumer, action.action, action.actor, action.reason, topics))
        elif action.target is ActionTarget.DELIVERY:
            self._run(self._SQL.RECORD_ACTION,
                      (action.at, action.consumer, action.event_id, action.action, action.actor, action.reason))
        elif action.target is ActionTarget.RETENTION:
            self._record_retention(action)
        else:
            raise ValueError(f"a producer records delivery, registry and retention actions, "
                             f"not {action.target.value!r} ones")

    def registry_actions(self, consumer: str | None = None) -> list[OperatorAction]:
        found = (self._rows(self._SQL.REGISTRY_ACTIONS) if consumer is None
                 else self._rows(self._SQL.REGISTRY_ACTIONS_OF, (consumer,)))
        return [rows.registry_action(r) for r in found]

    def has_consumers(self) -> bool:
        self._lock(REGISTRY_LOCK)
        return self._one(self._SQL.ANY_CONSUMER) is not None

    def is_registered(self, name: str) -> bool:
        self._lock(REGISTRY_LOCK)
        return self._one(self._SQL.IS_REGISTERED, (name,)) is not None

    def register_consumer(self, name: str, now: float, from_now: bool, every_event: bool = True) -> None:
        """A name with no consumer store yet: from now, after the last committed event; else from the first
        (its deliveries written here unless ``every_event`` is False: a subscriber to topics)."""
        self._lock(REGISTRY_LOCK)
        self._run(self._SQL.REGISTER, (name, now, bool(from_now)))
        if not from_now and every_event:
            self._run(self._SQL.PENDING_FOR_ALL, (name,))

    def bound_uid(self, name: str) -> str | None:
        row = self._one(self._SQL.BOUND_UID, (name,))
        return None if row is None or row[0] is None else str(row[0])

    def bind_consumer(self, name: str, uid: str) -> None:
        self._run(self._SQL.BIND, (uid, name))

    def remove_consumer(self, name: str) -> None:
        self._lock(REGISTRY_LOCK)
        self._run(self._SQL.FORGET_DELIVERIES_OF, (name,))
        self._run(self._SQL.FORGET_HEADS_OF, (name,))
        self._run(self._SQL.REMOVE_CONSUMER, (name,))

    # -- topics and subscriptions (issue 32) ------------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        self._run(self._SQL.SET_META, (key, value))

    def subscriptions(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(str(r[0]), tuple(json.loads(r[1]))) for r in self._rows(self._SQL.SUBSCRIPTIONS)]

    def flow_heads(self, flow_id: str) -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in self._rows(self._SQL.FLOW_HEADS, (flow_id,))}

    def deliver(self, event_id: str, routes: Sequence[tuple[str, int | None]], flow_id: str, seq: int) -> None:
        self._many(self._SQL.DELIVER_ROUTED, [(name, prev, event_id) for name, prev in routes])
        self._many(self._SQL.PUT_HEAD, [(flow_id, name, seq) for name, _ in routes])

    def deliver_all(self, name: str, routes: Sequence[tuple[int, int | None]], heads: dict[str, int]) -> None:
        self._many(self._SQL.DELIVER_AT, [(name, pos, prev) for pos, prev in routes])
        self._many(self._SQL.PUT_HEAD, [(flow_id, name, seq) for flow_id, seq in heads.items()])

    def subscribe(self, name: str, topics: tuple[str, ...], after: int | None) -> int:
        self._lock(REGISTRY_LOCK)
        if after is None:
            row = self._one(self._SQL.LAST_POS)
            after = 0 if row is None else int(row[0])
        self._run(self._SQL.SUBSCRIBE, (json.dumps(list(topics)), after, name))
        return after

    def event_for(self, event_id: str, consumer: str) -> tuple[int, str, bool] | None:
        row = self._one(self._SQL.EVENT_FOR, (consumer, consumer, event_id))
        if row is None:
            return None
        body = str(row[1]) if row[2] is None else envelope.delivered(str(row[1]), int(row[2]))
        return int(row[0]), body, row[3] is not None or row[4] is None

    def first_after(self, when: float) -> int | None:
        row = self._one(self._SQL.FIRST_AFTER, (when,))
        return None if row is None else int(row[0])

    def event_bodies(self) -> list[tuple[int, str, int, str]]:
        return [(int(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in self._rows(self._SQL.EVENT_BODIES)]

    def consumers(self) -> list[ConsumerEntry]:
        return [rows.consumer_entry(r) for r in self._rows(self._SQL.CONSUMERS)]

    def next_due(self, consumer: str, horizon: float, limit: int) -> list[tuple[int, str]]:
        """Positions and bodies of the oldest pending deliveries due at
        ``horizon``; in a unit of an engine that locks rows, the deliveries
        locked, skipping those another unit holds (being claimed)."""
        sql = self._guarded(self._SQL.NEXT_DUE, self._SQL.NEXT_DUE_LOCKED)
        # A delivery with a prev_seq (a subscriber to topics) carries it in its body.
        return [(int(r[0]), str(r[1]) if r[2] is None else envelope.delivered(str(r[1]), int(r[2])))
                for r in self._rows(sql, (consumer, horizon, limit))]

    def next_due_at(self, consumer: str) -> float | None:
        row = self._one(self._SQL.NEXT_DUE_AT, (consumer,))
        return None if row is None or row[0] is None else float(row[0])

    def pending_failures(self, consumer: str, pos: int) -> int | None:
        """Consecutive failures of a delivery that is still pending, else None."""
        sql = self._guarded(self._SQL.PENDING_FAILURES, self._SQL.PENDING_FAILURES_LOCKED)
        row = self._one(sql, (consumer, pos, DeliveryState.PENDING.value))
        return None if row is None else int(row[0])

    def set_retry(self, consumer: str, pos: int, retry: Retry, now: float) -> None:
        self._send(self._SQL.SET_RETRY, (retry.failures, retry.due_at, retry.error, now, consumer, pos))

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        row = self._one(self._guarded(self._SQL.DELIVERY_STATE, self._SQL.DELIVERY_STATE_LOCKED), (event_id, consumer))
        return None if row is None else (int(row[0]), DeliveryState(row[1]))

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        """An operator's decision: the delivery goes to ``state``, due at once, unclaimed."""
        self._run(self._SQL.RESOLVE, (DeliveryState(state).value, now, consumer, pos))

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._run(self._SQL.RECORD_PRUNE, (now, horizon, step.events, step.deliveries))

    # -- the console's bounded reads (issue 31, item 5)

    def set_aside(self, limit: int) -> list[SetAside]:
        return [SetAside(str(c), str(e), str(f), int(q), None if s is None else str(s))
                for c, e, f, q, s in self._rows(self._SQL.SET_ASIDE, (limit,))]

    def pending_summary(self, consumer: str, now: float, cap: int) -> PendingSummary:
        counted = self._one(self._SQL.PENDING_SUMMARY, (now, consumer, cap))
        oldest = self._one(self._SQL.OLDEST_PENDING, (consumer,))
        pending, leased = (0, 0) if counted is None else (int(counted[0]), int(counted[1]))
        return PendingSummary(pending, leased, None if oldest is None or oldest[0] is None else float(oldest[0]))

    def sizes(self, cap: int) -> tuple[int, int]:
        events, flows = self._one(self._SQL.EVENTS_UP_TO, (cap,)), self._one(self._SQL.FLOWS_UP_TO, (cap,))
        return (0 if events is None else int(events[0])), (0 if flows is None else int(flows[0]))
