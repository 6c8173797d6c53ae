"""The consumer file on SQLite: receive and apply with what a unit reads ahead, and pruning.

:class:`SqliteInboxStore` owns the connection; :class:`SqliteInbox` is one
view of it, a unit of work inside :meth:`SqliteInboxStore.write` or a
consistent snapshot inside :meth:`SqliteInboxStore.read`.  The statement texts
live in :mod:`.inbox_sql`; the methods that are the same on every engine in
:mod:`reliable_flow._store.repository.inbox`.

Besides receive and apply: the inbox as an operator sees and repairs it
(rows in full, skips and replacements, and their record), the effect
outbox and the application's own SQL run inside an apply, and retention
(tombstones, bounded pruning; see :mod:`.outbox` for how age is read).
"""

from __future__ import annotations

import sqlite3
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from ..._envelope import Envelope
from .. import rows
from ..records import FlowState, NextRow, PruneStep
from ..repository.inbox import InboxRepository
from ..shared import identity_problem
from .base import SqliteDialect, SqliteStore
from .connection import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .inbox_sql import (
    EFFECTS_PRUNABLE,
    FLOW_AHEAD,
    FORGET_HISTORY,
    INBOX_PRUNABLE,
    INSERT_NEW,
    INSERT_NEW_RETURNING,
    NEXT_ROW,
    NEXT_ROW_AHEAD,
    RETURNING,
    SqliteInboxSql,
    insert_chunks,
)
from .schema import CONSUMER

__all__ = ["SqliteInbox", "SqliteInboxStore"]

_REFUSED_ACTIONS = frozenset({
    sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT, sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH,
})

def _allow_all(*_: object) -> int:
    return sqlite3.SQLITE_OK


# The writes of an apply and of the effect outbox: none adds, frees or
# removes an inbox row (its slot), nor writes a projection behind
# put_projection's back, so what a unit read ahead stays true.
_T = SqliteInboxSql
_APPLY_WRITES = frozenset({
    _T.BLOCK, _T.UPSERT_PROJECTION, _T.RECORD_EFFECT, _T.MARK_APPLIED, _T.ADD_EFFECT, _T.ADD_TRANSITION,
    _T.RECORD_EFFECT_ACTION, _T.SET_APP_VERSION, "SAVEPOINT step", "RELEASE step",
})


def _keeps(sql: str) -> bool:
    """Whether ``sql`` leaves a unit's read-ahead true: a read, or one of an apply's writes."""
    return sql.startswith("SELECT") or sql in _APPLY_WRITES


