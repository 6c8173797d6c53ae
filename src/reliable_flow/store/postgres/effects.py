"""The effect outbox on PostgreSQL: every statement about effects, and the
application's own SQL run inside an apply."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from psycopg import sql

from ...statuses import Effect, EffectAction, EffectState
from ..effects import NewEffect
from ..shared import effect_changes
from .base import PgView
from .placeholders import pyformat

__all__ = ["DUE_EFFECTS", "NEXT_EFFECT_DUE", "PgEffects", "first_keyword"]

_COLUMNS = (
    "key, name, payload, event_id, flow_id, seq, meta, state, ordered, deadline, version, attempts, "
    "failures, due_at, lease_owner, last_error, result, reason, fed, created_at, updated_at"
)
_WAITING_BEHIND = (
    "NOT (e.ordered = 1 AND EXISTS (SELECT 1 FROM effect_outbox p "
    "WHERE p.flow_id = e.flow_id AND p.ordered = 1 "
    "AND p.state IN ('pending','running','in_doubt','dead','unknown') AND p.id < e.id))"
)
DUE_EFFECTS = (
    f"SELECT {_COLUMNS} FROM effect_outbox e "
    "WHERE e.state IN ('pending','running','in_doubt') AND e.due_at <= %s AND e.name = ANY(%s) "
    f"AND {_WAITING_BEHIND} ORDER BY e.due_at, e.id LIMIT %s"
)
NEXT_EFFECT_DUE = (
    "SELECT e.due_at FROM effect_outbox e "
    "WHERE e.state IN ('pending','running','in_doubt') AND e.name = ANY(%s) "
    f"AND {_WAITING_BEHIND} ORDER BY e.due_at, e.id LIMIT 1"
)
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


def _effect(row: Sequence[Any]) -> Effect:
    (key, name, payload, event_id, flow_id, seq, meta, state, ordered, deadline, version, attempts,
     failures, due_at, lease_owner, last_error, result, reason, fed, created_at, updated_at) = row
    return Effect(
        key, name, json.loads(payload), event_id, flow_id, int(seq), json.loads(meta), EffectState(state),
        bool(ordered), deadline, None if version is None else int(version), int(attempts), int(failures),
        float(due_at), lease_owner, last_error, None if result is None else json.loads(result), reason,
        None if fed is None else bool(fed), float(created_at), float(updated_at),
    )


class PgEffects(PgView):
    """The effect outbox's statements, on the consumer's connection."""

    engine = "postgres"

    def add_effect(self, new: NewEffect) -> Effect | None:
        stored = self._run(
            "INSERT INTO effect_outbox(key, name, payload, event_id, flow_id, seq, meta, ordered, deadline, "
            "version, fed, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT(key) DO NOTHING",
            (new.key, new.name, new.payload, new.event_id, new.flow_id, new.seq, new.meta, int(new.ordered),
             new.deadline, new.version, None if new.fed is None else int(new.fed), new.created_at,
             new.created_at),
        )
        return None if stored else self.effect(new.key)

    def effect(self, key: str) -> Effect | None:
        row = self._one(f"SELECT {_COLUMNS} FROM effect_outbox WHERE key = %s", (key,))
        return None if row is None else _effect(row)

    def effect_list(
        self, state: EffectState | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[Effect]:
        where: list[str] = []
        params: list[Any] = []
        if state is not None:
            where.append("state = %s")
            params.append(EffectState(state).value)
        if flow_id is not None:
            where.append("flow_id = %s")
            params.append(flow_id)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        return [_effect(r) for r in self._rows(
            f"SELECT {_COLUMNS} FROM effect_outbox {clause} ORDER BY id LIMIT %s", (*params, limit)
        )]

    def effect_counts(self) -> dict[str, int]:
        return {str(s): int(n) for s, n in self._rows(
            "SELECT state, count(*) FROM effect_outbox GROUP BY state ORDER BY state"
        )}

    def effect_actions(self, key: str | None = None) -> list[EffectAction]:
        where, params = ("WHERE key = %s", (key,)) if key is not None else ("", ())
        return [EffectAction(*r) for r in self._rows(
            f"SELECT at, key, action, actor, reason FROM effect_action {where} ORDER BY id", params
        )]

    def due_effects(self, now: float, names: Collection[str], limit: int) -> list[Effect]:
        """In a unit, the effects returned are locked and those another unit
        holds (being claimed) are skipped: two executors never take one."""
        chosen = sorted(names)
        if not chosen:
            return []
        lock = " FOR UPDATE OF e SKIP LOCKED" if self._writing else ""
        return [_effect(r) for r in self._rows(DUE_EFFECTS + lock, (now, chosen, limit))]

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

    def unfed_effects(self, limit: int) -> list[Effect]:
        return [_effect(r) for r in self._rows(
            f"SELECT {_COLUMNS} FROM effect_outbox WHERE fed = 0 AND state = 'succeeded' ORDER BY id LIMIT %s",
            (limit,),
        )]

    def record_effect_action(self, action: EffectAction) -> None:
        self._run(
            "INSERT INTO effect_action(at, key, action, actor, reason) VALUES (%s, %s, %s, %s, %s)",
            (action.at, action.key, action.action, action.actor, action.reason),
        )

    def user_execute(self, sql_text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement of the application's SQL, with ``?`` placeholders
        (see :mod:`.placeholders`; a statement without any is passed as it is,
        so psycopg's ``%s`` still work), run in this unit.  It is sent with the extended protocol,
        so a second statement hidden after a ``;`` is refused by the server;
        a statement that would end or reshape the library's transaction
        (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION,
        SET, ...) is refused before it is sent."""
        if first_keyword(sql_text) in _TRANSACTION_CONTROL:
            raise ValueError(
                f"sql must not use transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE, "
                f"SET, ...): the library commits or rolls back the whole apply; got {sql_text!r}"
            )
        # Binary results make psycopg use the extended protocol even without
        # parameters: one statement only, nothing prepared and cached.
        translated = pyformat(sql_text)
        text, args = (sql_text, tuple(params) or None) if translated is None else (translated, tuple(params))
        cur = self._conn.execute(text.encode(), args, prepare=False, binary=True)
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
