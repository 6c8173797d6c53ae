"""The consumer's store on PostgreSQL: every SQL statement the consumer side runs.

:class:`PgInboxStore` owns the connection; :class:`PgInbox` is one view of
it, a unit of work inside :meth:`PgInboxStore.write` or a snapshot inside
:meth:`PgInboxStore.read`.

What a unit locks, until it ends: a new event is stored by one ``INSERT
... ON CONFLICT DO NOTHING`` (a racing twin waits on the unique key, then
stores nothing, and receive compares), a set of independent events by one
such multi-row statement (``insert_new_many``, the same conditions per
row); when it was refused, receive's slower reads lock what they read:
``inbox_row`` the event id (advisory; its statement also reads the id's
tombstone), ``holder`` the flow (advisory), ``unapplied`` the schema's room
(so two receives never both take the last place under ``max_inbox``).
``flow_state`` and ``flow_and_next_row`` (apply) lock the flow (advisory)
and then its projection row (``FOR UPDATE``), so two applies of one flow
take turns and the second sees the first's result.  Each advisory lock is a
statement of its own, sent before the read it guards (see
:meth:`~.base.PgView._lock`), in the same order as ever: event, then flow.

Round trips: units run in pipeline mode (``PgInboxStore._PIPELINED``).
Receive is BEGIN + the INSERT, then COMMIT; apply_next is BEGIN + the flow's
lock + one read of its projection and next row, then the writes + COMMIT:
the projection, effect record, inbox mark and block are only sent, and
answered with the next read or the COMMIT (a failure there fails the unit
and writes nothing).  The application's SQL (``user_execute``) waits for its
own answer and everything sent before it, so it sees the apply's writes and
its error is raised by its call.

The statement texts live in :mod:`.inbox_sql`.  Besides receive and
apply: the inbox as an operator sees and repairs it, the effect outbox and
the application's own SQL run inside an apply, and retention (see
:mod:`.outbox`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

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
from .base import PgStore
from .connection import DEFAULT_LOCK_TIMEOUT, Conn, Database, first_error
from .inbox_sql import (
    ACTION,
    ADD_TRANSITION,
    APPLIED,
    BLOCK,
    DUE_EFFECTS,
    EFFECT_HISTORY,
    EFFECT_STARTS,
    EFFECTS_PRUNABLE,
    FLOW_AND_NEXT_ROW,
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
    INSERT_NEW_MANY,
    MAX_POS,
    NEXT_EFFECT_DUE,
    NEXT_ROW,
    OPEN_FLOWS,
    REPLACED,
    ROW,
    ROW_OR_TOMBSTONE,
    SKIPPED,
    UPSERT_PROJECTION,
    Candidate,
)
from .location import Target, parse
from .placeholders import pyformat
from .schema import CONSUMER
from .tombstones import PgTombstones, TombstoneSql

__all__ = ["INSERT_NEW", "NEXT_ROW", "OPEN_FLOWS", "PgInbox", "PgInboxStore"]

# Statements that end, split or reshape the library's transaction.
_TRANSACTION_CONTROL = frozenset({
    "begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release", "prepare", "set",
    "reset", "discard", "listen", "unlisten",
})

_SKIP = re.compile(r"(?:\s+|;|--[^\n]*(?:\n|$))+")  # an empty statement before ';' is no statement

_WORD = re.compile(r"[A-Za-z_]+")

def first_keyword(text: str) -> str:
    """The statement's first word, past whitespace, comments (``--`` and
    nested ``/* */``) and empty statements (``;``: the server drops them, so
    ``; COMMIT`` is one statement, COMMIT), lower-cased; '' if there is none."""
    i = 0
    while i < len(text):
        skipped = _SKIP.match(text, i)
        if skipped and skipped.end() > i:
            i = skipped.end()
            continue
        if text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < len(text) and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            continue
        if text[i] == "(":
            i += 1
            continue
        word = _WORD.match(text, i)
        return word.group(0).lower() if word else ""
    return ""


class PgInbox(PgTombstones):
    """The consumer's tables, seen through one connection: receive, apply,
    the operator's repairs, the effect outbox, tombstones and pruning."""

    engine = "postgres"
    _TOMBSTONES = TombstoneSql(INBOX_TOMBSTONE, INBOX_FORGET, INBOX_BURY)
    def insert_new(self, env: Envelope, received_at: float | None = None) -> bool:
        """Store the event unless its id or its (flow, seq) is taken or pruned; True if stored."""
        return bool(self._run(INSERT_NEW, {
            "id": env.event_id, "flow": env.flow_id, "seq": env.seq, "body": env.body, "at": received_at,
        }))

    def insert_new_many(self, envs: Sequence[Envelope], received_at: float | None = None) -> list[bool]:
        """:meth:`insert_new` of each event, in order, by one statement (the
        caller passes distinct ids and distinct (flow, seq) only)."""
        if len(envs) < 2:
            return [self.insert_new(env, received_at) for env in envs]
        stored = {str(r[0]) for r in self._rows(INSERT_NEW_MANY, (
            received_at, [e.event_id for e in envs], [e.flow_id for e in envs], [e.seq for e in envs],
            [e.body for e in envs],
        ))}
        return [env.event_id in stored for env in envs]

    def insert(self, env: Envelope, received_at: float | None = None) -> None:
        self._run(INSERT, (env.event_id, env.flow_id, env.seq, env.body, received_at))

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id holding (flow, seq), if any (a replaced row does not)."""
        self._lock("flow", flow_id)
        row = self._one("SELECT event_id FROM inbox WHERE flow_id = %s AND seq = %s AND live = 1", (flow_id, seq))
        return None if row is None else str(row[0])

    def unapplied(self, cap: int) -> int:
        """Rows still waiting (pending or blocked), counted up to ``cap``."""
        self._lock("room")
        row = self._one(
            "SELECT count(*) FROM (SELECT 1 FROM inbox WHERE state IN ('pending','blocked') LIMIT %s) t", (cap,)
        )
        return 0 if row is None else int(row[0])

    def last_seq(self, flow_id: str) -> int:
        row = self._one("SELECT last_seq FROM projection WHERE flow_id = %s", (flow_id,))
        return int(row[0]) if row else 0

    def flow_state(self, flow_id: str) -> FlowState | None:
        self._lock("flow", flow_id)
        lock = " FOR UPDATE" if self._writing else ""
        row = self._one("SELECT state, last_seq, data FROM projection WHERE flow_id = %s" + lock, (flow_id,))
        return None if row is None else rows.flow_state(row)

    def next_row(self, flow_id: str, seq: int) -> NextRow | None:
        row = self._one(NEXT_ROW, (flow_id, seq))
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]))

    def flow_and_next_row(self, flow_id: str) -> tuple[FlowState | None, NextRow | None]:
        """In a unit: the flow's advisory lock, then one statement that locks
        and reads its projection row and reads its next row (sent together
        in a pipelined unit: one round trip)."""
        if not self._writing:
            known = self.flow_state(flow_id)
            return known, self.next_row(flow_id, (0 if known is None else known.seq) + 1)
        self._lock("flow", flow_id)
        row = self._one(FLOW_AND_NEXT_ROW, (flow_id, flow_id))
        assert row is not None  # one row always, NULLs where a part is missing
        known = None if row[1] is None else rows.flow_state(row[:3])
        return known, None if row[3] is None else (int(row[3]), str(row[4]), str(row[5]))

    def block(self, event_id: str, reason: BlockReason, detail: str | None = None,
              now: float | None = None) -> None:
        self._send(BLOCK, (now, reason.value, detail, event_id, reason.value, detail))

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        self._send(UPSERT_PROJECTION, (flow_id, state, seq, data, view))

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record, and its inbox row marked applied."""
        self._send(
            "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (%s, %s, %s, %s)", (event_id, flow_id, seq, kind)
        )
        self._send(
            f"UPDATE inbox SET state = '{APPLIED}', reason = NULL, detail = NULL WHERE event_id = %s", (event_id,)
        )

    def open_flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows(OPEN_FLOWS)]

    def meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._rows("SELECT key, value FROM meta")}

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT state, last_seq, view FROM projection WHERE flow_id = %s", (flow_id,))
        return None if row is None else rows.projection(row)

    def effects(self, flow_id: str) -> list[AppliedEvent]:
        return [rows.effect_record(r) for r in self._rows(
            "SELECT event_id, flow_id, seq, kind FROM effect WHERE flow_id = %s ORDER BY id", (flow_id,)
        )]

    def flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")]

    def projected_flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT flow_id FROM projection ORDER BY flow_id")]

    def inbox_counts(self) -> InboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        gaps = self._one(GAPS)
        return rows.inbox_counts(self._rows(INBOX_COUNTS), 0 if gaps is None else int(gaps[0]))

    def inbox_rows(self, flow_id: str, from_seq: int = 1) -> list[StoredRow]:
        return [rows.stored_row(r) for r in self._rows(
            ROW + "WHERE flow_id = %s AND seq >= %s ORDER BY seq, live NULLS FIRST", (flow_id, from_seq)
        )]

    def inbox_row(self, event_id: str) -> StoredRow | None:
        """In a unit, the event id is locked first: a receive racing another
        receive of the same event waits, then finds it (``duplicate``).  The
        same statement reads the id's tombstone, kept for the
        ``tombstone(event_id)`` that receive asks next when there is no row."""
        self._lock("event", event_id)
        held = self._keep_tombstone(event_id, self._rows(ROW_OR_TOMBSTONE, (event_id, event_id)), (2, 3, 10))
        return None if held is None else rows.stored_row(held[1:10])

    def set_skipped(self, event_id: str) -> None:
        self._run(f"UPDATE inbox SET state = '{SKIPPED}' WHERE event_id = %s", (event_id,))

    def set_replaced(self, event_id: str) -> None:
        """The row gives up its (flow, seq) slot: live NULL, which the CHECK ties to 'replaced'."""
        self._run(f"UPDATE inbox SET state = '{REPLACED}', live = NULL WHERE event_id = %s", (event_id,))

    def record_inbox_action(self, action: OperatorAction) -> None:
        self._run(
            "INSERT INTO consumer_action(at, event_id, flow_id, seq, action, previous_state, actor, reason, "
            "replacement_event_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (action.at, action.event_id, action.flow_id, action.seq, action.action,
             InboxState(action.previous_state).value, action.actor, action.reason, action.replacement_event_id),
        )

    def inbox_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        if event_id is None:
            return [rows.inbox_action(r) for r in self._rows(ACTION + "ORDER BY id")]
        return [rows.inbox_action(r) for r in self._rows(
            ACTION + "WHERE event_id = %s OR replacement_event_id = %s ORDER BY id", (event_id, event_id)
        )]

    def add_effect(self, new: NewEffect) -> ScheduledEffect | None:
        stored = self._run(
            "INSERT INTO effect_outbox(key, name, payload, event_id, flow_id, seq, meta, ordered, deadline, "
            "version, fed, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT(key) DO NOTHING",
            (new.key, new.name, new.payload, new.event_id, new.flow_id, new.seq, new.meta, int(new.ordered),
             new.deadline, new.version, None if new.fed is None else int(new.fed), new.created_at,
             new.created_at),
        )
        return None if stored else self.effect(new.key)

    def effect(self, key: str) -> ScheduledEffect | None:
        row = self._one(f"SELECT {_COLUMNS} FROM effect_outbox WHERE key = %s", (key,))
        return None if row is None else effect_row(row)

    def effect_list(
        self, state: EffectState | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[ScheduledEffect]:
        where: list[str] = []
        params: list[Any] = []
        if state is not None:
            where.append("state = %s")
            params.append(EffectState(state).value)
        if flow_id is not None:
            where.append("flow_id = %s")
            params.append(flow_id)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        return [effect_row(r) for r in self._rows(
            f"SELECT {_COLUMNS} FROM effect_outbox {clause} ORDER BY id LIMIT %s", (*params, limit)
        )]

    def effect_counts(self) -> dict[str, int]:
        return {str(s): int(n) for s, n in self._rows(
            "SELECT state, count(*) FROM effect_outbox GROUP BY state ORDER BY state"
        )}

    def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE key = %s", (key,)) if key is not None else ("", ())
        return [effect_action(r) for r in self._rows(
            f"SELECT at, key, action, actor, reason FROM effect_action {where} ORDER BY id", params
        )]

    def due_effects(self, now: float, names: Collection[str], limit: int) -> list[ScheduledEffect]:
        """In a unit, the effects returned are locked and those another unit
        holds (being claimed) are skipped: two executors never take one."""
        chosen = sorted(names)
        if not chosen:
            return []
        lock = " FOR UPDATE OF e SKIP LOCKED" if self._writing else ""
        return [effect_row(r) for r in self._rows(DUE_EFFECTS + lock, (now, chosen, limit))]

    def next_effect_due_at(self, names: Collection[str]) -> float | None:
        chosen = sorted(names)
        if not chosen:
            return None
        row = self._one(NEXT_EFFECT_DUE, (chosen,))
        return None if row is None else float(row[0])

    def update_effect(self, key: str, changes: Mapping[str, Any], now: float) -> None:
        columns, values = effect_changes(changes)
        assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns)
        self._conn.execute(
            sql.SQL("UPDATE effect_outbox SET {}, updated_at = %s WHERE key = %s").format(assignments),
            (*values, now, key),
        )

    def unfed_effects(self, limit: int) -> list[ScheduledEffect]:
        return [effect_row(r) for r in self._rows(
            f"SELECT {_COLUMNS} FROM effect_outbox WHERE fed = 0 AND state = 'succeeded' ORDER BY id LIMIT %s",
            (limit,),
        )]

    def effect_history(self, key: str) -> list[EffectTransition]:
        return [effect_transition(r) for r in self._rows(EFFECT_HISTORY, (key,))]

    def effect_starts(self, name: str, since: float) -> tuple[int, float | None]:
        row = self._one(EFFECT_STARTS, (name, since))
        assert row is not None
        return int(row[0]), None if row[1] is None else float(row[1])

    def held_effect_counts(self, names: Collection[str], now: float) -> dict[str, int]:
        chosen = sorted(names)
        if not chosen:
            return {}
        return {name: int(count) for name, count in self._rows(HELD_EFFECTS, (now, chosen))}

    def add_transitions(self, rows: Sequence[EffectTransition]) -> None:
        self._conn.cursor().executemany(ADD_TRANSITION, [
            (t.key, t.name, t.at, t.transition.value, t.attempt, t.owner, t.detail) for t in rows
        ])

    def lock_effect_names(self, names: Collection[str]) -> None:
        """Claimers of these names queue here until the transaction ends, so
        a cap or a rate limit is counted and used by one claimer at a time
        (READ COMMITTED alone would let two count the same free slot)."""
        for name in sorted(names):
            self._lock("effect_name", name)

    def record_effect_action(self, action: OperatorAction) -> None:
        self._run(
            "INSERT INTO effect_action(at, key, action, actor, reason) VALUES (%s, %s, %s, %s, %s)",
            (action.at, action.key, action.action, action.actor, action.reason),
        )

    def user_execute(self, sql: str,  # the contract's name (shadows psycopg.sql here only)
                     params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement of the application's SQL, with ``?`` placeholders
        (see :mod:`.placeholders`; a statement without any is passed as it is,
        so psycopg's ``%s`` still work), run in this unit.  It is sent with the extended protocol,
        so a second statement hidden after a ``;`` is refused by the server;
        a statement that would end or reshape the library's transaction
        (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION,
        SET, ...) is refused before it is sent."""
        if first_keyword(sql) in _TRANSACTION_CONTROL:
            raise ValueError(
                f"sql must not use transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE, "
                f"SET, ...): the library commits or rolls back the whole apply; got {sql!r}"
            )
        # Binary results make psycopg use the extended protocol even without
        # parameters: one statement only, nothing prepared and cached.
        translated = pyformat(sql)
        text, args = (sql, tuple(params) or None) if translated is None else (translated, tuple(params))
        cur = self._conn.execute(text.encode(), args, prepare=False, binary=True)
        if self._pipe is not None:
            # In a pipelined unit, wait here for this statement and everything
            # the unit sent before it (which the server ran first, so the
            # statement saw it): its error is raised by this call, and the
            # handler goes on only once it succeeded.  Had an earlier write
            # of the unit failed, the server skipped this statement and that
            # write's error is raised here instead, before any more of the
            # handler runs, as a separate sync before the statement would.
            try:
                self._pipe.sync()
            except psycopg.Error as exc:
                failed = first_error(exc)
                if failed is exc:
                    raise
                raise failed from None
            self._answered = True
        return [tuple(r) for r in cur.fetchall()] if cur.description is not None else []

    def app_version(self, name: str) -> int:
        # In a unit of work, the caller migrates on what it reads here: take the
        # app-schema lock first, so two consumers opening at once migrate one
        # after the other and the second reads the first's version (READ
        # COMMITTED: the SELECT after the lock sees its commit), as SQLite's
        # write lock does.
        self._lock("app_schema")
        row = self._one("SELECT version FROM app_schema WHERE name = %s", (name,))
        return 0 if row is None else int(row[0])

    def set_app_version(self, name: str, version: int) -> None:
        self._run(
            "INSERT INTO app_schema(name, version) VALUES (%s, %s) "
            "ON CONFLICT(name) DO UPDATE SET version = excluded.version",
            (name, version),
        )

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        rows: list[Candidate] = [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]))
            for r in self._rows(INBOX_PRUNABLE, (horizon, MAX_POS, limit))
        ]
        records = 0
        if rows:
            self._looked_up = None
            self._bury(rows, now)
            ids = [r[1] for r in rows]
            records = self._run("DELETE FROM effect WHERE event_id = ANY(%s)", (ids,))
            self._run("DELETE FROM inbox WHERE event_id = ANY(%s)", (ids,))
        finished = [int(r[0]) for r in self._rows(EFFECTS_PRUNABLE, (horizon, limit))]
        if finished:  # an effect's history goes with it
            self._run(FORGET_HISTORY, (finished,))
        effect_rows = self._run("DELETE FROM effect_outbox WHERE id = ANY(%s)", (finished,)) if finished else 0
        step = PruneStep(len(rows), effect_records=records, effect_rows=effect_rows)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._run(
            "INSERT INTO prune_action(at, horizon, events, effect_records, effect_rows) "
            "VALUES (%s, %s, %s, %s, %s)",
            (now, horizon, step.events, step.effect_records, step.effect_rows),
        )


class PgInboxStore(PgStore[PgInbox]):
    """A consumer's store in a PostgreSQL schema: one connection, owned by
    the opening process and thread.

    ``location`` is a ``postgresql://`` string (schema as the fragment,
    default ``reliable_flow_consumer``) or a connection factory.  A new
    store records ``protocol``, ``name`` and a fresh ``uid``; an existing one
    must match ``protocol`` and, when given, ``name``.
    """

    def __init__(
        self, location: Target, protocol: str | None, *, name: str | None = None, default_name: str = "default",
        busy_timeout: float = DEFAULT_LOCK_TIMEOUT, readonly: bool = False, schema: str | None = None,
    ) -> None:
        def on_create(conn: Conn) -> None:
            conn.cursor().executemany(
                "INSERT INTO meta(key, value) VALUES (%s, %s)",
                [("protocol", protocol), ("name", name or default_name), ("uid", uuid.uuid4().hex)],
            )

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol, name)

        super().__init__(Database(
            parse(location, CONSUMER.name, schema), CONSUMER, lock_timeout=busy_timeout, on_create=on_create,
            check_meta=check_meta, readonly=readonly,
        ), PgInbox)

    # receive: BEGIN + the INSERT; COMMIT.  apply_next: BEGIN + the flow's
    # lock + its projection and next row; the writes + COMMIT (see
    # Database.write_view and PgInbox.user_execute).
    _PIPELINED = True

