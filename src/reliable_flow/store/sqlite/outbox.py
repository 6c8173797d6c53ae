"""The producer file on SQLite: every SQL statement the producer side runs.

:class:`SqliteOutboxStore` owns the connection; :class:`SqliteOutbox` is one
view of it, a unit of work inside :meth:`SqliteOutboxStore.write` or a
consistent snapshot inside :meth:`SqliteOutboxStore.read`.  Status values
in the SQL come from the enums; partial-index predicates keep their literal
(SQLite only uses a partial index when the query repeats its predicate
text), and a test pins those literals to the enums.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ...delivery import Retry
from ...envelope import Envelope
from ...errors import StorageError
from ...statuses import DeliveryRecord, DeliveryState, OperatorAction, OutboxEntry
from ..records import DeliveryCounts, FlowState, OutboxCounts, StoredEvent
from ..shared import delivery_summary, identity_problem
from .base import SqliteStore
from .connection import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .errors import storage_error
from .registry import SqliteRegistry
from .retention import SqliteOutboxRetention
from .schema import PRODUCER

__all__ = ["NEXT_DUE", "NEXT_DUE_AT", "NEXT_DUE_BODY", "SqliteOutbox", "SqliteOutboxStore"]

_PENDING = DeliveryState.PENDING.value
_ACCEPTED = DeliveryState.ACCEPTED.value
_SET_ASIDE = DeliveryState.SET_ASIDE.value

# The hot queries, named so tests can check their plans use an index.
# INDEXED BY: without ANALYZE statistics SQLite prefers the primary key and
# would walk every delivery of the consumer, accepted ones included.
NEXT_DUE = (
    "SELECT pos FROM delivery INDEXED BY delivery_due WHERE consumer = ? AND state = 'pending' AND due_at <= ? "
    "ORDER BY pos LIMIT ?"
)
NEXT_DUE_BODY = (
    "SELECT d.pos, o.body FROM delivery d INDEXED BY delivery_due JOIN outbox o ON o.pos = d.pos "
    "WHERE d.consumer = ? AND d.state = 'pending' AND d.due_at <= ? ORDER BY d.pos LIMIT 1"
)
NEXT_DUE_AT = "SELECT min(due_at) FROM delivery INDEXED BY delivery_due WHERE consumer = ? AND state = 'pending'"
_UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)
_MARK_DELIVERED = (
    f"UPDATE delivery SET state = '{_ACCEPTED}', last_status = ?, attempts = attempts + 1, "
    "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = ? WHERE consumer = ? AND pos = ?"
)
# A conflict never turns into "accepted", and never undoes one.
_MARK_CONFLICT = (
    f"UPDATE delivery SET state = CASE state WHEN '{_ACCEPTED}' THEN state ELSE '{_SET_ASIDE}' END, "
    "last_status = ?, attempts = attempts + 1, lease_owner = NULL, updated_at = ? "
    "WHERE consumer = ? AND pos = ?"
)
# Metrics: one pass over the deliveries, grouped.  A lease counts while its
# owner is set and its due time (the lease's end) is still ahead.
_DELIVERY_COUNTS = (
    "SELECT consumer, state, count(*), total(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), "
    "total(failures > 0), total(lease_owner IS NOT NULL AND due_at > ?), total(attempts = 0), min(updated_at) "
    "FROM delivery GROUP BY consumer, state ORDER BY consumer, state"
)
# Through the consumer table, so each (consumer, pos) is a key lookup rather
# than a scan of every delivery.
_DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o CROSS JOIN consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
)


class SqliteOutbox(SqliteRegistry, SqliteOutboxRetention):
    """The producer file's tables, seen through one connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.lost: BaseException | None = None

    # -- advance ----------------------------------------------------------------

    def find_event(self, event_id: str) -> StoredEvent | None:
        row = self._conn.execute("SELECT pos, seq, body FROM outbox WHERE event_id = ?", (event_id,)).fetchone()
        return None if row is None else StoredEvent(row[0], row[1], row[2])

    def flow_state(self, flow_id: str) -> FlowState | None:
        row = self._conn.execute("SELECT state, seq, data FROM flow WHERE flow_id = ?", (flow_id,)).fetchone()
        return None if row is None else FlowState(row[0], row[1], json.loads(row[2]))

    def backlog(self, cap: int) -> int:
        """Pending deliveries summed over consumers, or events before any consumer; counts stop at ``cap``."""
        if self._conn.execute("SELECT 1 FROM consumer LIMIT 1").fetchone() is None:
            return int(self._conn.execute("SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT ?)", (cap,)).fetchone()[0])
        return int(self._conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT ?)", (cap,)
        ).fetchone()[0])

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        self._conn.execute(_UPSERT_FLOW, (flow_id, seq, state, data))

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """The event, pending for every consumer already bound."""
        cur = self._conn.execute(
            "INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (?, ?, ?, ?, ?)",
            (env.event_id, env.flow_id, env.seq, env.body, committed_at),
        )
        self._conn.execute("INSERT INTO delivery(consumer, pos) SELECT name, ? FROM consumer", (cur.lastrowid,))

    @contextmanager
    def step(self) -> Iterator[None]:
        """One advance of a batch under a savepoint: if it fails, none of its
        writes stay.  If the engine dropped the whole transaction instead,
        :attr:`lost` is set and the batch must not go on."""
        conn = self._conn
        if not conn.in_transaction:
            # A SAVEPOINT outside a transaction would silently start one that
            # RELEASE then commits on its own: never let the batch split.
            self.lost = StorageError("the batch's transaction is gone")
            raise self.lost
        conn.execute("SAVEPOINT advance")
        try:
            yield
        except BaseException as exc:
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
        conn.execute("RELEASE advance")

    # -- consumers and deliveries ---------------------------------------------------

    def bound_uid(self, name: str) -> str | None:
        row = self._conn.execute("SELECT uid FROM consumer WHERE name = ?", (name,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def add_consumer(self, name: str, uid: str) -> None:
        """Bind a consumer name to a file; every event already committed is pending for it."""
        self._conn.execute("INSERT INTO consumer(name, uid) VALUES (?, ?)", (name, uid))
        self._conn.execute("INSERT INTO delivery(consumer, pos) SELECT ?, pos FROM outbox", (name,))

    def next_due(self, consumer: str, horizon: float, limit: int) -> list[int]:
        """Positions of the oldest pending deliveries due at ``horizon``."""
        return [int(r[0]) for r in self._conn.execute(NEXT_DUE, (consumer, horizon, limit))]

    def next_due_body(self, consumer: str, horizon: float) -> tuple[int, str] | None:
        row = self._conn.execute(NEXT_DUE_BODY, (consumer, horizon)).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def next_due_at(self, consumer: str) -> float | None:
        due = self._conn.execute(NEXT_DUE_AT, (consumer,)).fetchone()[0]
        return None if due is None else float(due)

    def body_at(self, pos: int) -> str | None:
        row = self._conn.execute("SELECT body FROM outbox WHERE pos = ?", (pos,)).fetchone()
        return None if row is None else str(row[0])

    def bodies(self, positions: Sequence[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for start in range(0, len(positions), 500):  # old SQLite allows 999 variables per statement
            chunk = list(positions[start:start + 500])
            found.update(self._conn.execute(
                f"SELECT pos, body FROM outbox WHERE pos IN ({','.join('?' * len(chunk))})", chunk
            ))
        return found

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        self._conn.executemany(
            "UPDATE delivery SET due_at = ?, lease_owner = ?, updated_at = ? WHERE consumer = ? AND pos = ?",
            [(until, owner, now, consumer, pos) for pos in positions],
        )

    def pending_failures(self, consumer: str, pos: int) -> int | None:
        """Consecutive failures of a delivery that is still pending, else None."""
        row = self._conn.execute(
            "SELECT failures FROM delivery WHERE consumer = ? AND pos = ? AND state = ?",
            (consumer, pos, _PENDING),
        ).fetchone()
        return None if row is None else int(row[0])

    def set_retry(self, consumer: str, pos: int, retry: Retry, now: float) -> None:
        self._conn.execute(
            "UPDATE delivery SET attempts = attempts + 1, failures = ?, due_at = ?, lease_owner = NULL, "
            "last_error = ?, updated_at = ? WHERE consumer = ? AND pos = ?",
            (retry.failures, retry.due_at, retry.error, now, consumer, pos),
        )

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` become accepted, ``conflicts`` set aside."""
        if delivered:
            self._conn.executemany(_MARK_DELIVERED, [(status, now, consumer, pos) for pos, status in delivered])
        if conflicts:
            self._conn.executemany(_MARK_CONFLICT, [(status, now, consumer, pos) for pos, status in conflicts])

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        row = self._conn.execute(
            "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos "
            "WHERE o.event_id = ? AND d.consumer = ?",
            (event_id, consumer),
        ).fetchone()
        return None if row is None else (int(row[0]), DeliveryState(row[1]))

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        """An operator's decision: the delivery goes to ``state``, due at once, unclaimed."""
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

    # -- reads ----------------------------------------------------------------------

    def protocol_name(self) -> str | None:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall()).get("protocol")

    def flow(self, flow_id: str) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT state, seq, data FROM flow WHERE flow_id = ?", (flow_id,)).fetchone()
        if row is None:
            return None
        return {"state": row[0], "seq": row[1], **json.loads(row[2])}

    def flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT flow_id FROM flow ORDER BY flow_id")]

    def event_body(self, event_id: str) -> str | None:
        row = self._conn.execute("SELECT body FROM outbox WHERE event_id = ?", (event_id,)).fetchone()
        return None if row is None else str(row[0])

    def outbox(self, flow_id: str | None = None, consumer: str | None = None) -> list[OutboxEntry]:
        """Outbox entries with their delivery state; call inside a read transaction."""
        where, params = ("WHERE o.flow_id = ?", (flow_id,)) if flow_id is not None else ("", ())
        events = self._conn.execute(
            f"SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o {where} ORDER BY o.pos", params
        ).fetchall()
        per_event: dict[int, dict[str, DeliveryRecord]] = {pos: {} for pos, *_ in events}
        for pos, name, state, last_status, attempts, last_error, due_at, owner in self._conn.execute(
            f"{_DELIVERIES}{where} ORDER BY d.pos, d.consumer", params
        ):
            per_event[pos][name] = DeliveryRecord(
                DeliveryState(state), last_status, attempts, last_error, due_at, owner
            )
        out = []
        for pos, event_id, fid, seq in events:
            deliveries = per_event[pos]
            if consumer is None:
                chosen = deliveries
            else:
                chosen = {consumer: deliveries[consumer]} if consumer in deliveries else {}
            state = delivery_summary(chosen)
            last = [d.last_status for d in chosen.values() if d.last_status is not None]
            out.append(OutboxEntry(
                event_id, fid, seq, state == DeliveryState.ACCEPTED, state, last[-1] if last else None, deliveries,
            ))
        return out

    def outbox_counts(self, now: float) -> OutboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        groups = tuple(
            DeliveryCounts(str(c), str(st), int(n), int(retries), int(failing), int(leased), int(untried),
                           None if touch is None else float(touch))
            for c, st, n, retries, failing, leased, untried, touch in self._conn.execute(_DELIVERY_COUNTS, (now,))
        )
        return OutboxCounts(
            int(self._conn.execute("SELECT count(*) FROM outbox").fetchone()[0]),
            int(self._conn.execute("SELECT count(*) FROM flow").fetchone()[0]),
            tuple(r[0] for r in self._conn.execute("SELECT name FROM consumer ORDER BY name")),
            groups,
        )

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE event_id = ?", (event_id,)) if event_id is not None else ("", ())
        return [
            OperatorAction(*r)
            for r in self._conn.execute(
                f"SELECT at, consumer, event_id, action, actor, reason FROM operator_action {where} ORDER BY id",
                params,
            )
        ]


class SqliteOutboxStore(SqliteStore[SqliteOutbox]):
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
        ), SqliteOutbox)
        self._bound: set[tuple[str, str]] = set()

    def known_binding(self, name: str, uid: str) -> bool:
        return (name, uid) in self._bound

    def remember_binding(self, name: str, uid: str) -> None:
        self._bound.add((name, uid))

    def forget_binding(self, name: str) -> None:
        self._bound = {(n, u) for n, u in self._bound if n != name}
