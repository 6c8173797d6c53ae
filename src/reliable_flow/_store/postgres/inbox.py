"""The consumer's store on PostgreSQL: receive, apply, the application's SQL and pruning.

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

Round trips: units run in pipeline mode (see :mod:`.connection`).
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
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from ..._envelope import Envelope
from ...records import ScheduledEffect
from .. import rows
from ..records import FlowState, NextRow, PruneStep, StoredRow
from ..repository.inbox import InboxRepository
from ..shared import identity_problem
from .base import PgStore, PgView
from .connection import DEFAULT_LOCK_TIMEOUT, Conn, Database, first_error
from .inbox_sql import (
    DELETE_EFFECT_RECORDS,
    DELETE_EFFECTS,
    DELETE_ROWS,
    EFFECT_FOR_UPDATE,
    EFFECTS_PRUNABLE,
    EFFECTS_PRUNABLE_READ,
    FLOW_AND_NEXT_ROW,
    FLOW_FOR_UPDATE,
    FORGET_HISTORY,
    INBOX_PRUNABLE,
    INBOX_PRUNABLE_READ,
    INSERT_NEW,
    INSERT_NEW_MANY,
    MAX_POS,
    NEXT_ROW,
    ROW_OR_TOMBSTONE,
    Candidate,
    PgInboxSql,
)
from .location import Target, parse
from .placeholders import pyformat, split
from .schema import CONSUMER

__all__ = ["PgInbox", "PgInboxStore"]

# Statements that end, split or reshape the library's transaction.
_TRANSACTION_CONTROL = frozenset({
    "begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release", "prepare", "set",
    "reset", "discard", "listen", "unlisten",
})

_LEAD = re.compile(r"[\s;(]*")  # an empty statement before ';' is no statement

_WORD = re.compile(r"[A-Za-z_]+")


def first_keyword(text: str) -> str:
    """The statement's first word, past whitespace, comments (``--`` and
    nested ``/* */``), opening parentheses and empty statements (``;``: the
    server drops them, so ``; COMMIT`` is one statement, COMMIT), lower-cased;
    '' if there is none."""
    for code, piece in split(text):
        if not code:
            if piece.startswith(("--", "/*")):
                continue
            return ""  # a literal or quoted name: no keyword
        rest = piece[_LEAD.match(piece).end():]  # type: ignore[union-attr]
        if rest:
            word = _WORD.match(rest)
            return word.group(0).lower() if word else ""
    return ""


class PgInbox(PgView, InboxRepository):
    """The consumer's tables, seen through one connection: receive and apply
    (their locks and pipelined reads), the effect outbox's claims, the
    application's SQL and pruning here; the rest is
    :class:`~reliable_flow._store.repository.inbox.InboxRepository`'s."""

    engine = "postgres"
    _SQL: ClassVar[type[PgInboxSql]] = PgInboxSql

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

    def flow_state(self, flow_id: str) -> FlowState | None:
        self._lock("flow", flow_id)
        row = self._one(self._guarded(self._SQL.FLOW, FLOW_FOR_UPDATE), (flow_id,))
        return None if row is None else rows.flow_state(row)

    def effect(self, key: str) -> ScheduledEffect | None:
        """In a unit the effect's row is locked (``FOR UPDATE``) as it is read:
        two operators acting on one effect at once (or an operator and an
        executor) take turns, and the second sees what the first did (under
        READ COMMITTED, without the lock, both would act on the state they read)."""
        row = self._one(self._guarded(self._SQL.EFFECT, EFFECT_FOR_UPDATE), (key,))
        return None if row is None else rows.effect(row)

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

    def inbox_row(self, event_id: str) -> StoredRow | None:
        """In a unit, the event id is locked first: a receive racing another
        receive of the same event waits, then finds it (``duplicate``).  The
        same statement reads the id's tombstone, kept for the
        ``tombstone(event_id)`` that receive asks next when there is no row."""
        self._lock("event", event_id)
        held = self._keep_tombstone(event_id, self._rows(ROW_OR_TOMBSTONE, (event_id, event_id)), (2, 3, 10))
        return None if held is None else rows.stored_row(held[1:10])

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

    def prunable(self, horizon: float, limit: int) -> PruneStep:
        """What a prune to ``horizon`` would remove now (inbox rows and
        finished effects, each counted up to ``limit``), read only."""
        rows = self._one(f"SELECT count(*) FROM ({INBOX_PRUNABLE_READ}) t", (horizon, MAX_POS, limit))
        effects = self._one(f"SELECT count(*) FROM ({EFFECTS_PRUNABLE_READ}) t", (horizon, limit))
        return PruneStep(0 if rows is None else int(rows[0]), effect_rows=0 if effects is None else int(effects[0]))

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        found: list[Candidate] = [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]))
            for r in self._rows(INBOX_PRUNABLE, (horizon, MAX_POS, limit))
        ]
        records = 0
        if found:
            self._looked_up = None
            self._bury(found, now)
            ids = [r[1] for r in found]
            records = self._run(DELETE_EFFECT_RECORDS, (ids,))
            self._run(DELETE_ROWS, (ids,))
        finished = [int(r[0]) for r in self._rows(EFFECTS_PRUNABLE, (horizon, limit))]
        if finished:  # an effect's history goes with it
            self._run(FORGET_HISTORY, (finished,))
        effect_rows = self._run(DELETE_EFFECTS, (finished,)) if finished else 0
        step = PruneStep(len(found), effect_records=records, effect_rows=effect_rows)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step


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

