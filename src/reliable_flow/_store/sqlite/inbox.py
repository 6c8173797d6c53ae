"""The consumer file on SQLite: every SQL statement the consumer side runs.

:class:`SqliteInboxStore` owns the connection; :class:`SqliteInbox` is one
view of it, a unit of work inside :meth:`SqliteInboxStore.write` or a
consistent snapshot inside :meth:`SqliteInboxStore.read`.  The statement texts
live in :mod:`.inbox_sql`.

Besides receive and apply: the inbox as an operator sees and repairs it
(rows in full, skips and replacements, and their record), the effect
outbox and the application's own SQL run inside an apply, and retention
(tombstones, bounded pruning; see :mod:`.outbox` for how age is read).
"""

from __future__ import annotations

import sqlite3
import sys
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ..._envelope import Envelope
from ...records import AppliedEvent, EffectTransition, OperatorAction, ScheduledEffect
from ...statuses import BlockReason, EffectState, InboxState
from .. import rows
from ..effects import NewEffect
from ..records import FlowState, InboxCounts, NextRow, PruneStep, StoredRow
from ..rows import EFFECT_SELECT as _COLUMNS
from ..rows import effect as effect_row
from ..rows import effect_action, effect_transition
from ..shared import effect_changes, identity_problem
from .base import SqliteStore
from .connection import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .inbox_sql import (
    ACTION,
    ADD_TRANSITION,
    APPLIED,
    BLOCK,
    DUE_EFFECTS,
    EFFECT_HISTORY,
    EFFECT_STARTS,
    EFFECTS_PRUNABLE,
    FLOW_AHEAD,
    FORGET_HISTORY,
    GAPS,
    HELD_EFFECTS,
    INBOX_BURY,
    INBOX_COUNTS,
    INBOX_FORGET,
    INBOX_PRUNABLE,
    INBOX_TOMBSTONE,
    INSERT,
    INSERT_NEW,
    INSERT_NEW_RETURNING,
    NEXT_EFFECT_DUE,
    NEXT_ROW,
    NEXT_ROW_AHEAD,
    OPEN_FLOWS,
    REPLACED,
    RETURNING,
    ROW,
    SKIPPED,
    UPSERT_PROJECTION,
    insert_chunks,
)
from .schema import CONSUMER
from .tombstones import SqliteTombstones, TombstoneSql

__all__ = ["INSERT_NEW", "NEXT_ROW", "OPEN_FLOWS", "SqliteInbox", "SqliteInboxStore"]

_REFUSED_ACTIONS = frozenset({
    sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT, sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH,
})

def _allow_all(*_: object) -> int:
    return sqlite3.SQLITE_OK


