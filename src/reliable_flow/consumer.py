"""The consumer: a persistent inbox, and strictly ordered apply per flow."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from . import envelope
from .crash import crash_point
from .db import DEFAULT_BUSY_TIMEOUT, Database, PathLike
from .errors import InboxFull, InvalidEnvelope
from .protocol import Protocol, Rejected
from .schema import CONSUMER
from .statuses import (
    ApplyResult,
    ApplyStatus,
    BlockReason,
    DrainResult,
    DrainStop,
    ReceiveResult,
    ReceiveStatus,
)

__all__ = ["Consumer", "read_effects", "read_inbox", "read_projection"]

DEFAULT_NAME = "default"

_FlowState = tuple[str, int, dict[str, Any]]

# The hot queries, named so tests can check their plans use an index.
# NEXT_ROW answers "next row, gap or idle" in one probe: the first inbox row
# of the flow at or after last_seq + 1 (later rows exist only past a gap).
NEXT_ROW = "SELECT seq, event_id, body FROM inbox WHERE flow_id = ? AND seq >= ? ORDER BY seq LIMIT 1"
OPEN_FLOWS = "SELECT DISTINCT flow_id FROM inbox WHERE state <> 'applied' ORDER BY flow_id"


def _check_flow_id(flow_id: object) -> str:
    # Same rules as the envelope's flow_id, so a typo'd argument is an error
    # rather than a silent "idle".
    return envelope.check_name("flow_id", flow_id)


def _check_limit(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class Consumer:
    """Owns a consumer file: the inbox, the projection and the effect records.

    ``schemas`` are the payload versions this consumer can decode (default:
    the protocol's ``consumer_schemas``); events in other versions are still
    accepted and stored unchanged, and block with ``unsupported_schema`` until
    a consumer that knows the version opens the same file.

    ``name`` identifies this consumer towards producers, which keep delivery
    state per name; it is fixed when the file is created (default
    ``"default"``).  One object per thread; after ``fork()`` call
    :meth:`reopen` in the child.

    ``max_inbox``: if set, ``receive`` raises :class:`InboxFull` (storing
    nothing) for a new event while that many rows are unapplied, unless the
    event is the next step of its flow (so a full inbox cannot deadlock).
    """

    def __init__(
        self,
        path: PathLike,
        protocol: Protocol,
        *,
        schemas: Collection[int] | None = None,
        name: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_inbox: int | None = None,
    ) -> None:
        if not isinstance(protocol, Protocol):
            raise TypeError(f"protocol must be a reliable_flow Protocol, got {type(protocol).__name__}")
        if max_inbox is not None and (isinstance(max_inbox, bool) or not isinstance(max_inbox, int) or max_inbox < 1):
            raise ValueError(f"max_inbox must be None or an int >= 1, got {max_inbox!r}")
        self.protocol = protocol
        self.max_inbox = max_inbox
        if schemas is None:
            chosen = frozenset(protocol.consumer_schemas or ())
        else:
            if isinstance(schemas, (str, bytes)) or not isinstance(schemas, Collection):
                raise ValueError(f"schemas must be a collection of ints, got {schemas!r}")
            chosen = frozenset(schemas)
            unknown = sorted(chosen - protocol.schemas.keys(), key=repr)
            if unknown or not chosen:
                raise ValueError(
                    f"schemas must be a non-empty subset of protocol {protocol.name!r}'s schemas "
                    f"{sorted(protocol.schemas)}; got {sorted(chosen, key=repr)}"
                )
        self.schemas: frozenset[int] = chosen
        if name is not None:
            try:
                _check_flow_id(name)
            except InvalidEnvelope as exc:
                raise ValueError(f"name {exc.problem}") from None
        new_name = name or DEFAULT_NAME

        def on_create(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?)",
                [("protocol", protocol.name), ("name", new_name), ("uid", uuid.uuid4().hex)],
            )

        def check_meta(meta: dict[str, str]) -> str | None:
            if meta.get("protocol") != protocol.name:
                return f"was created for protocol {meta.get('protocol')!r}, not {protocol.name!r}"
            if name is not None and meta.get("name") != name:
                return f"belongs to consumer {meta.get('name')!r}, not {name!r}"
            return None

        self._db = Database(
            path, CONSUMER, busy_timeout=busy_timeout, on_create=on_create, check_meta=check_meta
        )
        info = self._db.meta()
        self.name: str = info["name"]
        self.uid: str = info["uid"]

    @property
    def path(self) -> str:
        return self._db.path

    # -- receive --------------------------------------------------------------------

    def receive(self, envelope_in: dict[str, Any] | str | bytes) -> ReceiveResult:
        """Store an event durably, once; the consumer owns it after ``accepted``.

        Guarantees: ``accepted`` is returned only after COMMIT, so the event
        survives any later crash.  The same event id with the same canonical
        body is ``duplicate`` (nothing written); with another body
        ``id_conflict``; a new id in a (flow, seq) slot already taken is
        ``sequence_conflict``.  A schema this consumer cannot decode is still
        accepted, unchanged.  Malformed input raises ``InvalidEnvelope``; a
        full inbox (``max_inbox``) raises ``InboxFull``.
        """
        env = envelope.parse(envelope_in)
        with self._db.write() as conn:
            result = self._receive_in(conn, env)
        if result.status == ReceiveStatus.ACCEPTED:
            crash_point("receive.after_commit")
        return result

    def receive_many(
        self, envelopes: Sequence[dict[str, Any] | str | bytes]
    ) -> list[ReceiveResult | None]:
        """Receive several events in one transaction; one entry per event, in order.

        Same checks and statuses as :meth:`receive`.  Every envelope is
        validated before anything is stored: one malformed envelope raises
        ``InvalidEnvelope`` and stores none.  An event that a full inbox
        (``max_inbox``) refuses gets ``None`` and is not stored; the others
        are still examined, exactly as separate ``receive`` calls would be
        (so a flow's next step still gets in).
        """
        parsed = [envelope.parse(e) for e in envelopes]
        results: list[ReceiveResult | None] = []
        with self._db.write() as conn:
            for env in parsed:
                try:
                    results.append(self._receive_in(conn, env))
                except InboxFull:
                    results.append(None)
        if any(r is not None and r.status == ReceiveStatus.ACCEPTED for r in results):
            crash_point("receive.after_commit")
        return results

    def _receive_in(self, conn: sqlite3.Connection, env: envelope.Envelope) -> ReceiveResult:
        if self.max_inbox is None:
            # The common case first: a new event is stored by one statement;
            # only when a unique key refused it do we look at why.
            stored = conn.execute(
                "INSERT INTO inbox(event_id, flow_id, seq, body) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (env.event_id, env.flow_id, env.seq, env.body),
            ).rowcount
            if stored:
                crash_point("receive.after_inbox_insert")
                return ReceiveResult(ReceiveStatus.ACCEPTED, env.event_id, env.flow_id, env.seq)
        row = conn.execute("SELECT body FROM inbox WHERE event_id = ?", (env.event_id,)).fetchone()
        if row is not None:
            if row[0] == env.body:
                return ReceiveResult(ReceiveStatus.DUPLICATE, env.event_id, env.flow_id, env.seq)
            return ReceiveResult(
                ReceiveStatus.ID_CONFLICT, env.event_id, env.flow_id, env.seq,
                "an event with this id and a different body is already in the inbox",
            )
        other = conn.execute(
            "SELECT event_id FROM inbox WHERE flow_id = ? AND seq = ?", (env.flow_id, env.seq)
        ).fetchone()
        if other is not None:
            return ReceiveResult(
                ReceiveStatus.SEQUENCE_CONFLICT, env.event_id, env.flow_id, env.seq,
                f"seq {env.seq} of flow {env.flow_id!r} is already held by event {other[0]!r}",
            )
        if self.max_inbox is not None:
            self._check_room(conn, env.flow_id, env.seq)
        conn.execute(
            "INSERT INTO inbox(event_id, flow_id, seq, body) VALUES (?, ?, ?, ?)",
            (env.event_id, env.flow_id, env.seq, env.body),
        )
        crash_point("receive.after_inbox_insert")
        return ReceiveResult(ReceiveStatus.ACCEPTED, env.event_id, env.flow_id, env.seq)

    def _check_room(self, conn: sqlite3.Connection, flow_id: str, seq: int) -> None:
        cap = self.max_inbox
        used = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM inbox WHERE state <> 'applied' LIMIT ?)", (cap,)
        ).fetchone()[0]
        if used < cap:
            return
        row = conn.execute("SELECT last_seq FROM projection WHERE flow_id = ?", (flow_id,)).fetchone()
        if seq == (row[0] if row else 0) + 1:
            return  # the flow's very next step: refusing it could deadlock a full inbox
        raise InboxFull(
            f"{self.path} holds {used} unapplied events (max_inbox={cap}); "
            f"event {flow_id!r} seq {seq} refused, nothing stored"
        )

    # -- apply ----------------------------------------------------------------------

    def apply_next(self, flow_id: str) -> ApplyResult:
        """Apply exactly the next step of ``flow_id`` (seq = last_seq + 1), or say why not.

        Guarantees: ``applied`` means projection, effect record and the
        inbox row's ``applied`` mark were committed in one transaction, so a
        step leaves at most one effect.  ``gap``: seq last_seq + 1 has not
        arrived but a later one has; ``idle``: nothing to do.  ``blocked``:
        the event cannot be applied (``reason`` says why); the row is marked
        blocked and is examined again on every call, so a consumer that
        knows more schemas applies it unchanged later.  SQL errors roll back
        and propagate.  Retrying after ``CommitOutcomeUnknown`` is safe: if
        the step had committed, the retry looks at the following seq.
        """
        flow_id = _check_flow_id(flow_id)
        with self._db.write() as conn:
            result, _ = self._apply_in(conn, flow_id)
        if result.status == ApplyStatus.APPLIED:
            crash_point("apply.after_commit")
        return result

    def _apply_in(
        self, conn: sqlite3.Connection, flow_id: str, known: _FlowState | None = None
    ) -> tuple[ApplyResult, _FlowState | None]:
        """One apply step inside the caller's transaction.

        ``known`` is the flow's (state, last_seq, data) as left by the
        previous step of the same transaction, which holds the write lock,
        so it cannot be stale; the new one is returned after an apply.
        """
        if known is None:
            proj = conn.execute(
                "SELECT state, last_seq, data FROM projection WHERE flow_id = ?", (flow_id,)
            ).fetchone()
            known = (self.protocol.initial, 0, {}) if proj is None else (proj[0], proj[1], json.loads(proj[2]))
        state, last_seq, data = known
        seq = last_seq + 1
        row = conn.execute(NEXT_ROW, (flow_id, seq)).fetchone()
        if row is None:
            return ApplyResult(ApplyStatus.IDLE, flow_id, seq), known
        if row[0] != seq:
            return ApplyResult(ApplyStatus.GAP, flow_id, seq, detail=f"seq {seq} has not arrived"), known
        _, event_id, body = row
        event = json.loads(body)
        try:
            if event["schema"] not in self.schemas:
                raise Rejected(
                    BlockReason.UNSUPPORTED_SCHEMA,
                    f"schema {event['schema']} is not decoded by this consumer (decodes {sorted(self.schemas)})",
                )
            new_data = self.protocol.next_data(state, data, event["kind"], event["schema"], event["payload"])
        except Rejected as rejected:
            # Only a change is written: re-examining an unchanged block then
            # costs no fsync (a transaction without writes commits for free).
            conn.execute(
                "UPDATE inbox SET state = 'blocked', reason = ? "
                "WHERE event_id = ? AND (state <> 'blocked' OR reason IS NOT ?)",
                (rejected.reason.value, event_id, rejected.reason.value),
            )
            return ApplyResult(ApplyStatus.BLOCKED, flow_id, seq, event_id, rejected.reason, rejected.detail), known
        new_state = event["kind"]
        view = self.protocol.view(new_state, new_data)
        conn.execute(
            "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, "
            "last_seq = excluded.last_seq, data = excluded.data, view = excluded.view",
            (flow_id, new_state, seq, envelope.canonical(new_data), envelope.canonical(view)),
        )
        crash_point("apply.after_projection")
        conn.execute(
            "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (?, ?, ?, ?)",
            (event_id, flow_id, seq, new_state),
        )
        conn.execute("UPDATE inbox SET state = 'applied', reason = NULL WHERE event_id = ?", (event_id,))
        crash_point("apply.after_effect")
        return ApplyResult(ApplyStatus.APPLIED, flow_id, seq, event_id), (new_state, seq, new_data)

    def drain(self, flow_id: str, limit: int = 100, *, batch_size: int = 1) -> DrainResult:
        """Apply ``flow_id``'s next steps until a gap, a block, idle, or ``limit`` applies.

        ``batch_size`` applies share one transaction (default 1: each apply
        commits on its own); an interruption keeps every committed batch.
        ``stop`` is ``limit`` as soon as ``limit`` events were applied,
        without looking further; otherwise it says exactly where the
        single-step path would have stopped.
        """
        flow_id = _check_flow_id(flow_id)
        return self._drain_flows([flow_id], limit, batch_size)[flow_id]

    def process_all(self, limit: int = 1000, *, batch_size: int = 1) -> dict[str, DrainResult]:
        """Drain every flow that has unapplied inbox rows; ``limit`` is per flow.

        A gap or a blocked event stops only its own flow; the others go on.
        ``batch_size`` applies share one transaction, across flows.
        """
        flows = [r[0] for r in self._db.conn.execute(OPEN_FLOWS)]
        return self._drain_flows(flows, limit, batch_size)

    def _drain_flows(self, flows: list[str], limit: int, batch_size: int) -> dict[str, DrainResult]:
        limit = _check_limit("limit", limit)
        batch_size = _check_limit("batch_size", batch_size)
        results: dict[str, DrainResult] = {}
        queue = iter(flows)
        flow = next(queue, None)
        applied, last = 0, None
        while flow is not None:
            done_in_batch = 0
            with self._db.write() as conn:
                known: _FlowState | None = None  # re-read in every new transaction
                while flow is not None and done_in_batch < batch_size:
                    last, known = self._apply_in(conn, flow, known)
                    if last.status == ApplyStatus.APPLIED:
                        applied += 1
                        done_in_batch += 1
                        if applied < limit:
                            continue
                        stop = DrainStop.LIMIT
                    else:
                        stop = DrainStop(last.status.value)
                    results[flow] = DrainResult(flow, applied, stop, last)
                    flow = next(queue, None)
                    applied, last, known = 0, None, None
            if done_in_batch:
                crash_point("apply.after_commit")
        return results

    # -- reads ----------------------------------------------------------------------

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "last_seq", **protocol.project(...)}`` as applied, or None."""
        return read_projection(self._db.conn, flow_id)

    def effects(self, flow_id: str) -> list[dict[str, Any]]:
        """The flow's effect records in the order they were applied."""
        return read_effects(self._db.conn, flow_id)

    def inbox(self, flow_id: str) -> list[dict[str, Any]]:
        """The flow's inbox rows by seq: ``event_id``, ``seq``, ``state``, ``reason``."""
        return read_inbox(self._db.conn, flow_id)

    def flows(self) -> list[str]:
        """Ids of every flow with at least one inbox row, sorted."""
        return [r[0] for r in self._db.conn.execute("SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")]

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def reopen(self) -> None:
        """Open a new connection in the current process (use after fork())."""
        self._db.reopen()

    def __enter__(self) -> Consumer:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self._db.path!r}, {self.protocol.name}, name={self.name!r})"


def read_projection(conn: sqlite3.Connection, flow_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT state, last_seq, view FROM projection WHERE flow_id = ?", (flow_id,)
    ).fetchone()
    if row is None:
        return None
    return {"state": row[0], "last_seq": row[1], **json.loads(row[2])}


def read_effects(conn: sqlite3.Connection, flow_id: str) -> list[dict[str, Any]]:
    return [
        {"event_id": r[0], "flow_id": r[1], "seq": r[2], "kind": r[3]}
        for r in conn.execute(
            "SELECT event_id, flow_id, seq, kind FROM effect WHERE flow_id = ? ORDER BY id", (flow_id,)
        )
    ]


def read_inbox(conn: sqlite3.Connection, flow_id: str) -> list[dict[str, Any]]:
    return [
        {"event_id": r[0], "seq": r[1], "state": r[2], "reason": r[3]}
        for r in conn.execute(
            "SELECT event_id, seq, state, reason FROM inbox WHERE flow_id = ? ORDER BY seq", (flow_id,)
        )
    ]
