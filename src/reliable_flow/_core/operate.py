"""The operator's decisions: why a consumer's flow waits, the way past a bad
accepted event (skip it, or replace it by a corrected one), and the
producer's consumer registry.  Nothing here runs by itself: each change is
asked for by a person and recorded with who, when and why.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import _envelope as envelope
from .._envelope import Envelope
from .._store import FlowState, InboxReads, InboxUnit, OutboxReads, OutboxUnit, StoredRow
from ..errors import InvalidEnvelope, NotResolvable, UnknownConsumer, UnknownEvent
from ..protocol import Protocol
from ..records import ConsumerEntry, InboxRow, OperatorAction, ScheduledEffect, StuckFlow
from ..statuses import ActionTarget, EffectState, FlowWait, InboxState
from .effects import FAILED, FEEDBACK_REFUSED, waiting_behind
from .order import ORDER_META, STRICT

__all__ = [
    "effect_attention", "feedback_refused", "needs_attention", "refused_names", "register_in", "remove_in",
    "replace_in", "skip_in", "unknown_consumer", "why_waiting",
]

_WAITING = (InboxState.PENDING, InboxState.BLOCKED)


# -- why a flow waits ----------------------------------------------------------------------


def why_waiting(reads: InboxReads, flow_id: str) -> StuckFlow:
    """What ``flow_id`` waits for, from one snapshot of the consumer's store.

    A ``latest`` or ``any`` consumer (:mod:`.order`) never waits at a gap:
    its flow is blocked (a blocked row of it waits for an operator), ready
    (a pending row waits for the next apply) or idle."""
    projection = reads.projection(flow_id)
    state = None if projection is None else str(projection["state"])
    last_seq = 0 if projection is None else int(projection["last_seq"])
    next_seq = last_seq + 1
    unordered = (reads.meta_value(ORDER_META) or STRICT) != STRICT
    stored = reads.inbox_rows(flow_id, 1 if unordered else next_seq)
    rows = tuple(r.row() for r in stored)
    live = [r for r in rows if r.state is not InboxState.REPLACED]
    if unordered:
        rows = tuple(r for r in rows if r.state in _WAITING)
        blocked = [r for r in rows if r.state is InboxState.BLOCKED]
        live = blocked[-1:] or list(rows[:1])
    # A subscriber to some topics: its next row may be past next_seq, its
    # delivery's prev_seq saying which event of the flow comes before it.
    prev = {r.event_id: envelope.previous(r.body) for r in stored}

    def stuck(wait: FlowWait, since: float | None = None, row: InboxRow | None = None,
              detail: str | None = None) -> StuckFlow:
        reason = None if row is None else row.reason
        return StuckFlow(flow_id, state, last_seq, next_seq, wait, since, reason,
                         detail if row is None else row.detail, rows)

    if not live:
        waits = _effect_wait(reads, flow_id)
        if waits is not None:
            effect, blocker = waits
            return stuck(FlowWait.EFFECT, blocker.updated_at, detail=(
                f"effect {effect.key!r} waits behind {blocker.key!r} ({blocker.state})"))
        return stuck(FlowWait.IDLE)
    first = live[0]
    first_prev = prev[first.event_id]
    if unordered or first.seq == next_seq or (first_prev is not None and first_prev <= last_seq):
        if first.state is InboxState.BLOCKED:
            since = first.blocked_at if first.blocked_at is not None else first.received_at
            return stuck(FlowWait.BLOCKED, since, first)
        return stuck(FlowWait.READY, first.received_at)
    # A gap: it has waited since the oldest row behind it arrived (unknown if
    # any of them was stored before the file recorded arrival times).
    times = [r.received_at for r in live if r.state in _WAITING]
    since = None if not times or any(t is None for t in times) else min(t for t in times if t is not None)
    missing = next_seq if first_prev is None else first_prev
    return stuck(FlowWait.GAP, since, detail=f"seq {missing} has not arrived")


def _previous(row: StoredRow) -> int:
    """The seq of the flow's previous event for this consumer, before ``row``."""
    prev = envelope.previous(row.body)
    return row.seq - 1 if prev is None else prev


def _effect_wait(reads: InboxReads, flow_id: str) -> tuple[ScheduledEffect, ScheduledEffect] | None:
    """The flow's first effect that waits behind an earlier one, and that one."""
    effects = reads.effect_list(flow_id=flow_id)
    for effect in effects:
        blocker = waiting_behind(effect, effects)
        if blocker is not None:
            return effect, blocker
    return None


def needs_attention(flow: StuckFlow, now: float, stuck_after: float) -> bool:
    """Blocked, or ready / at a gap for ``stuck_after`` seconds or more (or since
    an unknown time: rows stored before arrival times were recorded).  A wait
    behind an effect is not itself an item: the effect waited behind is one
    when it needs a person (:func:`effect_attention`)."""
    if flow.wait is FlowWait.BLOCKED:
        return True
    if flow.wait in (FlowWait.IDLE, FlowWait.EFFECT):
        return False
    return flow.since is None or now - flow.since >= stuck_after


def feedback_refused(effect: ScheduledEffect) -> bool:
    """Succeeded (or failed for good), its result (or failure step) owed to
    the producer, and the last try to feed it back was refused (the executor
    records the refusal, a text beginning with ``feedback``, in
    ``last_error``, and tries again on every pass)."""
    return ((effect.state is EffectState.SUCCEEDED or effect.state in FAILED) and effect.fed is False
            and (effect.last_error or "").startswith(FEEDBACK_REFUSED))


