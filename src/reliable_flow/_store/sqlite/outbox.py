"""The producer file on SQLite: advance, a batch's deliveries, claims, marks and pruning.

:class:`SqliteOutboxStore` owns the connection; :class:`SqliteOutbox` is one
view of it, a unit of work inside :meth:`SqliteOutboxStore.write` or a
consistent snapshot inside :meth:`SqliteOutboxStore.read`.  Status values
in the SQL come from the enums; partial-index predicates keep their literal
(SQLite only uses a partial index when the query repeats its predicate
text), and a test pins those literals to the enums.  The statement texts
live in :mod:`.outbox_sql`; the methods that are the same on every engine
in :mod:`reliable_flow._store.repository.outbox`.

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
from typing import ClassVar

from ..._envelope import Envelope
from ...errors import StorageError
from .. import rows
from ..binding import BindingMemo
from ..records import FlowState, Keep, PruneStep, StoredEvent
from ..repository.outbox import OutboxRepository
from ..shared import identity_problem
from .base import SqliteDialect, SqliteStore
from .connection import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .errors import storage_error
from .outbox_sql import (
    APPEND,
    BACKLOG,
    BACKLOG_BEFORE_CONSUMERS,
    CLAIM,
    DELIVER,
    DELIVER_FROM,
    FIND_EVENT,
    FIND_EVENT_AND_FLOW,
    OUTBOX_PRUNABLE,
    UPSERT_FLOW,
    WAITING,
    SqliteOutboxSql,
    by_status,
    in_chunks,
)
from .schema import PRODUCER
from .watch import SqliteSignal

__all__ = ["SqliteOutbox", "SqliteOutboxStore"]

# The statements of an advance, which neither read nor change deliveries nor
# a tombstone: in a batch they leave its owed deliveries owed.  Every other
# statement first writes them (see Statements).
_ADVANCE = frozenset({
    FIND_EVENT, FIND_EVENT_AND_FLOW, SqliteOutboxSql.FLOW, UPSERT_FLOW, APPEND, SqliteOutboxSql.TOMBSTONE,
    "SAVEPOINT advance", "RELEASE advance", "ROLLBACK TO advance",
})


class SqliteOutbox(SqliteDialect, OutboxRepository):
    """The producer file's tables, seen through one connection: advance and
    a batch's deliveries, claims, marks and pruning here; the rest is
    :class:`~reliable_flow._store.repository.outbox.OutboxRepository`'s."""

    _SQL: ClassVar[type[SqliteOutboxSql]] = SqliteOutboxSql

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn, _ADVANCE.__contains__)
        self.lost: BaseException | None = None
        # The flow rows this unit read or wrote itself (only inside a
        # transaction, which on SQLite holds the file's write lock, so nobody
        # else changes them).
        self._flows: dict[str, tuple[str, int, str] | None] = {}
        # In a batch (inside step()), the deliveries of appended events are
        # written for all of them at once: from this position on (every
        # event at or after it was appended by this unit), before any other
        # statement than an advance's runs, and before the commit (_settle).
        self._in_step = False
        self._owed_from: int | None = None

    def _settle(self) -> None:
        """Before a statement other than an advance's, and before the commit:
        write the deliveries owed by this unit's batch (see ``_owed_from``)
        and forget the tombstone read ahead."""
        self._looked_up = None
        start, self._owed_from = self._owed_from, None
        if start is not None:
            self._conn.conn.execute(DELIVER_FROM, (start,))

    def find_event(self, event_id: str) -> StoredEvent | None:
        row = self._one(FIND_EVENT, (event_id,))
        return None if row is None else rows.stored_event(row)

    def find_event_and_flow(self, event_id: str, flow_id: str) -> tuple[StoredEvent | None, FlowState | None]:
        """:meth:`find_event` and :meth:`flow_state`; in a transaction one
        statement reads the event, its tombstone and the flow's row (in place
        of three), the tombstone kept for the ``tombstone(event_id)`` asked next."""
        if not self._conn.in_transaction:
            return self.find_event(event_id), self.flow_state(flow_id)
        found, tomb, flow = None, None, None
        for kind, a, b, c in self._rows(FIND_EVENT_AND_FLOW, (event_id, flow_id)):
            if kind == 0:
                found = rows.stored_event((a, b, c))
            elif kind == 1:
                tomb = rows.tombstone((a, b, c))
            else:
                flow = (a, b, c)
        self._looked_up = (event_id, tomb)
        self._flows[flow_id] = flow
        return found, self.flow_state(flow_id)

    def flow_state(self, flow_id: str) -> FlowState | None:
        row = self._flows[flow_id] if flow_id in self._flows else self._one(self._SQL.FLOW, (flow_id,))
        return None if row is None else rows.flow_state(row)

    def backlog(self, cap: int) -> int:
        """Pending deliveries summed over consumers, or events before any consumer; counts stop at ``cap``."""
        if self._one(self._SQL.ANY_CONSUMER) is None:
            return int(self._conn.execute(BACKLOG_BEFORE_CONSUMERS, (cap,)).fetchone()[0])
        return int(self._conn.execute(BACKLOG, (cap,)).fetchone()[0])

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        self._flows.pop(flow_id, None)
        self._conn.execute(UPSERT_FLOW, (flow_id, seq, state, data))
        if self._conn.in_transaction:  # a later flow_state of this unit reads it from here
            self._flows[flow_id] = (state, seq, data)

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """The event, pending for every consumer already bound."""
        cur = self._conn.execute(APPEND, (env.event_id, env.flow_id, env.seq, env.body, committed_at))
        if self._in_step:
            if self._owed_from is None:
                self._owed_from = cur.lastrowid
            return
        self._conn.execute(DELIVER, (cur.lastrowid,))

    @contextmanager
    def step(self) -> Iterator[None]:
        """One advance of a batch under a savepoint: if it fails, none of its
        writes stay.  If the engine dropped the whole transaction instead,
        :attr:`lost` is set and the batch must not go on."""
        conn = self._conn
        self._looked_up = None
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
            self._looked_up, self._flows = None, {}  # what the step wrote may be undone
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

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        for chunk, sql in in_chunks(CLAIM, positions):
            self._conn.execute(sql, (until, owner, now, consumer, *chunk))

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` become accepted, ``conflicts`` set aside."""
        for sql, answers in ((self._SQL.MARK_DELIVERED, delivered), (self._SQL.MARK_CONFLICT, conflicts)):
            if len(answers) == 1:
                [(pos, status)] = answers
                self._conn.execute(sql, (status, now, consumer, pos))
            elif answers:
                for status, positions in by_status(answers):
                    for chunk, sql_in in in_chunks(sql, positions):
                        self._conn.execute(sql_in, (status, now, consumer, *chunk))

    def prunable(self, horizon: float, limit: int) -> PruneStep:
        """What a prune to ``horizon`` would remove now (events, counted up to ``limit``), read only;
        a topic's longer retention is not counted (the prune keeps those events)."""
        if self._one(self._SQL.ANY_CONSUMER) is None:
            return PruneStep(0)
        row = self._one(f"SELECT count(*) FROM ({OUTBOX_PRUNABLE})", (horizon, 0, *WAITING, limit))
        return PruneStep(0 if row is None else int(row[0]))

    def prune_step(self, horizon: float, now: float, limit: int, keep: Keep | None = None,
                   after: int = 0) -> PruneStep:
        names = [r[0] for r in self._rows("SELECT name FROM consumer")]
        # No consumer yet: every event is still owed to the first one.
        found = self._rows(OUTBOX_PRUNABLE, (horizon, after, *WAITING, limit)) if names else []
        looked = (len(found), int(found[-1][0]) if found else after)
        if keep is not None:
            found = [r for r in found if not keep(int(r[0]), str(r[4]))]
        step = PruneStep(0, looked=looked[0], last_pos=looked[1])
        if found:
            self._bury(found, now)
            deliveries = self._many(
                "DELETE FROM delivery WHERE consumer = ? AND pos = ?", [(n, r[0]) for r in found for n in names]
            )
            self._many("DELETE FROM outbox WHERE pos = ?", [(r[0],) for r in found])
            step = PruneStep(len(found), deliveries=deliveries, looked=looked[0], last_pos=looked[1])
        self._record(now, horizon, step)  # also a pass that found nothing
        return step


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
        ), SqliteOutbox, SqliteOutbox._settle)

    def watch(self) -> SqliteSignal:
        """A signal for ``wait``: the file's ``data_version``, on a connection of its own."""
        return SqliteSignal(self.location)

