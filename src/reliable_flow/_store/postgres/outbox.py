"""The producer's store on PostgreSQL: every SQL statement the producer side runs.

:class:`PgOutboxStore` owns the connection; :class:`PgOutbox` is one view of
it, a unit of work inside :meth:`PgOutboxStore.write` or a snapshot inside
:meth:`PgOutboxStore.read`.

What a unit locks (READ COMMITTED holds nothing by itself), all until it ends:

* ``find_event``: the event id (advisory), so a retry racing its original
  waits and then finds it (``existing``), as on SQLite;
* ``flow_state``: the flow (advisory, which also covers a flow's first
  event, when there is no row yet) and its row (``FOR UPDATE``);
* ``find_event_and_flow`` (every advance): both of the above, in that
  order, also for an event id already used (whose answer needs no flow);
* ``backlog``: one advisory lock per schema, so two writers never both pass
  a ``max_backlog`` check that only one of them fits under;
* ``append_event``: the registry lock in shared mode (see below);
* ``next_due`` in a unit (a relay's claim): the deliveries it picks,
  ``FOR UPDATE SKIP LOCKED``, so two relays never claim the same one;
* ``pending_failures`` / ``delivery_state``: the delivery row.

Lock order is event, flow, backlog, registry, rows; a batch that takes them
for many events may still meet another batch in a cycle, which PostgreSQL
breaks by aborting one (:class:`DatabaseBusy`, nothing written).

The statement texts live in :mod:`.outbox_sql`.

The consumer registry (which names get deliveries, which consumer store
each is bound to, and the record of changes).  Registering (or removing) a name must not race with ``append_event``: an
event committed while a name is being registered would otherwise be
pending for nobody new (``append_event`` read the consumer table before the
name was there, and the registration's "every committed event" did not see
the event yet).  So a unit takes the schema's ``registry`` advisory lock:
``append_event`` and pruning in shared mode, registration, binding checks
and removal in exclusive mode.  A registration therefore waits for the
appends in flight and the appends after it see the new name.

Retention: tombstones of pruned events, and the bounded pruning
transactions that leave them.  Age is read as on SQLite: the rows before the first one stamped after the
horizon.  Concurrency: the candidate rows are locked (``FOR UPDATE ...
SKIP LOCKED``, so two pruners never bury one row twice), and on the producer
side their deliveries are locked and re-read before anything is removed, so
an operator's redelivery committed meanwhile keeps its event; a pruning
unit holds the registry lock in shared mode, so no name is registered (and
given every committed event) while events disappear.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._envelope import Envelope
from ...delivery import Retry
from ...records import ConsumerEntry, OperatorAction, OutboxEntry
from ...statuses import DeliveryState
from .. import rows
from ..binding import BindingMemo
from ..records import FlowState, OutboxCounts, PruneStep, StoredEvent
from ..shared import identity_problem
from .base import PgStore
from .connection import DEFAULT_LOCK_TIMEOUT, Conn, Database
from .location import Target, parse
from .outbox_sql import (
    APPEND,
    BACKLOG,
    CONSUMERS,
    DELIVERIES,
    DELIVERY_COUNTS,
    FIND_EVENT,
    FLOW,
    FLOW_FOR_UPDATE,
    LOCK_DELIVERIES,
    MARK_CONFLICT,
    MARK_DELIVERED,
    MAX_POS,
    NEXT_DUE,
    NEXT_DUE_AT,
    OUTBOX_BURY,
    OUTBOX_FORGET,
    OUTBOX_PRUNABLE,
    OUTBOX_TOMBSTONE,
    PENDING,
    PENDING_FOR_ALL,
    REGISTER,
    REGISTRY_LOCK,
    STILL_WAITING,
    UPSERT_FLOW,
    WAITING,
    Candidate,
)
from .schema import PRODUCER
from .tombstones import PgTombstones, TombstoneSql

__all__ = ["NEXT_DUE", "NEXT_DUE_AT", "PgOutbox", "PgOutboxStore"]


class PgOutbox(PgTombstones):
    """The producer's tables, seen through one connection: advance,
    deliveries, the consumer registry, tombstones and pruning."""

    _TOMBSTONES = TombstoneSql(OUTBOX_TOMBSTONE, OUTBOX_FORGET, OUTBOX_BURY)
    def find_event(self, event_id: str) -> StoredEvent | None:
        # The lock, then the read: two statements (the read's snapshot
        # follows the lock), sent together in a pipelined unit.
        self._lock("event", event_id)
        return self._found(event_id, self._rows(FIND_EVENT, (event_id, event_id)))

    def find_event_and_flow(self, event_id: str, flow_id: str) -> tuple[StoredEvent | None, FlowState | None]:
        """:meth:`find_event` then :meth:`flow_state`, each lock before its
        read and the event's before the flow's; in a pipelined unit the four
        statements go out together and are answered in one round trip (each
        read still a statement of its own, started once its lock is granted)."""
        if self._pipe is None:
            return self.find_event(event_id), self.flow_state(flow_id)
        self._lock("event", event_id)
        event = self._execute(FIND_EVENT, (event_id, event_id))
        self._lock("flow", flow_id)
        flow = self._execute(FLOW_FOR_UPDATE, (flow_id,))
        found = event.fetchall()  # waits for all four
        row = flow.fetchone()
        self._answered = True
        return self._found(event_id, found), None if row is None else rows.flow_state(row)

    def _found(self, event_id: str, found: list[tuple[Any, ...]]) -> StoredEvent | None:
        """The stored event among FIND_EVENT's rows; a tombstone among them is
        kept for the ``tombstone(event_id)`` call that follows."""
        stored = self._keep_tombstone(event_id, found, (4, 2, 5))
        return None if stored is None else rows.stored_event(stored[1:4])

    def flow_state(self, flow_id: str) -> FlowState | None:
        self._lock("flow", flow_id)
        row = self._one(FLOW_FOR_UPDATE if self._writing else FLOW, (flow_id,))
        return None if row is None else rows.flow_state(row)

    def backlog(self, cap: int) -> int:
        """Pending deliveries summed over consumers, or events before any consumer; counts stop at ``cap``."""
        self._lock("backlog")
        row = self._one(BACKLOG, (cap, cap))
        return 0 if row is None else int(row[0])

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        self._looked_up = None
        self._send(UPSERT_FLOW, (flow_id, seq, state, data))

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """The event, pending for every consumer registered when it commits.

        The registry lock and the insert stay two statements: the insert
        reads the consumer table, and must see a registration that held the
        lock exclusively while we waited (see the module's docstring)."""
        self._looked_up = None
        self._lock(REGISTRY_LOCK, shared=True)
        self._send(APPEND, (env.event_id, env.flow_id, env.seq, env.body, committed_at))

    def next_due(self, consumer: str, horizon: float, limit: int) -> list[tuple[int, str]]:
        """Positions and bodies of the oldest pending deliveries due at
        ``horizon``; in a unit, the deliveries locked, skipping those another
        unit holds (being claimed)."""
        lock = " FOR UPDATE OF d SKIP LOCKED" if self._writing else ""
        return [(int(r[0]), str(r[1])) for r in self._rows(NEXT_DUE + lock, (consumer, horizon, limit))]

    def next_due_at(self, consumer: str) -> float | None:
        row = self._one(NEXT_DUE_AT, (consumer,))
        return None if row is None or row[0] is None else float(row[0])

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        if positions:
            self._send(
                "UPDATE delivery SET due_at = %s, lease_owner = %s, updated_at = %s "
                "WHERE consumer = %s AND pos = ANY(%s)",
                (until, owner, now, consumer, [int(p) for p in positions]),
            )

    def pending_failures(self, consumer: str, pos: int) -> int | None:
        """Consecutive failures of a delivery that is still pending, else None."""
        lock = " FOR UPDATE" if self._writing else ""
        row = self._one(
            "SELECT failures FROM delivery WHERE consumer = %s AND pos = %s AND state = %s" + lock,
            (consumer, pos, PENDING),
        )
        return None if row is None else int(row[0])

    def set_retry(self, consumer: str, pos: int, retry: Retry, now: float) -> None:
        self._send(
            "UPDATE delivery SET attempts = attempts + 1, failures = %s, due_at = %s, lease_owner = NULL, "
            "last_error = %s, updated_at = %s WHERE consumer = %s AND pos = %s",
            (retry.failures, retry.due_at, retry.error, now, consumer, pos),
        )

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` become accepted, ``conflicts`` set aside."""
        cur = self._cursor()
        if delivered:
            cur.executemany(MARK_DELIVERED, [(status, now, consumer, pos) for pos, status in delivered])
        if conflicts:
            cur.executemany(MARK_CONFLICT, [(status, now, consumer, pos) for pos, status in conflicts])

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        lock = " FOR UPDATE OF d" if self._writing else ""
        row = self._one(
            "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos "
            "WHERE o.event_id = %s AND d.consumer = %s" + lock,
            (event_id, consumer),
        )
        return None if row is None else (int(row[0]), DeliveryState(row[1]))

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        """An operator's decision: the delivery goes to ``state``, due at once, unclaimed."""
        self._run(
            "UPDATE delivery SET state = %s, due_at = 0, failures = 0, lease_owner = NULL, updated_at = %s "
            "WHERE consumer = %s AND pos = %s",
            (DeliveryState(state).value, now, consumer, pos),
        )

    def record_action(self, action: OperatorAction) -> None:
        self._run(
            "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (action.at, action.consumer, action.event_id, action.action, action.actor, action.reason),
        )

    def protocol_name(self) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = 'protocol'")
        return None if row is None else str(row[0])

    def flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT flow_id FROM flow ORDER BY flow_id")]

    def outbox(self, flow_id: str | None = None, consumer: str | None = None) -> list[OutboxEntry]:
        """Outbox entries with their delivery state; call inside a read transaction."""
        where, params = ("WHERE o.flow_id = %s", (flow_id,)) if flow_id is not None else ("", ())
        events = self._rows(f"SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o {where} ORDER BY o.pos", params)
        deliveries = self._rows(f"{DELIVERIES}{where} ORDER BY d.pos, d.consumer", params)
        return rows.outbox_entries(events, deliveries, consumer)

    def outbox_counts(self, now: float) -> OutboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        groups = rows.delivery_counts(self._rows(DELIVERY_COUNTS, (now,)))
        events = self._one("SELECT count(*) FROM outbox")
        flows = self._one("SELECT count(*) FROM flow")
        return OutboxCounts(
            0 if events is None else int(events[0]), 0 if flows is None else int(flows[0]),
            tuple(str(r[0]) for r in self._rows("SELECT name FROM consumer ORDER BY name")), groups,
        )

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE event_id = %s", (event_id,)) if event_id is not None else ("", ())
        return [
            rows.delivery_action(r)
            for r in self._rows(
                f"SELECT at, consumer, event_id, action, actor, reason FROM operator_action {where} ORDER BY id",
                params,
            )
        ]

    def has_consumers(self) -> bool:
        self._lock(REGISTRY_LOCK)
        return self._one("SELECT 1 FROM consumer LIMIT 1") is not None

    def is_registered(self, name: str) -> bool:
        self._lock(REGISTRY_LOCK)
        return self._one("SELECT 1 FROM consumer WHERE name = %s", (name,)) is not None

    def register_consumer(self, name: str, now: float, from_now: bool) -> None:
        """A name with no store yet: from now, after the last committed event; else from the first."""
        self._lock(REGISTRY_LOCK)
        self._run(REGISTER, (name, now, bool(from_now)))
        if not from_now:
            self._run(PENDING_FOR_ALL, (name,))

    def bound_uid(self, name: str) -> str | None:
        row = self._one("SELECT uid FROM consumer WHERE name = %s", (name,))
        return None if row is None or row[0] is None else str(row[0])

    def bind_consumer(self, name: str, uid: str) -> None:
        self._run("UPDATE consumer SET uid = %s WHERE name = %s AND uid IS NULL", (uid, name))

    def remove_consumer(self, name: str) -> None:
        self._lock(REGISTRY_LOCK)
        self._run("DELETE FROM delivery WHERE consumer = %s", (name,))
        self._run("DELETE FROM consumer WHERE name = %s", (name,))

    def record_registry_action(self, action: OperatorAction) -> None:
        self._run(
            "INSERT INTO registry_action(at, consumer, action, actor, reason) VALUES (%s, %s, %s, %s, %s)",
            (action.at, action.consumer, action.action, action.actor, action.reason),
        )

    def consumers(self) -> list[ConsumerEntry]:
        return [rows.consumer_entry(r) for r in self._rows(CONSUMERS)]

    def registry_actions(self, consumer: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE consumer = %s", (consumer,)) if consumer is not None else ("", ())
        return [
            rows.registry_action(r)
            for r in self._rows(
                f"SELECT at, consumer, action, actor, reason FROM registry_action {where} ORDER BY id", params
            )
        ]

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        step = self._prune_outbox(horizon, now, limit)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._run(
            "INSERT INTO prune_action(at, horizon, events, deliveries) VALUES (%s, %s, %s, %s)",
            (now, horizon, step.events, step.deliveries),
        )

    def _prune_outbox(self, horizon: float, now: float, limit: int) -> PruneStep:
        self._lock(REGISTRY_LOCK, shared=True)
        if self._one("SELECT 1 FROM consumer LIMIT 1") is None:
            return PruneStep(0)  # no consumer yet: every event is still owed to the first one
        found = self._rows(OUTBOX_PRUNABLE, (horizon, MAX_POS, WAITING, limit))
        if not found:
            return PruneStep(0)
        positions = [int(r[0]) for r in found]
        self._rows(LOCK_DELIVERIES, (positions,))
        waiting = {int(r[0]) for r in self._rows(STILL_WAITING, (positions, WAITING))}
        rows: list[Candidate] = [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4])) for r in found if int(r[0]) not in waiting
        ]
        if not rows:
            return PruneStep(0)
        kept = [r[0] for r in rows]
        self._bury(rows, now)
        deliveries = self._run(
            "DELETE FROM delivery WHERE pos = ANY(%s) AND consumer IN (SELECT name FROM consumer)", (kept,)
        )
        self._run("DELETE FROM outbox WHERE pos = ANY(%s)", (kept,))
        return PruneStep(len(rows), deliveries=deliveries)


class PgOutboxStore(PgStore[PgOutbox], BindingMemo):
    """A producer's store in a PostgreSQL schema: one connection, owned by
    the opening process and thread.

    ``location`` is a ``postgresql://`` string (schema as the fragment,
    default ``reliable_flow_producer``) or a connection factory; ``schema``
    overrides the fragment.  Creates the schema if absent (recording
    ``protocol``), and refuses one of another kind, product, version or
    protocol before writing anything.  ``busy_timeout`` is the session's
    ``lock_timeout`` in seconds.  ``readonly`` opens it for reads only.
    """

    def __init__(
        self, location: Target, protocol: str | None, *, busy_timeout: float = DEFAULT_LOCK_TIMEOUT,
        readonly: bool = False, schema: str | None = None,
    ) -> None:
        def on_create(conn: Conn) -> None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', %s)", (protocol,))

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol)

        super().__init__(Database(
            parse(location, PRODUCER.name, schema), PRODUCER, lock_timeout=busy_timeout, on_create=on_create,
            check_meta=check_meta, readonly=readonly,
        ), PgOutbox)

    # advance: BEGIN + the event's lock and read + the flow's lock and read
    # (find_event_and_flow), then the writes + COMMIT: two round trips (see
    # Database.write_view).
    _PIPELINED = True

