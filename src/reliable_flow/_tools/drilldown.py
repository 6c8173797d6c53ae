"""``reliable-flow inspect --flow`` / ``--event``: why one flow or one event is
stuck, from both stores at once (read only), and what needs a person.

Each store (a SQLite file or a PostgreSQL location, see :mod:`.stores`) is
read in its own read transaction (no transaction spans two stores).  Times are seconds since the epoch; ``attention`` lists what makes
``inspect`` exit 1 (see docs/operations.md for every key).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from .._core.effects import with_waits
from .._core.operate import effect_attention, needs_attention, why_waiting
from .._core.owed import pair_refusal
from .._store import InboxReads, OutboxReads
from .._store.records import as_flow_dict
from ..errors import ConsumerMismatch
from ..records import DeliveryRecord, InboxRow, OutboxEntry, ScheduledEffect, StuckFlow
from ..statuses import DeliveryState, EffectState, FlowWait
from .stores import Location, open_consumer, open_producer, shown

__all__ = [
    "DEFAULT_STUCK_AFTER",
    "attention_lines",
    "consumer_attention",
    "effect_dict",
    "effect_item",
    "effect_report",
    "effect_report_of",
    "effect_state",
    "event_report",
    "flow_dict",
    "flow_report",
    "flow_report_of",
    "format_effect_report",
    "format_event_report",
    "format_flow_report",
    "opened",
    "row_dict",
    "set_aside_attention",
    "shows_due",
    "when",
]

#: Seconds a flow may wait at a gap, or with its next step pending, before
#: ``inspect`` calls it stuck.
DEFAULT_STUCK_AFTER = 300.0


@contextmanager
def opened(producer_path: Location, consumer_path: Location) -> Iterator[tuple[OutboxReads, InboxReads]]:
    """Both stores, opened read-only, each inside one read transaction;
    :class:`~reliable_flow.errors.ConsumerMismatch` when they share no
    registration (:func:`~reliable_flow._core.owed.pair_refusal`)."""
    producer = open_producer(producer_path)
    try:
        consumer = open_consumer(consumer_path)
        try:
            with producer.read() as p_reads, consumer.read() as c_reads:
                meta = c_reads.meta()
                why = pair_refusal(shown(producer_path, producer), shown(consumer_path, consumer),
                                   p_reads.consumers(), meta.get("name"), meta.get("uid"))
                if why is not None:
                    raise ConsumerMismatch(why)
                yield p_reads, c_reads
        finally:
            consumer.close()
    finally:
        producer.close()


def when(seconds: float | None) -> str:
    """An epoch time as UTC ISO 8601 ("-" for none)."""
    if not seconds:
        return "-"
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")


# -- JSON-able pieces -------------------------------------------------------------------------


def row_dict(row: InboxRow) -> dict[str, Any]:
    return {"event_id": row.event_id, "flow_id": row.flow_id, "seq": row.seq, "state": row.state.value,
            "reason": None if row.reason is None else row.reason.value, "detail": row.detail,
            "received_at": row.received_at, "blocked_at": row.blocked_at}


def flow_dict(flow: StuckFlow) -> dict[str, Any]:
    return {"flow_id": flow.flow_id, "state": flow.state, "last_seq": flow.last_seq, "next_seq": flow.next_seq,
            "wait": flow.wait.value, "since": flow.since,
            "reason": None if flow.reason is None else flow.reason.value, "detail": flow.detail,
            "rows": [row_dict(r) for r in flow.rows]}


def _delivery(d: DeliveryRecord, now: float) -> dict[str, Any]:
    """A delivery, with whether its lease (held until ``due_at``) has ended."""
    return {"state": d.state.value, "last_status": d.last_status, "attempts": d.attempts,
            "last_error": d.last_error, "due_at": d.due_at, "lease_owner": d.lease_owner,
            "lease_expired": None if d.lease_owner is None else d.due_at <= now}


def effect_dict(e: ScheduledEffect) -> dict[str, Any]:
    return {"key": e.key, "name": e.name, "flow_id": e.flow_id, "event_id": e.event_id, "seq": e.seq,
            "state": e.state.value, "ordered": e.ordered, "attempts": e.attempts, "due_at": e.due_at,
            "lease_owner": e.lease_owner, "last_error": e.last_error, "reason": e.reason, "fed": e.fed,
            "waiting_behind": e.waiting_behind,
            "waiting_behind_state": None if e.waiting_behind_state is None else e.waiting_behind_state.value}


def effect_state(e: dict[str, Any]) -> str:
    """An effect's state for a person: ``waiting behind <key> (<state>)`` when it waits."""
    if e.get("waiting_behind"):
        return f"waiting behind {e['waiting_behind']} ({e['waiting_behind_state']})"
    return str(e["state"])


