"""The effect outbox on SQLite: every statement about effects, and the
application's own SQL run inside an apply."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ...statuses import Effect, EffectAction, EffectState
from ..effects import NewEffect
from ..shared import effect_changes

__all__ = ["DUE_EFFECTS", "NEXT_EFFECT_DUE", "SqliteEffects"]

_REFUSED_ACTIONS = frozenset({
    sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT, sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH,
})


def _allow_all(*_: object) -> int:
    return sqlite3.SQLITE_OK

_COLUMNS = (
    "key, name, payload, event_id, flow_id, seq, meta, state, ordered, deadline, version, attempts, "
    "failures, due_at, lease_owner, last_error, result, reason, fed, created_at, updated_at"
)
_CLAIMABLE = ("pending", "running", "in_doubt")
_UNRESOLVED = ("pending", "running", "in_doubt", "dead", "unknown")
# The predicates repeat the partial indexes' text, so SQLite uses them.
DUE_EFFECTS = (
    f"SELECT {_COLUMNS} FROM effect_outbox e INDEXED BY effect_due "
    "WHERE e.state IN ('pending','running','in_doubt') AND e.due_at <= ? AND e.name IN ({names}) "
    "AND NOT (e.ordered = 1 AND EXISTS (SELECT 1 FROM effect_outbox p INDEXED BY effect_open_ordered "
    "WHERE p.flow_id = e.flow_id AND p.ordered = 1 "
    "AND p.state IN ('pending','running','in_doubt','dead','unknown') AND p.id < e.id)) "
    "ORDER BY e.due_at, e.id LIMIT ?"
)

# The earliest time DUE_EFFECTS will pick something up (same predicates, any time).
NEXT_EFFECT_DUE = (
    "SELECT e.due_at FROM effect_outbox e INDEXED BY effect_due "
    "WHERE e.state IN ('pending','running','in_doubt') AND e.name IN ({names}) "
    "AND NOT (e.ordered = 1 AND EXISTS (SELECT 1 FROM effect_outbox p INDEXED BY effect_open_ordered "
    "WHERE p.flow_id = e.flow_id AND p.ordered = 1 "
    "AND p.state IN ('pending','running','in_doubt','dead','unknown') AND p.id < e.id)) "
    "ORDER BY e.due_at, e.id LIMIT 1"
)


def _effect(row: Sequence[Any]) -> Effect:
    (key, name, payload, event_id, flow_id, seq, meta, state, ordered, deadline, version, attempts,
     failures, due_at, lease_owner, last_error, result, reason, fed, created_at, updated_at) = row
    return Effect(
        key, name, json.loads(payload), event_id, flow_id, seq, json.loads(meta), EffectState(state),
        bool(ordered), deadline, version, attempts, failures, due_at, lease_owner, last_error,
        None if result is None else json.loads(result), reason, None if fed is None else bool(fed),
        created_at, updated_at,
    )


class SqliteEffects:
    """The effect outbox's statements, on the consumer file's connection."""

    _conn: sqlite3.Connection
    engine = "sqlite"

    def add_effect(self, new: NewEffect) -> Effect | None:
        stored = self._conn.execute(
            "INSERT INTO effect_outbox(key, name, payload, event_id, flow_id, seq, meta, ordered, deadline, "
            "version, fed, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(key) DO NOTHING",
            (new.key, new.name, new.payload, new.event_id, new.flow_id, new.seq, new.meta, int(new.ordered),
             new.deadline, new.version, None if new.fed is None else int(new.fed), new.created_at,
             new.created_at),
        ).rowcount
        return None if stored else self.effect(new.key)

    def effect(self, key: str) -> Effect | None:
        row = self._conn.execute(f"SELECT {_COLUMNS} FROM effect_outbox WHERE key = ?", (key,)).fetchone()
        return None if row is None else _effect(row)

    def effect_list(
        self, state: EffectState | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[Effect]:
        where, params = [], []
        if state is not None:
            where.append("state = ?")
            params.append(EffectState(state).value)
        if flow_id is not None:
            where.append("flow_id = ?")
            params.append(flow_id)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        return [_effect(r) for r in self._conn.execute(
            f"SELECT {_COLUMNS} FROM effect_outbox {clause} ORDER BY id LIMIT ?", (*params, -1 if limit is None else limit)
        )]

    def effect_counts(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT state, count(*) FROM effect_outbox GROUP BY state ORDER BY state"))

    def effect_actions(self, key: str | None = None) -> list[EffectAction]:
        where, params = ("WHERE key = ?", (key,)) if key is not None else ("", ())
        return [EffectAction(*r) for r in self._conn.execute(
            f"SELECT at, key, action, actor, reason FROM effect_action {where} ORDER BY id", params
        )]

    def due_effects(self, now: float, names: Collection[str], limit: int) -> list[Effect]:
        chosen = sorted(names)
        if not chosen:
            return []
        sql = DUE_EFFECTS.format(names=",".join("?" * len(chosen)))
        return [_effect(r) for r in self._conn.execute(sql, (now, *chosen, limit))]

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

    def unfed_effects(self, limit: int) -> list[Effect]:
        return [_effect(r) for r in self._conn.execute(
            f"SELECT {_COLUMNS} FROM effect_outbox INDEXED BY effect_unfed WHERE fed = 0 "
            "AND state = 'succeeded' ORDER BY id LIMIT ?", (limit,)
        )]

    def record_effect_action(self, action: EffectAction) -> None:
        self._conn.execute(
            "INSERT INTO effect_action(at, key, action, actor, reason) VALUES (?, ?, ?, ?, ?)",
            (action.at, action.key, action.action, action.actor, action.reason),
        )

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
            if conn.in_transaction:
                conn.execute("ROLLBACK TO step")
                conn.execute("RELEASE step")
            raise
        conn.execute("RELEASE step")
