"""``reliable-flow inspect``: what an operator needs to see in the two files."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..statuses import EffectState
from ..store.sqlite.connection import PathLike
from .snapshot import snapshot

__all__ = ["format_report", "inspect_files"]


def inspect_files(producer_path: PathLike, consumer_path: PathLike) -> dict[str, Any]:
    """A summary of both files, read without writing to either.

    Keys: ``producer`` (flow and event counts, per consumer the pending and
    set-aside events), ``consumer`` (inbox counts by state, blocked events
    with reasons, flows stopped at a gap).
    """
    snap = snapshot(producer_path, consumer_path)
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
                pending.append({**ref, "attempts": d["attempts"], "last_error": d["last_error"]})
        per_consumer[name] = {
            "accepted": accepted, "pending": pending, "set_aside": set_aside, "skipped": skipped,
        }

    counts = {"pending": 0, "blocked": 0, "applied": 0}
    blocked, gaps = [], []
    for flow_id, rows in cons["inbox"].items():
        for row in rows:
            counts[row["state"]] += 1
            if row["state"] == "blocked":
                blocked.append({"flow_id": flow_id, "event_id": row["event_id"], "seq": row["seq"],
                                "reason": row["reason"]})
        projection = cons["projections"].get(flow_id)
        next_seq = (projection["last_seq"] if projection else 0) + 1
        present = {row["seq"] for row in rows}
        waiting = sorted(s for s in present if s > next_seq)
        if next_seq not in present and waiting:
            gaps.append({"flow_id": flow_id, "missing_seq": next_seq, "waiting": waiting})

    outbox = cons["effect_outbox"]
    effect_counts = {state.value: 0 for state in EffectState}
    for effect in outbox:
        effect_counts[effect["state"]] += 1
    attention = [
        {k: e[k] for k in ("key", "name", "flow_id", "state", "attempts", "due_at", "lease_owner", "last_error",
                           "reason")}
        for e in outbox
        if e["state"] in (EffectState.RUNNING, EffectState.IN_DOUBT, EffectState.UNKNOWN, EffectState.DEAD)
        or (e["state"] == EffectState.PENDING and e["failures"])
    ]
    return {
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
            "flows": len(cons["inbox"]),
            "inbox": counts,
            "blocked": blocked,
            "gaps": gaps,
            "effects": {"counts": effect_counts, "attention": attention,
                        "actions": cons["effect_actions"]},
        },
    }


def _when(seconds: float) -> str:
    """An epoch time as UTC ISO 8601 ("-" for 0: due at once)."""
    if not seconds:
        return "-"
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")


def _rows(items: list[dict[str, Any]], keys: list[str]) -> list[str]:
    return ["    " + "  ".join(f"{k}={item[k]}" for k in keys) for item in items]


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
        lines += _rows(d["pending"][:20], ["event_id", "flow_id", "seq", "attempts", "last_error"])
        if len(d["pending"]) > 20:
            lines.append(f"    ... {len(d['pending']) - 20} more undelivered")
        if d["set_aside"]:
            lines.append("  set aside (conflict; needs an operator, see docs/operations.md):")
            lines += _rows(d["set_aside"], ["event_id", "flow_id", "seq", "last_status", "attempts"])
    if p["operator_actions"]:
        lines.append("  operator actions:")
        lines += _rows(p["operator_actions"], ["action", "event_id", "consumer", "actor", "reason"])
    inbox = c["inbox"]
    lines.append(
        f"consumer {c['name']!r} ({c['protocol']}): {c['flows']} flows; inbox {inbox['pending']} pending, "
        f"{inbox['blocked']} blocked, {inbox['applied']} applied"
    )
    if c["blocked"]:
        lines.append("  blocked (the flow stops here until fixed or upgraded):")
        lines += _rows(c["blocked"], ["flow_id", "seq", "event_id", "reason"])
    if c["gaps"]:
        lines.append("  gaps (waiting for a missing seq):")
        lines += _rows(c["gaps"], ["flow_id", "missing_seq", "waiting"])
    if not c["blocked"] and not c["gaps"]:
        lines.append("  no blocked events, no gaps")
    effects = c["effects"]
    if any(effects["counts"].values()):
        shown = ", ".join(f"{n} {s}" for s, n in effects["counts"].items() if n)
        lines.append(f"  effects: {shown}")
        if effects["attention"]:
            lines.append("  effects needing attention (running, retrying, in doubt, unknown, dead):")
            shown_rows = [{**e, "due": _when(e["due_at"])} for e in effects["attention"]]
            lines += _rows(shown_rows, ["key", "state", "attempts", "due", "lease_owner", "last_error", "reason"])
        if effects["actions"]:
            lines.append("  operator actions on effects:")
            lines += _rows(effects["actions"], ["action", "key", "actor", "reason"])
    return "\n".join(lines)
