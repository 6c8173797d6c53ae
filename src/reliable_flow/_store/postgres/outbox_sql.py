"""The producer's SQL on PostgreSQL: every statement text the producer side
runs (:mod:`.outbox` runs them), named so tests can check their status
literals."""

from __future__ import annotations

from ...statuses import DeliveryState

__all__ = [
    "ACCEPTED",
    "APPEND",
    "BACKLOG",
    "CONSUMERS",
    "DELIVERIES",
    "DELIVERY_COUNTS",
    "FIND_EVENT",
    "FLOW",
    "FLOW_FOR_UPDATE",
    "LOCK_DELIVERIES",
    "MARK_CONFLICT",
    "MARK_DELIVERED",
    "MAX_POS",
    "NEXT_DUE",
    "NEXT_DUE_AT",
    "OUTBOX_BURY",
    "OUTBOX_FORGET",
    "OUTBOX_PRUNABLE",
    "OUTBOX_TOMBSTONE",
    "PENDING",
    "PENDING_FOR_ALL",
    "REGISTER",
    "REGISTRY_LOCK",
    "SET_ASIDE",
    "STILL_WAITING",
    "UPSERT_FLOW",
    "WAITING",
    "Candidate",
]

PENDING = DeliveryState.PENDING.value

ACCEPTED = DeliveryState.ACCEPTED.value

SET_ASIDE = DeliveryState.SET_ASIDE.value

NEXT_DUE = (
    "SELECT d.pos, o.body FROM delivery d JOIN outbox o ON o.pos = d.pos "
    "WHERE d.consumer = %s AND d.state = 'pending' AND d.due_at <= %s ORDER BY d.pos LIMIT %s"
)

# An event id's stored event and its tombstone, in one read (one snapshot:
# pruning moves an event from one to the other in one transaction, so the
# read sees it in exactly one of them, or in neither).
FIND_EVENT = (
    "SELECT true, pos, seq, body, NULL, NULL FROM outbox WHERE event_id = %s "
    "UNION ALL SELECT false, NULL, seq, NULL, flow_id, body_hash FROM outbox_tombstone WHERE event_id = %s"
)

FLOW = "SELECT state, seq, data FROM flow WHERE flow_id = %s"

FLOW_FOR_UPDATE = FLOW + " FOR UPDATE"

# Pending deliveries summed over consumers, or events before any consumer; up to %s.
BACKLOG = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM consumer) "
    "THEN (SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT %s) t) "
    "ELSE (SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT %s) t) END"
)

NEXT_DUE_AT = "SELECT min(due_at) FROM delivery WHERE consumer = %s AND state = 'pending'"

UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)

APPEND = (
    "WITH e AS (INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (%s, %s, %s, %s, %s) "
    "RETURNING pos) INSERT INTO delivery(consumer, pos) SELECT c.name, e.pos FROM consumer c CROSS JOIN e"
)

MARK_DELIVERED = (
    f"UPDATE delivery SET state = '{ACCEPTED}', last_status = %s, attempts = attempts + 1, "
    "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = %s WHERE consumer = %s AND pos = %s"
)

# A conflict never turns into "accepted", and never undoes one.
MARK_CONFLICT = (
    f"UPDATE delivery SET state = CASE state WHEN '{ACCEPTED}' THEN state ELSE '{SET_ASIDE}' END, "
    "last_status = %s, attempts = attempts + 1, lease_owner = NULL, updated_at = %s "
    "WHERE consumer = %s AND pos = %s"
)

DELIVERY_COUNTS = (
    "SELECT consumer, state, count(*), coalesce(sum(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), 0), "
    "count(*) FILTER (WHERE failures > 0), count(*) FILTER (WHERE lease_owner IS NOT NULL AND due_at > %s), "
    "count(*) FILTER (WHERE attempts = 0), min(updated_at) "
    "FROM delivery GROUP BY consumer, state ORDER BY consumer, state"
)

DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o JOIN delivery d ON d.pos = o.pos "
)

REGISTRY_LOCK = "registry"

CONSUMERS = (
    "SELECT c.name, c.uid, c.registered_at, c.from_pos, "
    "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'pending'), "
    "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'set_aside') "
    "FROM consumer c ORDER BY c.name"
)

REGISTER = (
    "INSERT INTO consumer(name, uid, registered_at, from_pos) "
    "SELECT %s, NULL, %s, CASE WHEN %s THEN (SELECT coalesce(max(pos), 0) FROM outbox) END"
)

PENDING_FOR_ALL = "INSERT INTO delivery(consumer, pos) SELECT %s, pos FROM outbox"

WAITING = [DeliveryState.PENDING.value, DeliveryState.SET_ASIDE.value]

MAX_POS = 9223372036854775807

OUTBOX_PRUNABLE = (
    "SELECT o.pos, o.event_id, o.flow_id, o.seq, o.body FROM outbox o "
    "WHERE o.pos < coalesce((SELECT pos FROM outbox WHERE committed_at > %s ORDER BY pos LIMIT 1), %s) "
    "AND NOT EXISTS (SELECT 1 FROM delivery d JOIN consumer c ON c.name = d.consumer "
    "WHERE d.pos = o.pos AND d.state = ANY(%s)) ORDER BY o.pos LIMIT %s FOR UPDATE OF o SKIP LOCKED"
)

# The deliveries of the candidates, locked and read again after the lock.
STILL_WAITING = (
    "SELECT DISTINCT d.pos FROM delivery d WHERE d.pos = ANY(%s) AND d.state = ANY(%s) "
    "AND d.consumer IN (SELECT name FROM consumer)"
)

LOCK_DELIVERIES = "SELECT 1 FROM delivery WHERE pos = ANY(%s) ORDER BY consumer, pos FOR UPDATE"

Candidate = tuple[int, str, str, int, str]

OUTBOX_TOMBSTONE = "SELECT flow_id, seq, body_hash FROM outbox_tombstone WHERE event_id = %s"

OUTBOX_FORGET = (
    "DELETE FROM outbox_tombstone WHERE event_id IN "
    "(SELECT event_id FROM outbox_tombstone WHERE pruned_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)"
)

OUTBOX_BURY = "INSERT INTO outbox_tombstone(event_id, flow_id, seq, body_hash, pruned_at) VALUES (%s, %s, %s, %s, %s)"