def shows_due(e: dict[str, Any]) -> bool:
    """``due_at`` means something only while an executor will take the effect up by itself."""
    live = (EffectState.PENDING, EffectState.RUNNING, EffectState.IN_DOUBT)
    return e["state"] in live and not e.get("waiting_behind")


def _event(entry: OutboxEntry, now: float) -> dict[str, Any]:
    return {"event_id": entry.event_id, "seq": entry.seq,
            "deliveries": {n: _delivery(d, now) for n, d in entry.deliveries.items()}}


# -- attention ------------------------------------------------------------------------------------


def _item(kind: str, consumer: str | None, flow_id: str, seq: int, event_id: str | None, since: float | None,
          reason: str | None, detail: str | None, effect_key: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "consumer": consumer, "flow_id": flow_id, "seq": seq, "event_id": event_id,
            "since": since, "reason": reason, "detail": detail, "effect_key": effect_key}


_EFFECT_ADVICE = {
    "effect_dead": "fix the cause, then retry_effect; or resolve_effect / cancel_effect",
    "effect_unknown": "ask the target whether it happened (by the key), then resolve_effect, retry_effect "
                      "or cancel_effect",
    "effect_in_doubt": "may or may not have taken effect: an executor reconciles it or re-runs it by key "
                       "(is one running?); or resolve_effect / cancel_effect",
    "feedback_refused": "its result could not be advanced into the producer; fed again on every executor pass",
}


def effect_item(name: str | None, effect: ScheduledEffect, now: float) -> dict[str, Any] | None:
    """The attention item for an effect that is dead, unknown, in doubt, or
    whose feedback was refused (see docs/effects.md, 'Operating it')."""
    kind = effect_attention(effect, now)
    if kind is None:
        return None
    error = f"{effect.last_error}: " if effect.last_error else ""
    return _item(kind, name, effect.flow_id, effect.seq, effect.event_id, effect.updated_at, effect.reason,
                 f"effect {effect.name!r}: {error}{_EFFECT_ADVICE[kind]}", effect.key)


def _effect_items(name: str | None, effects: list[ScheduledEffect], now: float) -> list[dict[str, Any]]:
    return [item for e in effects if (item := effect_item(name, e, now)) is not None]


def consumer_attention(name: str | None, flow: StuckFlow, now: float, stuck_after: float) -> dict[str, Any] | None:
    """The attention item for a flow that is blocked, or ready / at a gap too long."""
    if not needs_attention(flow, now, stuck_after):
        return None
    at_next = [r for r in flow.rows if r.seq == flow.next_seq and r.state.value in ("pending", "blocked")]
    event_id = at_next[0].event_id if at_next else None
    detail = flow.detail
    if flow.wait is FlowWait.READY:
        detail = "pending and not applied: is an apply (worker) running for this consumer?"
    reason = None if flow.reason is None else flow.reason.value
    return _item(flow.wait.value, name, flow.flow_id, flow.next_seq, event_id, flow.since, reason, detail)


def set_aside_attention(consumer: str, flow_id: str, seq: int, event_id: str, last_status: str | None
                        ) -> dict[str, Any]:
    return _item("set_aside", consumer, flow_id, seq, event_id, None, last_status,
                 "the consumer answered with a conflict: see docs/operations.md, 'An event is set aside'")


