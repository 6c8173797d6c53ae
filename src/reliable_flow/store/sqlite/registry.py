"""The producer file's consumer registry on SQLite: which names get
deliveries, which file each is bound to, and the record of changes.

A mixin of :class:`~reliable_flow.store.sqlite.outbox.SqliteOutbox` (one
view of one connection, ``self._conn``).
"""

from __future__ import annotations

import sqlite3

from ...operations import ConsumerEntry, RegistryAction

__all__ = ["CONSUMERS", "SqliteRegistry"]

# Pending through the partial index of due work; set-aside rows are few but
# not indexed by state, so that count walks the consumer's deliveries.
CONSUMERS = (
    "SELECT c.name, c.uid, c.registered_at, c.from_pos, "
    "(SELECT count(*) FROM delivery d INDEXED BY delivery_due WHERE d.consumer = c.name AND d.state = 'pending'), "
    "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'set_aside') "
    "FROM consumer c ORDER BY c.name"
)


class SqliteRegistry:
    """Registering, binding and removing consumer names."""

    _conn: sqlite3.Connection

    def has_consumers(self) -> bool:
        return self._conn.execute("SELECT 1 FROM consumer LIMIT 1").fetchone() is not None

    def is_registered(self, name: str) -> bool:
        return self._conn.execute("SELECT 1 FROM consumer WHERE name = ?", (name,)).fetchone() is not None

    def register_consumer(self, name: str, now: float, from_now: bool) -> None:
        """A name with no file yet: from now, after the last committed event; else from the first."""
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
        self._conn.execute("DELETE FROM delivery WHERE consumer = ?", (name,))
        self._conn.execute("DELETE FROM consumer WHERE name = ?", (name,))

    def record_registry_action(self, action: RegistryAction) -> None:
        self._conn.execute(
            "INSERT INTO registry_action(at, consumer, action, actor, reason) VALUES (?, ?, ?, ?, ?)",
            (action.at, action.consumer, action.action, action.actor, action.reason),
        )

    def consumers(self) -> list[ConsumerEntry]:
        return [
            ConsumerEntry(name, uid, uid is not None, registered_at, from_pos is not None, backlog, set_aside)
            for name, uid, registered_at, from_pos, backlog, set_aside in self._conn.execute(CONSUMERS)
        ]

    def registry_actions(self, consumer: str | None = None) -> list[RegistryAction]:
        where, params = ("WHERE consumer = ?", (consumer,)) if consumer is not None else ("", ())
        return [
            RegistryAction(*r)
            for r in self._conn.execute(
                f"SELECT at, consumer, action, actor, reason FROM registry_action {where} ORDER BY id", params
            )
        ]
