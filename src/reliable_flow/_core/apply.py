"""``apply_next`` and ``drain``: apply exactly a flow's next step, in the
consumer's unit of work, or say why not."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _envelope as envelope
from .._effects import EffectRegistry
from .._envelope import Envelope
from .._handlers import ApplyContext, Event, Handler
from .._store import FlowState, InboxUnit
from ..crash import crash_point
from ..protocol import PayloadError, Protocol, Rejected
from ..records import ApplyResult, DrainResult
from ..statuses import ApplyStatus, BlockReason, DrainStop
from . import order

__all__ = ["ApplyRules", "Committed", "Draining", "Source", "apply_arrived", "apply_event", "apply_in", "drain_in",
           "unordered_apply_in"]

#: What an apply outcome is about, for the face to log it with: the event
#: applied or blocked (a dict), the body of the row waiting after a gap (a
#: str, parsed only if the record is wanted), or None (idle).
Source = dict[str, Any] | str | None


@dataclass(frozen=True)
class ApplyRules:
    """Everything an apply decides with: the protocol, the schemas this
    consumer decodes, its handlers, the effects they may schedule, its name
    (for effect keys) and its clock."""

    protocol: Protocol
    schemas: Collection[int]
    handlers: Sequence[Handler] = ()
    effects: EffectRegistry | None = None
    consumer: str = "default"
    clock: Callable[[], float] | None = None
    order: str = order.STRICT


def _handle(unit: InboxUnit, rules: ApplyRules, event: Event, previous: str, new_state: str,
            new_data: dict[str, Any]) -> None:
    assert rules.clock is not None
    ctx = ApplyContext(unit, event, previous, new_state, new_data, rules.consumer, rules.effects, rules.clock())
    for handler in rules.handlers:
        handler(ctx)


def apply_in(
    unit: InboxUnit, rules: ApplyRules, flow_id: str, known: FlowState | None = None,
) -> tuple[ApplyResult, FlowState | None, Source]:
    """One apply step inside ``unit``'s transaction: the outcome, the flow's
    state after it, and what the outcome is about (:data:`Source`).

    ``known`` is the flow's state as left by the previous step of the same
    transaction, which holds the write lock, so it cannot be stale; the new
    one is returned after an apply.  A ``latest`` or ``any`` consumer's
    step is :func:`unordered_apply_in`'s.
    """
    if rules.order != order.STRICT:
        return unordered_apply_in(unit, rules, flow_id, known)
    protocol = rules.protocol
    if known is None:
        stored, row = unit.flow_and_next_row(flow_id)
        known = stored or FlowState(protocol.initial, 0, {})
    else:
        row = unit.next_row(flow_id, known.seq + 1)
    seq = known.seq + 1
    if row is None:
        return ApplyResult(ApplyStatus.IDLE, flow_id, seq), known, None
    found_seq, event_id, body = row
    if found_seq != seq:
        # The flow's next row for this consumer applies when the delivery
        # says its previous event for this consumer is the last applied one
        # (a subscriber to some topics only: issue 32); else a gap.
        prev = envelope.previous(body)
        if prev is None or prev > known.seq:
            missing, detail = (seq, f"seq {seq} has not arrived") if prev is None else (
                prev, f"seq {prev}, the flow's event for this consumer before seq {found_seq}, has not arrived")
            return ApplyResult(ApplyStatus.GAP, flow_id, missing, detail=detail), known, body
        seq = found_seq
    event = json.loads(body)
    result, state = apply_event(unit, rules, known, seq, event_id, event, body)
    return result, state, event


def unordered_apply_in(
    unit: InboxUnit, rules: ApplyRules, flow_id: str, known: FlowState | None,
) -> tuple[ApplyResult, FlowState | None, Source]:
    """One apply step of a ``latest`` or ``any`` consumer inside ``unit``
    (the rules: :mod:`.order`), as :func:`apply_in`, never a gap: a
    ``latest`` consumer applies the flow's newest waiting row if it is newer
    than the projection (setting every older waiting row aside as
    superseded), an ``any`` consumer its oldest pending row."""
    if known is None:
        known = unit.flow_state(flow_id) or FlowState(rules.protocol.initial, 0, {})
    if rules.order == order.LATEST:
        row = unit.newest_waiting(flow_id)
        if row is not None and row[0] <= known.seq:
            unit.supersede(flow_id, known.seq + 1, order.superseded_detail(known.seq))
            row = None
    else:
        row = unit.oldest_pending(flow_id)
    if row is None:
        return ApplyResult(ApplyStatus.IDLE, flow_id, known.seq + 1), known, None
    seq, event_id, body = row
    event = json.loads(body)
    result, state = apply_event(unit, rules, known, seq, event_id, event, body)
    if result.status == ApplyStatus.APPLIED and rules.order == order.LATEST:
        unit.supersede(flow_id, seq, order.superseded_detail(seq))
    return result, state, event


def apply_event(
    unit: InboxUnit, rules: ApplyRules, known: FlowState, seq: int, event_id: str, event: dict[str, Any],
    body: str,
) -> tuple[ApplyResult, FlowState]:
    """Apply the stored event ``event_id`` (at ``seq``, parsed as ``event``)
    onto the flow's state ``known``, or block it: the outcome and the
    flow's state after it.  The protocol's transition check is made in the
    ``strict`` order only (:mod:`.order`)."""
    flow_id = event["flow_id"]
    try:
        if event["schema"] not in rules.schemas:
            raise Rejected(
                BlockReason.UNSUPPORTED_SCHEMA,
                f"schema {event['schema']} is not decoded by this consumer (decodes {sorted(rules.schemas)})",
            )
        new_data = _next_data(rules, known, event["kind"], event["schema"], event["payload"])
    except Rejected as rejected:
        unit.block(event_id, rejected.reason, rejected.detail, _now(rules))
        return ApplyResult(ApplyStatus.BLOCKED, flow_id, seq, event_id, rejected.reason, rejected.detail), known
    new = order.after(rules.order, known, seq, event["kind"], new_data)
    view = rules.protocol.view(new.state, new_data)
    applied = ApplyResult(ApplyStatus.APPLIED, flow_id, seq, event_id)
    if not rules.handlers:
        _write_applied(unit, flow_id, new, seq, event_id, event["kind"], view)
        return applied, new
    try:
        # Under a nested step: a handler's payload error must leave nothing
        # of this apply behind, only the block.
        with unit.step():
            _write_applied(unit, flow_id, new, seq, event_id, event["kind"], view)
            _handle(unit, rules, Event(event_id, flow_id, seq, event["kind"], event["schema"], event["payload"],
                                       event.get("meta", {}), body), known.state, new.state, new_data)
    except PayloadError as exc:
        unit.block(event_id, BlockReason.INVALID_PAYLOAD, str(exc), _now(rules))
        return ApplyResult(
            ApplyStatus.BLOCKED, flow_id, seq, event_id, BlockReason.INVALID_PAYLOAD, str(exc)
        ), known
    return applied, new


def _next_data(rules: ApplyRules, known: FlowState, kind: str, schema: int, payload: Any) -> dict[str, Any]:
    """The flow's data after the step (:class:`Rejected` if it may not be
    taken): in the flow's order, or out of it (:func:`.order.unordered_data`)."""
    if rules.order == order.STRICT:
        return rules.protocol.next_data(known.state, known.data, kind, schema, payload)
    return order.unordered_data(rules.protocol, known, kind, schema, payload)