def _set_aside(entries: list[OutboxEntry]) -> list[dict[str, Any]]:
    return [set_aside_attention(name, e.flow_id, e.seq, e.event_id, d.last_status)
            for e in entries for name, d in sorted(e.deliveries.items()) if d.state is DeliveryState.SET_ASIDE]


# -- the two drill-downs --------------------------------------------------------------------------


def flow_report(producer_path: Location, consumer_path: Location, flow_id: str, *,
                stuck_after: float = DEFAULT_STUCK_AFTER, now: float | None = None) -> dict[str, Any]:
    """One flow on both sides: the producer's flow and its events' delivery state
    per consumer; the consumer's projection, next seq, rows and why it waits."""
    with opened(producer_path, consumer_path) as (p, c):
        return flow_report_of(p, c, flow_id, stuck_after=stuck_after, now=now)


def flow_report_of(p: OutboxReads, c: InboxReads, flow_id: str, *, stuck_after: float = DEFAULT_STUCK_AFTER,
                   now: float | None = None) -> dict[str, Any]:
    """:func:`flow_report` from reads already open (the console's, kept open between pages)."""
    now = time.time() if now is None else now
    entries = p.outbox(flow_id)
    produced = as_flow_dict(p.flow_state(flow_id))
    name = c.meta().get("name")
    flow = why_waiting(c, flow_id)
    effects = with_waits(c, c.effect_list(flow_id=flow_id))
    attention = _set_aside(entries)
    item = consumer_attention(name, flow, now, stuck_after)
    if item is not None:
        attention.insert(0, item)
    attention += _effect_items(name, effects, now)
    return {
        "checked_at": now, "stuck_after": stuck_after, "flow_id": flow_id,
        "producer": {"flow": produced, "events": [_event(e, now) for e in entries]},
        "consumer": {"name": name, "flow": flow_dict(flow), "effects": [effect_dict(e) for e in effects]},
        "attention": attention,
    }


def event_report(producer_path: Location, consumer_path: Location, event_id: str, *,
                 stuck_after: float = DEFAULT_STUCK_AFTER, now: float | None = None) -> dict[str, Any]:
    """One event on both sides: its envelope, its delivery state per consumer and
    the operator actions on it (producer); its inbox row, its flow's wait and
    the skips / replacements naming it (consumer)."""
    now = time.time() if now is None else now
    with opened(producer_path, consumer_path) as (p, c):
        stored = p.find_event(event_id)
        envelope = None if stored is None else stored.body
        entries = [] if envelope is None else [e for e in p.outbox(_flow_of(envelope)) if e.event_id == event_id]
        actions = [a.as_dict() for a in p.operator_actions(event_id)]
        name = c.meta().get("name")
        found = c.inbox_row(event_id)
        row = None if found is None else found.row()
        inbox_body = None if found is None else found.body
        flow = None if row is None else why_waiting(c, row.flow_id)
        inbox_actions = [a.as_dict() for a in c.inbox_actions(event_id)]
        effects = [] if row is None else with_waits(
            c, [e for e in c.effect_list(flow_id=row.flow_id) if e.event_id == event_id])
    attention = _set_aside(entries)
    if flow is not None and row is not None and row.seq == flow.next_seq:
        item = consumer_attention(name, flow, now, stuck_after)
        if item is not None and item["event_id"] in (event_id, None):
            attention.insert(0, item)
    attention += _effect_items(name, effects, now)
    return {
        "checked_at": now, "stuck_after": stuck_after, "event_id": event_id,
        "producer": {
            "event": None if envelope is None else _json(envelope),
            "deliveries": {} if not entries else {n: _delivery(d, now) for n, d in entries[0].deliveries.items()},
            "operator_actions": actions,
        },
        "consumer": {
            "name": name, "row": None if row is None else row_dict(row),
            "event": None if inbox_body is None else _json(inbox_body),
            "flow": None if flow is None else flow_dict(flow), "actions": inbox_actions,
            "effects": [effect_dict(e) for e in effects],
        },
        "attention": attention,
    }


