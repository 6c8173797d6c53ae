"""The producer file's SQL on SQLite: every statement text the producer side
runs (:mod:`.outbox` runs them), named so tests can check their plans and
their status literals."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ...statuses import DeliveryState

__all__ = [
    "ACCEPTED", "ADD_META", "ANY_CONSUMER", "APPEND", "BACKLOG", "BACKLOG_BEFORE_CONSUMERS", "BIND", "BOUND_UID", "CLAIM",
    "CONSUMERS", "CONSUMER_NAMES", "COUNT_EVENTS", "COUNT_FLOWS", "DELIVERIES", "DELIVERIES_OF_FLOW",
    "DELIVERY_COUNTS", "DELIVERY_STATE", "DELIVERY_STATE_LOCKED", "DELIVER_FROM", "EVENTS", "EVENTS_OF_FLOW",
    "FIND_EVENT", "FIND_EVENT_AND_FLOW", "FLOW", "FLOWS", "FORGET_DELIVERIES_OF", "IN_MAX", "IS_REGISTERED",
    "MARK_CONFLICT", "MARK_DELIVERED", "META_VALUE", "NEXT_DUE", "NEXT_DUE_AT", "NEXT_DUE_LOCKED", "OPERATOR_ACTIONS",
    "OPERATOR_ACTIONS_OF_EVENT", "OUTBOX_PRUNABLE", "PENDING", "PENDING_FAILURES", "PENDING_FAILURES_LOCKED",
    "PENDING_FOR_ALL", "RECORD_ACTION", "RECORD_PRUNE", "RECORD_REGISTRY_ACTION", "REGISTER",
    "REGISTRY_ACTIONS", "REGISTRY_ACTIONS_OF", "REMOVE_CONSUMER", "RESOLVE", "SET_ASIDE", "SET_RETRY", "TOMBSTONE",
    "TOMBSTONE_BURY", "TOMBSTONE_FORGET", "UPSERT_FLOW", "WAITING", "by_status", "in_chunks",
]

PENDING = DeliveryState.PENDING.value

ACCEPTED = DeliveryState.ACCEPTED.value

SET_ASIDE = DeliveryState.SET_ASIDE.value

# The hot queries, named so tests can check their plans use an index.
# INDEXED BY: without ANALYZE statistics SQLite prefers the primary key and
# would walk every delivery of the consumer, accepted ones included.
# The next due events with their bodies, in one read: a relay without a
# lease sends what it read; a claim leases the positions it read.
NEXT_DUE = (
    "SELECT d.pos, o.body FROM delivery d INDEXED BY delivery_due JOIN outbox o ON o.pos = d.pos "
    "WHERE d.consumer = ? AND d.state = 'pending' AND d.due_at <= ? ORDER BY d.pos LIMIT ?"
)

NEXT_DUE_AT = "SELECT min(due_at) FROM delivery INDEXED BY delivery_due WHERE consumer = ? AND state = 'pending'"

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
# every registered consumer.
DELIVER_FROM = (
    "INSERT INTO delivery(consumer, pos) SELECT c.name, o.pos FROM outbox o CROSS JOIN consumer c WHERE o.pos >= ?"
)

FIND_EVENT = "SELECT pos, seq, body FROM outbox WHERE event_id = ?"
FLOW = "SELECT state, seq, data FROM flow WHERE flow_id = ?"
APPEND = "INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (?, ?, ?, ?, ?)"

CLAIM = "UPDATE delivery SET due_at = ?, lease_owner = ?, updated_at = ? WHERE consumer = ? AND pos = ?"

UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)

MARK_DELIVERED = (
    f"UPDATE delivery SET state = '{ACCEPTED}', last_status = ?, attempts = attempts + 1, "
    "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = ? WHERE consumer = ? AND pos = ?"
)

# A conflict never turns into "accepted", and never undoes one.
MARK_CONFLICT = (
    f"UPDATE delivery SET state = CASE state WHEN '{ACCEPTED}' THEN state ELSE '{SET_ASIDE}' END, "
    "last_status = ?, attempts = attempts + 1, lease_owner = NULL, updated_at = ? "
    "WHERE consumer = ? AND pos = ?"
)

# Metrics: one pass over the deliveries, grouped.  A lease counts while its
# owner is set and its due time (the lease's end) is still ahead.
DELIVERY_COUNTS = (
    "SELECT consumer, state, count(*), total(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), "
    "total(failures > 0), total(lease_owner IS NOT NULL AND due_at > ?), total(attempts = 0), min(updated_at) "
    "FROM delivery GROUP BY consumer, state ORDER BY consumer, state"
)

# Through the consumer table, so each (consumer, pos) is a key lookup rather
# than a scan of every delivery.
_DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o CROSS JOIN consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
)
DELIVERIES = _DELIVERIES + "ORDER BY d.pos, d.consumer"
DELIVERIES_OF_FLOW = _DELIVERIES + "WHERE o.flow_id = ? ORDER BY d.pos, d.consumer"

# Pending through the partial index of due work; set-aside rows are few but
# not indexed by state, so that count walks the consumer's deliveries.
CONSUMERS = (
    "SELECT c.name, c.uid, c.registered_at, c.from_pos, "
    "(SELECT count(*) FROM delivery d INDEXED BY delivery_due WHERE d.consumer = c.name AND d.state = 'pending'), "
    "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'set_aside') "
    "FROM consumer c ORDER BY c.name"
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
    "AND NOT EXISTS (SELECT 1 FROM consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
    "WHERE d.state IN (?, ?)) ORDER BY o.pos LIMIT ?"
)

TOMBSTONE = "SELECT flow_id, seq, body_hash FROM outbox_tombstone WHERE event_id = ?"

# A scan, but of a table that forgetting keeps to the window's size.
TOMBSTONE_FORGET = (
    "DELETE FROM outbox_tombstone WHERE event_id IN "
    "(SELECT event_id FROM outbox_tombstone WHERE pruned_at < ? LIMIT ?)"
)

TOMBSTONE_BURY = "INSERT INTO outbox_tombstone(event_id, flow_id, seq, body_hash, pruned_at) VALUES (?, ?, ?, ?, ?)"


RECORD_PRUNE = "INSERT INTO prune_action(at, horizon, events, deliveries) VALUES (?, ?, ?, ?)"

# The plain reads and writes (the shared repository's: see
# reliable_flow._store.repository.outbox.OutboxSql).
META_VALUE = "SELECT value FROM meta WHERE key = ?"
ADD_META = "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
FLOWS = "SELECT flow_id FROM flow ORDER BY flow_id"
EVENTS = "SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o ORDER BY o.pos"
EVENTS_OF_FLOW = "SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o WHERE o.flow_id = ? ORDER BY o.pos"
COUNT_EVENTS = "SELECT count(*) FROM outbox"
COUNT_FLOWS = "SELECT count(*) FROM flow"
CONSUMER_NAMES = "SELECT name FROM consumer ORDER BY name"
OPERATOR_ACTIONS = "SELECT at, consumer, event_id, action, actor, reason FROM operator_action ORDER BY id"
OPERATOR_ACTIONS_OF_EVENT = (
    "SELECT at, consumer, event_id, action, actor, reason FROM operator_action WHERE event_id = ? ORDER BY id"
)
RECORD_ACTION = (
    "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) VALUES (?, ?, ?, ?, ?, ?)"
)
REGISTRY_ACTIONS = "SELECT at, consumer, action, actor, reason FROM registry_action ORDER BY id"
REGISTRY_ACTIONS_OF = "SELECT at, consumer, action, actor, reason FROM registry_action WHERE consumer = ? ORDER BY id"
RECORD_REGISTRY_ACTION = "INSERT INTO registry_action(at, consumer, action, actor, reason) VALUES (?, ?, ?, ?, ?)"
ANY_CONSUMER = "SELECT 1 FROM consumer LIMIT 1"
IS_REGISTERED = "SELECT 1 FROM consumer WHERE name = ?"
REGISTER = (
    "INSERT INTO consumer(name, uid, registered_at, from_pos) "
    "SELECT ?, NULL, ?, CASE WHEN ? THEN (SELECT coalesce(max(pos), 0) FROM outbox) END"
)
PENDING_FOR_ALL = "INSERT INTO delivery(consumer, pos) SELECT ?, pos FROM outbox"
BOUND_UID = "SELECT uid FROM consumer WHERE name = ?"
BIND = "UPDATE consumer SET uid = ? WHERE name = ? AND uid IS NULL"
FORGET_DELIVERIES_OF = "DELETE FROM delivery WHERE consumer = ?"
REMOVE_CONSUMER = "DELETE FROM consumer WHERE name = ?"
SET_RETRY = (
    "UPDATE delivery SET attempts = attempts + 1, failures = ?, due_at = ?, lease_owner = NULL, "
    "last_error = ?, updated_at = ? WHERE consumer = ? AND pos = ?"
)
RESOLVE = (
    "UPDATE delivery SET state = ?, due_at = 0, failures = 0, lease_owner = NULL, updated_at = ? "
    "WHERE consumer = ? AND pos = ?"
)
# A unit holds the file's write lock: a read in it needs no lock of its own.
NEXT_DUE_LOCKED = NEXT_DUE
PENDING_FAILURES = "SELECT failures FROM delivery WHERE consumer = ? AND pos = ? AND state = ?"
PENDING_FAILURES_LOCKED = PENDING_FAILURES
DELIVERY_STATE = (
    "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos WHERE o.event_id = ? AND d.consumer = ?"
)
DELIVERY_STATE_LOCKED = DELIVERY_STATE
BACKLOG_BEFORE_CONSUMERS = "SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT ?)"
BACKLOG = "SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT ?)"

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
