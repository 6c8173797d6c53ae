"""Retention on SQLite: tombstones of pruned events, and the bounded pruning
transactions that leave them, for both file kinds.

Mixins of :class:`~reliable_flow.store.sqlite.outbox.SqliteOutbox` and
:class:`~reliable_flow.store.sqlite.inbox.SqliteInbox` (one view of one
connection, ``self._conn``).

An event's age is its position in commit (producer: ``pos``) or arrival
(consumer: ``rowid``) order: the events older than the horizon are those
before the first one stamped after it.  So a pruning pass walks from the
oldest row and stops at the first young one, reading only the old rows it
keeps (pending or set aside: few) and the ones it prunes, never the whole
table, and no index on the time columns slows every write down.
"""

from __future__ import annotations

import sqlite3

from ...envelope import body_hash
from ...statuses import DeliveryState
from ..records import PruneStep, Tombstone

__all__ = ["EFFECTS_PRUNABLE", "INBOX_PRUNABLE", "OUTBOX_PRUNABLE", "SqliteInboxRetention", "SqliteOutboxRetention"]

_WAITING = (DeliveryState.PENDING.value, DeliveryState.SET_ASIDE.value)

# Producer: events before the first committed after the horizon (NULL
# committed_at: before v4, old enough) that no consumer still waits for
# (every delivery accepted or skipped).  Through the consumer table, so each
# (consumer, pos) is a key lookup.  Delivery states are bound parameters
# (from the enum): the query's first table is the outbox.
OUTBOX_PRUNABLE = (
    "SELECT o.pos, o.event_id, o.flow_id, o.seq, o.body FROM outbox o "
    "WHERE o.pos < coalesce((SELECT pos FROM outbox WHERE committed_at > ? ORDER BY pos LIMIT 1), 9223372036854775807) "
    "AND NOT EXISTS (SELECT 1 FROM consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
    "WHERE d.state IN (?, ?)) ORDER BY o.pos LIMIT ?"
)
_OUTBOX_TOMBSTONE = "SELECT flow_id, seq, body_hash FROM outbox_tombstone WHERE event_id = ?"

# Consumer: rows before the first received after the horizon (NULL
# received_at: before v3, old enough) that are done (applied, skipped,
# replaced) and at or before their flow's last applied seq.
INBOX_PRUNABLE = (
    "SELECT i.rowid, i.event_id, i.flow_id, i.seq, i.body FROM inbox i "
    "JOIN projection p ON p.flow_id = i.flow_id "
    "WHERE i.rowid < coalesce((SELECT rowid FROM inbox WHERE received_at > ? ORDER BY rowid LIMIT 1), "
    "9223372036854775807) "
    "AND i.state IN ('applied','skipped','replaced') AND i.seq <= p.last_seq ORDER BY i.rowid LIMIT ?"
)
_INBOX_TOMBSTONE = "SELECT flow_id, seq, body_hash FROM inbox_tombstone WHERE event_id = ?"
# Finished effect-outbox rows (final, and fed when feedback was asked for),
# last written before the horizon; through the index by state.  ``dead`` and
# ``unknown`` wait for an operator and are kept.
EFFECTS_PRUNABLE = (
    "SELECT id FROM effect_outbox INDEXED BY effect_by_state "
    "WHERE state IN ('succeeded','expired','superseded','cancelled') AND updated_at <= ? "
    "AND (fed IS NULL OR fed = 1) ORDER BY state, id LIMIT ?"
)


class _Tombstones:
    """Reading, writing and forgetting the tombstones of one table."""

    _conn: sqlite3.Connection
    _LOOKUP: str
    _TABLE: str

    def tombstone(self, event_id: str) -> Tombstone | None:
        row = self._conn.execute(self._LOOKUP, (event_id,)).fetchone()
        return None if row is None else Tombstone(str(row[0]), int(row[1]), bytes(row[2]))

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        # A scan, but of a table that forgetting keeps to the window's size.
        gone = int(self._conn.execute(
            f"DELETE FROM {self._TABLE} WHERE event_id IN "
            f"(SELECT event_id FROM {self._TABLE} WHERE pruned_at < ? LIMIT ?)", (before, limit)
        ).rowcount)
        self._record(now, before, PruneStep(0))  # every pruning transaction is recorded
        return gone

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        """Append one pruning transaction to ``prune_action``."""
        raise NotImplementedError

    def _bury(self, rows: list[tuple[int, str, str, int, str]], now: float) -> None:
        self._conn.executemany(
            f"INSERT INTO {self._TABLE}(event_id, flow_id, seq, body_hash, pruned_at) VALUES (?, ?, ?, ?, ?)",
            [(event_id, flow_id, seq, body_hash(body), now) for _, event_id, flow_id, seq, body in rows],
        )


class SqliteOutboxRetention(_Tombstones):
    """The producer's tombstones and pruning."""

    _LOOKUP = _OUTBOX_TOMBSTONE
    _TABLE = "outbox_tombstone"

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        conn = self._conn
        names = [r[0] for r in conn.execute("SELECT name FROM consumer")]
        # No consumer yet: every event is still owed to the first one.
        rows = conn.execute(OUTBOX_PRUNABLE, (horizon, *_WAITING, limit)).fetchall() if names else []
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


class SqliteInboxRetention(_Tombstones):
    """The consumer's tombstones and pruning."""

    _LOOKUP = _INBOX_TOMBSTONE
    _TABLE = "inbox_tombstone"

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        conn = self._conn
        rows = conn.execute(INBOX_PRUNABLE, (horizon, limit)).fetchall()
        records = 0
        if rows:
            self._bury(rows, now)
            records = conn.executemany("DELETE FROM effect WHERE event_id = ?", [(r[1],) for r in rows]).rowcount
            conn.executemany("DELETE FROM inbox WHERE rowid = ?", [(r[0],) for r in rows])
        finished = [(r[0],) for r in conn.execute(EFFECTS_PRUNABLE, (horizon, limit))]
        effect_rows = conn.executemany("DELETE FROM effect_outbox WHERE id = ?", finished).rowcount if finished else 0
        step = PruneStep(len(rows), effect_records=records, effect_rows=effect_rows)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._conn.execute(
            "INSERT INTO prune_action(at, horizon, events, effect_records, effect_rows) VALUES (?, ?, ?, ?, ?)",
            (now, horizon, step.events, step.effect_records, step.effect_rows),
        )