def effect_report(producer_path: Location, consumer_path: Location, key: str, *,
                  stuck_after: float = DEFAULT_STUCK_AFTER, now: float | None = None) -> dict[str, Any]:
    """One effect (by idempotency key): its row in the effect outbox, its
    durable history in order (every transition, with time, attempt and
    executor) and the operator actions on it (consumer side; the producer
    is opened only to check the pair)."""
    with opened(producer_path, consumer_path) as (_, c):
        return effect_report_of(c, key, stuck_after=stuck_after, now=now)


def effect_report_of(c: InboxReads, key: str, *, stuck_after: float = DEFAULT_STUCK_AFTER,
                     now: float | None = None) -> dict[str, Any]:
    """:func:`effect_report` from the consumer's reads already open."""
    now = time.time() if now is None else now
    name = c.meta().get("name")
    found = c.effect(key)
    effect = None if found is None else with_waits(c, [found])[0]
    history = [dataclasses.asdict(t) for t in c.effect_history(key)]
    actions = [a.as_dict() for a in c.effect_actions(key)]
    return {
        "checked_at": now, "stuck_after": stuck_after, "effect_key": key,
        "consumer": {"name": name, "effect": None if effect is None else effect_dict(effect),
                     "history": history, "actions": actions},
        "attention": [] if effect is None else _effect_items(name, [effect], now),
    }


def format_effect_report(report: dict[str, Any]) -> str:
    c = report["consumer"]
    effect = c["effect"]
    if effect is None:
        lines = [f"effect {report['effect_key']!r}: not in the effect outbox of {c['name']!r}"
                 + (" (pruned: its history went with it)" if not c["history"] else "")]
    else:
        lines = [f"effect {report['effect_key']!r} ({effect['name']}) of consumer {c['name']!r}: "
                 f"{effect_state(effect)}, attempts {effect['attempts']}"
                 + (f", due {when(effect['due_at'])}" if shows_due(effect) else ""),
                 f"  event {effect['event_id']} flow {effect['flow_id']!r} seq {effect['seq']}"]
    if c["history"]:
        lines.append("history:")
        for t in c["history"]:
            who = f" [{t['owner']}]" if t["owner"] else ""
            due = f" due {when(t['due_at'])}" if t["due_at"] is not None else ""
            detail = f": {t['detail']}" if t["detail"] else ""
            lines.append(f"  {when(t['at'])}  {t['transition']:<16} attempt {t['attempt']}{who}{due}{detail}")
    return "\n".join(lines + attention_lines(report))


def _json(body: str) -> Any:
    return json.loads(body)


def _flow_of(body: str | None) -> str | None:
    return None if body is None else str(_json(body)["flow_id"])


# -- text -------------------------------------------------------------------------------------------


def attention_lines(report: dict[str, Any]) -> list[str]:
    items = report["attention"]
    if not items:
        return [f"nothing needs attention (stuck after {report['stuck_after']:g} s)"]
    lines = [f"needs attention ({len(items)}):"]
    for a in items:
        where = f"flow {a['flow_id']!r} seq {a['seq']}" + (f" event {a['event_id']}" if a["event_id"] else "")
        if a.get("effect_key"):
            where += f" effect {a['effect_key']}"
        extra = "".join(f"  {k}={a[k]}" for k in ("consumer", "reason") if a[k])
        since = f"  since {when(a['since'])}" if a["since"] else ""
        lines.append(f"  {a['kind']}: {where}{extra}{since}")
        if a["detail"]:
            lines.append(f"    {a['detail']}")
    return lines


def _delivery_lines(deliveries: dict[str, dict[str, Any]], indent: str) -> list[str]:
    lines = []
    for name, d in deliveries.items():
        text = f"{indent}to {name!r}: {d['state']}, attempts {d['attempts']}"
        if d["last_status"]:
            text += f", last answer {d['last_status']}"
        if d["lease_owner"]:
            state = "expired" if d["lease_expired"] else "held"
            text += f", lease {state} by {d['lease_owner']} until {when(d['due_at'])}"
        elif d["state"] == "pending" and d["due_at"]:
            text += f", due {when(d['due_at'])}"
        if d["last_error"]:
            text += f", last error: {d['last_error']}"
        lines.append(text)
    return lines