class SqliteInbox(SqliteDialect, InboxRepository):
    """The consumer file's tables, seen through one connection: receive and
    apply with what a unit reads ahead, the effect outbox's claims, the
    application's SQL and pruning here; the rest is
    :class:`~reliable_flow._store.repository.inbox.InboxRepository`'s."""

    engine = "sqlite"
    _SQL: ClassVar[type[SqliteInboxSql]] = SqliteInboxSql

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn, _keeps)
        # (flow, seq, rows, complete): what next_row(flow, seq) will answer,
        # read ahead by an earlier next_row of this unit (see NEXT_ROW): the
        # first of ``rows``, or, once they are used up, None if the read
        # returned every row of the flow from there (``complete``).
        self._ahead: tuple[str, int, list[NextRow], bool] | None = None
        # Projection rows this unit knows as they are now, by flow (None: no
        # row): those it wrote, and the one read with a stored event.  Only
        # inside a transaction, which on SQLite holds the file's write lock.
        self._known: dict[str, tuple[str, int, str] | None] = {}

    def _settle(self) -> None:
        """Before a statement that may add, free or remove a flow's rows, or
        write a projection (see :func:`_keeps`): forget what was read ahead."""
        self._ahead, self._known = None, {}

    def insert_new(self, env: Envelope, received_at: float | None = None) -> bool:
        """Store the event unless its id or its (flow, seq) is taken or pruned; True if stored.
        Where SQLite has RETURNING, the same statement reads the flow's
        projection, for the apply on arrival that may follow."""
        params = (env.event_id, env.flow_id, env.seq, env.body, received_at)
        if not RETURNING or not self._conn.in_transaction:
            return bool(self._run(INSERT_NEW, params))
        row = self._one(INSERT_NEW_RETURNING, params)
        if row is None:
            return False
        self._known[env.flow_id] = None if row[0] is None else (row[0], row[1], row[2])
        return True

    def insert_new_many(self, envs: Sequence[Envelope], received_at: float | None = None) -> list[bool]:
        """:meth:`insert_new` of each event, as if one after the other, in a
        few statements; only for events with distinct ids and distinct (flow,
        seq), so that none of them decides another's fate."""
        if not RETURNING:
            return [self.insert_new(env, received_at) for env in envs]
        stored: set[str] = set()
        for chunk, sql in insert_chunks(envs):
            params: list[object] = [received_at]
            for env in chunk:
                params += (env.event_id, env.flow_id, env.seq, env.body)
            stored.update(r[0] for r in self._rows(sql, params))
        return [env.event_id in stored for env in envs]

    def last_seq(self, flow_id: str) -> int:
        if flow_id in self._known:
            known = self._known[flow_id]
            return 0 if known is None else int(known[1])
        row = self._one(self._SQL.LAST_SEQ, (flow_id,))
        return int(row[0]) if row else 0

    def flow_state(self, flow_id: str) -> FlowState | None:
        known = self._known[flow_id] if flow_id in self._known else self._one(self._SQL.FLOW, (flow_id,))
        return None if known is None else rows.flow_state(known)

    def flow_and_next_row(self, flow_id: str) -> tuple[FlowState | None, NextRow | None]:
        """In a transaction, one statement reads the flow's projection and its
        next rows (the later ones kept for the ``next_row`` calls that follow)."""
        if not self._conn.in_transaction:
            known_state = self.flow_state(flow_id)
            return known_state, self.next_row(flow_id, (0 if known_state is None else known_state.seq) + 1)
        known: tuple[str, int, str] | None = None
        rows_ahead: list[NextRow] = []
        for kind, a, b, c in self._rows(FLOW_AHEAD, (flow_id,)):
            if kind == 0:
                known = (a, b, c)
            else:
                rows_ahead.append((a, b, c))
        self._known[flow_id] = known
        seq = (0 if known is None else int(known[1])) + 1
        self._ahead = (flow_id, seq, rows_ahead, len(rows_ahead) < NEXT_ROW_AHEAD)
        return self.flow_state(flow_id), self.next_row(flow_id, seq)

    def next_row(self, flow_id: str, seq: int) -> NextRow | None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == flow_id and ahead[1] == seq and (ahead[2] or ahead[3]):
            found, complete = ahead[2], ahead[3]
        else:
            found = [(int(r[0]), str(r[1]), str(r[2])) for r in self._rows(NEXT_ROW, (flow_id, seq))]
            complete = len(found) < NEXT_ROW_AHEAD
        if not found:
            return None
        first = found[0]
        # Applying `first` (writes to its own row and the projection only)
        # leaves the rows after it as they are: the next question's answer.
        self._ahead = (flow_id, first[0] + 1, found[1:], complete)
        return first

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        self._known.pop(flow_id, None)
        self._send(self._SQL.UPSERT_PROJECTION, (flow_id, state, seq, data, view))
        if self._conn.in_transaction:
            self._known[flow_id] = (state, seq, data)

    def user_execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The statement runs under an authorizer that refuses transaction
        control (and ATTACH / DETACH): whatever its text looks like, it cannot
        commit or roll back part of the library's transaction."""
        denied: list[int] = []

        def authorize(action: int, *_: object) -> int:
            if action in _REFUSED_ACTIONS:
                denied.append(action)
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        self._conn.conn.set_authorizer(authorize)
        try:
            return [tuple(r) for r in self._conn.execute(sql, tuple(params))]
        except sqlite3.DatabaseError:
            if denied:
                raise ValueError(
                    f"sql must not use transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, "
                    f"ATTACH, DETACH): the library commits or rolls back the whole apply; got {sql!r}"
                ) from None
            raise
        finally:
            # Python 3.10 cannot remove an authorizer; a permissive one is the same.
            self._conn.conn.set_authorizer(None if sys.version_info >= (3, 11) else _allow_all)

    @contextmanager
    def step(self) -> Iterator[None]:
        conn = self._conn
        conn.execute("SAVEPOINT step")
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO step")  # also forgets what was read ahead (_settle)
                conn.execute("RELEASE step")
            raise
        conn.execute("RELEASE step")

    def prunable(self, horizon: float, limit: int) -> PruneStep:
        """What a prune to ``horizon`` would remove now (inbox rows and
        finished effects, each counted up to ``limit``), read only."""
        rows = self._one(f"SELECT count(*) FROM ({INBOX_PRUNABLE})", (horizon, limit))
        effects = self._one(f"SELECT count(*) FROM ({EFFECTS_PRUNABLE})", (horizon, limit))
        return PruneStep(0 if rows is None else int(rows[0]), effect_rows=0 if effects is None else int(effects[0]))

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        found = self._rows(INBOX_PRUNABLE, (horizon, limit))
        records = 0
        if found:
            self._bury(found, now)
            records = self._many("DELETE FROM effect WHERE event_id = ?", [(r[1],) for r in found])
            self._many("DELETE FROM inbox WHERE rowid = ?", [(r[0],) for r in found])
        finished = [(r[0],) for r in self._rows(EFFECTS_PRUNABLE, (horizon, limit))]
        if finished:  # an effect's history goes with it
            self._many(FORGET_HISTORY, finished)
        effect_rows = self._many("DELETE FROM effect_outbox WHERE id = ?", finished) if finished else 0
        step = PruneStep(len(found), effect_records=records, effect_rows=effect_rows)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step


class SqliteInboxStore(SqliteStore[SqliteInbox]):
    """A consumer file on local disk: one connection, owned by the opening process.

    A new file records ``protocol``, ``name`` and a fresh ``uid``; an
    existing one must match ``protocol`` and, when given, ``name``.
    ``readonly`` opens it ``mode=ro`` and never writes.
    """

    def __init__(
        self, path: PathLike, protocol: str | None, *, name: str | None = None, default_name: str = "default",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT, readonly: bool = False,
    ) -> None:
        def on_create(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [("protocol", protocol), ("name", name or default_name), ("uid", uuid.uuid4().hex)],
            )

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol, name)

        super().__init__(Database(
            path, CONSUMER, busy_timeout=busy_timeout, on_create=on_create, check_meta=check_meta,
            readonly=readonly,
        ), SqliteInbox)

