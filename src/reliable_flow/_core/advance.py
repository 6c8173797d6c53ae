"""``advance``: the checks and writes of one step of a flow, in the producer's
unit of work."""

from __future__ import annotations

import json

from .. import _envelope as envelope
from .._store import FlowState, OutboxUnit, StoredEvent
from ..crash import crash_point
from ..protocol import Protocol, Rejected
from ..records import AdvanceResult
from ..statuses import AdvanceStatus, BlockReason
from .topics import Routing, route_in

__all__ = ["advance_at_current_in", "advance_in", "build"]

_BODY_FIELDS = ("flow_id", "seq", "kind", "schema", "payload", "meta")


def build(
    event_id: object, flow_id: object, expected_seq: object, kind: object,
    payload: object, schema: object, meta: object,
) -> envelope.Envelope:
    """The envelope of an ``advance`` call; malformed arguments raise ``InvalidEnvelope``."""
    expected = envelope.check_expected_seq(expected_seq)
    return envelope.make(
        event_id=event_id, flow_id=flow_id, seq=expected + 1, kind=kind,
        schema=schema, payload=payload, meta=meta,
    )


def _differences(stored: str, new: str) -> str:
    old_obj, new_obj = json.loads(stored), json.loads(new)
    # Compare canonical text, not Python values: 3 == 3.0 == True in Python,
    # but they are different events.
    fields = [
        f for f in _BODY_FIELDS
        if envelope.canonical({f: old_obj.get(f)}) != envelope.canonical({f: new_obj.get(f)})
    ]
    named = ["expected_seq" if f == "seq" else f for f in fields]
    return "differs from the stored event in: " + ", ".join(named)


def _pruned(unit: OutboxUnit, env: envelope.Envelope) -> AdvanceResult | None:
    """The answer for an event id whose event was pruned, from its tombstone
    (looked at only after the outbox had no such event)."""
    tomb = unit.tombstone(env.event_id)
    if tomb is None:
        return None
    if tomb.body_hash == envelope.body_hash(env.body):
        return AdvanceResult(
            AdvanceStatus.EXISTING, env.event_id, env.flow_id, tomb.seq,
            f"already committed at seq {tomb.seq} with the same body (since pruned); nothing written",
        )
    return AdvanceResult(
        AdvanceStatus.CONFLICT, env.event_id, env.flow_id, tomb.seq,
        f"differs from the pruned event (flow {tomb.flow_id!r}, seq {tomb.seq}); only its body's hash "
        "is kept, so the differing fields cannot be named",
    )


def _answered(unit: OutboxUnit, env: envelope.Envelope, stored: StoredEvent | None) -> AdvanceResult | None:
    """The answer for an event id already used (``stored``, or pruned), else None."""
    if stored is not None:
        if stored.body == env.body:
            return AdvanceResult(
                AdvanceStatus.EXISTING, env.event_id, env.flow_id, stored.seq,
                f"already committed at seq {stored.seq} with the same body; nothing written",
            )
        return AdvanceResult(
            AdvanceStatus.CONFLICT, env.event_id, env.flow_id, stored.seq, _differences(stored.body, env.body)
        )
    return _pruned(unit, env)


def advance_in(
    unit: OutboxUnit, protocol: Protocol, env: envelope.Envelope, max_backlog: int | None,
    now: float | None = None, routing: Routing | None = None,
) -> AdvanceResult:
    """Decide and write one advance inside ``unit``'s transaction; a new event
    is stamped as committed at ``now`` and, with ``routing`` (declared
    topics), delivered to its topics' subscribers (:func:`.topics.route_in`)."""
    stored, flow = unit.find_event_and_flow(env.event_id, env.flow_id)
    answered = _answered(unit, env, stored)
    if answered is not None:
        return answered
    return _step(unit, protocol, env, flow, max_backlog, now, routing)


def advance_at_current_in(
    unit: OutboxUnit, protocol: Protocol, event_id: object, flow_id: object, kind: object, payload: object,
    schema: object, meta: object, max_backlog: int | None, now: float | None = None,
    routing: Routing | None = None,
) -> tuple[AdvanceResult, envelope.Envelope]:
    """``advance`` at the seq the flow is at when this transaction reads it
    (so never ``stale``), inside ``unit``'s transaction, with every other
    check of :func:`advance_in`; and the envelope decided on.  An event id
    already used is judged at its own seq: a retry with the same body is
    ``existing``, anything else ``conflict``.  Malformed arguments raise
    ``InvalidEnvelope``."""
    checked = build(event_id, flow_id, 0, kind, payload, schema, meta)
    # The event id first, then the flow, as advance_in reads (and on
    # PostgreSQL locks) them.
    stored, flow = unit.find_event_and_flow(checked.event_id, checked.flow_id)
    used = stored.seq if stored is not None else None
    if used is None:
        tomb = unit.tombstone(checked.event_id)
        used = None if tomb is None else tomb.seq
    if used is not None:
        env = checked if used == 1 else build(event_id, flow_id, used - 1, kind, payload, schema, meta)
        answered = _answered(unit, env, stored)
        assert answered is not None
        return answered, env
    env = checked if flow is None else build(event_id, flow_id, flow.seq, kind, payload, schema, meta)
    return _step(unit, protocol, env, flow, max_backlog, now, routing), env


def _step(
    unit: OutboxUnit, protocol: Protocol, env: envelope.Envelope, flow: FlowState | None, max_backlog: int | None,
    now: float | None, routing: Routing | None = None,
) -> AdvanceResult:
    """The step of a new event id from the flow as read in this transaction."""
    current_seq, state, data = (0, protocol.initial, {}) if flow is None else (flow.seq, flow.state, flow.data)
    expected = env.seq - 1
    if expected != current_seq:
        return AdvanceResult(
            AdvanceStatus.STALE, env.event_id, env.flow_id, None,
            f"expected_seq is {expected} but flow {env.flow_id!r} is at seq {current_seq}",
        )
    try:
        new_data = protocol.next_data(state, data, env.kind, env.schema, env.payload, protocol.producer_schemas)
    except Rejected as rejected:
        status = (
            AdvanceStatus.INVALID_TRANSITION
            if rejected.reason is BlockReason.INVALID_TRANSITION
            else AdvanceStatus.INVALID_PAYLOAD
        )
        return AdvanceResult(status, env.event_id, env.flow_id, None, rejected.detail)
    if max_backlog is not None and unit.backlog(max_backlog) >= max_backlog:
        return AdvanceResult(
            AdvanceStatus.BACKLOG_FULL, env.event_id, env.flow_id, None,
            f"{max_backlog} deliveries are still pending (max_backlog); relay first",
        )
    unit.put_flow(env.flow_id, env.seq, env.kind, envelope.canonical(new_data))
    crash_point("advance.after_flow_write")
    unit.append_event(env, now)
    if routing is not None:
        route_in(unit, routing, env)
    crash_point("advance.after_outbox_insert")
    return AdvanceResult(AdvanceStatus.COMMITTED, env.event_id, env.flow_id, env.seq)
