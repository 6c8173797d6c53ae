"""The consumer file on SQLite: every SQL statement the consumer side runs.

:class:`SqliteInboxStore` owns the connection; :class:`SqliteInbox` is one
view of it, a unit of work inside :meth:`SqliteInboxStore.write` or a
consistent snapshot inside :meth:`SqliteInboxStore.read`.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

from ...envelope import Envelope
from ...statuses import BlockReason, EffectRecord, InboxEntry, InboxState
from ..records import FlowState, InboxCounts, NextRow, PruneStep
from ..shared import identity_problem
from .base import SqliteStore
from .connection import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .effects import SqliteEffects
from .inbox_admin import SqliteInboxAdmin
from .retention import SqliteInboxRetention
from .schema import CONSUMER

__all__ = ["INSERT_NEW", "NEXT_ROW", "OPEN_FLOWS", "SqliteInbox", "SqliteInboxStore"]

_BLOCKED = InboxState.BLOCKED.value
_APPLIED = InboxState.APPLIED.value

# The hot queries, named so tests can check their plans use an index.
# NEXT_ROW answers "next row, gap or idle" in one probe: the first inbox row
# of the flow at or after last_seq + 1 (later rows exist only past a gap)
# that holds its slot (live = 1: not replaced).
# It reads two rows: after the first is applied, the flow's next question
# (the row at or after its seq + 1) is already answered by the second, or by
# its absence, as long as no row of the flow is added or freed meanwhile.
NEXT_ROW = "SELECT seq, event_id, body FROM inbox WHERE flow_id = ? AND seq >= ? AND live = 1 ORDER BY seq LIMIT 2"
OPEN_FLOWS = "SELECT DISTINCT flow_id FROM inbox WHERE state IN ('pending','blocked') ORDER BY flow_id"
_INSERT = "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) VALUES (?, ?, ?, ?, ?)"
# The common receive in one statement: stored unless the id or the slot is
# taken, the id is tombstoned (a pruned event), or the seq is at or before
# the flow's last applied one (a slot a pruned row held).  Two key probes
# beyond the insert; every refusal is then explained by receive's slow path.
INSERT_NEW = (
    "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) SELECT ?1, ?2, ?3, ?4, ?5 "
    "WHERE NOT EXISTS (SELECT 1 FROM inbox_tombstone WHERE event_id = ?1) "
    "AND ?3 > coalesce((SELECT last_seq FROM projection WHERE flow_id = ?2), 0) ON CONFLICT DO NOTHING"
)
_UPSERT_PROJECTION = (
    "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, "
    "last_seq = excluded.last_seq, data = excluded.data, view = excluded.view"
)
# Metrics.  A flow is at a gap when its first row still waiting (pending or
# blocked) is past last_seq + 1.
_INBOX_COUNTS = "SELECT state, reason, count(*) FROM inbox GROUP BY state, reason"
_GAPS = (
    "SELECT count(*) FROM (SELECT flow_id, min(seq) AS first FROM inbox WHERE state IN ('pending','blocked') "
    "GROUP BY flow_id) o LEFT JOIN projection p ON p.flow_id = o.flow_id "
    "WHERE o.first > coalesce(p.last_seq, 0) + 1"
)
# Only a change is written: re-examining an unchanged block then costs no
# fsync (a transaction without writes commits for free).
# blocked_at keeps the time the row first became blocked.
_BLOCK = (
    f"UPDATE inbox SET blocked_at = CASE WHEN state = '{_BLOCKED}' THEN blocked_at ELSE ? END, "
    f"state = '{_BLOCKED}', reason = ?, detail = ? "
    f"WHERE event_id = ? AND (state <> '{_BLOCKED}' OR reason IS NOT ? OR detail IS NOT ?)"
)


class SqliteInbox(SqliteEffects, SqliteInboxAdmin, SqliteInboxRetention):
    """The consumer file's tables, seen through one connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # (flow, seq, answer): what next_row(flow, seq) will answer, read
        # ahead by the previous next_row of this unit (see NEXT_ROW).
        self._ahead: tuple[str, int, NextRow | None] | None = None

    # -- receive --------------------------------------------------------------------

    def insert_new(self, env: Envelope, received_at: float | None = None) -> bool:
        """Store the event unless its id or its (flow, seq) is taken or pruned; True if stored."""
        self._ahead = None
        return bool(self._conn.execute(INSERT_NEW,
                                       (env.event_id, env.flow_id, env.seq, env.body, received_at)).rowcount)

    def insert(self, env: Envelope, received_at: float | None = None) -> None:
        self._ahead = None
        self._conn.execute(_INSERT, (env.event_id, env.flow_id, env.seq, env.body, received_at))

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id holding (flow, seq), if any (a replaced row does not)."""
        row = self._conn.execute(
            "SELECT event_id FROM inbox WHERE flow_id = ? AND seq = ? AND live = 1", (flow_id, seq)
        ).fetchone()
        return None if row is None else str(row[0])

    def unapplied(self, cap: int) -> int:
        """Rows still waiting (pending or blocked), counted up to ``cap``."""
        return int(self._conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM inbox WHERE state IN ('pending','blocked') LIMIT ?)", (cap,)
        ).fetchone()[0])

    def last_seq(self, flow_id: str) -> int:
        row = self._conn.execute("SELECT last_seq FROM projection WHERE flow_id = ?", (flow_id,)).fetchone()
        return int(row[0]) if row else 0

    # -- apply ----------------------------------------------------------------------

    def flow_state(self, flow_id: str) -> FlowState | None:
        row = self._conn.execute(
            "SELECT state, last_seq, data FROM projection WHERE flow_id = ?", (flow_id,)
        ).fetchone()
        return None if row is None else FlowState(row[0], row[1], json.loads(row[2]))

    def next_row(self, flow_id: str, seq: int) -> NextRow | None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == flow_id and ahead[1] == seq:
            return ahead[2]
        rows: list[NextRow] = self._conn.execute(NEXT_ROW, (flow_id, seq)).fetchall()
        if not rows:
            return None
        first = rows[0]
        # Applying `first` (writes to its own row and the projection only)
        # leaves the rows after it as they are: the next question's answer.
        self._ahead = (flow_id, first[0] + 1, rows[1] if len(rows) > 1 else None)
        return first

    # Writes that can add, free or remove a flow's rows forget what was read ahead.
    def set_skipped(self, event_id: str) -> None:
        self._ahead = None
        super().set_skipped(event_id)

    def set_replaced(self, event_id: str) -> None:
        self._ahead = None
        super().set_replaced(event_id)

    def user_execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._ahead = None
        return super().user_execute(sql, params)

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        self._ahead = None
        return super().prune_step(horizon, now, limit)

    def block(self, event_id: str, reason: BlockReason, detail: str | None = None,
              now: float | None = None) -> None:
        self._conn.execute(_BLOCK, (now, reason.value, detail, event_id, reason.value, detail))

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        self._conn.execute(_UPSERT_PROJECTION, (flow_id, state, seq, data, view))

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record, and its inbox row marked applied."""
        self._conn.execute(
            "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (?, ?, ?, ?)", (event_id, flow_id, seq, kind)
        )
        self._conn.execute(
            f"UPDATE inbox SET state = '{_APPLIED}', reason = NULL, detail = NULL WHERE event_id = ?", (event_id,)
        )

    def open_flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute(OPEN_FLOWS)]

    # -- reads ----------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT state, last_seq, view FROM projection WHERE flow_id = ?", (flow_id,)
        ).fetchone()
        if row is None:
            return None
        return {"state": row[0], "last_seq": row[1], **json.loads(row[2])}

    def effects(self, flow_id: str) -> list[EffectRecord]:
        return [
            EffectRecord(*r)
            for r in self._conn.execute(
                "SELECT event_id, flow_id, seq, kind FROM effect WHERE flow_id = ? ORDER BY id", (flow_id,)
            )
        ]

    def inbox(self, flow_id: str) -> list[InboxEntry]:
        return [
            InboxEntry(r[0], r[1], InboxState(r[2]), None if r[3] is None else BlockReason(r[3]),
                       dict(json.loads(r[4]).get("meta", {})))
            for r in self._conn.execute(
                "SELECT event_id, seq, state, reason, body FROM inbox WHERE flow_id = ? ORDER BY seq, live", (flow_id,)
            )
        ]

    def flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")]

    def projected_flows(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT flow_id FROM projection ORDER BY flow_id")]

    def inbox_counts(self) -> InboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        by_state: dict[str, int] = {}
        blocked: dict[str, int] = {}
        for state, reason, n in self._conn.execute(_INBOX_COUNTS):
            by_state[state] = by_state.get(state, 0) + int(n)
            if state == _BLOCKED and reason is not None:
                blocked[reason] = blocked.get(reason, 0) + int(n)
        return InboxCounts(by_state, blocked, int(self._conn.execute(_GAPS).fetchone()[0]))


class SqliteInboxStore(SqliteStore[SqliteInbox]):
    """A consumer file on local disk: one connection, owned by the opening process.

    A new file records ``protocol``, ``name`` and a fresh ``uid``; an
    existing one must match ``protocol`` and, when given, ``name``.
    ``readonly`` opens it ``mode=ro`` and never writes.
    """

    def __init__(
        self, path: PathLike, protocol: str | None, *, name: str | None = None, default_name: str = "default",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT, readonly: bool = False,
    ) -> None:
        def on_create(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [("protocol", protocol), ("name", name or default_name), ("uid", uuid.uuid4().hex)],
            )

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol, name)

        super().__init__(Database(
            path, CONSUMER, busy_timeout=busy_timeout, on_create=on_create, check_meta=check_meta,
            readonly=readonly,
        ), SqliteInbox)
