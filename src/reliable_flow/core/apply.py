"""``apply_next`` and ``drain``: apply exactly a flow's next step, in the
consumer's unit of work, or say why not."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from .. import envelope
from ..crash import crash_point
from ..effects import Effects
from ..handlers import ApplyContext, Event, Handler
from ..protocol import PayloadError, Protocol, Rejected
from ..statuses import ApplyResult, ApplyStatus, BlockReason, DrainResult, DrainStop
from ..store import FlowState, InboxUnit

__all__ = ["ApplyRules", "apply_in", "drain_flows"]


@dataclass(frozen=True)
class ApplyRules:
    """Everything an apply decides with: the protocol, the schemas this
    consumer decodes, its handlers, the effects they may schedule, its name
    (for effect keys) and its clock."""

    protocol: Protocol
    schemas: Collection[int]
    handlers: Sequence[Handler] = ()
    effects: Effects | None = None
    consumer: str = "default"
    clock: Callable[[], float] | None = None


def _handle(unit: InboxUnit, rules: ApplyRules, event: dict[str, Any], body: str, event_id: str, flow_id: str,
            seq: int, previous: str, new_state: str, new_data: dict[str, Any]) -> None:
    assert rules.clock is not None
    ctx = ApplyContext(
        unit,
        Event(event_id, flow_id, seq, event["kind"], event["schema"], event["payload"], event.get("meta", {}), body),
        previous, new_state, new_data, rules.consumer, rules.effects, rules.clock(),
    )
    for handler in rules.handlers:
        handler(ctx)


def apply_in(
    unit: InboxUnit, rules: ApplyRules, flow_id: str, known: FlowState | None = None
) -> tuple[ApplyResult, FlowState | None]:
    """One apply step inside ``unit``'s transaction.

    ``known`` is the flow's state as left by the previous step of the same
    transaction, which holds the write lock, so it cannot be stale; the new
    one is returned after an apply.
    """
    protocol, schemas = rules.protocol, rules.schemas
    if known is None:
        known = unit.flow_state(flow_id) or FlowState(protocol.initial, 0, {})
    seq = known.seq + 1
    row = unit.next_row(flow_id, seq)
    if row is None:
        return ApplyResult(ApplyStatus.IDLE, flow_id, seq), known
    found_seq, event_id, body = row
    if found_seq != seq:
        return ApplyResult(ApplyStatus.GAP, flow_id, seq, detail=f"seq {seq} has not arrived"), known
    event = json.loads(body)
    try:
        if event["schema"] not in schemas:
            raise Rejected(
                BlockReason.UNSUPPORTED_SCHEMA,
                f"schema {event['schema']} is not decoded by this consumer (decodes {sorted(schemas)})",
            )
        new_data = protocol.next_data(known.state, known.data, event["kind"], event["schema"], event["payload"])
    except Rejected as rejected:
        unit.block(event_id, rejected.reason)
        return ApplyResult(
            ApplyStatus.BLOCKED, flow_id, seq, event_id, rejected.reason, rejected.detail
        ), known
    new_state = event["kind"]
    view = protocol.view(new_state, new_data)
    if not rules.handlers:
        _write_applied(unit, flow_id, seq, event_id, new_state, new_data, view)
        return ApplyResult(ApplyStatus.APPLIED, flow_id, seq, event_id), FlowState(new_state, seq, new_data)
    try:
        # Under a nested step: a handler's payload error must leave nothing
        # of this apply behind, only the block.
        with unit.step():
            _write_applied(unit, flow_id, seq, event_id, new_state, new_data, view)
            _handle(unit, rules, event, body, event_id, flow_id, seq, known.state, new_state, new_data)
    except PayloadError as exc:
        unit.block(event_id, BlockReason.INVALID_PAYLOAD)
        return ApplyResult(
            ApplyStatus.BLOCKED, flow_id, seq, event_id, BlockReason.INVALID_PAYLOAD, str(exc)
        ), known
    return ApplyResult(ApplyStatus.APPLIED, flow_id, seq, event_id), FlowState(new_state, seq, new_data)


def _write_applied(unit: InboxUnit, flow_id: str, seq: int, event_id: str, new_state: str,
                   new_data: dict[str, Any], view: dict[str, Any]) -> None:
    unit.put_projection(flow_id, new_state, seq, envelope.canonical(new_data), envelope.canonical(view))
    crash_point("apply.after_projection")
    unit.record_applied(event_id, flow_id, seq, new_state)
    crash_point("apply.after_effect")


def drain_flows(
    write: Callable[[], AbstractContextManager[InboxUnit]], rules: ApplyRules,
    flows: list[str], limit: int, batch_size: int,
) -> dict[str, DrainResult]:
    """Apply each flow's next steps until a gap, a block, idle or ``limit``,
    ``batch_size`` applies to a transaction (opened by ``write``)."""
    results: dict[str, DrainResult] = {}
    queue = iter(flows)
    flow = next(queue, None)
    applied, last = 0, None
    while flow is not None:
        done_in_batch = 0
        with write() as unit:
            known: FlowState | None = None  # re-read in every new transaction
            while flow is not None and done_in_batch < batch_size:
                last, known = apply_in(unit, rules, flow, known)
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
