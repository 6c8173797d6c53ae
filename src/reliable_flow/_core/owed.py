"""What a producer waits for from a consumer's effects, as the two sides
see it (issue 30, item 5).

An effect registered with ``feedback=`` owes its producer a step: its
result once it succeeds, or its failure step.  The producer's flow waits
for that step; the producer cannot see why it does not come when the
effect runs beside a consumer on another host.  So the consumer's side
publishes a **summary** of the effects that still owe a step (a bridge
does, on each announcement), and the producer's ``inspect`` reads it.

The summary is a view, never an authority: it is as of its ``at``, it may
be stale (the bridge stopped) and it is bounded (the oldest
:data:`OWED_LIMIT`, with a count).  Nothing is decided from it but what an
operator is shown.

Decisions only: the caller gives the reads and the clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .._store.effects import EffectReads
from ..records import ConsumerEntry, ScheduledEffect
from ..statuses import EffectState
from .operate import feedback_refused

__all__ = [
    "OWED_LIMIT",
    "STALE_AFTER",
    "SUMMARY_VERSION",
    "owed_effects",
    "owed_summary",
    "pair_refusal",
    "parse_summary",
    "unfed_too_long",
    "waiting_for",
    "waiting_items",
]

#: The oldest effects a summary lists (``count`` says how many owe a step).
OWED_LIMIT = 100
#: Rows read per state when a summary is made: effects without ``feedback=``
#: take rows too, so ``truncated`` says when this many were read.
SCAN_LIMIT = 1000
#: Seconds after which a summary is called stale (its bridge announces every 5 s).
STALE_AFTER = 30.0
SUMMARY_VERSION = 1

_S = EffectState
#: States in which an effect will still end and owe its step (or waits for an operator).
_OPEN = (_S.PENDING, _S.RUNNING, _S.IN_DOUBT, _S.UNKNOWN, _S.DEAD)


def owed_effects(reads: EffectReads, names: Collection[str], now: float) -> tuple[list[ScheduledEffect], bool]:
    """The effects of ``names`` (those registered with ``feedback=``) whose
    producer still waits for a step: not final yet (pending, running, in
    doubt), parked for an operator (unknown, dead), or final with their
    step not fed yet; oldest first (by ``created_at``).  ``True`` second
    when a read was cut at :data:`SCAN_LIMIT` (there may be more)."""
    found: dict[str, ScheduledEffect] = {}
    truncated = False
    reads_: list[list[ScheduledEffect]] = [reads.effect_list(state=s, limit=SCAN_LIMIT) for s in _OPEN]
    reads_.append(reads.unfed_effects(SCAN_LIMIT, now))
    for rows in reads_:
        truncated = truncated or len(rows) >= SCAN_LIMIT
        for effect in rows:
            if effect.name in names and effect.fed is not True:
                found[effect.key] = effect
    return sorted(found.values(), key=lambda e: (e.created_at, e.key)), truncated


def waiting_for(state: str, fed: bool | None, refused: bool) -> str:
    """What the producer's flow waits for, in a few words, for an effect in
    ``state`` (``fed`` as stored; ``refused``: its last feedback was refused)."""
    if refused:
        return "its step, refused by the producer (fed again on every executor pass)"
    if fed is False:
        return "its step, to be fed by an executor with producer="
    if state in (_S.PENDING, _S.RUNNING, _S.IN_DOUBT):
        return "the effect to finish"
    if state == _S.UNKNOWN:
        return "an operator (unknown: resolve, retry or cancel it), or its unknown_after"
    return "an operator (dead without a failure step: resolve, retry or cancel it)"


def owed_summary(consumer: str, uid: str, effects: list[ScheduledEffect], truncated: bool,
                 targets: Mapping[str, tuple[str | None, Callable[[str], str] | None]], now: float) -> dict[str, Any]:
    """The summary a consumer's side publishes: per effect (the oldest
    :data:`OWED_LIMIT`) its key, name, flow (the producer's, when its
    ``Feedback(flow=)`` maps it), state, since when it is owed
    (``created_at``), its last change, and the producer it feeds
    (``targets[name]``: a served name, a local producer's uid, or None
    when not known here).  JSON-ready."""
    listed = []
    for e in effects[:OWED_LIMIT]:
        producer, flow = targets.get(e.name, (None, None))
        flow_id = e.flow_id
        if flow is not None:
            try:
                flow_id = str(flow(e.flow_id))
            except Exception:  # noqa: BLE001 - the application's function: shown as the effect's own flow
                flow_id = e.flow_id
        refused = feedback_refused(e)
        listed.append({"key": e.key, "name": e.name, "flow_id": flow_id, "state": e.state.value,
                       "since": e.created_at, "updated_at": e.updated_at, "fed": e.fed, "refused": refused,
                       "producer": producer})
    return {"v": SUMMARY_VERSION, "consumer": consumer, "uid": uid, "at": now, "count": len(effects),
            "truncated": truncated, "effects": listed}


def _field(obj: Mapping[str, Any], name: str, kinds: tuple[type, ...], where: str) -> Any:
    value = obj.get(name)
    if (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)  # a bool is no number
            or (isinstance(value, float) and not math.isfinite(value))):
        raise ValueError(f"summary: {where}{name}: expected {'/'.join(k.__name__ for k in kinds)}, "
                         f"got {value!r}"[:200])
    return value


def parse_summary(text: str | bytes) -> dict[str, Any]:
    """A published summary, checked field by field (it comes from a broker:
    never trusted by type); a ValueError naming the field otherwise."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"summary: not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("v") != SUMMARY_VERSION:
        raise ValueError(f"summary: not a version {SUMMARY_VERSION} summary")
    out = {"consumer": _field(raw, "consumer", (str,), ""), "uid": _field(raw, "uid", (str,), ""),
           "at": float(_field(raw, "at", (int, float), "")), "count": _field(raw, "count", (int,), ""),
           "truncated": _field(raw, "truncated", (bool,), ""), "effects": []}
    for i, e in enumerate(_field(raw, "effects", (list,), "")):
        where = f"effects[{i}]."
        if not isinstance(e, dict):
            raise ValueError(f"summary: {where[:-1]} is not an object")  # noqa: TRY004 - a bad message, as every field
        state = _field(e, "state", (str,), where)
        if state not in {s.value for s in EffectState}:
            raise ValueError(f"summary: {where}state: not an effect state, got {state!r}"[:200])
        fed = e.get("fed")
        out["effects"].append({
            "key": _field(e, "key", (str,), where), "name": _field(e, "name", (str,), where),
            "flow_id": _field(e, "flow_id", (str,), where), "state": state,
            "since": float(_field(e, "since", (int, float), where)),
            "updated_at": float(_field(e, "updated_at", (int, float), where)),
            "fed": fed if isinstance(fed, bool) else None, "refused": _field(e, "refused", (bool,), where),
            "producer": _field(e, "producer", (str, type(None)), where)})
    return out


