"""``advance``: the checks and writes of one step of a flow, in the producer's
unit of work."""

from __future__ import annotations

import json

from .. import envelope
from ..crash import crash_point
from ..protocol import Protocol, Rejected
from ..statuses import AdvanceResult, AdvanceStatus, BlockReason
from ..store import OutboxUnit

__all__ = ["advance_in", "build"]

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


def advance_in(
    unit: OutboxUnit, protocol: Protocol, env: envelope.Envelope, max_backlog: int | None,
    now: float | None = None,
) -> AdvanceResult:
    """Decide and write one advance inside ``unit``'s transaction; a new event
    is stamped as committed at ``now``."""
    stored = unit.find_event(env.event_id)
    if stored is not None:
        if stored.body == env.body:
            return AdvanceResult(
                AdvanceStatus.EXISTING, env.event_id, env.flow_id, stored.seq,
                f"already committed at seq {stored.seq} with the same body; nothing written",
            )
        return AdvanceResult(
            AdvanceStatus.CONFLICT, env.event_id, env.flow_id, stored.seq, _differences(stored.body, env.body)
        )
    pruned = _pruned(unit, env)
    if pruned is not None:
        return pruned
    flow = unit.flow_state(env.flow_id)
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
    crash_point("advance.after_outbox_insert")
    return AdvanceResult(AdvanceStatus.COMMITTED, env.event_id, env.flow_id, env.seq)
