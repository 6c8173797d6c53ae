"""``apply_next`` and ``drain``: apply exactly a flow's next step, in the
consumer's unit of work, or say why not."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager

from .. import envelope
from ..crash import crash_point
from ..protocol import Protocol, Rejected
from ..statuses import ApplyResult, ApplyStatus, BlockReason, DrainResult, DrainStop
from ..store import FlowState, InboxUnit

__all__ = ["apply_in", "drain_flows"]


def apply_in(
    unit: InboxUnit, protocol: Protocol, schemas: Collection[int], flow_id: str, known: FlowState | None = None
) -> tuple[ApplyResult, FlowState | None]:
    """One apply step inside ``unit``'s transaction.

    ``known`` is the flow's state as left by the previous step of the same
    transaction, which holds the write lock, so it cannot be stale; the new
    one is returned after an apply.
    """
    if known is None:
        known = unit.flow_state(flow_id) or FlowState(protocol.initial, 0, {})
    seq = known.seq + 1
    row = unit.next_row(flow_id, seq)
    if row is None:
        return ApplyResult(ApplyStatus.IDLE, flow_id, seq), known
    if row.seq != seq:
        return ApplyResult(ApplyStatus.GAP, flow_id, seq, detail=f"seq {seq} has not arrived"), known
    event = json.loads(row.body)
    try:
        if event["schema"] not in schemas:
            raise Rejected(
                BlockReason.UNSUPPORTED_SCHEMA,
                f"schema {event['schema']} is not decoded by this consumer (decodes {sorted(schemas)})",
            )
        new_data = protocol.next_data(known.state, known.data, event["kind"], event["schema"], event["payload"])
    except Rejected as rejected:
        unit.block(row.event_id, rejected.reason)
        return ApplyResult(
            ApplyStatus.BLOCKED, flow_id, seq, row.event_id, rejected.reason, rejected.detail
        ), known
    new_state = event["kind"]
    view = protocol.view(new_state, new_data)
    unit.put_projection(flow_id, new_state, seq, envelope.canonical(new_data), envelope.canonical(view))
    crash_point("apply.after_projection")
    unit.record_applied(row.event_id, flow_id, seq, new_state)
    crash_point("apply.after_effect")
    return ApplyResult(ApplyStatus.APPLIED, flow_id, seq, row.event_id), FlowState(new_state, seq, new_data)


def drain_flows(
    write: Callable[[], AbstractContextManager[InboxUnit]], protocol: Protocol, schemas: Collection[int],
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
                last, known = apply_in(unit, protocol, schemas, flow, known)
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
