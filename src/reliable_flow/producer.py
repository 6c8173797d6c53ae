"""The producer: flow state and its outbox event, committed together."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from . import envelope
from .crash import crash_point
from .db import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .errors import WrongFile
from .protocol import Protocol, Rejected
from .schema import PRODUCER
from .statuses import AdvanceResult, AdvanceStatus, BlockReason, DeliveryState

__all__ = ["Producer", "read_flow", "read_outbox"]

_BODY_FIELDS = ("flow_id", "seq", "kind", "schema", "payload", "meta")


def _differences(stored: str, new: str) -> str:
    old_obj, new_obj = json.loads(stored), json.loads(new)
    fields = [f for f in _BODY_FIELDS if old_obj.get(f) != new_obj.get(f)]
    named = ["expected_seq" if f == "seq" else f for f in fields]
    return "differs from the stored event in: " + ", ".join(named)


class Producer:
    """Owns a producer file: flows, and the outbox of events they committed.

    ``Producer(path, protocol)`` creates the file if it is absent, upgrades an
    older one in place, and refuses a file that is not a producer file or was
    created for another protocol.  One object per thread; after ``fork()``
    call :meth:`reopen` in the child.
    """

    def __init__(self, path: PathLike, protocol: Protocol, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> None:
        if not isinstance(protocol, Protocol):
            raise TypeError(f"protocol must be a reliable_flow Protocol, got {type(protocol).__name__}")
        self.protocol = protocol

        def on_create(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', ?)", (protocol.name,))

        self._registered: set[tuple[str, str]] = set()  # consumers known to be bound
        self._db = Database(path, PRODUCER, busy_timeout=busy_timeout, on_create=on_create)
        stored = self._db.meta().get("protocol")
        if stored != protocol.name:
            self._db.close()
            raise WrongFile(
                f"{self._db.path} was created for protocol {stored!r}, not {protocol.name!r}"
            )

    @property
    def path(self) -> str:
        return self._db.path

    def advance(
        self,
        event_id: str,
        flow_id: str,
        *,
        expected_seq: int,
        kind: str,
        payload: dict[str, Any],
        schema: int = 1,
        meta: dict[str, str] | None = None,
    ) -> AdvanceResult:
        """Move ``flow_id`` one step and record the event, in one transaction.

        Guarantees: either the flow row *and* its outbox event are committed
        together (``committed``), or nothing is written.  Re-sending the same
        call is safe: an identical event id and body returns ``existing``
        even after the flow has moved on; the same id with any other body
        returns ``conflict``.  A new id with the wrong ``expected_seq`` is
        ``stale``; an illegal step is ``invalid_transition`` or
        ``invalid_payload``.  Malformed arguments raise ``InvalidEnvelope``.
        SQL errors roll everything back and propagate.
        """
        expected = envelope.check_expected_seq(expected_seq)
        env = envelope.make(
            event_id=event_id, flow_id=flow_id, seq=expected + 1, kind=kind,
            schema=schema, payload=payload, meta=meta,
        )
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT seq, body FROM outbox WHERE event_id = ?", (env.event_id,)
            ).fetchone()
            if row is not None:
                if row[1] == env.body:
                    return AdvanceResult(AdvanceStatus.EXISTING, env.event_id, env.flow_id, row[0])
                return AdvanceResult(
                    AdvanceStatus.CONFLICT, env.event_id, env.flow_id, row[0], _differences(row[1], env.body)
                )
            flow = conn.execute(
                "SELECT seq, state, data FROM flow WHERE flow_id = ?", (env.flow_id,)
            ).fetchone()
            current_seq, state, data = (0, self.protocol.initial, {}) if flow is None else (
                flow[0], flow[1], json.loads(flow[2])
            )
            if expected != current_seq:
                return AdvanceResult(
                    AdvanceStatus.STALE, env.event_id, env.flow_id, None,
                    f"expected_seq is {expected} but flow {env.flow_id!r} is at seq {current_seq}",
                )
            try:
                new_data = self.protocol.next_data(state, data, env.kind, env.schema, env.payload)
            except Rejected as rejected:
                status = (
                    AdvanceStatus.INVALID_TRANSITION
                    if rejected.reason is BlockReason.INVALID_TRANSITION
                    else AdvanceStatus.INVALID_PAYLOAD
                )
                return AdvanceResult(status, env.event_id, env.flow_id, None, rejected.detail)
            conn.execute(
                "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, "
                "data = excluded.data",
                (env.flow_id, env.seq, env.kind, envelope.canonical(new_data)),
            )
            crash_point("advance.after_flow_write")
            cur = conn.execute(
                "INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, ?, ?, ?)",
                (env.event_id, env.flow_id, env.seq, env.body),
            )
            conn.execute(
                "INSERT INTO delivery(consumer, pos) SELECT name, ? FROM consumer", (cur.lastrowid,)
            )
            crash_point("advance.after_outbox_insert")
        crash_point("advance.after_commit")
        return AdvanceResult(AdvanceStatus.COMMITTED, env.event_id, env.flow_id, env.seq)

    # -- reads --------------------------------------------------------------------

    def flow(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "seq", **data}`` of the flow as committed, or None if it has no event yet."""
        return read_flow(self._db.conn, flow_id)

    def flows(self) -> list[str]:
        """Ids of every flow with at least one committed event, sorted."""
        return [r[0] for r in self._db.conn.execute("SELECT flow_id FROM flow ORDER BY flow_id")]

    def outbox(self, flow_id: str | None = None, *, consumer: str | None = None) -> list[dict[str, Any]]:
        """The flow's events (every flow's if ``flow_id`` is None) in commit order.

        Each entry: ``event_id``, ``flow_id``, ``seq``, ``accepted`` (bool),
        ``state`` (pending / accepted / set_aside), ``last_status`` (the last
        relay answer, e.g. ``id_conflict`` for a set-aside event) and
        ``deliveries`` ({consumer name: {state, last_status, attempts}}).
        With ``consumer=`` the top-level fields describe that consumer;
        otherwise all consumers together: accepted only if every consumer
        accepted, set_aside if any set it aside.
        """
        with self._db.read() as conn:
            return read_outbox(conn, flow_id, consumer)

    def event(self, event_id: str) -> dict[str, Any] | None:
        """The stored envelope of one outbox event, or None."""
        row = self._db.conn.execute("SELECT body FROM outbox WHERE event_id = ?", (event_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    # -- lifecycle ----------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def reopen(self) -> None:
        """Open a new connection in the current process (use after fork())."""
        self._db.reopen()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Producer({self._db.path!r}, {self.protocol.name})"


def read_flow(conn: sqlite3.Connection, flow_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT state, seq, data FROM flow WHERE flow_id = ?", (flow_id,)).fetchone()
    if row is None:
        return None
    return {"state": row[0], "seq": row[1], **json.loads(row[2])}


def read_outbox(
    conn: sqlite3.Connection, flow_id: str | None = None, consumer: str | None = None
) -> list[dict[str, Any]]:
    """Outbox entries with their delivery state; call inside a read transaction."""
    where, params = ("WHERE o.flow_id = ?", (flow_id,)) if flow_id is not None else ("", ())
    events = conn.execute(
        f"SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o {where} ORDER BY o.pos", params
    ).fetchall()
    per_event: dict[int, dict[str, dict[str, Any]]] = {pos: {} for pos, *_ in events}
    rows = conn.execute(
        f"SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts FROM delivery d "
        f"JOIN outbox o ON o.pos = d.pos {where} ORDER BY d.pos, d.consumer",
        params,
    ).fetchall()
    for pos, name, state, last_status, attempts in rows:
        per_event[pos][name] = {"state": state, "last_status": last_status, "attempts": attempts}
    out = []
    for pos, event_id, fid, seq in events:
        deliveries = per_event[pos]
        if consumer is None:
            chosen = deliveries
        else:
            chosen = {consumer: deliveries[consumer]} if consumer in deliveries else {}
        states = {d["state"] for d in chosen.values()}
        if DeliveryState.SET_ASIDE in states:
            state = DeliveryState.SET_ASIDE.value
        elif chosen and states == {DeliveryState.ACCEPTED}:
            state = DeliveryState.ACCEPTED.value
        else:
            state = DeliveryState.PENDING.value
        last = [d["last_status"] for d in chosen.values() if d["last_status"] is not None]
        out.append({
            "event_id": event_id, "flow_id": fid, "seq": seq,
            "accepted": state == DeliveryState.ACCEPTED, "state": state,
            "last_status": last[-1] if last else None, "deliveries": deliveries,
        })
    return out
