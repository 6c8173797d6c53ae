"""The consumer file's SQL on SQLite: its statement table
(:class:`SqliteInboxSql`: the shared statements and SQLite's texts of those
that differ) and the statements only :mod:`.inbox` runs, named so tests can
check their plans and their status literals."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence

from ..._envelope import Envelope
from ...statuses import InboxState
from ..repository.statements import InboxSql
from ..rows import EFFECT_SELECT as _COLUMNS

__all__ = [
    "EFFECTS_PRUNABLE", "FLOW_AHEAD", "FORGET_HISTORY", "INBOX_PRUNABLE", "INSERT_MAX", "INSERT_NEW",
    "INSERT_NEW_RETURNING", "NEXT_ROW", "NEXT_ROW_AHEAD", "RETURNING", "SqliteInboxSql", "insert_chunks",
]

BLOCKED = InboxState.BLOCKED.value

# The hot queries, named so tests can check their plans use an index.
# NEXT_ROW answers "next row, gap or idle" in one probe: the first inbox row
# of the flow at or after last_seq + 1 (later rows exist only past a gap)
# that holds its slot (live = 1: not replaced).
# It reads up to NEXT_ROW_AHEAD rows: after the first is applied, the
# flow's next question (the row at or after its seq + 1) is already
# answered by the second, and so on, or by their absence when the read
# returned fewer, as long as no row of the flow is added or freed meanwhile.
NEXT_ROW_AHEAD = 4

NEXT_ROW = (
    "SELECT seq, event_id, body FROM inbox WHERE flow_id = ? AND seq >= ? AND live = 1 "
    f"ORDER BY seq LIMIT {NEXT_ROW_AHEAD}"
)

# An apply's first reads in one statement: the flow's projection (kind 0:
# state, last_seq, data) and NEXT_ROW's answer at last_seq + 1 (kind 1).
FLOW_AHEAD = (
    "SELECT 0, state, last_seq, data FROM projection WHERE flow_id = ?1 UNION ALL "
    "SELECT * FROM (SELECT 1, seq, event_id, body FROM inbox WHERE flow_id = ?1 "
    "AND seq >= coalesce((SELECT last_seq FROM projection WHERE flow_id = ?1), 0) + 1 AND live = 1 "
    f"ORDER BY seq LIMIT {NEXT_ROW_AHEAD})"
)

# The common receive in one statement: stored unless the id or the slot is
# taken, the id is tombstoned (a pruned event), or the seq is at or before
# the flow's last applied one (a slot a pruned row held).  Two key probes
# beyond the insert; every refusal is then explained by receive's slow path.
INSERT_NEW = (
    "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) SELECT ?1, ?2, ?3, ?4, ?5 "
    "WHERE NOT EXISTS (SELECT 1 FROM inbox_tombstone WHERE event_id = ?1) "
    "AND ?3 > coalesce((SELECT last_seq FROM projection WHERE flow_id = ?2), 0) ON CONFLICT DO NOTHING"
)

# SQLite 3.35 and later: INSERT ... RETURNING.
RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

# INSERT_NEW, answering (when it stored the row) the flow's projection row
# as it is (state, last_seq, data; NULLs when there is none), which the
# apply on arrival reads next.
INSERT_NEW_RETURNING = INSERT_NEW + (
    " RETURNING (SELECT state FROM projection WHERE flow_id = ?2), "
    "(SELECT last_seq FROM projection WHERE flow_id = ?2), (SELECT data FROM projection WHERE flow_id = ?2)"
)

# INSERT_NEW for many events at once: the same conditions per row, answering
# the ids it stored.  Rows of at most INSERT_MAX events, in power-of-two
# sizes, so only a few statement texts exist.
INSERT_MAX = 128


def _insert_many(size: int) -> str:
    rows = ",".join(["(?,?,?,?)"] * size)
    return (
        "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) "
        f"SELECT v.column1, v.column2, v.column3, v.column4, ?1 FROM (VALUES {rows}) v "
        "WHERE NOT EXISTS (SELECT 1 FROM inbox_tombstone t WHERE t.event_id = v.column1) "
        "AND v.column3 > coalesce((SELECT last_seq FROM projection p WHERE p.flow_id = v.column2), 0) "
        "ON CONFLICT DO NOTHING RETURNING event_id"
    )


def insert_chunks(envs: Sequence[Envelope]) -> Iterator[tuple[Sequence[Envelope], str]]:
    """The events in order, cut into power-of-two chunks, each with its statement."""
    start = 0
    while start < len(envs):
        size = INSERT_MAX
        while size > len(envs) - start:
            size //= 2
        yield envs[start:start + size], _insert_many(size)
        start += size


# Consumer: rows before the first received after the horizon (NULL
# received_at: before v3, old enough) that are done (applied, skipped,
# replaced) and at or before their flow's last applied seq.
INBOX_PRUNABLE = (
    "SELECT i.rowid, i.event_id, i.flow_id, i.seq, i.body FROM inbox i "
    "JOIN projection p ON p.flow_id = i.flow_id "
    "WHERE i.rowid < coalesce((SELECT rowid FROM inbox WHERE received_at > ? ORDER BY rowid LIMIT 1), "
    "9223372036854775807) "
    "AND i.state IN ('applied','skipped','replaced','superseded') AND i.seq <= p.last_seq ORDER BY i.rowid LIMIT ?"
)

# Finished effect-outbox rows (final, and fed when feedback was asked for),
# last written before the horizon; through the index by state.  ``dead`` and
# ``unknown`` wait for an operator and are kept.
EFFECTS_PRUNABLE = (
    "SELECT id FROM effect_outbox INDEXED BY effect_by_state "
    "WHERE state IN ('succeeded','expired','superseded','cancelled') AND updated_at <= ? "
    "AND (fed IS NULL OR fed = 1) ORDER BY state, id LIMIT ?"
)

FORGET_HISTORY = "DELETE FROM effect_history WHERE key = (SELECT key FROM effect_outbox WHERE id = ?)"



class SqliteInboxSql(InboxSql, param="?"):
    """The consumer side's statement table on SQLite."""

    ROWS_OF_FLOW = InboxSql.ROW + "WHERE flow_id = ? AND seq >= ? ORDER BY seq, live"
    # Only a change is written: re-examining an unchanged block then costs no
    # fsync (a transaction without writes commits for free).
    # blocked_at keeps the time the row first became blocked.
    BLOCK = (
        f"UPDATE inbox SET blocked_at = CASE WHEN state = '{BLOCKED}' THEN blocked_at ELSE ? END, "
        f"state = '{BLOCKED}', reason = ?, detail = ? "
        f"WHERE event_id = ? AND (state <> '{BLOCKED}' OR reason IS NOT ? OR detail IS NOT ?)"
    )
    # The predicates repeat the partial indexes' text, so SQLite uses them.
    DUE_EFFECTS = (
        f"SELECT {_COLUMNS} FROM effect_outbox e INDEXED BY effect_due "
        "WHERE e.state IN ('pending','running','in_doubt') AND e.due_at <= ? AND e.name IN ({names}) "
        "AND NOT (e.ordered = 1 AND EXISTS (SELECT 1 FROM effect_outbox p INDEXED BY effect_open_ordered "
        "WHERE p.flow_id = e.flow_id AND p.ordered = 1 "
        "AND p.state IN ('pending','running','in_doubt','dead','unknown') AND p.id < e.id)) "
        "ORDER BY e.due_at, e.id LIMIT ?"
    )
    DUE_EFFECTS_LOCKED = DUE_EFFECTS  # a unit holds the file's write lock
    # The earliest time DUE_EFFECTS will pick something up (same predicates, any time).
    NEXT_EFFECT_DUE = (
        "SELECT e.due_at FROM effect_outbox e INDEXED BY effect_due "
        "WHERE e.state IN ('pending','running','in_doubt') AND e.name IN ({names}) "
        "AND NOT (e.ordered = 1 AND EXISTS (SELECT 1 FROM effect_outbox p INDEXED BY effect_open_ordered "
        "WHERE p.flow_id = e.flow_id AND p.ordered = 1 "
        "AND p.state IN ('pending','running','in_doubt','dead','unknown') AND p.id < e.id)) "
        "ORDER BY e.due_at, e.id LIMIT 1"
    )
    # Rate limits count the starts (``claimed``) of a name in a window (index
    # effect_history_starts); caps count the claims still leased.
    EFFECT_STARTS = (
        "SELECT count(*), min(at), max(at) FROM effect_history INDEXED BY effect_history_starts "
        "WHERE name = ? AND transition = 'claimed' AND at > ?"
    )
    HELD_EFFECTS = (
        "SELECT name, count(*) FROM effect_outbox WHERE state IN ('running','in_doubt') AND lease_owner IS NOT NULL "
        "AND due_at > ? AND name IN ({names}) GROUP BY name"
    )
    # Through the expression index inbox_correlation (v7): the same
    # expression, and the index's own condition, so the planner may use it.
    FLOWS_BY_CORRELATION = (
        "SELECT DISTINCT flow_id FROM inbox WHERE json_extract(body, '$.meta.correlation_id') = ? "
        "AND json_extract(body, '$.meta.correlation_id') IS NOT NULL ORDER BY flow_id LIMIT ?"
    )
    # Owed feedback: a result, or a failure step (an unknown effect's once due).
    UNFED = (
        f"SELECT {_COLUMNS} FROM effect_outbox INDEXED BY effect_unfed WHERE fed = 0 "
        "AND (state IN ('succeeded','dead','cancelled','expired','superseded') OR (state = 'unknown' AND due_at <= ?)) "
        "ORDER BY id LIMIT ?"
    )
    # A scan, but of a table that forgetting keeps to the window's size.
    TOMBSTONE_FORGET = (
        "DELETE FROM inbox_tombstone WHERE event_id IN "
        "(SELECT event_id FROM inbox_tombstone WHERE pruned_at < ? LIMIT ?)"
    )
