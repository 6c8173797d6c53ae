"""The producer's store on PostgreSQL: every SQL statement the producer side runs.

:class:`PgOutboxStore` owns the connection; :class:`PgOutbox` is one view of
it, a unit of work inside :meth:`PgOutboxStore.write` or a snapshot inside
:meth:`PgOutboxStore.read`.

What a unit locks (READ COMMITTED holds nothing by itself), all until it ends:

* ``find_event``: the event id (advisory), so a retry racing its original
  waits and then finds it (``existing``), as on SQLite;
* ``flow_state``: the flow (advisory, which also covers a flow's first
  event, when there is no row yet) and its row (``FOR UPDATE``);
* ``backlog``: one advisory lock per schema, so two writers never both pass
  a ``max_backlog`` check that only one of them fits under;
* ``append_event``: the registry lock in shared mode (see :mod:`.registry`);
* ``next_due`` in a unit (a relay's claim): the deliveries it picks,
  ``FOR UPDATE SKIP LOCKED``, so two relays never claim the same one;
* ``pending_failures`` / ``delivery_state``: the delivery row.

Lock order is event, flow, backlog, registry, rows; a batch that takes them
for many events may still meet another batch in a cycle, which PostgreSQL
breaks by aborting one (:class:`DatabaseBusy`, nothing written).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...delivery import Retry
from ...envelope import Envelope
from ...statuses import DeliveryRecord, DeliveryState, OperatorAction, OutboxEntry
from ..records import DeliveryCounts, FlowState, OutboxCounts, StoredEvent
from ..shared import delivery_summary, identity_problem
from .base import PgStore
from .connection import DEFAULT_LOCK_TIMEOUT, Conn, Database
from .location import Target, parse
from .registry import REGISTRY_LOCK, PgRegistry
from .retention import PgOutboxRetention
from .schema import PRODUCER

__all__ = ["NEXT_DUE", "NEXT_DUE_AT", "NEXT_DUE_BODY", "PgOutbox", "PgOutboxStore"]

_PENDING = DeliveryState.PENDING.value
_ACCEPTED = DeliveryState.ACCEPTED.value
_SET_ASIDE = DeliveryState.SET_ASIDE.value

NEXT_DUE = (
    "SELECT pos FROM delivery WHERE consumer = %s AND state = 'pending' AND due_at <= %s ORDER BY pos LIMIT %s"
)
NEXT_DUE_BODY = (
    "SELECT d.pos, o.body FROM delivery d JOIN outbox o ON o.pos = d.pos "
    "WHERE d.consumer = %s AND d.state = 'pending' AND d.due_at <= %s ORDER BY d.pos LIMIT 1"
)
NEXT_DUE_AT = "SELECT min(due_at) FROM delivery WHERE consumer = %s AND state = 'pending'"
_UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)
_APPEND = (
    "WITH e AS (INSERT INTO outbox(event_id, flow_id, seq, body, committed_at) VALUES (%s, %s, %s, %s, %s) "
    "RETURNING pos) INSERT INTO delivery(consumer, pos) SELECT c.name, e.pos FROM consumer c CROSS JOIN e"
)
_MARK_DELIVERED = (
    f"UPDATE delivery SET state = '{_ACCEPTED}', last_status = %s, attempts = attempts + 1, "
    "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = %s WHERE consumer = %s AND pos = %s"
)
# A conflict never turns into "accepted", and never undoes one.
_MARK_CONFLICT = (
    f"UPDATE delivery SET state = CASE state WHEN '{_ACCEPTED}' THEN state ELSE '{_SET_ASIDE}' END, "
    "last_status = %s, attempts = attempts + 1, lease_owner = NULL, updated_at = %s "
    "WHERE consumer = %s AND pos = %s"
)
_DELIVERY_COUNTS = (
    "SELECT consumer, state, count(*), coalesce(sum(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), 0), "
    "count(*) FILTER (WHERE failures > 0), count(*) FILTER (WHERE lease_owner IS NOT NULL AND due_at > %s), "
    "count(*) FILTER (WHERE attempts = 0), min(updated_at) "
    "FROM delivery GROUP BY consumer, state ORDER BY consumer, state"
)
_DELIVERIES = (
    "SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at, d.lease_owner "
    "FROM outbox o JOIN delivery d ON d.pos = o.pos "
)


class PgOutbox(PgRegistry, PgOutboxRetention):
    """The producer's tables, seen through one connection."""

    # -- advance ----------------------------------------------------------------

    def find_event(self, event_id: str) -> StoredEvent | None:
        self._lock("event", event_id)
        row = self._one("SELECT pos, seq, body FROM outbox WHERE event_id = %s", (event_id,))
        return None if row is None else StoredEvent(int(row[0]), int(row[1]), str(row[2]))

    def flow_state(self, flow_id: str) -> FlowState | None:
        self._lock("flow", flow_id)
        lock = " FOR UPDATE" if self._writing else ""
        row = self._one("SELECT state, seq, data FROM flow WHERE flow_id = %s" + lock, (flow_id,))
        return None if row is None else FlowState(row[0], int(row[1]), json.loads(row[2]))

    def backlog(self, cap: int) -> int:
        """Pending deliveries summed over consumers, or events before any consumer; counts stop at ``cap``."""
        self._lock("backlog")
        if self._one("SELECT 1 FROM consumer LIMIT 1") is None:
            row = self._one("SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT %s) t", (cap,))
        else:
            row = self._one(
                "SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT %s) t", (cap,)
            )
        return 0 if row is None else int(row[0])

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        self._run(_UPSERT_FLOW, (flow_id, seq, state, data))

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """The event, pending for every consumer registered when it commits."""
        self._lock(REGISTRY_LOCK, shared=True)
        self._run(_APPEND, (env.event_id, env.flow_id, env.seq, env.body, committed_at))

    # -- consumers and deliveries ---------------------------------------------------

    def next_due(self, consumer: str, horizon: float, limit: int) -> list[int]:
        """Positions of the oldest pending deliveries due at ``horizon``; in a
        unit, locked, skipping those another unit holds (being claimed)."""
        lock = " FOR UPDATE SKIP LOCKED" if self._writing else ""
        return [int(r[0]) for r in self._rows(NEXT_DUE + lock, (consumer, horizon, limit))]

    def next_due_body(self, consumer: str, horizon: float) -> tuple[int, str] | None:
        lock = " FOR UPDATE OF d SKIP LOCKED" if self._writing else ""
        row = self._one(NEXT_DUE_BODY + lock, (consumer, horizon))
        return None if row is None else (int(row[0]), str(row[1]))

    def next_due_at(self, consumer: str) -> float | None:
        row = self._one(NEXT_DUE_AT, (consumer,))
        return None if row is None or row[0] is None else float(row[0])

    def body_at(self, pos: int) -> str | None:
        row = self._one("SELECT body FROM outbox WHERE pos = %s", (pos,))
        return None if row is None else str(row[0])

    def bodies(self, positions: Sequence[int]) -> dict[int, str]:
        if not positions:
            return {}
        return {int(p): str(b) for p, b in self._rows(
            "SELECT pos, body FROM outbox WHERE pos = ANY(%s)", ([int(p) for p in positions],)
        )}

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        if positions:
            self._run(
                "UPDATE delivery SET due_at = %s, lease_owner = %s, updated_at = %s "
                "WHERE consumer = %s AND pos = ANY(%s)",
                (until, owner, now, consumer, [int(p) for p in positions]),
            )

    def pending_failures(self, consumer: str, pos: int) -> int | None:
        """Consecutive failures of a delivery that is still pending, else None."""
        lock = " FOR UPDATE" if self._writing else ""
        row = self._one(
            "SELECT failures FROM delivery WHERE consumer = %s AND pos = %s AND state = %s" + lock,
            (consumer, pos, _PENDING),
        )
        return None if row is None else int(row[0])

    def set_retry(self, consumer: str, pos: int, retry: Retry, now: float) -> None:
        self._run(
            "UPDATE delivery SET attempts = attempts + 1, failures = %s, due_at = %s, lease_owner = NULL, "
            "last_error = %s, updated_at = %s WHERE consumer = %s AND pos = %s",
            (retry.failures, retry.due_at, retry.error, now, consumer, pos),
        )

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` become accepted, ``conflicts`` set aside."""
        cur = self._conn.cursor()
        if delivered:
            cur.executemany(_MARK_DELIVERED, [(status, now, consumer, pos) for pos, status in delivered])
        if conflicts:
            cur.executemany(_MARK_CONFLICT, [(status, now, consumer, pos) for pos, status in conflicts])

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        lock = " FOR UPDATE OF d" if self._writing else ""
        row = self._one(
            "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos "
            "WHERE o.event_id = %s AND d.consumer = %s" + lock,
            (event_id, consumer),
        )
        return None if row is None else (int(row[0]), DeliveryState(row[1]))

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        """An operator's decision: the delivery goes to ``state``, due at once, unclaimed."""
        self._run(
            "UPDATE delivery SET state = %s, due_at = 0, failures = 0, lease_owner = NULL, updated_at = %s "
            "WHERE consumer = %s AND pos = %s",
            (DeliveryState(state).value, now, consumer, pos),
        )

    def record_action(self, action: OperatorAction) -> None:
        self._run(
            "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (action.at, action.consumer, action.event_id, action.action, action.actor, action.reason),
        )

    # -- reads ----------------------------------------------------------------------

    def protocol_name(self) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = 'protocol'")
        return None if row is None else str(row[0])

    def flow(self, flow_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT state, seq, data FROM flow WHERE flow_id = %s", (flow_id,))
        if row is None:
            return None
        return {"state": row[0], "seq": int(row[1]), **json.loads(row[2])}

    def flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT flow_id FROM flow ORDER BY flow_id")]

    def event_body(self, event_id: str) -> str | None:
        row = self._one("SELECT body FROM outbox WHERE event_id = %s", (event_id,))
        return None if row is None else str(row[0])

    def outbox(self, flow_id: str | None = None, consumer: str | None = None) -> list[OutboxEntry]:
        """Outbox entries with their delivery state; call inside a read transaction."""
        where, params = ("WHERE o.flow_id = %s", (flow_id,)) if flow_id is not None else ("", ())
        events = self._rows(f"SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o {where} ORDER BY o.pos", params)
        per_event: dict[int, dict[str, DeliveryRecord]] = {int(r[0]): {} for r in events}
        for pos, name, state, last_status, attempts, last_error, due_at, owner in self._rows(
            f"{_DELIVERIES}{where} ORDER BY d.pos, d.consumer", params
        ):
            per_event[int(pos)][name] = DeliveryRecord(
                DeliveryState(state), last_status, int(attempts), last_error, float(due_at), owner
            )
        out = []
        for pos, event_id, fid, seq in events:
            deliveries = per_event[int(pos)]
            if consumer is None:
                chosen = deliveries
            else:
                chosen = {consumer: deliveries[consumer]} if consumer in deliveries else {}
            state = delivery_summary(chosen)
            last = [d.last_status for d in chosen.values() if d.last_status is not None]
            out.append(OutboxEntry(
                event_id, fid, int(seq), state == DeliveryState.ACCEPTED, state, last[-1] if last else None,
                deliveries,
            ))
        return out

    def outbox_counts(self, now: float) -> OutboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        groups = tuple(
            DeliveryCounts(str(c), str(st), int(n), int(retries), int(failing), int(leased), int(untried),
                           None if touch is None else float(touch))
            for c, st, n, retries, failing, leased, untried, touch in self._rows(_DELIVERY_COUNTS, (now,))
        )
        events = self._one("SELECT count(*) FROM outbox")
        flows = self._one("SELECT count(*) FROM flow")
        return OutboxCounts(
            0 if events is None else int(events[0]), 0 if flows is None else int(flows[0]),
            tuple(str(r[0]) for r in self._rows("SELECT name FROM consumer ORDER BY name")), groups,
        )

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        where, params = ("WHERE event_id = %s", (event_id,)) if event_id is not None else ("", ())
        return [
            OperatorAction(*r)
            for r in self._rows(
                f"SELECT at, consumer, event_id, action, actor, reason FROM operator_action {where} ORDER BY id",
                params,
            )
        ]


class PgOutboxStore(PgStore[PgOutbox]):
    """A producer's store in a PostgreSQL schema: one connection, owned by
    the opening process and thread.

    ``location`` is a ``postgresql://`` string (schema as the fragment,
    default ``reliable_flow_producer``) or a connection factory; ``schema``
    overrides the fragment.  Creates the schema if absent (recording
    ``protocol``), and refuses one of another kind, product, version or
    protocol before writing anything.  ``busy_timeout`` is the session's
    ``lock_timeout`` in seconds.  ``readonly`` opens it for reads only.
    """

    def __init__(
        self, location: Target, protocol: str | None, *, busy_timeout: float = DEFAULT_LOCK_TIMEOUT,
        readonly: bool = False, schema: str | None = None,
    ) -> None:
        def on_create(conn: Conn) -> None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', %s)", (protocol,))

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol)

        super().__init__(Database(
            parse(location, PRODUCER.name, schema), PRODUCER, lock_timeout=busy_timeout, on_create=on_create,
            check_meta=check_meta, readonly=readonly,
        ), PgOutbox)
        self._bound: set[tuple[str, str]] = set()

    def known_binding(self, name: str, uid: str) -> bool:
        return (name, uid) in self._bound

    def remember_binding(self, name: str, uid: str) -> None:
        self._bound.add((name, uid))

    def forget_binding(self, name: str) -> None:
        self._bound = {(n, u) for n, u in self._bound if n != name}
