"""``apply_next`` and ``drain``: apply exactly a flow's next step, in the
consumer's unit of work, or say why not."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from .. import envelope, observe
from ..crash import crash_point
from ..effects import Effects
from ..envelope import Envelope
from ..handlers import ApplyContext, Event, Handler
from ..observe import CONSUMER, INFO, WARNING, Note, Observer
from ..protocol import PayloadError, Protocol, Rejected
from ..statuses import ApplyResult, ApplyStatus, BlockReason, DrainResult, DrainStop
from ..store import FlowState, InboxUnit
from . import conflicts

__all__ = ["ApplyRules", "apply_arrived", "apply_in", "drain_flows"]


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
    unit: InboxUnit, rules: ApplyRules, flow_id: str, known: FlowState | None = None,
    notes: list[Note] | None = None,
) -> tuple[ApplyResult, FlowState | None]:
    """One apply step inside ``unit``'s transaction.

    ``known`` is the flow's state as left by the previous step of the same
    transaction, which holds the write lock, so it cannot be stale; the new
    one is returned after an apply.  ``notes``: where to put the log record
    of the outcome, to be written once the transaction committed.
    """
    result, state, source = _step(unit, rules, flow_id, known)
    if notes is not None and result.status is not ApplyStatus.IDLE:
        _note(notes, rules.consumer, result, source)
    return result, state


def _note(notes: list[Note], consumer: str, result: ApplyResult, source: dict[str, Any] | str | None) -> None:
    """The log record of an outcome (``source``: the event, or the body of the
    row waiting after a gap, parsed only here, when the record is wanted)."""
    status = result.status
    level = INFO if status is ApplyStatus.APPLIED or status is ApplyStatus.GAP else WARNING
    if not CONSUMER.isEnabledFor(level):
        return
    event = json.loads(source) if isinstance(source, str) else source or {}
    extra = observe.fields(result.event_id, result.flow_id, result.seq, status, consumer, event.get("meta"))
    once: tuple[Any, ...] | None = None
    if status is ApplyStatus.BLOCKED:
        extra.update(reason=None if result.reason is None else str(result.reason), detail=result.detail)
        once = ("blocked", result.event_id, result.reason)
    elif status is ApplyStatus.GAP:  # the meta is the waiting event's
        extra.update(detail=result.detail, waiting_event_id=event.get("event_id"), waiting_seq=event.get("seq"))
        once = ("gap", result.flow_id, result.seq)
    notes.append((CONSUMER, level, str(status), extra, once))


def _step(
    unit: InboxUnit, rules: ApplyRules, flow_id: str, known: FlowState | None
) -> tuple[ApplyResult, FlowState | None, dict[str, Any] | str | None]:
    protocol, schemas = rules.protocol, rules.schemas
    if known is None:
        known = unit.flow_state(flow_id) or FlowState(protocol.initial, 0, {})
    seq = known.seq + 1
    row = unit.next_row(flow_id, seq)
    if row is None:
        return ApplyResult(ApplyStatus.IDLE, flow_id, seq), known, None
    found_seq, event_id, body = row
    if found_seq != seq:
        return ApplyResult(ApplyStatus.GAP, flow_id, seq, detail=f"seq {seq} has not arrived"), known, body
    event = json.loads(body)
    try:
        if event["schema"] not in schemas:
            raise Rejected(
                BlockReason.UNSUPPORTED_SCHEMA,
                f"schema {event['schema']} is not decoded by this consumer (decodes {sorted(schemas)})",
            )
        new_data = protocol.next_data(known.state, known.data, event["kind"], event["schema"], event["payload"])
    except Rejected as rejected:
        unit.block(event_id, rejected.reason, rejected.detail, _now(rules))
        return ApplyResult(
            ApplyStatus.BLOCKED, flow_id, seq, event_id, rejected.reason, rejected.detail
        ), known, event
    new_state = event["kind"]
    view = protocol.view(new_state, new_data)
    if not rules.handlers:
        _write_applied(unit, flow_id, seq, event_id, new_state, new_data, view)
        return ApplyResult(ApplyStatus.APPLIED, flow_id, seq, event_id), FlowState(new_state, seq, new_data), event
    try:
        # Under a nested step: a handler's payload error must leave nothing
        # of this apply behind, only the block.
        with unit.step():
            _write_applied(unit, flow_id, seq, event_id, new_state, new_data, view)
            _handle(unit, rules, event, body, event_id, flow_id, seq, known.state, new_state, new_data)
    except PayloadError as exc:
        unit.block(event_id, BlockReason.INVALID_PAYLOAD, str(exc), _now(rules))
        return ApplyResult(
            ApplyStatus.BLOCKED, flow_id, seq, event_id, BlockReason.INVALID_PAYLOAD, str(exc)
        ), known, event
    return ApplyResult(ApplyStatus.APPLIED, flow_id, seq, event_id), FlowState(new_state, seq, new_data), event


def _now(rules: ApplyRules) -> float | None:
    """When a block happens, on the consumer's clock (None without one)."""
    return None if rules.clock is None else rules.clock()


