"""``reliable-flow inspect``: what an operator needs to see in the two stores
(SQLite files or PostgreSQL locations, see :mod:`.stores`)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from .._core.operate import feedback_refused, why_waiting
from ..records import ScheduledEffect
from ..statuses import EffectState, FlowWait, InboxState
from .attention import attention_items
from .drilldown import (
    DEFAULT_STUCK_AFTER,
    attention_lines,
    effect_state,
    opened,
    shows_due,
    when,
)
from .snapshot import snapshot
from .stores import Location

__all__ = ["format_report", "inspect_files"]


def inspect_files(producer_path: Location, consumer_path: Location, *,
                  stuck_after: float = DEFAULT_STUCK_AFTER, now: float | None = None) -> dict[str, Any]:
    """A summary of both stores, read without writing to either.

    Each is a SQLite file path or a PostgreSQL location (the two may be on
    different engines).

    Keys: ``producer`` (flow and event counts, per consumer the pending and
    set-aside events, the consumer registry), ``consumer`` (inbox counts by
    state, blocked events with reasons and details, flows stopped at a gap,
    why each open flow waits), ``attention`` (what is blocked, set aside, or
    ready / at a gap for ``stuck_after`` seconds or more at ``now``; see
    docs/operations.md for every key).
    """
    snap = snapshot(producer_path, consumer_path)
    at = time.time() if now is None else now
    prod, cons = snap["producer"], snap["consumer"]

    events = [e for entries in prod["outbox"].values() for e in entries]
    consumers = sorted({name for e in events for name in e["deliveries"]})
    per_consumer: dict[str, Any] = {}
    for name in consumers:
        pending, set_aside, skipped, accepted = [], [], [], 0
        for e in events:
            d = e["deliveries"].get(name)
            if d is None:
                continue
            ref = {"event_id": e["event_id"], "flow_id": e["flow_id"], "seq": e["seq"]}
            if d["state"] == "accepted":
                accepted += 1
            elif d["state"] == "set_aside":
                set_aside.append({**ref, "last_status": d["last_status"], "attempts": d["attempts"]})
            elif d["state"] == "skipped":
                skipped.append(ref)
            else:
                pending.append({**ref, "attempts": d["attempts"], "last_error": d["last_error"],
                                "lease_owner": d["lease_owner"], "due_at": d["due_at"]})
        per_consumer[name] = {
            "accepted": accepted, "pending": pending, "set_aside": set_aside, "skipped": skipped,
        }

    counts = {state.value: 0 for state in InboxState}
    blocked, gaps = [], []
    for flow_id, rows in cons["inbox"].items():
        for row in rows:
            counts[row["state"]] += 1
            if row["state"] == "blocked":
                blocked.append({"flow_id": flow_id, "event_id": row["event_id"], "seq": row["seq"],
                                "reason": row["reason"], "meta": row.get("meta", {})})
        if cons.get("order", "strict") != "strict":
            continue  # a latest or any consumer never waits for a missing seq
        projection = cons["projections"].get(flow_id)
        next_seq = (projection["last_seq"] if projection else 0) + 1
        present = {row["seq"] for row in rows}
        waiting = sorted(s for s in present if s > next_seq)
        if next_seq not in present and waiting:
            metas = {row["seq"]: row.get("meta", {}) for row in rows}
            gaps.append({"flow_id": flow_id, "missing_seq": next_seq, "waiting": waiting,
                         "meta": [metas[s] for s in waiting]})  # of the waiting events, in order

    outbox = [ScheduledEffect(**e) for e in cons["effect_outbox"]]
    effect_counts = {state.value: 0 for state in EffectState}
    for effect in outbox:
        effect_counts[effect.state.value] += 1
    attention = [
        {"key": e.key, "name": e.name, "flow_id": e.flow_id, "state": e.state.value, "attempts": e.attempts,
         "due_at": e.due_at, "lease_owner": e.lease_owner, "last_error": e.last_error, "reason": e.reason,
         "waiting_behind": e.waiting_behind,
         "waiting_behind_state": None if e.waiting_behind_state is None else e.waiting_behind_state.value}
        for e in outbox
        if e.state in (EffectState.RUNNING, EffectState.IN_DOUBT, EffectState.UNKNOWN, EffectState.DEAD)
        or (e.state is EffectState.PENDING and (e.failures or e.waiting_behind)) or feedback_refused(e)
    ]
    report: dict[str, Any] = {
        "producer": {
            "protocol": prod["protocol"],
            "flows": len(prod["flows"]),
            "events": len(events),
            "unbound_events": sum(1 for e in events if not e["deliveries"]),
            "consumers": per_consumer,
            "operator_actions": prod["operator_actions"],
        },
        "consumer": {
            "protocol": cons["protocol"],
            "name": cons["name"],
            "order": cons.get("order", "strict"),
            "flows": len(cons["inbox"]),
            "inbox": counts,
            "blocked": blocked,
            "gaps": gaps,
            "effects": {"counts": effect_counts, "attention": attention,
                        "timers": _timers(outbox, at), "actions": cons["effect_actions"]},
            "schedules": cons.get("schedules", []),
            "schedule_actions": cons.get("schedule_actions", []),
        },
    }
    _add_operations(report, producer_path, consumer_path, stuck_after, at, outbox)
    return report


#: What each order's states mean, for the report (docs/operations.md, "Each consumer's own order").
ORDER_STATES = {
    "strict": "each event applied once, in its flow's order; a missing one is a gap",
    "latest": ("only an event newer than its flow's projection applies (a snapshot); an older one is "
               "superseded, never applied, never waited for; no gaps"),
    "any": ("each event applied once, on arrival, in any order; last_seq is the highest seq applied; "
            "no gaps"),
}


def _timers(outbox: list[ScheduledEffect], now: float) -> list[dict[str, Any]]:
    """Per effect name, the pending effects not due before a later time than
    ``now`` (delayed, backing off, rate limited): how many, and the next one."""
    timers: dict[str, dict[str, Any]] = {}
    for e in outbox:
        if e.state is EffectState.PENDING and e.due_at > now:
            t = timers.setdefault(e.name, {"name": e.name, "waiting": 0, "next_due": e.due_at, "next_key": e.key})
            t["waiting"] += 1
            if e.due_at < t["next_due"]:
                t["next_due"], t["next_key"] = e.due_at, e.key
    return [timers[n] for n in sorted(timers)]


def _add_operations(report: dict[str, Any], producer_path: Location, consumer_path: Location,
                    stuck_after: float, now: float, effects: list[ScheduledEffect]) -> None:
    """The registry, why each open flow (or flow with an effect waiting behind
    another) waits, the operators' skips and replacements, and what needs
    attention (read after the snapshot, except ``effects``)."""
    with opened(producer_path, consumer_path) as (p, c):
        registry = [asdict(entry) for entry in p.consumers()]
        registry_actions = [a.as_dict() for a in p.registry_actions()]
        flows = sorted(set(c.open_flows()) | {e.flow_id for e in effects if e.waiting_behind})
        waits = [why_waiting(c, flow) for flow in flows]
        actions = [a.as_dict() for a in c.inbox_actions()]
        attention, _ = attention_items(p, c, now, stuck_after)  # the console's list, read the same way
    prod, cons = report["producer"], report["consumer"]
    prod["registry"], prod["registry_actions"] = registry, registry_actions
    rows = {row.event_id: row for w in waits for row in w.rows}
    for item in cons["blocked"]:
        row = rows.get(item["event_id"])
        item["detail"], item["blocked_at"] = (None, None) if row is None else (row.detail, row.blocked_at)
    since = {w.flow_id: w.since for w in waits}
    for item in cons["gaps"]:
        item["since"] = since.get(item["flow_id"])
    cons["waiting"] = [
        {"flow_id": w.flow_id, "wait": w.wait.value, "next_seq": w.next_seq, "since": w.since,
         "reason": None if w.reason is None else w.reason.value, "detail": w.detail}
        for w in waits if w.wait is not FlowWait.IDLE
    ]
    cons["actions"] = actions
    report["attention"], report["stuck_after"], report["checked_at"] = attention, stuck_after, now


def _lease(entry: dict[str, Any]) -> str:
    """Who holds a delivery's lease and until when, or why it waits."""
    if entry.get("lease_owner"):
        return f"held by {entry['lease_owner']} until {when(entry['due_at'])}"
    if entry.get("due_at"):
        return f"backing off until {when(entry['due_at'])}"
    return "-"


