"""The producer's SQL on PostgreSQL: its statement table
(:class:`PgOutboxSql`: the shared statements, rendered with ``%s``, and
PostgreSQL's texts of those that differ) and the statements only
:mod:`.outbox` runs, named so tests can check their status literals."""

from __future__ import annotations

from ...statuses import DeliveryState
from ..repository.statements import OutboxSql, rendered

__all__ = [
    "APPEND", "BACKLOG", "CLAIM", "FIND_EVENT", "FLOW_FOR_UPDATE", "LOCK_DELIVERIES", "MAX_POS", "OUTBOX_PRUNABLE", "OUTBOX_PRUNABLE_READ",
    "STILL_WAITING", "UPSERT_FLOW", "WAITING", "Candidate", "PgOutboxSql",
]

# An event id's stored event and its tombstone, in one read (one snapshot:
# pruning moves an event from one to the other in one transaction, so the
# read sees it in exactly one of them, or in neither).
FIND_EVENT = (
    "SELECT true, pos, seq, body, NULL, NULL FROM outbox WHERE event_id = %s "
    "UNION ALL SELECT false, NULL, seq, NULL, flow_id, body_hash FROM outbox_tombstone WHERE event_id = %s"
)

FLOW_FOR_UPDATE = rendered(OutboxSql.FLOW, "%s") + " FOR UPDATE"

# Pending deliveries summed over consumers, or events before any consumer; up to %s.
BACKLOG = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM consumer) "
    "THEN (SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT %s) t) "
    "ELSE (SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT %s) t) END"
)

# The flow's new row, and a notification of its id on the schema's channel
# (reliable_flow._store.watch.channel), sent when the transaction commits: what ``wait`` hears.
UPSERT_FLOW = (
    "WITH f AS (INSERT INTO flow(flow_id, seq, state, data) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data "
    "RETURNING flow_id) SELECT pg_notify(%s, flow_id) FROM f"
)

APPEND = (
    "WITH e AS (INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (%s, %s, %s, %s, %s) "
    "RETURNING pos) INSERT INTO delivery(consumer, pos) SELECT c.name, e.pos FROM consumer c CROSS JOIN e "
    "WHERE c.topics IS NULL"
)

CLAIM = (
    "UPDATE delivery SET due_at = %s, lease_owner = %s, updated_at = %s WHERE consumer = %s AND pos = ANY(%s)"
)

WAITING = [DeliveryState.PENDING.value, DeliveryState.SET_ASIDE.value]

MAX_POS = 9223372036854775807

# What a prune would take, read only (the dry run counts it).
OUTBOX_PRUNABLE_READ = (
    "SELECT o.pos, o.event_id, o.flow_id, o.seq, o.body FROM outbox o "
    "WHERE o.pos < coalesce((SELECT pos FROM outbox WHERE committed_at > %s ORDER BY pos LIMIT 1), %s) "
    "AND o.pos > %s AND NOT EXISTS (SELECT 1 FROM delivery d JOIN consumer c ON c.name = d.consumer "
    "WHERE d.pos = o.pos AND d.state = ANY(%s)) ORDER BY o.pos LIMIT %s"
)
OUTBOX_PRUNABLE = OUTBOX_PRUNABLE_READ + " FOR UPDATE OF o SKIP LOCKED"

# The deliveries of the candidates, locked and read again after the lock.
STILL_WAITING = (
    "SELECT DISTINCT d.pos FROM delivery d WHERE d.pos = ANY(%s) AND d.state = ANY(%s) "
    "AND d.consumer IN (SELECT name FROM consumer)"
)

LOCK_DELIVERIES = "SELECT 1 FROM delivery WHERE pos = ANY(%s) ORDER BY consumer, pos FOR UPDATE"

Candidate = tuple[int, str, str, int, str]

_DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o JOIN delivery d ON d.pos = o.pos "
)


class PgOutboxSql(OutboxSql, param="%s"):
    """The producer side's statement table on PostgreSQL."""

    NEXT_DUE = (
        "SELECT d.pos, o.body, d.prev_seq FROM delivery d JOIN outbox o ON o.pos = d.pos "
        "WHERE d.consumer = %s AND d.state = 'pending' AND d.due_at <= %s ORDER BY d.pos LIMIT %s"
    )
    NEXT_DUE_AT = "SELECT min(due_at) FROM delivery WHERE consumer = %s AND state = 'pending'"
    # In a unit the guarding reads lock their rows (READ COMMITTED holds nothing
    # by itself): a relay's claim skips the deliveries another claim holds.
    NEXT_DUE_LOCKED = NEXT_DUE + " FOR UPDATE OF d SKIP LOCKED"
    PENDING_FAILURES_LOCKED = rendered(OutboxSql.PENDING_FAILURES, "%s") + " FOR UPDATE"
    DELIVERY_STATE_LOCKED = rendered(OutboxSql.DELIVERY_STATE, "%s") + " FOR UPDATE OF d"
    DELIVERY_COUNTS = (
        "SELECT consumer, state, count(*), coalesce(sum(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), 0), "
        "count(*) FILTER (WHERE failures > 0), count(*) FILTER (WHERE lease_owner IS NOT NULL AND due_at > %s), "
        "count(*) FILTER (WHERE attempts = 0), min(updated_at) "
        "FROM delivery GROUP BY consumer, state ORDER BY consumer, state"
    )
    DELIVERIES = _DELIVERIES + "ORDER BY d.pos, d.consumer"
    DELIVERIES_OF_FLOW = _DELIVERIES + "WHERE o.flow_id = %s ORDER BY d.pos, d.consumer"
    CONSUMERS = (
        "SELECT c.name, c.uid, c.registered_at, c.from_pos, "
        "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'pending'), "
        "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'set_aside'), "
        "c.topics, c.topics_from FROM consumer c ORDER BY c.name"
    )
    # Through the partial index of pending work (delivery_due), as SQLite.
    PENDING_SUMMARY = (
        "SELECT count(*), coalesce(sum(CASE WHEN lease_owner IS NOT NULL AND due_at > %s THEN 1 ELSE 0 END), 0) "
        "FROM (SELECT lease_owner, due_at FROM delivery WHERE consumer = %s AND state = 'pending' LIMIT %s) t"
    )
    OLDEST_PENDING = (
        "SELECT o.committed_at FROM delivery d JOIN outbox o ON o.pos = d.pos "
        "WHERE d.consumer = %s AND d.state = 'pending' ORDER BY d.pos LIMIT 1"
    )
    TOMBSTONE_FORGET = (
        "DELETE FROM outbox_tombstone WHERE event_id IN "
        "(SELECT event_id FROM outbox_tombstone WHERE pruned_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)"
    )