_APPLY_POINTS = ("apply.after_projection", "apply.after_effect")
_ARRIVAL_POINTS = ("receive_apply.after_projection", "receive_apply.after_effect")


def _write_applied(unit: InboxUnit, flow_id: str, seq: int, event_id: str, new_state: str,
                   new_data: dict[str, Any], view: dict[str, Any],
                   points: tuple[str, str] = _APPLY_POINTS) -> None:
    unit.put_projection(flow_id, new_state, seq, envelope.canonical(new_data), envelope.canonical(view))
    crash_point(points[0])
    unit.record_applied(event_id, flow_id, seq, new_state)
    crash_point(points[1])


def apply_arrived(unit: InboxUnit, rules: ApplyRules, env: Envelope, notes: list[Note] | None = None) -> bool:
    """Apply the event that receive just stored, in the same transaction,
    when it is exactly its flow's next step and applies cleanly: projection,
    effect record and the row's ``applied`` mark, as ``apply_next`` would
    write them.  Anything else (a gap before it, a block: unknown schema,
    rejected step, payload error in a handler) writes nothing here and
    returns False: the row stays pending and ``apply_next`` decides later,
    exactly as without this mode."""
    known = unit.flow_state(env.flow_id)
    if env.seq != (0 if known is None else known.seq) + 1 or env.schema not in rules.schemas:
        return False
    protocol = rules.protocol
    if known is None:
        known = FlowState(protocol.initial, 0, {})
    try:
        new_data = protocol.next_data(known.state, known.data, env.kind, env.schema, env.payload)
    except Rejected:
        return False
    new_state = env.kind
    view = protocol.view(new_state, new_data)
    if not rules.handlers:
        _write_applied(unit, env.flow_id, env.seq, env.event_id, new_state, new_data, view, _ARRIVAL_POINTS)
    else:
        event = {"kind": env.kind, "schema": env.schema, "payload": env.payload, "meta": env.meta}
        try:
            with unit.step():
                _write_applied(unit, env.flow_id, env.seq, env.event_id, new_state, new_data, view, _ARRIVAL_POINTS)
                _handle(unit, rules, event, env.body, env.event_id, env.flow_id, env.seq, known.state,
                        new_state, new_data)
        except PayloadError:
            return False
    if notes is not None:
        _note(notes, rules.consumer, ApplyResult(ApplyStatus.APPLIED, env.flow_id, env.seq, env.event_id),
              {"meta": env.meta})
    return True


def drain_flows(
    write: Callable[[], AbstractContextManager[InboxUnit]], rules: ApplyRules,
    flows: list[str], limit: int, batch_size: int, observer: Observer | None = None,
) -> dict[str, DrainResult]:
    """Apply each flow's next steps until a gap, a block, idle or ``limit``,
    ``batch_size`` applies to a transaction (opened by ``write``).  The
    ``observer`` counts the applies and logs each outcome after its commit."""
    notes: list[Note] | None = [] if observer is not None and CONSUMER.isEnabledFor(WARNING) else None
    results: dict[str, DrainResult] = {}
    at = 0  # the flow being drained: flows[at]
    applied, last = 0, None  # of that flow, in transactions committed so far
    while at < len(flows):

        def once(i: int = at, flow_applied: int = applied, flow_last: ApplyResult | None = last
                 ) -> tuple[int, int, int, ApplyResult | None, dict[str, DrainResult]]:
            """One transaction from where the committed ones left off: the
            position, counts and results it reaches (kept only once it
            committed, so an aborted run is simply run again)."""
            if notes:
                notes.clear()
            done, finished = 0, {}
            with write() as unit:
                known: FlowState | None = None  # re-read in every new transaction
                while i < len(flows) and done < batch_size:
                    flow = flows[i]
                    flow_last, known = apply_in(unit, rules, flow, known, notes)
                    if flow_last.status == ApplyStatus.APPLIED:
                        flow_applied += 1
                        done += 1
                        if flow_applied < limit:
                            continue
                        stop = DrainStop.LIMIT
                    else:
                        stop = DrainStop(flow_last.status.value)
                    finished[flow] = DrainResult(flow, flow_applied, stop, flow_last)
                    i += 1
                    flow_applied, flow_last, known = 0, None, None
            return i, done, flow_applied, flow_last, finished

        at, done_in_batch, applied, last, finished = conflicts.rerun_on_conflict(once)
        results.update(finished)
        if done_in_batch:
            crash_point("apply.after_commit")
        if observer is not None:
            observer.applied += done_in_batch
            observer.emit(notes)
    return results