def _now(rules: ApplyRules) -> float | None:
    """When a block happens, on the consumer's clock (None without one)."""
    return None if rules.clock is None else rules.clock()


_APPLY_POINTS = ("apply.after_projection", "apply.after_effect")
_ARRIVAL_POINTS = ("receive_apply.after_projection", "receive_apply.after_effect")


def _write_applied(unit: InboxUnit, flow_id: str, new: FlowState, seq: int, event_id: str, kind: str,
                   view: dict[str, Any], points: tuple[str, str] = _APPLY_POINTS) -> None:
    """The flow's projection as ``new`` and the applied event's record (at
    its own ``seq``: in the ``any`` order it may be below the projection's)."""
    unit.put_projection(flow_id, new.state, new.seq, envelope.canonical(new.data), envelope.canonical(view))
    crash_point(points[0])
    unit.record_applied(event_id, flow_id, seq, kind)
    crash_point(points[1])


def apply_arrived(unit: InboxUnit, rules: ApplyRules, env: Envelope) -> bool:
    """Apply the event that receive just stored, in the same transaction,
    when the consumer's order lets it apply now (:func:`.order.applies_on_arrival`:
    in the ``strict`` order, exactly its flow's next step) and it applies
    cleanly: projection, effect record and the row's ``applied`` mark, as
    ``apply_next`` would write them.  Anything else (a gap before it, a
    block: unknown schema, rejected step, payload error in a handler)
    writes nothing here and returns False: the row stays pending and
    ``apply_next`` decides later, exactly as without this mode."""
    known = unit.flow_state(env.flow_id)
    last = 0 if known is None else known.seq
    if not order.applies_on_arrival(rules.order, env, last) or env.schema not in rules.schemas:
        return False
    if known is None:
        known = FlowState(rules.protocol.initial, 0, {})
    try:
        new_data = _next_data(rules, known, env.kind, env.schema, env.payload)
    except Rejected:
        return False
    new = order.after(rules.order, known, env.seq, env.kind, new_data)
    view = rules.protocol.view(new.state, new_data)
    if not rules.handlers:
        _write_applied(unit, env.flow_id, new, env.seq, env.event_id, env.kind, view, _ARRIVAL_POINTS)
    else:
        try:
            with unit.step():
                _write_applied(unit, env.flow_id, new, env.seq, env.event_id, env.kind, view, _ARRIVAL_POINTS)
                _handle(unit, rules, env, known.state, new.state, new_data)  # the Envelope is the Event
        except PayloadError:
            return False
    if rules.order == order.LATEST:
        unit.supersede(env.flow_id, env.seq, order.superseded_detail(env.seq))
    return True


