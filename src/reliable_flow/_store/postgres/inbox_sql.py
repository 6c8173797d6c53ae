"""The consumer's SQL on PostgreSQL: its statement table
(:class:`PgInboxSql`: the shared statements, rendered with ``%s``, and
PostgreSQL's texts of those that differ) and the statements only
:mod:`.inbox` runs, named so tests can check their status literals."""

from __future__ import annotations

from ...statuses import InboxState
from ..repository.statements import InboxSql, rendered
from ..rows import EFFECT_SELECT as _COLUMNS
from .schema import CORRELATION_ID

__all__ = [
    "DELETE_EFFECTS", "DELETE_EFFECT_RECORDS", "DELETE_ROWS", "EFFECTS_PRUNABLE", "EFFECTS_PRUNABLE_READ", "EFFECT_FOR_UPDATE",
    "FLOW_AND_NEXT_ROW",
    "FLOW_FOR_UPDATE", "FORGET_HISTORY", "INBOX_PRUNABLE", "INBOX_PRUNABLE_READ", "INSERT_NEW", "INSERT_NEW_MANY", "MAX_POS", "NEXT_ROW",
    "ROW_OR_TOMBSTONE", "WAITING_BEHIND", "Candidate", "PgInboxSql",
]

BLOCKED = InboxState.BLOCKED.value

NEXT_ROW = (
    "SELECT seq, event_id, body FROM inbox WHERE flow_id = %s AND seq >= %s AND live = 1 ORDER BY seq LIMIT 1"
)

# The flow's projection row, locked, and its first live row after the
# projection's last seq (NEXT_ROW at last_seq + 1), in one statement.  It is
# sent after the flow's advisory lock (a statement of its own, so this one's
# snapshot is taken once the lock is granted); every writer of a projection
# row holds that lock, so the row lock never waits and the inbox row is read
# on the same snapshot as the projection.  One row, NULLs where either part
# is missing.
FLOW_AND_NEXT_ROW = (
    "WITH p AS (SELECT state, last_seq, data FROM projection WHERE flow_id = %s FOR UPDATE) "
    "SELECT p.state, p.last_seq, p.data, n.seq, n.event_id, n.body FROM (SELECT 1) AS one "
    "LEFT JOIN p ON true LEFT JOIN LATERAL (SELECT seq, event_id, body FROM inbox "
    "WHERE flow_id = %s AND seq >= coalesce(p.last_seq, 0) + 1 AND live = 1 ORDER BY seq LIMIT 1) n ON true"
)

INSERT_NEW = (
    "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) SELECT %(id)s, %(flow)s, %(seq)s, %(body)s, %(at)s "
    "WHERE NOT EXISTS (SELECT 1 FROM inbox_tombstone WHERE event_id = %(id)s) "
    "AND %(seq)s > coalesce((SELECT last_seq FROM projection WHERE flow_id = %(flow)s), 0) ON CONFLICT DO NOTHING"
)

# INSERT_NEW for a set of events at once, with each of its conditions per
# row (no tombstone of the id, a seq above the flow's last applied seq, and,
# by ON CONFLICT, neither the id nor a live row of the (flow, seq) taken):
# the ids stored come back.  Only for events with distinct ids and distinct
# (flow, seq), so no row of the set decides another's fate; rows go in in
# the order given (arrival follows it).
INSERT_NEW_MANY = (
    "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) SELECT n.id, n.flow, n.seq, n.body, %s::double precision "
    "FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[]) WITH ORDINALITY AS n(id, flow, seq, body, i) "
    "WHERE NOT EXISTS (SELECT 1 FROM inbox_tombstone t WHERE t.event_id = n.id) "
    "AND n.seq > coalesce((SELECT last_seq FROM projection p WHERE p.flow_id = n.flow), 0) "
    "ORDER BY n.i ON CONFLICT DO NOTHING RETURNING event_id"
)

# An event id's inbox row or its tombstone, in one read (one snapshot:
# pruning moves a row from one to the other in one transaction, so the read
# sees it in exactly one of them, or in neither): a leading true and ROW's
# columns, or false and the tombstone's flow_id, seq (where ROW has
# them) and body_hash (last).
ROW_OR_TOMBSTONE = (
    "SELECT true, event_id, flow_id, seq, state, reason, detail, received_at, blocked_at, body, NULL "
    "FROM inbox WHERE event_id = %s UNION ALL SELECT false, NULL, flow_id, seq, NULL, NULL, NULL, NULL, NULL, "
    "NULL, body_hash FROM inbox_tombstone WHERE event_id = %s"
)

WAITING_BEHIND = (
    "NOT (e.ordered = 1 AND EXISTS (SELECT 1 FROM effect_outbox p "
    "WHERE p.flow_id = e.flow_id AND p.ordered = 1 "
    "AND p.state IN ('pending','running','in_doubt','dead','unknown') AND p.id < e.id))"
)

MAX_POS = 9223372036854775807

