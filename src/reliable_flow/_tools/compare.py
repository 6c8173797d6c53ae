"""``reliable-flow compare``: does each consumer's projection agree with the
producer's flows?  Read only.

For every flow a consumer should have (some event of it is delivered, or to
be delivered, to that consumer) and every flow the consumer has applied:
the producer's flow (state, seq) against the consumer's projection (state,
last_seq), and the event each side holds at that seq.  A difference that a
recorded operator action explains (a skip or a replacement on the consumer,
a skipped delivery on the producer) is listed with the action and does not
count as a difference for the exit code.  An event the producer pruned is
matched through its tombstone (same id in the same slot).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .._store.outbox import OutboxStore
from .._store.records import Tombstone, as_flow_dict
from ..records import OperatorAction, OutboxEntry
from ..statuses import DeliveryState, InboxState
from .stores import Location, open_consumer, open_producer, shown

__all__ = ["KINDS", "compare_files", "dumps", "format_comparison"]

#: Every kind of difference, in the order they are looked for.
KINDS = ("missing_on_consumer", "missing_on_producer", "ahead", "behind", "event_differs", "state_differs")


def _producer_side(store: OutboxStore) -> dict[str, Any]:
    with store.read() as reads:
        flows = {f: as_flow_dict(reads.flow_state(f)) for f in reads.flows()}
        entries = reads.outbox()
        consumers = reads.consumers()
        registered = {c.name for c in consumers}
        partial = {c.name for c in consumers if c.topics is not None}
        actions = reads.operator_actions()
    events: dict[str, dict[int, OutboxEntry]] = {}
    for e in entries:
        events.setdefault(e.flow_id, {})[e.seq] = e
    return {"flows": flows, "events": events, "registered": registered, "partial": partial, "actions": actions}


def _consumer_side(location: Location) -> dict[str, Any]:
    store = open_consumer(location)
    try:
        where = shown(location, store)
        with store.read() as reads:
            name = reads.meta().get("name", "")
            projections = {}
            at_last: dict[str, str | None] = {}
            for flow in reads.projected_flows():  # not the inbox: its rows may all be pruned
                projection = reads.projection(flow)
                if projection is None:
                    continue
                projections[flow] = projection
                done = [r for r in reads.inbox_rows(flow, projection["last_seq"])
                        if r.seq == projection["last_seq"] and r.state in (InboxState.APPLIED, InboxState.SKIPPED)]
                at_last[flow] = done[0].event_id if done else None
            actions = reads.inbox_actions()
    finally:
        store.close()
    return {"name": name, "path": where, "projections": projections, "at_last": at_last, "actions": actions}


def _expected(flow_events: dict[int, OutboxEntry], name: str, registered: bool) -> bool:
    """Should this consumer have the flow: some event of it is (to be) delivered to it."""
    if not registered:
        return True
    return any(name in e.deliveries for e in flow_events.values())


def _explained(kind: str, flow: str, seq: int, name: str, consumer_event: str | None,
               inbox: list[OperatorAction], producer: list[OperatorAction],
               events: dict[int, OutboxEntry]) -> list[dict[str, Any]]:
    """The recorded operator actions that explain a difference, if any."""
    mine = [a for a in inbox if a.flow_id == flow and a.seq == seq]
    if kind == "state_differs":
        return [a.as_dict() for a in mine]
    if kind == "event_differs":
        replaced = [a.as_dict() for a in mine if a.action == "replace" and a.replacement_event_id == consumer_event]
        return replaced or _skipped_delivery(events.get(seq), name, producer)
    if kind in ("behind", "missing_on_consumer"):
        return _skipped_delivery(events.get(seq + 1), name, producer)
    return []


def _skipped_delivery(entry: OutboxEntry | None, name: str, producer: list[OperatorAction]) -> list[dict[str, Any]]:
    """The producer's recorded decision that ``name`` never gets ``entry``'s event."""
    if entry is None or name not in entry.deliveries or entry.deliveries[name].state is not DeliveryState.SKIPPED:
        return []
    found = [a for a in producer if a.event_id == entry.event_id and a.consumer == name and a.action == "skip"]
    return [a.as_dict() for a in found]  # listed: no previous_state


def _pruned_there(tombstone: Callable[[str], Tombstone | None], event_id: str, flow: str, seq: int) -> bool:
    """The producer pruned ``event_id`` from that very slot (its tombstone says so)."""
    found = tombstone(event_id)
    return found is not None and (found.flow_id, found.seq) == (flow, seq)


def _compare_one(prod: dict[str, Any], cons: dict[str, Any],
                 tombstone: Callable[[str], Tombstone | None]) -> list[dict[str, Any]]:
    name = cons["name"]
    registered = name in prod["registered"]
    out = []
    for flow in sorted(set(prod["flows"]) | set(cons["projections"])):
        p_flow, c_proj = prod["flows"].get(flow), cons["projections"].get(flow)
        flow_events = prod["events"].get(flow, {})
        p_seq = 0 if p_flow is None else int(p_flow["seq"])
        c_seq = 0 if c_proj is None else int(c_proj["last_seq"])
        if name in prod["partial"] and p_flow is not None and c_proj is not None:
            # A subscriber to topics: compared with the flow's last event
            # routed to it (its projection holds only its own kinds' steps).
            mine = [s for s, e in flow_events.items() if name in e.deliveries]
            if not mine or max(mine) <= c_seq <= p_seq:
                continue
            p_seq = max(mine)
        c_event = cons["at_last"].get(flow)
        kind = None
        if c_proj is None:
            if p_flow is not None and _expected(flow_events, name, registered):
                kind = "missing_on_consumer"
        elif p_flow is None:
            kind = "missing_on_producer"
        elif c_seq > p_seq:
            kind = "ahead"
        elif c_seq < p_seq:
            kind = "behind"
        elif c_event is not None and (
            flow_events[c_seq].event_id != c_event if c_seq in flow_events
            else not _pruned_there(tombstone, c_event, flow, c_seq)
        ):
            kind = "event_differs"
        elif p_flow["state"] != c_proj["state"]:
            kind = "state_differs"
        if kind is None:
            continue
        held = flow_events.get(c_seq)
        explained = _explained(kind, flow, c_seq, name, c_event, cons["actions"], prod["actions"], flow_events)
        out.append({
            "flow_id": flow, "kind": kind,
            "producer": None if p_flow is None else {"state": p_flow["state"], "seq": p_seq,
                                                     "event_at_consumer_seq": None if held is None else held.event_id},
            "consumer": None if c_proj is None else {"state": c_proj["state"], "last_seq": c_seq,
                                                     "event_at_last_seq": c_event},
            "explained_by": explained,
        })
    return out


def compare_files(producer_path: Location, consumer_paths: Sequence[Location]) -> dict[str, Any]:
    """Each consumer's projections against the producer's flows, read only.

    Each store is a SQLite file path or a PostgreSQL location; they may mix
    engines.  ``path`` in the report is a file's path as given, or a
    PostgreSQL location as the store shows it (no password).

    Keys: ``consumers``: one entry per consumer store (``name``, ``path``,
    ``registered``: whether the producer knows the name, ``differences``:
    flow by flow, see :data:`KINDS`); ``differences``: how many no recorded
    operator action explains (what makes ``compare`` exit 1).
    """
    store = open_producer(producer_path)
    try:
        prod = _producer_side(store)
        report: dict[str, Any] = {"producer": shown(producer_path, store), "consumers": [], "differences": 0}
        for location in consumer_paths:
            cons = _consumer_side(location)
            found = _compare_one(prod, cons, store.latest.tombstone)
            report["consumers"].append({"name": cons["name"], "path": cons["path"],
                                        "registered": cons["name"] in prod["registered"], "differences": found})
            report["differences"] += sum(1 for d in found if not d["explained_by"]) + (
                0 if cons["name"] in prod["registered"] else 1)
    finally:
        store.close()
    return report


def _side(d: dict[str, Any] | None, seq_key: str) -> str:
    return "none" if d is None else f"{d['state']} at seq {d[seq_key]}"


def format_comparison(report: dict[str, Any]) -> str:
    """The report of :func:`compare_files` as plain text."""
    lines = []
    for c in report["consumers"]:
        found = c["differences"]
        lines.append(f"consumer {c['name']!r} ({c['path']}): {len(found)} flows differ from the producer"
                     + ("" if c["registered"] else "; its name is NOT registered in the producer"))
        for d in found:
            lines.append(f"  flow {d['flow_id']!r}: {d['kind']}: producer {_side(d['producer'], 'seq')}, "
                         f"consumer {_side(d['consumer'], 'last_seq')}")
            if d["kind"] == "event_differs":
                lines.append(f"    the consumer applied {d['consumer']['event_at_last_seq']}, the producer holds "
                             f"{(d['producer'] or {}).get('event_at_consumer_seq')} at that seq")
            for a in d["explained_by"]:
                lines.append(f"    explained: {a['action']} of {a['event_id']} by {a['actor']}: {a['reason']}")
    lines.append(f"{report['differences']} unexplained differences" if report["differences"]
                 else "no unexplained differences")
    return "\n".join(lines)


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