@dataclass(frozen=True)
class Draining:
    """Where a drain stands between its transactions: the flow being
    drained (``flows[at]``), and how many of its steps committed transactions
    applied and the last outcome among them."""

    at: int = 0
    applied: int = 0
    last: ApplyResult | None = None


@dataclass(frozen=True)
class Committed:
    """What one drain transaction did, for the face to keep once it
    committed: where the drain then stands, the events it applied, the
    flows it finished, and every step's outcome with its :data:`Source` (to
    log)."""

    reached: Draining
    applied: int
    finished: dict[str, DrainResult]
    outcomes: list[tuple[ApplyResult, Source]]


def drain_in(unit: InboxUnit, rules: ApplyRules, flows: Sequence[str], start: Draining, limit: int,
             batch_size: int) -> Committed:
    """Apply each flow's next steps from ``start`` on, in ``unit``, until
    ``batch_size`` applies: a flow ends at a gap, a block (an ``any``
    consumer's goes on past it), idle or ``limit`` applies.  Nothing it returns counts until the unit commits, so a unit
    run again after an abort starts again from ``start``."""
    i, flow_applied, flow_last = start.at, start.applied, start.last
    done, finished, outcomes = 0, {}, []
    known: FlowState | None = None  # re-read in every new transaction
    while i < len(flows) and done < batch_size:
        flow = flows[i]
        flow_last, known, source = apply_in(unit, rules, flow, known)
        outcomes.append((flow_last, source))
        if flow_last.status == ApplyStatus.APPLIED:
            flow_applied += 1
            done += 1
            if flow_applied < limit:
                continue
            stop = DrainStop.LIMIT
        elif flow_last.status == ApplyStatus.BLOCKED and rules.order == order.ANY:
            continue  # an any consumer's other events do not wait behind a blocked one (no longer pending)
        else:
            stop = DrainStop(flow_last.status.value)
        finished[flow] = DrainResult(flow, flow_applied, stop, flow_last)
        i += 1
        flow_applied, flow_last, known = 0, None, None
    return Committed(Draining(i, flow_applied, flow_last), done, finished, outcomes)