# What a prune would take, read only (the dry run counts it), and locked.
INBOX_PRUNABLE_READ = (
    "SELECT i.arrival, i.event_id, i.flow_id, i.seq, i.body FROM inbox i "
    "JOIN projection p ON p.flow_id = i.flow_id "
    "WHERE i.arrival < coalesce((SELECT arrival FROM inbox WHERE received_at > %s ORDER BY arrival LIMIT 1), %s) "
    "AND i.state IN ('applied','skipped','replaced','superseded') AND i.seq <= p.last_seq ORDER BY i.arrival LIMIT %s"
)
INBOX_PRUNABLE = INBOX_PRUNABLE_READ + " FOR UPDATE OF i SKIP LOCKED"

EFFECTS_PRUNABLE_READ = (
    "SELECT id FROM effect_outbox "
    "WHERE state IN ('succeeded','expired','superseded','cancelled') AND updated_at <= %s "
    "AND (fed IS NULL OR fed = 1) ORDER BY state, id LIMIT %s"
)
EFFECTS_PRUNABLE = EFFECTS_PRUNABLE_READ + " FOR UPDATE SKIP LOCKED"

Candidate = tuple[int, str, str, int, str]

FORGET_HISTORY = "DELETE FROM effect_history WHERE key IN (SELECT key FROM effect_outbox WHERE id = ANY(%s))"
FLOW_FOR_UPDATE = rendered(InboxSql.FLOW, "%s") + " FOR UPDATE"
EFFECT_FOR_UPDATE = rendered(InboxSql.EFFECT, "%s") + " FOR UPDATE"
DELETE_EFFECT_RECORDS = "DELETE FROM effect WHERE event_id = ANY(%s)"
DELETE_ROWS = "DELETE FROM inbox WHERE event_id = ANY(%s)"
DELETE_EFFECTS = "DELETE FROM effect_outbox WHERE id = ANY(%s)"


class PgInboxSql(InboxSql, param="%s"):
    """The consumer side's statement table on PostgreSQL."""

    ROWS_OF_FLOW = InboxSql.ROW + "WHERE flow_id = %s AND seq >= %s ORDER BY seq, live NULLS FIRST"
    # Only a change is written; blocked_at keeps the time the row first became blocked.
    BLOCK = (
        f"UPDATE inbox SET blocked_at = CASE WHEN state = '{BLOCKED}' THEN blocked_at ELSE %s END, "
        f"state = '{BLOCKED}', reason = %s, detail = %s "
        f"WHERE event_id = %s AND (state <> '{BLOCKED}' OR reason IS DISTINCT FROM %s OR detail IS DISTINCT FROM %s)"
    )
    DUE_EFFECTS = (
        f"SELECT {_COLUMNS} FROM effect_outbox e "
        "WHERE e.state IN ('pending','running','in_doubt') AND e.due_at <= %s AND e.name = ANY({names}) "
        f"AND {WAITING_BEHIND} ORDER BY e.due_at, e.id LIMIT %s"
    )
    # In a unit the effects taken are locked, and those another claim holds skipped.
    DUE_EFFECTS_LOCKED = DUE_EFFECTS + " FOR UPDATE OF e SKIP LOCKED"
    NEXT_EFFECT_DUE = (
        "SELECT e.due_at FROM effect_outbox e "
        "WHERE e.state IN ('pending','running','in_doubt') AND e.name = ANY({names}) "
        f"AND {WAITING_BEHIND} ORDER BY e.due_at, e.id LIMIT 1"
    )
    # Rate limits count the starts (``claimed``) of a name in a window (index
    # effect_history_starts); caps count the claims still leased.
    EFFECT_STARTS = (
        "SELECT count(*), min(at), max(at) FROM effect_history WHERE name = %s AND transition = 'claimed' AND at > %s"
    )
    HELD_EFFECTS = (
        "SELECT name, count(*) FROM effect_outbox WHERE state IN ('running','in_doubt') AND lease_owner IS NOT NULL "
        "AND due_at > %s AND name = ANY({names}) GROUP BY name"
    )
    # Owed feedback: a result, or a failure step (an unknown effect's once due).
    UNFED = (f"SELECT {_COLUMNS} FROM effect_outbox WHERE fed = 0 AND (state IN ('succeeded','dead','cancelled',"
             "'expired','superseded') OR (state = 'unknown' AND due_at <= %s)) ORDER BY id LIMIT %s")
    TOMBSTONE_FORGET = (
        "DELETE FROM inbox_tombstone WHERE event_id IN "
        "(SELECT event_id FROM inbox_tombstone WHERE pruned_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)"
    )
    # Through the expression index inbox_correlation (v4): the same
    # expression, compared with the id's JSON text (to_json writes a string
    # as the envelope's encoder does: the same escapes, non-ASCII as it is).
    FLOWS_BY_CORRELATION = (
        f"SELECT DISTINCT flow_id FROM inbox WHERE {CORRELATION_ID} = to_json(%s::text)::text "
        "ORDER BY flow_id LIMIT %s"
    )
