"""The producer's SQL on PostgreSQL: every statement text the producer side
runs (:mod:`.outbox` runs them), named so tests can check their status
literals."""

from __future__ import annotations

from ...statuses import DeliveryState

__all__ = [
    "ACCEPTED", "ADD_META", "ANY_CONSUMER", "APPEND", "BACKLOG", "BIND", "BOUND_UID", "CLAIM", "CONSUMERS", "CONSUMER_NAMES",
    "COUNT_EVENTS", "COUNT_FLOWS", "DELIVERIES", "DELIVERIES_OF_FLOW", "DELIVERY_COUNTS", "DELIVERY_STATE",
    "DELIVERY_STATE_LOCKED", "EVENTS", "EVENTS_OF_FLOW", "FIND_EVENT", "FLOW", "FLOWS", "FLOW_FOR_UPDATE",
    "FORGET_DELIVERIES_OF", "IS_REGISTERED", "LOCK_DELIVERIES", "MARK_CONFLICT", "MARK_DELIVERED", "MAX_POS",
    "META_VALUE", "NEXT_DUE", "NEXT_DUE_AT", "NEXT_DUE_LOCKED", "OPERATOR_ACTIONS", "OPERATOR_ACTIONS_OF_EVENT",
    "OUTBOX_PRUNABLE", "PENDING", "PENDING_FAILURES", "PENDING_FAILURES_LOCKED", "PENDING_FOR_ALL",
    "RECORD_ACTION", "RECORD_PRUNE", "RECORD_REGISTRY_ACTION", "REGISTER", "REGISTRY_ACTIONS",
    "REGISTRY_ACTIONS_OF", "REMOVE_CONSUMER", "RESOLVE", "SET_ASIDE", "SET_RETRY", "STILL_WAITING", "TOMBSTONE",
    "TOMBSTONE_BURY", "TOMBSTONE_FORGET", "UPSERT_FLOW", "WAITING", "Candidate",
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

# The flow's new row, and a notification of its id on the schema's channel
# (reliable_flow._store.watch.channel), sent when the transaction commits: what ``wait`` hears.
UPSERT_FLOW = (
    "WITH f AS (INSERT INTO flow(flow_id, seq, state, data) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data "
    "RETURNING flow_id) SELECT pg_notify(%s, flow_id) FROM f"
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

_DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o JOIN delivery d ON d.pos = o.pos "
)
DELIVERIES = _DELIVERIES + "ORDER BY d.pos, d.consumer"
DELIVERIES_OF_FLOW = _DELIVERIES + "WHERE o.flow_id = %s ORDER BY d.pos, d.consumer"

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

TOMBSTONE = "SELECT flow_id, seq, body_hash FROM outbox_tombstone WHERE event_id = %s"

TOMBSTONE_FORGET = (
    "DELETE FROM outbox_tombstone WHERE event_id IN "
    "(SELECT event_id FROM outbox_tombstone WHERE pruned_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)"
)

TOMBSTONE_BURY = "INSERT INTO outbox_tombstone(event_id, flow_id, seq, body_hash, pruned_at) VALUES (%s, %s, %s, %s, %s)"

RECORD_PRUNE = "INSERT INTO prune_action(at, horizon, events, deliveries) VALUES (%s, %s, %s, %s)"

# The plain reads and writes (the shared repository's: see
# reliable_flow._store.repository.outbox.OutboxSql).
META_VALUE = "SELECT value FROM meta WHERE key = %s"
ADD_META = "INSERT INTO meta(key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING"
FLOWS = "SELECT flow_id FROM flow ORDER BY flow_id"
EVENTS = "SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o ORDER BY o.pos"
EVENTS_OF_FLOW = "SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o WHERE o.flow_id = %s ORDER BY o.pos"
COUNT_EVENTS = "SELECT count(*) FROM outbox"
COUNT_FLOWS = "SELECT count(*) FROM flow"
CONSUMER_NAMES = "SELECT name FROM consumer ORDER BY name"
OPERATOR_ACTIONS = "SELECT at, consumer, event_id, action, actor, reason FROM operator_action ORDER BY id"
OPERATOR_ACTIONS_OF_EVENT = (
    "SELECT at, consumer, event_id, action, actor, reason FROM operator_action WHERE event_id = %s ORDER BY id"
)
RECORD_ACTION = (
    "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) VALUES (%s, %s, %s, %s, %s, %s)"
)
REGISTRY_ACTIONS = "SELECT at, consumer, action, actor, reason FROM registry_action ORDER BY id"
REGISTRY_ACTIONS_OF = (
    "SELECT at, consumer, action, actor, reason FROM registry_action WHERE consumer = %s ORDER BY id"
)
RECORD_REGISTRY_ACTION = (
    "INSERT INTO registry_action(at, consumer, action, actor, reason) VALUES (%s, %s, %s, %s, %s)"
)
ANY_CONSUMER = "SELECT 1 FROM consumer LIMIT 1"
IS_REGISTERED = "SELECT 1 FROM consumer WHERE name = %s"
BOUND_UID = "SELECT uid FROM consumer WHERE name = %s"
BIND = "UPDATE consumer SET uid = %s WHERE name = %s AND uid IS NULL"
FORGET_DELIVERIES_OF = "DELETE FROM delivery WHERE consumer = %s"
REMOVE_CONSUMER = "DELETE FROM consumer WHERE name = %s"
SET_RETRY = (
    "UPDATE delivery SET attempts = attempts + 1, failures = %s, due_at = %s, lease_owner = NULL, "
    "last_error = %s, updated_at = %s WHERE consumer = %s AND pos = %s"
)
RESOLVE = (
    "UPDATE delivery SET state = %s, due_at = 0, failures = 0, lease_owner = NULL, updated_at = %s "
    "WHERE consumer = %s AND pos = %s"
)
CLAIM = (
    "UPDATE delivery SET due_at = %s, lease_owner = %s, updated_at = %s WHERE consumer = %s AND pos = ANY(%s)"
)
# In a unit the guarding reads lock their rows (READ COMMITTED holds nothing
# by itself): a relay's claim skips the deliveries another claim holds.
NEXT_DUE_LOCKED = NEXT_DUE + " FOR UPDATE OF d SKIP LOCKED"
PENDING_FAILURES = "SELECT failures FROM delivery WHERE consumer = %s AND pos = %s AND state = %s"
PENDING_FAILURES_LOCKED = PENDING_FAILURES + " FOR UPDATE"
DELIVERY_STATE = (
    "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos WHERE o.event_id = %s AND d.consumer = %s"
)
DELIVERY_STATE_LOCKED = DELIVERY_STATE + " FOR UPDATE OF d"
