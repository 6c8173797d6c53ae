"""The producer file on SQLite: every SQL statement the producer side runs.

:class:`SqliteOutboxStore` owns the connection; :class:`SqliteOutbox` is one
view of it, a unit of work inside :meth:`SqliteOutboxStore.write` or a
consistent snapshot inside :meth:`SqliteOutboxStore.read`.  Status values
in the SQL come from the enums; partial-index predicates keep their literal
(SQLite only uses a partial index when the query repeats its predicate
text), and a test pins those literals to the enums.  The statement texts
live in :mod:`.outbox_sql`.

The consumer registry: which names get deliveries, which file each is
bound to, and the record of changes.  Retention: tombstones of pruned
events, and the bounded pruning transactions that leave them.
An event's age is its position in commit (producer: ``pos``) or arrival
(consumer: ``rowid``) order: the events older than the horizon are those
before the first one stamped after it.  So a pruning pass walks from the
oldest row and stops at the first young one, reading only the old rows it
keeps (pending or set aside: few) and the ones it prunes, never the whole
table, and no index on the time columns slows every write down.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..._envelope import Envelope
from ...delivery import Retry
from ...errors import StorageError
from ...records import ConsumerEntry, OperatorAction, OutboxEntry
from ...statuses import DeliveryState
from .. import rows
from ..binding import BindingMemo
from ..records import FlowState, OutboxCounts, PruneStep, StoredEvent, Tombstone
from ..shared import identity_problem
from .base import SqliteStore
from .connection import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .errors import storage_error
from .outbox_sql import (
    CLAIM,
    CONSUMERS,
    DELIVER_FROM,
    DELIVERIES,
    DELIVERY_COUNTS,
    FIND_EVENT_AND_FLOW,
    MARK_CONFLICT,
    MARK_DELIVERED,
    NEXT_DUE,
    NEXT_DUE_AT,
    OUTBOX_BURY,
    OUTBOX_FORGET,
    OUTBOX_PRUNABLE,
    OUTBOX_TOMBSTONE,
    PENDING,
    UPSERT_FLOW,
    WAITING,
    by_status,
    in_chunks,
)
from .schema import PRODUCER
from .tombstones import SqliteTombstones, TombstoneSql

__all__ = ["NEXT_DUE", "NEXT_DUE_AT", "SqliteOutbox", "SqliteOutboxStore"]


class SqliteOutbox(SqliteTombstones):
    """The producer file's tables, seen through one connection: advance,
    deliveries, the consumer registry, tombstones and pruning."""

    _TOMBSTONES = TombstoneSql(OUTBOX_TOMBSTONE, OUTBOX_FORGET, OUTBOX_BURY)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.lost: BaseException | None = None
        # Answers this unit already holds (only inside a transaction, which
        # on SQLite holds the file's write lock, so nobody else changes them):
        # the tombstone read with the last find_event_and_flow, for the
        # tombstone() call that follows it; and the flow rows this unit read
        # or wrote itself.
        self._tomb: tuple[str, Tombstone | None] | None = None
        self._flows: dict[str, tuple[str, int, str] | None] = {}
        # In a batch (inside step()), the deliveries of appended events are
        # written for all of them at once: from this position on (every
        # event at or after it was appended by this unit), before anything
        # reads or changes deliveries, and before the commit (_before_commit).
        self._in_step = False
        self._owed_from: int | None = None

    def find_event(self, event_id: str) -> StoredEvent | None:
        row = self._conn.execute("SELECT pos, seq, body FROM outbox WHERE event_id = ?", (event_id,)).fetchone()
        return None if row is None else rows.stored_event(row)

    def find_event_and_flow(self, event_id: str, flow_id: str) -> tuple[StoredEvent | None, FlowState | None]:
        """:meth:`find_event` and :meth:`flow_state`; in a transaction one
        statement reads the event, its tombstone and the flow's row (in place
        of three), the tombstone kept for the ``tombstone(event_id)`` asked next."""
        if not self._conn.in_transaction:
            return self.find_event(event_id), self.flow_state(flow_id)
        found, tomb, flow = None, None, None
        for kind, a, b, c in self._conn.execute(FIND_EVENT_AND_FLOW, (event_id, flow_id)):
            if kind == 0:
                found = rows.stored_event((a, b, c))
            elif kind == 1:
                tomb = rows.tombstone((a, b, c))
            else:
                flow = (a, b, c)
        self._tomb = (event_id, tomb)
        self._flows[flow_id] = flow
        return found, self.flow_state(flow_id)

    def tombstone(self, event_id: str) -> Tombstone | None:
        held, self._tomb = self._tomb, None
        if held is not None and held[0] == event_id:
            return held[1]
        return super().tombstone(event_id)

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        self._tomb = None
        return super().forget_tombstones(before, now, limit)

    def flow_state(self, flow_id: str) -> FlowState | None:
        if flow_id in self._flows:
            row = self._flows[flow_id]
        else:
            row = self._conn.execute("SELECT state, seq, data FROM flow WHERE flow_id = ?", (flow_id,)).fetchone()
        return None if row is None else rows.flow_state(row)

    def _before_commit(self) -> None:
        """Write the deliveries owed by this unit's batch (see ``_owed_from``)."""
        start, self._owed_from = self._owed_from, None
        if start is not None:
            self._conn.execute(DELIVER_FROM, (start,))

    def backlog(self, cap: int) -> int:
        """Pending deliveries summed over consumers, or events before any consumer; counts stop at ``cap``."""
        self._before_commit()
        if self._conn.execute("SELECT 1 FROM consumer LIMIT 1").fetchone() is None:
            return int(self._conn.execute("SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT ?)", (cap,)).fetchone()[0])
        return int(self._conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT ?)", (cap,)
        ).fetchone()[0])

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        self._flows.pop(flow_id, None)
        self._conn.execute(UPSERT_FLOW, (flow_id, seq, state, data))
        if self._conn.in_transaction:  # a later flow_state of this unit reads it from here
            self._flows[flow_id] = (state, seq, data)

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """The event, pending for every consumer already bound."""
        cur = self._conn.execute(
            "INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (?, ?, ?, ?, ?)",
            (env.event_id, env.flow_id, env.seq, env.body, committed_at),
        )
        if self._in_step:
            if self._owed_from is None:
                self._owed_from = cur.lastrowid
            return
        self._conn.execute("INSERT INTO delivery(consumer, pos) SELECT name, ? FROM consumer", (cur.lastrowid,))

    @contextmanager
    def step(self) -> Iterator[None]:
        """One advance of a batch under a savepoint: if it fails, none of its
        writes stay.  If the engine dropped the whole transaction instead,
        :attr:`lost` is set and the batch must not go on."""
        conn = self._conn
        self._tomb = None
        if not conn.in_transaction:
            # A SAVEPOINT outside a transaction would silently start one that
            # RELEASE then commits on its own: never let the batch split.
            self.lost = StorageError("the batch's transaction is gone")
            raise self.lost
        conn.execute("SAVEPOINT advance")
        self._in_step = True
        try:
            yield
        except BaseException as exc:
            self._tomb, self._flows = None, {}  # what the step wrote may be undone
            self._in_step = False
            if conn.in_transaction:
                conn.execute("ROLLBACK TO advance")
                conn.execute("RELEASE advance")
                raise
            # SQLite already rolled the whole transaction back (e.g. disk full).
            self.lost = exc
            if isinstance(exc, sqlite3.Error):
                translated = storage_error(exc, "advance in a batch")
                if translated is not exc:
                    raise translated from exc
            raise
        self._in_step = False
        conn.execute("RELEASE advance")

    def bound_uid(self, name: str) -> str | None:
        row = self._conn.execute("SELECT uid FROM consumer WHERE name = ?", (name,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def next_due(self, consumer: str, horizon: float, limit: int) -> list[tuple[int, str]]:
        """Positions and bodies of the oldest pending deliveries due at ``horizon``."""
        self._before_commit()
        return [(int(r[0]), str(r[1])) for r in self._conn.execute(NEXT_DUE, (consumer, horizon, limit))]

    def next_due_at(self, consumer: str) -> float | None:
        self._before_commit()
        due = self._conn.execute(NEXT_DUE_AT, (consumer,)).fetchone()[0]
        return None if due is None else float(due)

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        self._before_commit()
        for chunk, sql in in_chunks(CLAIM, positions):
            self._conn.execute(sql, (until, owner, now, consumer, *chunk))

    def pending_failures(self, consumer: str, pos: int) -> int | None:
        """Consecutive failures of a delivery that is still pending, else None."""
        self._before_commit()
        row = self._conn.execute(
            "SELECT failures FROM delivery WHERE consumer = ? AND pos = ? AND state = ?",
            (consumer, pos, PENDING),
        ).fetchone()
        return None if row is None else int(row[0])

    def set_retry(self, consumer: str, pos: int, retry: Retry, now: float) -> None:
        self._before_commit()
        self._conn.execute(
            "UPDATE delivery SET attempts = attempts + 1, failures = ?, due_at = ?, lease_owner = NULL, "
            "last_error = ?, updated_at = ? WHERE consumer = ? AND pos = ?",
            (retry.failures, retry.due_at, retry.error, now, consumer, pos),
        )

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` become accepted, ``conflicts`` set aside."""
        self._before_commit()
        for sql, answers in ((MARK_DELIVERED, delivered), (MARK_CONFLICT, conflicts)):
            if len(answers) == 1:
                [(pos, status)] = answers
                self._conn.execute(sql, (status, now, consumer, pos))
            elif answers:
                for status, positions in by_status(answers):
                    for chunk, sql_in in in_chunks(sql, positions):
                        self._conn.execute(sql_in, (status, now, consumer, *chunk))

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        self._before_commit()
        row = self._conn.execute(
            "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos "
            "WHERE o.event_id = ? AND d.consumer = ?",
            (event_id, consumer),
        ).fetchone()
        return None if row is None else (int(row[0]), DeliveryState(row[1]))

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        """An operator's decision: the delivery goes to ``state``, due at once, unclaimed."""
        self._before_commit()
        self._conn.execute(
            "UPDATE delivery SET state = ?, due_at = 0, failures = 0, lease_owner = NULL, updated_at = ? "
            "WHERE consumer = ? AND pos = ?",
            (state.value, now, consumer, pos),
        )

    def record_action(self, action: OperatorAction) -> None:
        self._conn.execute(
            "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) VALUES (?, ?, ?, ?, ?, ?)",
            (action.at, action.consumer, action.event_id, action.action, action.actor, action.reason),
        )

    def protocol_name(self) -> str | None:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall()).get("protocol")

    def flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT flow_id FROM flow ORDER BY flow_id")]

    def outbox(self, flow_id: str | None = None, consumer: str | None = None) -> list[OutboxEntry]:
        """Outbox entries with their delivery state; call inside a read transaction."""
        self._before_commit()
        where, params = ("WHERE o.flow_id = ?", (flow_id,)) if flow_id is not None else ("", ())
        events = self._conn.execute(
            f"SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o {where} ORDER BY o.pos", params
        ).fetchall()
        deliveries = self._conn.execute(f"{DELIVERIES}{where} ORDER BY d.pos, d.consumer", params)
        return rows.outbox_entries(events, deliveries, consumer)

    def outbox_counts(self, now: float) -> OutboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        self._before_commit()
        groups = rows.delivery_counts(self._conn.execute(DELIVERY_COUNTS, (now,)))
        return OutboxCounts(
            int(self._conn.execute("SELECT count(*) FROM outbox").fetchone()[0]),
            int(self._conn.execute("SELECT count(*) FROM flow").fetchone()[0]),
            tuple(r[0] for r in self._conn.execute("SELECT name FROM consumer ORDER BY name")),
            groups,
        )

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE event_id = ?", (event_id,)) if event_id is not None else ("", ())
        return [
            rows.delivery_action(r)
            for r in self._conn.execute(
                f"SELECT at, consumer, event_id, action, actor, reason FROM operator_action {where} ORDER BY id",
                params,
            )
        ]

    def has_consumers(self) -> bool:
        return self._conn.execute("SELECT 1 FROM consumer LIMIT 1").fetchone() is not None

    def is_registered(self, name: str) -> bool:
        return self._conn.execute("SELECT 1 FROM consumer WHERE name = ?", (name,)).fetchone() is not None

    def register_consumer(self, name: str, now: float, from_now: bool) -> None:
        """A name with no file yet: from now, after the last committed event; else from the first."""
        self._before_commit()
        self._conn.execute(
            "INSERT INTO consumer(name, uid, registered_at, from_pos) "
            "SELECT ?, NULL, ?, CASE WHEN ? THEN (SELECT coalesce(max(pos), 0) FROM outbox) END",
            (name, now, from_now),
        )
        if not from_now:
            self._conn.execute("INSERT INTO delivery(consumer, pos) SELECT ?, pos FROM outbox", (name,))

    def bind_consumer(self, name: str, uid: str) -> None:
        self._conn.execute("UPDATE consumer SET uid = ? WHERE name = ? AND uid IS NULL", (uid, name))

    def remove_consumer(self, name: str) -> None:
        self._before_commit()
        self._conn.execute("DELETE FROM delivery WHERE consumer = ?", (name,))
        self._conn.execute("DELETE FROM consumer WHERE name = ?", (name,))

    def record_registry_action(self, action: OperatorAction) -> None:
        self._conn.execute(
            "INSERT INTO registry_action(at, consumer, action, actor, reason) VALUES (?, ?, ?, ?, ?)",
            (action.at, action.consumer, action.action, action.actor, action.reason),
        )

    def consumers(self) -> list[ConsumerEntry]:
        self._before_commit()
        return [rows.consumer_entry(r) for r in self._conn.execute(CONSUMERS)]

    def registry_actions(self, consumer: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE consumer = ?", (consumer,)) if consumer is not None else ("", ())
        return [
            rows.registry_action(r)
            for r in self._conn.execute(
                f"SELECT at, consumer, action, actor, reason FROM registry_action {where} ORDER BY id", params
            )
        ]

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        self._before_commit()
        conn = self._conn
        self._tomb = None
        names = [r[0] for r in conn.execute("SELECT name FROM consumer")]
        # No consumer yet: every event is still owed to the first one.
        rows = conn.execute(OUTBOX_PRUNABLE, (horizon, *WAITING, limit)).fetchall() if names else []
        step = PruneStep(0)
        if rows:
            self._bury(rows, now)
            deliveries = conn.executemany(
                "DELETE FROM delivery WHERE consumer = ? AND pos = ?", [(n, r[0]) for r in rows for n in names]
            ).rowcount
            conn.executemany("DELETE FROM outbox WHERE pos = ?", [(r[0],) for r in rows])
            step = PruneStep(len(rows), deliveries=deliveries)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._conn.execute(
            "INSERT INTO prune_action(at, horizon, events, deliveries) VALUES (?, ?, ?, ?)",
            (now, horizon, step.events, step.deliveries),
        )


class SqliteOutboxStore(SqliteStore[SqliteOutbox], BindingMemo):
    """A producer file on local disk: one connection, owned by the opening process.

    Creates the file if absent (recording ``protocol``), upgrades an older
    one in place, and refuses a file of another kind or protocol before
    writing a byte.  ``readonly`` opens it ``mode=ro`` and never writes.
    """

    def __init__(
        self, path: PathLike, protocol: str | None, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        readonly: bool = False,
    ) -> None:
        def on_create(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', ?)", (protocol,))

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol)

        super().__init__(Database(
            path, PRODUCER, busy_timeout=busy_timeout, on_create=on_create, check_meta=check_meta,
            readonly=readonly,
        ), SqliteOutbox, SqliteOutbox._before_commit)