class SqliteInbox(SqliteTombstones):
    """The consumer file's tables, seen through one connection: receive,
    apply, the operator's repairs, the effect outbox, tombstones and pruning."""

    engine = "sqlite"
    _TOMBSTONES = TombstoneSql(INBOX_TOMBSTONE, INBOX_FORGET, INBOX_BURY)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # (flow, seq, rows, complete): what next_row(flow, seq) will answer,
        # read ahead by an earlier next_row of this unit (see NEXT_ROW): the
        # first of ``rows``, or, once they are used up, None if the read
        # returned every row of the flow from there (``complete``).
        self._ahead: tuple[str, int, list[NextRow], bool] | None = None
        # Projection rows this unit knows as they are now, by flow (None: no
        # row): those it wrote, and the one read with a stored event.  Only
        # inside a transaction, which on SQLite holds the file's write lock.
        self._known: dict[str, tuple[str, int, str] | None] = {}

    def insert_new(self, env: Envelope, received_at: float | None = None) -> bool:
        """Store the event unless its id or its (flow, seq) is taken or pruned; True if stored.
        Where SQLite has RETURNING, the same statement reads the flow's
        projection, for the apply on arrival that may follow."""
        self._ahead = None
        params = (env.event_id, env.flow_id, env.seq, env.body, received_at)
        if not RETURNING or not self._conn.in_transaction:
            return bool(self._conn.execute(INSERT_NEW, params).rowcount)
        row = self._conn.execute(INSERT_NEW_RETURNING, params).fetchone()
        if row is None:
            return False
        self._known[env.flow_id] = None if row[0] is None else (row[0], row[1], row[2])
        return True

    def insert_new_many(self, envs: Sequence[Envelope], received_at: float | None = None) -> list[bool]:
        """:meth:`insert_new` of each event, as if one after the other, in a
        few statements; only for events with distinct ids and distinct (flow,
        seq), so that none of them decides another's fate."""
        self._ahead = None
        if not RETURNING:
            return [self.insert_new(env, received_at) for env in envs]
        stored: set[str] = set()
        for chunk, sql in insert_chunks(envs):
            params: list[object] = [received_at]
            for env in chunk:
                params += (env.event_id, env.flow_id, env.seq, env.body)
            stored.update(r[0] for r in self._conn.execute(sql, params))
        return [env.event_id in stored for env in envs]

    def insert(self, env: Envelope, received_at: float | None = None) -> None:
        self._ahead = None
        self._conn.execute(INSERT, (env.event_id, env.flow_id, env.seq, env.body, received_at))

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id holding (flow, seq), if any (a replaced row does not)."""
        row = self._conn.execute(
            "SELECT event_id FROM inbox WHERE flow_id = ? AND seq = ? AND live = 1", (flow_id, seq)
        ).fetchone()
        return None if row is None else str(row[0])

    def unapplied(self, cap: int) -> int:
        """Rows still waiting (pending or blocked), counted up to ``cap``."""
        return int(self._conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM inbox WHERE state IN ('pending','blocked') LIMIT ?)", (cap,)
        ).fetchone()[0])

    def last_seq(self, flow_id: str) -> int:
        if flow_id in self._known:
            known = self._known[flow_id]
            return 0 if known is None else int(known[1])
        row = self._conn.execute("SELECT last_seq FROM projection WHERE flow_id = ?", (flow_id,)).fetchone()
        return int(row[0]) if row else 0

    def flow_state(self, flow_id: str) -> FlowState | None:
        if flow_id in self._known:
            known = self._known[flow_id]
        else:
            known = self._conn.execute(
                "SELECT state, last_seq, data FROM projection WHERE flow_id = ?", (flow_id,)
            ).fetchone()
        return None if known is None else rows.flow_state(known)

    def flow_and_next_row(self, flow_id: str) -> tuple[FlowState | None, NextRow | None]:
        """In a transaction, one statement reads the flow's projection and its
        next rows (the later ones kept for the ``next_row`` calls that follow)."""
        if not self._conn.in_transaction:
            known_state = self.flow_state(flow_id)
            return known_state, self.next_row(flow_id, (0 if known_state is None else known_state.seq) + 1)
        known: tuple[str, int, str] | None = None
        rows_ahead: list[NextRow] = []
        for kind, a, b, c in self._conn.execute(FLOW_AHEAD, (flow_id,)):
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
            rows, complete = ahead[2], ahead[3]
        else:
            rows = self._conn.execute(NEXT_ROW, (flow_id, seq)).fetchall()
            complete = len(rows) < NEXT_ROW_AHEAD
        if not rows:
            return None
        first = rows[0]
        # Applying `first` (writes to its own row and the projection only)
        # leaves the rows after it as they are: the next question's answer.
        self._ahead = (flow_id, first[0] + 1, rows[1:], complete)
        return first

    def block(self, event_id: str, reason: BlockReason, detail: str | None = None,
              now: float | None = None) -> None:
        self._conn.execute(BLOCK, (now, reason.value, detail, event_id, reason.value, detail))

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        self._known.pop(flow_id, None)
        self._conn.execute(UPSERT_PROJECTION, (flow_id, state, seq, data, view))
        if self._conn.in_transaction:
            self._known[flow_id] = (state, seq, data)

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record, and its inbox row marked applied."""
        self._conn.execute(
            "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (?, ?, ?, ?)", (event_id, flow_id, seq, kind)
        )
        self._conn.execute(
            f"UPDATE inbox SET state = '{APPLIED}', reason = NULL, detail = NULL WHERE event_id = ?", (event_id,)
        )

    def open_flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute(OPEN_FLOWS)]

    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT state, last_seq, view FROM projection WHERE flow_id = ?", (flow_id,)
        ).fetchone()
        return None if row is None else rows.projection(row)

    def effects(self, flow_id: str) -> list[AppliedEvent]:
        return [rows.effect_record(r) for r in self._conn.execute(
            "SELECT event_id, flow_id, seq, kind FROM effect WHERE flow_id = ? ORDER BY id", (flow_id,)
        )]

    def flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")]

    def projected_flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT flow_id FROM projection ORDER BY flow_id")]

    def inbox_counts(self) -> InboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        groups = self._conn.execute(INBOX_COUNTS).fetchall()
        return rows.inbox_counts(groups, int(self._conn.execute(GAPS).fetchone()[0]))

    def inbox_rows(self, flow_id: str, from_seq: int = 1) -> list[StoredRow]:
        return [rows.stored_row(r) for r in self._conn.execute(
            ROW + "WHERE flow_id = ? AND seq >= ? ORDER BY seq, live", (flow_id, from_seq)
        )]

    def inbox_row(self, event_id: str) -> StoredRow | None:
        found = self._conn.execute(ROW + "WHERE event_id = ?", (event_id,)).fetchone()
        return None if found is None else rows.stored_row(found)

    def set_skipped(self, event_id: str) -> None:
        self._ahead = None  # it may add, free or remove a flow's rows
        self._conn.execute(f"UPDATE inbox SET state = '{SKIPPED}' WHERE event_id = ?", (event_id,))

    def set_replaced(self, event_id: str) -> None:
        """The row gives up its (flow, seq) slot: live NULL, which the CHECK ties to 'replaced'."""
        self._ahead = None  # it may add, free or remove a flow's rows
        self._conn.execute(f"UPDATE inbox SET state = '{REPLACED}', live = NULL WHERE event_id = ?", (event_id,))

    def record_inbox_action(self, action: OperatorAction) -> None:
        self._conn.execute(
            "INSERT INTO consumer_action(at, event_id, flow_id, seq, action, previous_state, actor, reason, "
            "replacement_event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (action.at, action.event_id, action.flow_id, action.seq, action.action,
             InboxState(action.previous_state).value, action.actor, action.reason, action.replacement_event_id),
        )

    def inbox_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        if event_id is None:
            return [rows.inbox_action(r) for r in self._conn.execute(ACTION + "ORDER BY id")]
        return [rows.inbox_action(r) for r in self._conn.execute(
            ACTION + "WHERE event_id = ? OR replacement_event_id = ? ORDER BY id", (event_id, event_id)
        )]

    def add_effect(self, new: NewEffect) -> ScheduledEffect | None:
        stored = self._conn.execute(
            "INSERT INTO effect_outbox(key, name, payload, event_id, flow_id, seq, meta, ordered, deadline, "
            "version, fed, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(key) DO NOTHING",
            (new.key, new.name, new.payload, new.event_id, new.flow_id, new.seq, new.meta, int(new.ordered),
             new.deadline, new.version, None if new.fed is None else int(new.fed), new.created_at,
             new.created_at),
        ).rowcount
        return None if stored else self.effect(new.key)

    def effect(self, key: str) -> ScheduledEffect | None:
        row = self._conn.execute(f"SELECT {_COLUMNS} FROM effect_outbox WHERE key = ?", (key,)).fetchone()
        return None if row is None else effect_row(row)

    def effect_list(
        self, state: EffectState | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[ScheduledEffect]:
        where, params = [], []
        if state is not None:
            where.append("state = ?")
            params.append(EffectState(state).value)
        if flow_id is not None:
            where.append("flow_id = ?")
            params.append(flow_id)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        return [effect_row(r) for r in self._conn.execute(
            f"SELECT {_COLUMNS} FROM effect_outbox {clause} ORDER BY id LIMIT ?", (*params, -1 if limit is None else limit)
        )]

    def effect_counts(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT state, count(*) FROM effect_outbox GROUP BY state ORDER BY state"))

    def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE key = ?", (key,)) if key is not None else ("", ())
        return [effect_action(r) for r in self._conn.execute(
            f"SELECT at, key, action, actor, reason FROM effect_action {where} ORDER BY id", params
        )]

    def due_effects(self, now: float, names: Collection[str], limit: int) -> list[ScheduledEffect]:
        chosen = sorted(names)
        if not chosen:
            return []
        sql = DUE_EFFECTS.format(names=",".join("?" * len(chosen)))
        return [effect_row(r) for r in self._conn.execute(sql, (now, *chosen, limit))]

    def next_effect_due_at(self, names: Collection[str]) -> float | None:
        chosen = sorted(names)
        if not chosen:
            return None
        row = self._conn.execute(NEXT_EFFECT_DUE.format(names=",".join("?" * len(chosen))), chosen).fetchone()
        return None if row is None else float(row[0])

    def update_effect(self, key: str, changes: Mapping[str, Any], now: float) -> None:
        columns, values = effect_changes(changes)
        assignments = ", ".join(f"{c} = ?" for c in columns)
        self._conn.execute(
            f"UPDATE effect_outbox SET {assignments}, updated_at = ? WHERE key = ?", (*values, now, key)
        )

    def unfed_effects(self, limit: int) -> list[ScheduledEffect]:
        return [effect_row(r) for r in self._conn.execute(
            f"SELECT {_COLUMNS} FROM effect_outbox INDEXED BY effect_unfed WHERE fed = 0 "
            "AND state = 'succeeded' ORDER BY id LIMIT ?", (limit,)
        )]

    def effect_history(self, key: str) -> list[EffectTransition]:
        return [effect_transition(r) for r in self._conn.execute(EFFECT_HISTORY, (key,))]

    def effect_starts(self, name: str, since: float) -> tuple[int, float | None]:
        count, first = self._conn.execute(EFFECT_STARTS, (name, since)).fetchone()
        return int(count), None if first is None else float(first)

    def held_effect_counts(self, names: Collection[str], now: float) -> dict[str, int]:
        chosen = sorted(names)
        if not chosen:
            return {}
        return dict(self._conn.execute(HELD_EFFECTS.format(names=",".join("?" * len(chosen))), (now, *chosen)))

    def add_transitions(self, rows: Sequence[EffectTransition]) -> None:
        self._conn.executemany(ADD_TRANSITION, [
            (t.key, t.name, t.at, t.transition.value, t.attempt, t.owner, t.detail) for t in rows
        ])

    def lock_effect_names(self, names: Collection[str]) -> None:
        """Nothing to do: a unit of work holds the file's one write lock."""

    def record_effect_action(self, action: OperatorAction) -> None:
        self._conn.execute(
            "INSERT INTO effect_action(at, key, action, actor, reason) VALUES (?, ?, ?, ?, ?)",
            (action.at, action.key, action.action, action.actor, action.reason),
        )

    def user_execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The statement runs under an authorizer that refuses transaction
        control (and ATTACH / DETACH): whatever its text looks like, it cannot
        commit or roll back part of the library's transaction."""
        self._ahead = None  # it may add, free or remove a flow's rows
        self._known = {}  # or write a projection
        denied: list[int] = []

        def authorize(action: int, *_: object) -> int:
            if action in _REFUSED_ACTIONS:
                denied.append(action)
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        self._conn.set_authorizer(authorize)
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
            self._conn.set_authorizer(None if sys.version_info >= (3, 11) else _allow_all)

    def app_version(self, name: str) -> int:
        row = self._conn.execute("SELECT version FROM app_schema WHERE name = ?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    def set_app_version(self, name: str, version: int) -> None:
        self._conn.execute(
            "INSERT INTO app_schema(name, version) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET version = excluded.version",
            (name, version),
        )

    @contextmanager
    def step(self) -> Iterator[None]:
        conn = self._conn
        conn.execute("SAVEPOINT step")
        try:
            yield
        except BaseException:
            self._ahead, self._known = None, {}  # what the step wrote may be undone
            if conn.in_transaction:
                conn.execute("ROLLBACK TO step")
                conn.execute("RELEASE step")
            raise
        conn.execute("RELEASE step")

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        self._ahead = None  # it may add, free or remove a flow's rows
        conn = self._conn
        rows = conn.execute(INBOX_PRUNABLE, (horizon, limit)).fetchall()
        records = 0
        if rows:
            self._bury(rows, now)
            records = conn.executemany("DELETE FROM effect WHERE event_id = ?", [(r[1],) for r in rows]).rowcount
            conn.executemany("DELETE FROM inbox WHERE rowid = ?", [(r[0],) for r in rows])
        finished = [(r[0],) for r in conn.execute(EFFECTS_PRUNABLE, (horizon, limit))]
        if finished:  # an effect's history goes with it
            conn.executemany(FORGET_HISTORY, finished)
        effect_rows = conn.executemany("DELETE FROM effect_outbox WHERE id = ?", finished).rowcount if finished else 0
        step = PruneStep(len(rows), effect_records=records, effect_rows=effect_rows)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._conn.execute(
            "INSERT INTO prune_action(at, horizon, events, effect_records, effect_rows) VALUES (?, ?, ?, ?, ?)",
            (now, horizon, step.events, step.effect_records, step.effect_rows),
        )


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

