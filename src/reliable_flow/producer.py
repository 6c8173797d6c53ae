"""The producer: flow state and its outbox event, committed together."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from . import envelope
from .crash import crash_point
from .db import DEFAULT_BUSY_TIMEOUT, Database, PathLike, storage_error
from .errors import NotResolvable, StorageError, UnknownEvent
from .protocol import Protocol, Rejected
from .schema import PRODUCER
from .statuses import AdvanceResult, AdvanceStatus, BlockReason, DeliveryState

__all__ = ["Batch", "Producer", "read_flow", "read_operator_actions", "read_outbox"]

_BODY_FIELDS = ("flow_id", "seq", "kind", "schema", "payload", "meta")


def _differences(stored: str, new: str) -> str:
    old_obj, new_obj = json.loads(stored), json.loads(new)
    # Compare canonical text, not Python values: 3 == 3.0 == True in Python,
    # but they are different events.
    fields = [f for f in _BODY_FIELDS if envelope.canonical({f: old_obj.get(f)}) != envelope.canonical({f: new_obj.get(f)})]
    named = ["expected_seq" if f == "seq" else f for f in fields]
    return "differs from the stored event in: " + ", ".join(named)


def _build(
    event_id: object, flow_id: object, expected_seq: object, kind: object,
    payload: object, schema: object, meta: object,
) -> envelope.Envelope:
    expected = envelope.check_expected_seq(expected_seq)
    return envelope.make(
        event_id=event_id, flow_id=flow_id, seq=expected + 1, kind=kind,
        schema=schema, payload=payload, meta=meta,
    )


class Batch:
    """Advances that commit together; made by :meth:`Producer.batch`."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._conn: sqlite3.Connection | None = None
        self._broken: BaseException | None = None
        self.results: list[AdvanceResult] = []

    @property
    def committed(self) -> int:
        """How many advances of this batch will commit (status ``committed``)."""
        return sum(1 for r in self.results if r.status == AdvanceStatus.COMMITTED)

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
        """As :meth:`Producer.advance`, inside the batch's transaction."""
        if self._conn is None:
            raise RuntimeError("this batch is closed; use it inside its with-block")
        if self._broken is not None:
            raise StorageError(
                "SQLite rolled this batch back after an earlier advance failed; nothing of it will commit"
            ) from self._broken
        env = _build(event_id, flow_id, expected_seq, kind, payload, schema, meta)
        conn = self._conn
        if not conn.in_transaction:
            # A SAVEPOINT outside a transaction would silently start one that
            # RELEASE then commits on its own: never let the batch split.
            self._broken = StorageError("the batch's transaction is gone")
            raise self._broken
        # A savepoint per advance: if one fails and the caller catches the
        # error, none of its half-done writes stay in the batch.
        conn.execute("SAVEPOINT advance")
        try:
            result = self._producer._advance_in(conn, env)
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO advance")
                conn.execute("RELEASE advance")
            else:
                # SQLite already rolled the whole transaction back (e.g. disk
                # full): the batch is lost, and must not go on in autocommit.
                self._broken = exc
                if isinstance(exc, sqlite3.Error):
                    translated = storage_error(exc, "advance in a batch")
                    if translated is not exc:
                        raise translated from exc
            raise
        conn.execute("RELEASE advance")
        self.results.append(result)
        return result


