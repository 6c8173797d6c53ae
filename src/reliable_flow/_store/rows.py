"""Rows as the engines read them, turned into the records the decision code
sees: one mapper per record, the same for every engine.  An engine selects
the columns in the order written here and hands the row (a tuple) over;
values are normalised (``int``, ``float``, enums, JSON) so that what a
driver returns (SQLite's loose types, PostgreSQL's numerics) does not leak."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..records import (
    AppliedEvent,
    ConsumerEntry,
    DeliveryRecord,
    EffectSchedule,
    EffectTransition,
    OperatorAction,
    OutboxEntry,
    ScheduledEffect,
)
from ..statuses import ActionTarget, BlockReason, DeliveryState, EffectState, InboxState, Transition
from .records import DeliveryCounts, FlowState, InboxCounts, StoredEvent, StoredRow, Tombstone
from .shared import delivery_summary

__all__ = [
    "consumer_entry", "delivery_action", "delivery_counts", "effect", "effect_action", "effect_record",
    "effect_transition", "flow_state",
    "inbox_action", "inbox_counts", "outbox_entries", "projection", "registry_action", "schedule", "schedule_action",
    "stored_event", "stored_row", "tombstone",
]

Row = Sequence[Any]


def flow_state(row: Row) -> FlowState:
    """``(state, seq | last_seq, data)``."""
    return FlowState(str(row[0]), int(row[1]), json.loads(row[2]))


def projection(row: Row) -> dict[str, Any]:
    """``(state, last_seq, view)``: ``{"state", "last_seq", **view}``."""
    return {"state": row[0], "last_seq": int(row[1]), **json.loads(row[2])}


def stored_event(row: Row) -> StoredEvent:
    """``(pos, seq, body)``."""
    return StoredEvent(int(row[0]), int(row[1]), str(row[2]))


def tombstone(row: Row) -> Tombstone:
    """``(flow_id, seq, body_hash)``."""
    return Tombstone(str(row[0]), int(row[1]), bytes(row[2]))


def outbox_entries(events: Iterable[Row], deliveries: Iterable[Row], consumer: str | None) -> list[OutboxEntry]:
    """``events``: ``(pos, event_id, flow_id, seq)`` in commit order;
    ``deliveries``: ``(pos, consumer, state, last_status, attempts,
    last_error, due_at, lease_owner)`` of those events.  Each event with its
    deliveries and its summary state towards ``consumer`` (all when None)."""
    events = list(events)
    per_event: dict[int, dict[str, DeliveryRecord]] = {int(r[0]): {} for r in events}
    for pos, name, state, last_status, attempts, last_error, due_at, owner in deliveries:
        per_event[int(pos)][name] = DeliveryRecord(
            DeliveryState(state), last_status, int(attempts), last_error, float(due_at), owner
        )
    out = []
    for pos, event_id, fid, seq in events:
        delivered = per_event[int(pos)]
        if consumer is None:
            chosen = delivered
        else:
            chosen = {consumer: delivered[consumer]} if consumer in delivered else {}
        state = delivery_summary(chosen)
        last = [d.last_status for d in chosen.values() if d.last_status is not None]
        out.append(OutboxEntry(
            event_id, fid, int(seq), state == DeliveryState.ACCEPTED, state, last[-1] if last else None, delivered,
        ))
    return out


def delivery_counts(rows: Iterable[Row]) -> tuple[DeliveryCounts, ...]:
    """``(consumer, state, count, retries, failing, leased, untried, oldest_touch)`` per group."""
    return tuple(
        DeliveryCounts(str(c), str(st), int(n), int(retries), int(failing), int(leased), int(untried),
                       None if touch is None else float(touch))
        for c, st, n, retries, failing, leased, untried, touch in rows
    )


def consumer_entry(row: Row) -> ConsumerEntry:
    """``(name, uid, registered_at, from_pos, backlog, set_aside, topics, topics_from)``."""
    name, uid, registered_at, from_pos, backlog, set_aside, topics, topics_from = row
    return ConsumerEntry(name, uid, uid is not None, registered_at, from_pos is not None, int(backlog),
                         int(set_aside), None if topics is None else tuple(json.loads(topics)),
                         None if topics_from is None else int(topics_from))


def stored_row(row: Row) -> StoredRow:
    """``(event_id, flow_id, seq, state, reason, detail, received_at, blocked_at, body)``."""
    return StoredRow(row[0], row[1], int(row[2]), InboxState(row[3]), None if row[4] is None else BlockReason(row[4]),
                     row[5], row[6], row[7], str(row[8]))


def inbox_action(row: Row) -> OperatorAction:
    """``(at, event_id, flow_id, seq, action, previous_state, actor, reason, replacement_event_id)``."""
    return OperatorAction(
        at=float(row[0]), target=ActionTarget.INBOX, event_id=row[1], flow_id=row[2], seq=int(row[3]),
        action=row[4], previous_state=InboxState(row[5]), actor=row[6], reason=row[7], replacement_event_id=row[8],
    )


def delivery_action(row: Row) -> OperatorAction:
    """``(at, consumer, event_id, action, actor, reason)``; no ``previous_state`` (not stored)."""
    return OperatorAction(at=float(row[0]), target=ActionTarget.DELIVERY, consumer=row[1], event_id=row[2],
                          action=row[3], actor=row[4], reason=row[5])


def registry_action(row: Row) -> OperatorAction:
    """``(at, consumer, action, actor, reason, topics)``."""
    return OperatorAction(at=float(row[0]), target=ActionTarget.REGISTRY, consumer=row[1], action=row[2],
                          actor=row[3], reason=row[4], topics=None if row[5] is None else tuple(json.loads(row[5])))


def retention_action(row: Row) -> OperatorAction:
    """``(at, action, horizon, forget_before, actor, reason)``."""
    return OperatorAction(at=float(row[0]), target=ActionTarget.RETENTION, action=row[1], horizon=float(row[2]),
                          forget_before=None if row[3] is None else float(row[3]), actor=row[4], reason=row[5])


def inbox_counts(rows: Iterable[Row], gaps: int) -> InboxCounts:
    """``rows``: ``(state, reason, count)`` groups; ``gaps``: flows stopped at a gap."""
    by_state: dict[str, int] = {}
    blocked: dict[str, int] = {}
    for state, reason, n in rows:
        by_state[state] = by_state.get(state, 0) + int(n)
        if state == InboxState.BLOCKED.value and reason is not None:
            blocked[reason] = blocked.get(reason, 0) + int(n)
    return InboxCounts(by_state, blocked, gaps)


def effect_record(row: Row) -> AppliedEvent:
    """``(event_id, flow_id, seq, kind)``."""
    return AppliedEvent(row[0], row[1], int(row[2]), row[3])


def effect_action(row: Row) -> OperatorAction:
    """``(at, key, action, actor, reason)``."""
    return OperatorAction(at=float(row[0]), target=ActionTarget.EFFECT, key=row[1], action=row[2], actor=row[3],
                          reason=row[4])


#: The columns :func:`schedule` maps, in order.
SCHEDULE_SELECT = ("schedule, name, payload, interval_seconds, cron, tz, missed, paused, next_at, last_tick, "
                   "skipped, created_at, updated_at")


def schedule(row: Row) -> EffectSchedule:
    """A row of :data:`SCHEDULE_SELECT`."""
    return EffectSchedule(
        schedule=row[0], name=row[1], payload=json.loads(row[2]), interval=None if row[3] is None else float(row[3]),
        cron=row[4], tz=row[5], missed=row[6], paused=bool(row[7]), next_at=float(row[8]),
        last_tick=None if row[9] is None else float(row[9]), skipped=int(row[10]), created_at=float(row[11]),
        updated_at=float(row[12]))


def schedule_action(row: Row) -> OperatorAction:
    """``(at, schedule, action, actor, reason)``."""
    return OperatorAction(at=float(row[0]), target=ActionTarget.SCHEDULE, schedule=row[1], action=row[2],
                          actor=row[3], reason=row[4])


def effect_transition(row: Row) -> EffectTransition:
    """``(key, name, at, transition, attempt, owner, detail, due_at)``."""
    return EffectTransition(key=row[0], name=row[1], at=float(row[2]), transition=Transition(row[3]),
                            attempt=int(row[4]), owner=row[5], detail=row[6],
                            due_at=None if row[7] is None else float(row[7]))


#: The effect-outbox columns :func:`effect` reads, in its order.
EFFECT_SELECT = (
    "key, name, payload, event_id, flow_id, seq, meta, state, ordered, deadline, version, attempts, "
    "failures, due_at, lease_owner, last_error, result, reason, fed, created_at, updated_at"
)


def effect(row: Row) -> ScheduledEffect:
    """The columns of :data:`EFFECT_SELECT`."""
    (key, name, payload, event_id, flow_id, seq, meta, state, ordered, deadline, version, attempts,
     failures, due_at, lease_owner, last_error, result, reason, fed, created_at, updated_at) = row
    return ScheduledEffect(
        key, name, json.loads(payload), event_id, flow_id, int(seq), json.loads(meta), EffectState(state),
        bool(ordered), deadline, None if version is None else int(version), int(attempts), int(failures),
        float(due_at), lease_owner, last_error, None if result is None else json.loads(result), reason,
        None if fed is None else bool(fed), float(created_at), float(updated_at),
    )