def effect_attention(effect: ScheduledEffect, now: float) -> str | None:
    """Why ``inspect`` lists an effect as needing attention (its attention
    ``kind``), or None: ``effect_dead`` and ``effect_unknown`` (they wait for
    an operator), ``effect_in_doubt`` (``in_doubt``, or ``running`` with its
    lease ended at ``now``: it may or may not have taken effect),
    ``feedback_refused`` (see :func:`feedback_refused`)."""
    if effect.state is EffectState.DEAD:
        return "effect_dead"
    if effect.state is EffectState.UNKNOWN:
        return "effect_unknown"
    if effect.state is EffectState.IN_DOUBT or (effect.state is EffectState.RUNNING and effect.due_at <= now):
        return "effect_in_doubt"
    if feedback_refused(effect):
        return "feedback_refused"
    return None


# -- a way past a bad accepted event ---------------------------------------------------------------


def _waiting_row(unit: InboxUnit, event_id: str, action: str, location: str) -> StoredRow:
    row = unit.inbox_row(event_id)
    if row is None:
        raise UnknownEvent(f"event {event_id!r} is not in the inbox of {location}")
    if row.state not in _WAITING:
        raise NotResolvable(f"event {event_id!r} is {row.state} in {location}; only a pending or blocked "
                            f"event can be {action}")
    return row


def skip_in(unit: InboxUnit, protocol: Protocol, event_id: str, actor: str, reason: str, now: float,
            location: str) -> OperatorAction:
    """Move the event's flow past it: the projection's last_seq becomes its seq,
    state and data unchanged, no effect record; the row ends ``skipped``."""
    row = _waiting_row(unit, event_id, "skipped", location)
    known = unit.flow_state(row.flow_id) or FlowState(protocol.initial, 0, {})
    if not _previous(row) <= known.seq < row.seq:
        raise NotResolvable(
            f"event {event_id!r} is seq {row.seq} of flow {row.flow_id!r}, whose next step is seq "
            f"{known.seq + 1}; only the next step can be skipped"
        )
    view = protocol.view(known.state, known.data)
    unit.put_projection(row.flow_id, known.state, row.seq, envelope.canonical(known.data), envelope.canonical(view))
    unit.set_skipped(event_id)
    action = OperatorAction(at=now, target=ActionTarget.INBOX, event_id=event_id, flow_id=row.flow_id, seq=row.seq,
                            action="skip", previous_state=row.state, actor=actor, reason=reason)
    unit.record_action(action)
    return action


def replace_in(unit: InboxUnit, event_id: str, corrected: Envelope, actor: str, reason: str, now: float,
               location: str) -> OperatorAction:
    """Keep the event as ``replaced`` and store ``corrected`` (same flow and seq,
    a new id) pending in its place."""
    row = _waiting_row(unit, event_id, "replaced", location)
    if (corrected.flow_id, corrected.seq) != (row.flow_id, row.seq):
        raise InvalidEnvelope(
            "envelope", f"a replacement must have the flow and seq of the event it replaces "
            f"({row.flow_id!r}, {row.seq}), got ({corrected.flow_id!r}, {corrected.seq})"
        )
    if unit.inbox_row(corrected.event_id) is not None or unit.tombstone(corrected.event_id) is not None:
        raise InvalidEnvelope("event_id", f"{corrected.event_id!r} is already in the inbox (or was, and was "
                                          f"pruned); a replacement needs a new event id")
    unit.set_replaced(event_id)
    unit.insert(corrected, now)
    action = OperatorAction(at=now, target=ActionTarget.INBOX, event_id=event_id, flow_id=row.flow_id, seq=row.seq,
                            action="replace", previous_state=row.state, actor=actor, reason=reason,
                            replacement_event_id=corrected.event_id)
    unit.record_action(action)
    return action


# -- the consumer registry ----------------------------------------------------------------------


def unknown_consumer(location: str, name: str, known: Sequence[ConsumerEntry]) -> UnknownConsumer:
    names = ", ".join(repr(c.name) for c in known) or "none"
    return UnknownConsumer(
        f"producer {location} has no consumer named {name!r} (registered: {names}). A new name "
        f"gets every event from the first one, so it is registered only when asked: "
        f"producer.admin.register_consumer({name!r}, actor=..., reason=...), relay(..., register=True), "
        f"Worker(..., register=True) or `reliable-flow run --register`"
    )


def refused_names(reads: OutboxReads, names: Sequence[str]) -> list[str]:
    """The names a relay would refuse without ``register=True``: those not
    registered, except the first one when the producer has no consumer."""
    known = {c.name for c in reads.consumers()}
    missing = [n for n in names if n not in known]
    return missing if known else missing[1:]


def register_in(unit: OutboxUnit, name: str, from_now: bool, record: OperatorAction, location: str,
                every_event: bool = True) -> None:
    if unit.is_registered(name):
        raise NotResolvable(f"consumer {name!r} is already registered in {location}")
    unit.register_consumer(name, record.at, from_now, every_event)
    unit.record_action(record)


def remove_in(unit: OutboxUnit, name: str, record: OperatorAction, location: str) -> None:
    if not unit.is_registered(name):
        raise unknown_consumer(location, name, unit.consumers())
    unit.remove_consumer(name)
    unit.record_action(record)