class Producer:
    """Owns a producer file: flows, and the outbox of events they committed.

    ``Producer(path, protocol)`` creates the file if it is absent, upgrades an
    older one in place, and refuses a file that is not a producer file or was
    created for another protocol.  One object per thread; after ``fork()``
    call :meth:`reopen` in the child.

    ``max_backlog``: if set, ``advance`` answers ``backlog_full`` (storing
    nothing) while that many deliveries are still pending, summed over the
    consumers (or that many events, before any consumer was relayed to).
    """

    def __init__(
        self,
        path: PathLike,
        protocol: Protocol,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_backlog: int | None = None,
    ) -> None:
        if not isinstance(protocol, Protocol):
            raise TypeError(f"protocol must be a reliable_flow Protocol, got {type(protocol).__name__}")
        if max_backlog is not None and (
            isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 1
        ):
            raise ValueError(f"max_backlog must be None or an int >= 1, got {max_backlog!r}")
        self.protocol = protocol
        self.max_backlog = max_backlog

        def on_create(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', ?)", (protocol.name,))

        self._registered: set[tuple[str, str]] = set()  # consumers known to be bound
        def check_meta(meta: dict[str, str]) -> str | None:
            stored = meta.get("protocol")
            return None if stored == protocol.name else f"was created for protocol {stored!r}, not {protocol.name!r}"

        self._db = Database(
            path, PRODUCER, busy_timeout=busy_timeout, on_create=on_create, check_meta=check_meta
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
        ``invalid_payload``; over ``max_backlog`` it is ``backlog_full``.
        Malformed arguments raise ``InvalidEnvelope``.
        SQL errors roll everything back and propagate.
        """
        env = _build(event_id, flow_id, expected_seq, kind, payload, schema, meta)
        with self._db.write() as conn:
            result = self._advance_in(conn, env)
        if result.status == AdvanceStatus.COMMITTED:
            crash_point("advance.after_commit")
        return result

    def batch(self) -> AbstractContextManager[Batch]:
        """``with producer.batch() as b: b.advance(...)`` -- several advances, one commit.

        All advances in the block (also across flows) commit together when
        the block ends, or none of them if it raises.  Each ``b.advance``
        returns its own result, with the same checks and statuses as
        :meth:`advance`; later advances see earlier ones of the same batch
        (advance a flow twice with expected_seq 0 then 1).  Results say what
        *will* be committed: they hold only once the block exited normally.
        """
        return self._batch()

    @contextmanager
    def _batch(self) -> Iterator[Batch]:
        batch = Batch(self)
        with self._db.write() as conn:
            batch._conn = conn
            try:
                yield batch
                if batch._broken is not None:
                    raise StorageError(
                        "an advance of this batch failed and SQLite rolled the batch back; nothing committed"
                    ) from batch._broken
            finally:
                batch._conn = None
        if batch.committed:
            crash_point("advance.after_commit")

    def _advance_in(self, conn: sqlite3.Connection, env: envelope.Envelope) -> AdvanceResult:
        """The checks and writes of one advance, inside the caller's transaction."""
        expected = env.seq - 1
        row = conn.execute("SELECT seq, body FROM outbox WHERE event_id = ?", (env.event_id,)).fetchone()
        if row is not None:
            if row[1] == env.body:
                return AdvanceResult(
                    AdvanceStatus.EXISTING, env.event_id, env.flow_id, row[0],
                    f"already committed at seq {row[0]} with the same body; nothing written",
                )
            return AdvanceResult(
                AdvanceStatus.CONFLICT, env.event_id, env.flow_id, row[0], _differences(row[1], env.body)
            )
        flow = conn.execute("SELECT seq, state, data FROM flow WHERE flow_id = ?", (env.flow_id,)).fetchone()
        current_seq, state, data = (0, self.protocol.initial, {}) if flow is None else (
            flow[0], flow[1], json.loads(flow[2])
        )
        if expected != current_seq:
            return AdvanceResult(
                AdvanceStatus.STALE, env.event_id, env.flow_id, None,
                f"expected_seq is {expected} but flow {env.flow_id!r} is at seq {current_seq}",
            )
        try:
            new_data = self.protocol.next_data(
                state, data, env.kind, env.schema, env.payload, self.protocol.producer_schemas
            )
        except Rejected as rejected:
            status = (
                AdvanceStatus.INVALID_TRANSITION
                if rejected.reason is BlockReason.INVALID_TRANSITION
                else AdvanceStatus.INVALID_PAYLOAD
            )
            return AdvanceResult(status, env.event_id, env.flow_id, None, rejected.detail)
        if self.max_backlog is not None and self._backlog(conn) >= self.max_backlog:
            return AdvanceResult(
                AdvanceStatus.BACKLOG_FULL, env.event_id, env.flow_id, None,
                f"{self.max_backlog} deliveries are still pending (max_backlog); relay first",
            )
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
        conn.execute("INSERT INTO delivery(consumer, pos) SELECT name, ? FROM consumer", (cur.lastrowid,))
        crash_point("advance.after_outbox_insert")
        return AdvanceResult(AdvanceStatus.COMMITTED, env.event_id, env.flow_id, env.seq)

    def _backlog(self, conn: sqlite3.Connection) -> int:
        cap = self.max_backlog
        if conn.execute("SELECT 1 FROM consumer LIMIT 1").fetchone() is None:
            return int(conn.execute("SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT ?)", (cap,)).fetchone()[0])
        return int(conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM delivery WHERE state = 'pending' LIMIT ?)", (cap,)
        ).fetchone()[0])

    # -- operator actions -----------------------------------------------------------

    def redeliver(self, event_id: str, *, consumer: str, actor: str, reason: str) -> dict[str, Any]:
        """Put a set-aside (or backing-off) event back in line for ``consumer``, now.

        For use after the consumer's data was fixed.  Recorded with actor,
        time and reason; never done automatically.  The next relay sends it;
        if the conflict persists it is set aside again.
        """
        return self._operator_action("redeliver", event_id, consumer, actor, reason)

    def skip(self, event_id: str, *, consumer: str, actor: str, reason: str) -> dict[str, Any]:
        """Decide that ``consumer`` will never get this event; recorded, never automatic.

        The consumer's flow then waits at a gap for this seq for ever: only
        do this when the business has decided the step may be left out.
        """
        return self._operator_action("skip", event_id, consumer, actor, reason)

    def _operator_action(self, action: str, event_id: str, consumer: str, actor: str, reason: str) -> dict[str, Any]:
        for name, value in (("event_id", event_id), ("consumer", consumer), ("actor", actor), ("reason", reason)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        now = time.time()
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos "
                "WHERE o.event_id = ? AND d.consumer = ?",
                (event_id, consumer),
            ).fetchone()
            if row is None:
                raise UnknownEvent(f"no delivery of event {event_id!r} to consumer {consumer!r} in {self.path}")
            pos, state = row
            if state not in (DeliveryState.SET_ASIDE, DeliveryState.PENDING):
                raise NotResolvable(f"event {event_id!r} is {state} for consumer {consumer!r}; cannot {action} it")
            new_state = DeliveryState.PENDING if action == "redeliver" else DeliveryState.SKIPPED
            conn.execute(
                "UPDATE delivery SET state = ?, due_at = 0, failures = 0, lease_owner = NULL, updated_at = ? "
                "WHERE consumer = ? AND pos = ?",
                (new_state.value, now, consumer, pos),
            )
            conn.execute(
                "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) VALUES (?, ?, ?, ?, ?, ?)",
                (now, consumer, event_id, action, actor, reason),
            )
        return {"at": now, "consumer": consumer, "event_id": event_id, "action": action,
                "actor": actor, "reason": reason, "previous_state": state}

    def operator_actions(self, event_id: str | None = None) -> list[dict[str, Any]]:
        """Every recorded operator action (for one event if given), oldest first."""
        return read_operator_actions(self._db.conn, event_id)

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
        ``state`` (pending / accepted / set_aside / skipped), ``last_status`` (the last
        relay answer, e.g. ``id_conflict`` for a set-aside event) and
        ``deliveries`` ({consumer name: {state, last_status, attempts,
        last_error, due_at}}).
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

    def __enter__(self) -> Producer:  # noqa: PYI034 - Self needs Python 3.11
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
        # Through the consumer table, so each (consumer, pos) is a key lookup
        # rather than a scan of every delivery.
        f"SELECT d.pos, d.consumer, d.state, d.last_status, d.attempts, d.last_error, d.due_at "
        f"FROM outbox o CROSS JOIN consumer c CROSS JOIN delivery d ON d.consumer = c.name AND d.pos = o.pos "
        f"{where} ORDER BY d.pos, d.consumer",
        params,
    ).fetchall()
    for pos, name, state, last_status, attempts, last_error, due_at in rows:
        per_event[pos][name] = {
            "state": state, "last_status": last_status, "attempts": attempts,
            "last_error": last_error, "due_at": due_at,
        }
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
        elif chosen and states <= {DeliveryState.ACCEPTED, DeliveryState.SKIPPED}:
            state = DeliveryState.SKIPPED.value
        else:
            state = DeliveryState.PENDING.value
        last = [d["last_status"] for d in chosen.values() if d["last_status"] is not None]
        out.append({
            "event_id": event_id, "flow_id": fid, "seq": seq,
            "accepted": state == DeliveryState.ACCEPTED, "state": state,
            "last_status": last[-1] if last else None, "deliveries": deliveries,
        })
    return out


def read_operator_actions(conn: sqlite3.Connection, event_id: str | None = None) -> list[dict[str, Any]]:
    where, params = ("WHERE event_id = ?", (event_id,)) if event_id is not None else ("", ())
    return [
        {"at": r[0], "consumer": r[1], "event_id": r[2], "action": r[3], "actor": r[4], "reason": r[5]}
        for r in conn.execute(
            f"SELECT at, consumer, event_id, action, actor, reason FROM operator_action {where} ORDER BY id",
            params,
        )
    ]
