"""The consumer's store on PostgreSQL: every SQL statement the consumer side runs.

:class:`PgInboxStore` owns the connection; :class:`PgInbox` is one view of
it, a unit of work inside :meth:`PgInboxStore.write` or a snapshot inside
:meth:`PgInboxStore.read`.

What a unit locks, until it ends: a new event is stored by one ``INSERT
... ON CONFLICT DO NOTHING`` (a racing twin waits on the unique key, then
stores nothing, and receive compares); when it was refused, receive's
slower reads lock what they read: ``body_of`` the event id, ``holder`` the
flow (advisory), ``unapplied`` the schema's room (so two receives never both
take the last place under ``max_inbox``).  ``flow_state`` (apply) locks
the flow and its projection row (``FOR UPDATE``), so two applies of one
flow take turns and the second sees the first's result.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ...envelope import Envelope
from ...statuses import BlockReason, EffectRecord, InboxEntry, InboxState
from ..records import FlowState, InboxCounts, NextRow
from ..shared import identity_problem
from .base import PgStore
from .connection import DEFAULT_LOCK_TIMEOUT, Conn, Database
from .effects import PgEffects
from .inbox_admin import PgInboxAdmin
from .location import Target, parse
from .retention import PgInboxRetention
from .schema import CONSUMER

__all__ = ["INSERT_NEW", "NEXT_ROW", "OPEN_FLOWS", "PgInbox", "PgInboxStore"]

_BLOCKED = InboxState.BLOCKED.value
_APPLIED = InboxState.APPLIED.value

NEXT_ROW = (
    "SELECT seq, event_id, body FROM inbox WHERE flow_id = %s AND seq >= %s AND live = 1 ORDER BY seq LIMIT 1"
)
OPEN_FLOWS = "SELECT DISTINCT flow_id FROM inbox WHERE state IN ('pending','blocked') ORDER BY flow_id"
_INSERT = "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) VALUES (%s, %s, %s, %s, %s)"
INSERT_NEW = (
    "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) SELECT %(id)s, %(flow)s, %(seq)s, %(body)s, %(at)s "
    "WHERE NOT EXISTS (SELECT 1 FROM inbox_tombstone WHERE event_id = %(id)s) "
    "AND %(seq)s > coalesce((SELECT last_seq FROM projection WHERE flow_id = %(flow)s), 0) ON CONFLICT DO NOTHING"
)
_UPSERT_PROJECTION = (
    "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, "
    "last_seq = excluded.last_seq, data = excluded.data, view = excluded.view"
)
_INBOX_COUNTS = "SELECT state, reason, count(*) FROM inbox GROUP BY state, reason"
_GAPS = (
    "SELECT count(*) FROM (SELECT flow_id, min(seq) AS first FROM inbox WHERE state IN ('pending','blocked') "
    "GROUP BY flow_id) o LEFT JOIN projection p ON p.flow_id = o.flow_id "
    "WHERE o.first > coalesce(p.last_seq, 0) + 1"
)
# Only a change is written; blocked_at keeps the time the row first became blocked.
_BLOCK = (
    f"UPDATE inbox SET blocked_at = CASE WHEN state = '{_BLOCKED}' THEN blocked_at ELSE %s END, "
    f"state = '{_BLOCKED}', reason = %s, detail = %s "
    f"WHERE event_id = %s AND (state <> '{_BLOCKED}' OR reason IS DISTINCT FROM %s OR detail IS DISTINCT FROM %s)"
)


class PgInbox(PgEffects, PgInboxAdmin, PgInboxRetention):
    """The consumer's tables, seen through one connection."""

    # -- receive --------------------------------------------------------------------

    def insert_new(self, env: Envelope, received_at: float | None = None) -> bool:
        """Store the event unless its id or its (flow, seq) is taken or pruned; True if stored."""
        return bool(self._run(INSERT_NEW, {
            "id": env.event_id, "flow": env.flow_id, "seq": env.seq, "body": env.body, "at": received_at,
        }))

    def insert(self, env: Envelope, received_at: float | None = None) -> None:
        self._run(_INSERT, (env.event_id, env.flow_id, env.seq, env.body, received_at))

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id holding (flow, seq), if any (a replaced row does not)."""
        self._lock("flow", flow_id)
        row = self._one("SELECT event_id FROM inbox WHERE flow_id = %s AND seq = %s AND live = 1", (flow_id, seq))
        return None if row is None else str(row[0])

    def unapplied(self, cap: int) -> int:
        """Rows still waiting (pending or blocked), counted up to ``cap``."""
        self._lock("room")
        row = self._one(
            "SELECT count(*) FROM (SELECT 1 FROM inbox WHERE state IN ('pending','blocked') LIMIT %s) t", (cap,)
        )
        return 0 if row is None else int(row[0])

    def last_seq(self, flow_id: str) -> int:
        row = self._one("SELECT last_seq FROM projection WHERE flow_id = %s", (flow_id,))
        return int(row[0]) if row else 0

    # -- apply ----------------------------------------------------------------------

    def flow_state(self, flow_id: str) -> FlowState | None:
        self._lock("flow", flow_id)
        lock = " FOR UPDATE" if self._writing else ""
        row = self._one("SELECT state, last_seq, data FROM projection WHERE flow_id = %s" + lock, (flow_id,))
        return None if row is None else FlowState(row[0], int(row[1]), json.loads(row[2]))

    def next_row(self, flow_id: str, seq: int) -> NextRow | None:
        row = self._one(NEXT_ROW, (flow_id, seq))
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]))

    def block(self, event_id: str, reason: BlockReason, detail: str | None = None,
              now: float | None = None) -> None:
        self._run(_BLOCK, (now, reason.value, detail, event_id, reason.value, detail))

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        self._run(_UPSERT_PROJECTION, (flow_id, state, seq, data, view))

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record, and its inbox row marked applied."""
        self._run(
            "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (%s, %s, %s, %s)", (event_id, flow_id, seq, kind)
        )
        self._run(
            f"UPDATE inbox SET state = '{_APPLIED}', reason = NULL, detail = NULL WHERE event_id = %s", (event_id,)
        )

    def open_flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows(OPEN_FLOWS)]

    # -- reads ----------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._rows("SELECT key, value FROM meta")}

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT state, last_seq, view FROM projection WHERE flow_id = %s", (flow_id,))
        if row is None:
            return None
        return {"state": row[0], "last_seq": int(row[1]), **json.loads(row[2])}

    def effects(self, flow_id: str) -> list[EffectRecord]:
        return [
            EffectRecord(r[0], r[1], int(r[2]), r[3])
            for r in self._rows(
                "SELECT event_id, flow_id, seq, kind FROM effect WHERE flow_id = %s ORDER BY id", (flow_id,)
            )
        ]

    def inbox(self, flow_id: str) -> list[InboxEntry]:
        return [
            InboxEntry(r[0], int(r[1]), InboxState(r[2]), None if r[3] is None else BlockReason(r[3]),
                       dict(json.loads(r[4]).get("meta", {})))
            for r in self._rows(
                "SELECT event_id, seq, state, reason, body FROM inbox WHERE flow_id = %s "
                "ORDER BY seq, live NULLS FIRST", (flow_id,)
            )
        ]

    def flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")]

    def projected_flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT flow_id FROM projection ORDER BY flow_id")]

    def inbox_counts(self) -> InboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        by_state: dict[str, int] = {}
        blocked: dict[str, int] = {}
        for state, reason, n in self._rows(_INBOX_COUNTS):
            by_state[state] = by_state.get(state, 0) + int(n)
            if state == _BLOCKED and reason is not None:
                blocked[reason] = blocked.get(reason, 0) + int(n)
        gaps = self._one(_GAPS)
        return InboxCounts(by_state, blocked, 0 if gaps is None else int(gaps[0]))


class PgInboxStore(PgStore[PgInbox]):
    """A consumer's store in a PostgreSQL schema: one connection, owned by
    the opening process and thread.

    ``location`` is a ``postgresql://`` string (schema as the fragment,
    default ``reliable_flow_consumer``) or a connection factory.  A new
    store records ``protocol``, ``name`` and a fresh ``uid``; an existing one
    must match ``protocol`` and, when given, ``name``.
    """

    def __init__(
        self, location: Target, protocol: str | None, *, name: str | None = None, default_name: str = "default",
        busy_timeout: float = DEFAULT_LOCK_TIMEOUT, readonly: bool = False, schema: str | None = None,
    ) -> None:
        def on_create(conn: Conn) -> None:
            conn.cursor().executemany(
                "INSERT INTO meta(key, value) VALUES (%s, %s)",
                [("protocol", protocol), ("name", name or default_name), ("uid", uuid.uuid4().hex)],
            )

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol, name)

        super().__init__(Database(
            parse(location, CONSUMER.name, schema), CONSUMER, lock_timeout=busy_timeout, on_create=on_create,
            check_meta=check_meta, readonly=readonly,
        ), PgInbox)