def _flow_lines(name: str | None, flow: dict[str, Any]) -> list[str]:
    lines = [f"consumer {name!r}: state {flow['state']}, last_seq {flow['last_seq']}, next seq {flow['next_seq']}: "
             f"{flow['wait']}" + (f" since {when(flow['since'])}" if flow["since"] else "")]
    why = ": ".join(str(x) for x in (flow["reason"], flow["detail"]) if x)
    if why:
        lines.append(f"  {why}")
    for r in flow["rows"]:
        text = f"  seq {r['seq']} {r['event_id']}: {r['state']}, received {when(r['received_at'])}"
        if r["blocked_at"]:
            text += f", blocked {when(r['blocked_at'])}"
        lines.append(text)
    return lines


def _effect_lines(effects: list[dict[str, Any]], indent: str) -> list[str]:
    lines = []
    for e in effects:
        text = f"{indent}effect {e['key']} ({e['name']}): {effect_state(e)}, attempts {e['attempts']}"
        if e["lease_owner"]:
            text += f", lease held by {e['lease_owner']}"
        if shows_due(e):
            text += f", due {when(e['due_at'])}"
        text += "".join(f", {k} {e[k]}" for k in ("reason", "last_error") if e[k])
        lines.append(text)
    return lines


def format_flow_report(report: dict[str, Any]) -> str:
    p, c = report["producer"], report["consumer"]
    flow = p["flow"]
    lines = [f"flow {report['flow_id']!r}"]
    lines.append("producer: " + ("no such flow" if flow is None else f"state {flow['state']}, seq {flow['seq']}"))
    for e in p["events"]:
        lines.append(f"  seq {e['seq']} {e['event_id']}")
        lines += _delivery_lines(e["deliveries"], "    ")
    lines += _flow_lines(c["name"], c["flow"])
    lines += _effect_lines(c["effects"], "  ")
    return "\n".join(lines + attention_lines(report))


def format_event_report(report: dict[str, Any]) -> str:
    p, c = report["producer"], report["consumer"]
    event = p["event"] or c["event"]
    lines = [f"event {report['event_id']!r}"]
    if event is not None:
        lines.append(f"  flow {event['flow_id']!r} seq {event['seq']} kind {event['kind']} schema {event['schema']}")
        lines.append(f"  payload {event['payload']}" + (f"  meta {event['meta']}" if event.get("meta") else ""))
    lines.append("producer: " + ("not in the outbox" if p["event"] is None else "in the outbox"))
    lines += _delivery_lines(p["deliveries"], "  ")
    for a in p["operator_actions"]:
        lines.append(f"  {a['action']} for {a['consumer']!r} by {a['actor']} at {when(a['at'])}: {a['reason']}")
    row = c["row"]
    if row is None:
        lines.append(f"consumer {c['name']!r}: not in the inbox")
    else:
        if p["event"] is not None and c["event"] is not None and p["event"] != c["event"]:
            lines.append("  the consumer holds another body under this id (an id conflict)")
        lines.append(f"consumer {c['name']!r}: {row['state']}" + (f" ({row['reason']})" if row["reason"] else "")
                     + f", received {when(row['received_at'])}")
        if row["detail"]:
            lines.append(f"  {row['detail']}")
        lines += _flow_lines(c["name"], c["flow"])[:1]
    for a in c["actions"]:
        replaced = f" by {a['replacement_event_id']}" if a["replacement_event_id"] else ""
        lines.append(f"  {a['action']} of {a['event_id']}{replaced} by {a['actor']} at {when(a['at'])}: {a['reason']}")
    lines += _effect_lines(c.get("effects", []), "  ")
    return "\n".join(lines + attention_lines(report))