def _rows(items: list[dict[str, Any]], keys: list[str]) -> list[str]:
    return ["    " + "  ".join(f"{k}={item[k]}" for k in keys) for item in items]


def _with_meta(items: list[dict[str, Any]]) -> list[str]:
    """Show the events' meta (correlation ids ...) in the text only when some has one."""
    return ["meta"] if any(any(m) if isinstance(m, list) else m for m in (i.get("meta") for i in items)) else []


def format_report(report: dict[str, Any]) -> str:
    """The report of :func:`inspect_files` as plain text for a terminal."""
    p, c = report["producer"], report["consumer"]
    lines = [
        f"producer ({p['protocol']}): {p['flows']} flows, {p['events']} events",
    ]
    if p["unbound_events"]:
        lines.append(f"  {p['unbound_events']} events not yet bound to any consumer (no relay has run)")
    for name, d in p["consumers"].items():
        lines.append(
            f"  to consumer {name!r}: {d['accepted']} accepted, {len(d['pending'])} undelivered, "
            f"{len(d['set_aside'])} set aside" + (f", {len(d['skipped'])} skipped" if d["skipped"] else "")
        )
        lines += _rows([{**e, "lease": _lease(e)} for e in d["pending"][:20]],
                       ["event_id", "flow_id", "seq", "attempts", "last_error", "lease"])
        if len(d["pending"]) > 20:
            lines.append(f"    ... {len(d['pending']) - 20} more undelivered")
        if d["set_aside"]:
            lines.append("  set aside (conflict; needs an operator, see docs/operations.md):")
            lines += _rows(d["set_aside"], ["event_id", "flow_id", "seq", "last_status", "attempts"])
    if p["operator_actions"]:
        lines.append("  operator actions:")
        lines += _rows(p["operator_actions"], ["action", "event_id", "consumer", "actor", "reason"])
    lines += _registry_lines(p)
    inbox = c["inbox"]
    lines.append(
        f"consumer {c['name']!r} ({c['protocol']}{'' if c['order'] == 'strict' else ', order ' + c['order']}): "
        f"{c['flows']} flows; inbox "
        f"{inbox['pending']} pending, {inbox['blocked']} blocked, {inbox['applied']} applied"
        + "".join(f", {inbox[s]} {s}" for s in ("skipped", "replaced", "superseded") if inbox.get(s))
    )
    lines.append(f"  order {c['order']}: {ORDER_STATES[c['order']]}")
    if c["blocked"]:
        lines.append("  blocked (the flow stops here until fixed or upgraded):")
        lines += _rows(c["blocked"], ["flow_id", "seq", "event_id", "reason"] + _with_meta(c["blocked"]))
        lines += [f"      {b['detail']} (blocked since {when(b['blocked_at'] or 0)})" for b in c["blocked"]
                  if b.get("detail")]
    if c["gaps"]:
        lines.append("  gaps (waiting for a missing seq):")
        shown_gaps = [{**g, "since": when(g.get("since") or 0)} for g in c["gaps"]]
        lines += _rows(shown_gaps, ["flow_id", "missing_seq", "waiting", "since"] + _with_meta(c["gaps"]))
    if not c["blocked"] and not c["gaps"]:
        lines.append("  no blocked events, no gaps")
    effects = c["effects"]
    if any(effects["counts"].values()):
        shown = ", ".join(f"{n} {s}" for s, n in effects["counts"].items() if n)
        lines.append(f"  effects: {shown}")
        if effects["attention"]:
            lines.append("  effects needing attention (running, retrying, waiting, in doubt, unknown, dead, "
                         "feedback refused):")
            for e in effects["attention"]:  # due only where it means something: not on a dead one
                keys = ["key", "state", "attempts"] + (["due"] if shows_due(e) else [])
                lines += _rows([{**e, "state": effect_state(e), "due": when(e["due_at"])}],
                               keys + ["lease_owner", "last_error", "reason"])
        if effects.get("timers"):
            lines.append("  effects waiting for a time (delayed, backing off, rate limited):")
            lines += _rows([{**t, "next_due": when(t["next_due"])} for t in effects["timers"]],
                           ["name", "waiting", "next_due", "next_key"])
        if effects["actions"]:
            lines.append("  operator actions on effects:")
            lines += _rows(effects["actions"], ["action", "key", "actor", "reason"])
    if c.get("schedules"):
        lines.append("  recurring schedules (last and next tick; paused ones make no tick):")
        lines += _rows([{**s, "every": s["cron"] + f" ({s['tz']})" if s["cron"] else f"{s['interval']:g} s",
                         "state": "paused" if s["paused"] else "active", "last_tick": when(s["last_tick"]),
                         "next_tick": when(s["next_at"])}
                        for s in c["schedules"]],
                       ["schedule", "name", "every", "state", "last_tick", "next_tick", "missed", "skipped"])
    if c.get("schedule_actions"):
        lines.append("  operator actions on schedules:")
        lines += _rows(c["schedule_actions"], ["action", "schedule", "actor", "reason"])
    if c.get("actions"):
        lines.append("  operator actions (skip / replace):")
        lines += _rows(c["actions"], ["action", "event_id", "replacement_event_id", "actor", "reason"])
    return "\n".join(lines + attention_lines(report))


def _registry_lines(p: dict[str, Any]) -> list[str]:
    """Registered names not yet bound to a file (no relay reached them: a typo?), and registry changes."""
    lines = [f"  consumer {r['name']!r} is registered but no relay has reached it yet (a typo?): "
             f"backlog {r['backlog']}" for r in p.get("registry", []) if not r["bound"]]
    by_people = [a for a in p.get("registry_actions", []) if a["actor"] != "relay"]
    if by_people:
        lines.append("  registry changes by operators:")
        lines += _rows(by_people, ["action", "consumer", "actor", "reason"])
    return lines