def waiting_items(summary: Mapping[str, Any], producer: Collection[str], now: float,
                  stuck_after: float) -> list[dict[str, Any]]:
    """The summary's effects feeding one of ``producer`` (its served name
    or uid; an effect whose producer the consumer's side did not know is
    kept) that have been owed for ``stuck_after`` seconds or more at
    ``now``: the flows waiting for a result too long."""
    items = []
    for e in summary["effects"]:
        if e["producer"] is not None and e["producer"] not in producer:
            continue
        if now - e["since"] < stuck_after:
            continue
        items.append({"kind": "waiting_for_result", "consumer": summary["consumer"], "flow_id": e["flow_id"],
                      "effect_key": e["key"], "effect": e["name"], "state": e["state"], "since": e["since"],
                      "producer_known": e["producer"] is not None,
                      "detail": f"waits for {waiting_for(e['state'], e['fed'], e['refused'])}"})
    return items


def pair_refusal(producer: str, consumer: str, registry: list[ConsumerEntry], name: str | None,
                 uid: str | None) -> str | None:
    """Why the producer store at ``producer`` and the consumer ``name``
    (storage ``uid``) at ``consumer`` are no pair, in one sentence; None
    when they share a registration (the name is in the producer's registry,
    bound to that uid or not bound yet) or the registry is empty (a producer
    that never relayed: nothing to tell)."""
    if not registry:
        return None
    names = [entry.name for entry in registry]
    entry = next((e for e in registry if e.name == name), None)
    if entry is None:
        return (f"producer {producer} and consumer {name!r} at {consumer} share no registration: the producer's "
                f"consumer registry holds {names}, not {name!r} (is this the consumer this producer feeds?)")
    if entry.uid is not None and uid is not None and entry.uid != uid:
        return (f"producer {producer} and consumer {name!r} at {consumer} share no registration: the producer "
                f"binds {name!r} to storage uid {entry.uid}, and this consumer's uid is {uid} (another store "
                f"under that name)")
    return None


def unfed_too_long(effect: ScheduledEffect, now: float, stuck_after: float) -> bool:
    """Finished, its step owed (``fed`` False) and not refused, and not fed
    for ``stuck_after`` seconds since it finished: no executor with a
    producer feeds it (a refused one is ``feedback_refused`` already)."""
    return effect.fed is False and not feedback_refused(effect) and now - effect.updated_at >= stuck_after
