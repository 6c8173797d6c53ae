"""The producer file's SQL on SQLite: its statement table
(:class:`SqliteOutboxSql`: the shared statements and SQLite's texts of
those that differ) and the statements only :mod:`.outbox` runs, named so
tests can check their plans and their status literals."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ...statuses import DeliveryState
from ..repository.statements import OutboxSql

__all__ = [
    "APPEND", "BACKLOG", "BACKLOG_BEFORE_CONSUMERS", "CLAIM", "DELIVER", "DELIVER_FROM", "FIND_EVENT", "FIND_EVENT_AND_FLOW",
    "IN_MAX", "OUTBOX_PRUNABLE", "UPSERT_FLOW", "WAITING", "SqliteOutboxSql", "by_status", "in_chunks",
]

# Advance's reads of an event in one statement: the event id's stored event
# (kind 0: pos, seq, body), its tombstone (kind 1: flow, seq, body hash) and
# the flow's row (kind 2: state, seq, data).
FIND_EVENT_AND_FLOW = (
    "SELECT 0, pos, seq, body FROM outbox WHERE event_id = ?1 "
    "UNION ALL SELECT 1, flow_id, seq, body_hash FROM outbox_tombstone WHERE event_id = ?1 "
    "UNION ALL SELECT 2, state, seq, data FROM flow WHERE flow_id = ?2"
)

# A batch's deliveries, written at once: every event at or after the first
# the batch appended is the batch's (positions only grow), pending for
# every registered consumer that gets every event (a subscriber to topics
# gets its deliveries from advance's routing: _core/topics.py).
DELIVER_FROM = (
    "INSERT INTO delivery(consumer, pos) SELECT c.name, o.pos FROM outbox o CROSS JOIN consumer c "
    "WHERE o.pos >= ? AND c.topics IS NULL"
)
# One event's deliveries, to every registered consumer that gets every event.
DELIVER = "INSERT INTO delivery(consumer, pos) SELECT name, ? FROM consumer WHERE topics IS NULL"

FIND_EVENT = "SELECT pos, seq, body FROM outbox WHERE event_id = ?"
APPEND = "INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (?, ?, ?, ?, ?)"

CLAIM = "UPDATE delivery SET due_at = ?, lease_owner = ?, updated_at = ? WHERE consumer = ? AND pos = ?"

UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)

WAITING = (DeliveryState.PENDING.value, DeliveryState.SET_ASIDE.value)

# Producer: events before the first committed after the horizon (NULL
# committed_at: before v4, old enough) that no consumer still waits for
# (every delivery accepted or skipped).  Through the consumer table, so each
# (consumer, pos) is a key lookup.  Delivery states are bound parameters
# (from the enum): the query's first table is the outbox.
OUTBOX_PRUNABLE = (
    "SELECT o.pos, o.event_id, o.flow_id, o.seq, o.body FROM outbox o "
    "WHERE o.pos < coalesce((SELECT pos FROM outbox WHERE committed_at > ? ORDER BY pos LIMIT 1), 9223372036854775807) "
    "AND o.pos > ? AND NOT EXISTS (SELECT 1 FROM consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
    "WHERE d.state IN (?, ?)) ORDER BY o.pos LIMIT ?"
)

BACKLOG_BEFORE_CONSUMERS = "SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT ?)"
BACKLOG = "SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT ?)"

# Through the consumer table, so each (consumer, pos) is a key lookup rather
# than a scan of every delivery.
_DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o CROSS JOIN consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
)


class SqliteOutboxSql(OutboxSql, param="?"):
    """The producer side's statement table on SQLite."""

    # The hot queries, named so tests can check their plans use an index.
    # INDEXED BY: without ANALYZE statistics SQLite prefers the primary key and
    # would walk every delivery of the consumer, accepted ones included.
    # The next due events with their bodies, in one read: a relay without a
    # lease sends what it read; a claim leases the positions it read.
    NEXT_DUE = (
        "SELECT d.pos, o.body, d.prev_seq FROM delivery d INDEXED BY delivery_due JOIN outbox o ON o.pos = d.pos "
        "WHERE d.consumer = ? AND d.state = 'pending' AND d.due_at <= ? ORDER BY d.pos LIMIT ?"
    )
    NEXT_DUE_AT = "SELECT min(due_at) FROM delivery INDEXED BY delivery_due WHERE consumer = ? AND state = 'pending'"
    # A unit holds the file's write lock: a read in it needs no lock of its own.
    NEXT_DUE_LOCKED = NEXT_DUE
    PENDING_FAILURES_LOCKED = OutboxSql.PENDING_FAILURES
    DELIVERY_STATE_LOCKED = OutboxSql.DELIVERY_STATE
    # Metrics: one pass over the deliveries, grouped.  A lease counts while its
    # owner is set and its due time (the lease's end) is still ahead.
    DELIVERY_COUNTS = (
        "SELECT consumer, state, count(*), total(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), "
        "total(failures > 0), total(lease_owner IS NOT NULL AND due_at > ?), total(attempts = 0), min(updated_at) "
        "FROM delivery GROUP BY consumer, state ORDER BY consumer, state"
    )
    DELIVERIES = _DELIVERIES + "ORDER BY d.pos, d.consumer"
    DELIVERIES_OF_FLOW = _DELIVERIES + "WHERE o.flow_id = ? ORDER BY d.pos, d.consumer"
    # Pending through the partial index of due work, set aside through its own (v7).
    CONSUMERS = (
        "SELECT c.name, c.uid, c.registered_at, c.from_pos, "
        "(SELECT count(*) FROM delivery d INDEXED BY delivery_due WHERE d.consumer = c.name AND d.state = 'pending'), "
        "(SELECT count(*) FROM delivery d INDEXED BY delivery_set_aside WHERE d.consumer = c.name "
        "AND d.state = 'set_aside'), c.topics, c.topics_from FROM consumer c ORDER BY c.name"
    )
    # The console's (issue 31), through the partial index of due work.
    PENDING_SUMMARY = (
        "SELECT count(*), coalesce(sum(CASE WHEN lease_owner IS NOT NULL AND due_at > ? THEN 1 ELSE 0 END), 0) "
        "FROM (SELECT lease_owner, due_at FROM delivery INDEXED BY delivery_due "
        "WHERE consumer = ? AND state = 'pending' LIMIT ?) t"
    )
    OLDEST_PENDING = (
        "SELECT o.committed_at FROM delivery d INDEXED BY delivery_due JOIN outbox o ON o.pos = d.pos "
        "WHERE d.consumer = ? AND d.state = 'pending' ORDER BY d.pos LIMIT 1"
    )
    # A scan, but of a table that forgetting keeps to the window's size.
    TOMBSTONE_FORGET = (
        "DELETE FROM outbox_tombstone WHERE event_id IN "
        "(SELECT event_id FROM outbox_tombstone WHERE pruned_at < ? LIMIT ?)"
    )


# A batch's marks: one statement per status and up to IN_MAX positions
# (``pos IN (...)``) rather than one per event.  The list is padded to a
# power of two by repeating its last position (harmless in an IN list), so
# only a few statement texts exist and each is prepared once.
IN_MAX = 128


def by_status(answers: Sequence[tuple[int, str]]) -> list[tuple[str, list[int]]]:
    """Positions grouped by the status recorded for them, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for pos, status in answers:
        groups.setdefault(status, []).append(pos)
    return list(groups.items())


def in_chunks(sql: str, positions: Sequence[int]) -> Iterator[tuple[list[int], str]]:
    """``sql`` (ending in ``pos = ?``) for sets of positions: each chunk, padded,
    with its ``pos IN (?, ...)`` text."""
    assert sql.endswith("pos = ?")
    for start in range(0, len(positions), IN_MAX):
        chunk = list(positions[start:start + IN_MAX])
        size = 1
        while size < len(chunk):
            size *= 2
        chunk += chunk[-1:] * (size - len(chunk))
        yield chunk, sql[: -len("= ?")] + "IN (" + ",".join("?" * size) + ")"
