"""A read-only picture of a producer store and a consumer store (either engine)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .._core.effects import with_waits
from .._store.records import as_flow_dict
from .stores import Location, open_consumer, open_producer

__all__ = ["snapshot"]


def snapshot(producer_location: Location, consumer_location: Location) -> dict[str, Any]:
    """Everything both stores hold, grouped by flow, without writing to either.

    Each argument is a SQLite file path or a PostgreSQL location (a
    ``postgresql://...#schema`` string or a connection factory), as
    ``Producer`` / ``Consumer`` take; the two may be on different engines.
    Plain dicts and lists (JSON-able), because this is a dump for tools.
    The consumer's flows are those with an inbox row or a projection (a
    flow whose rows were all pruned keeps its projection); its effects
    carry ``waiting_behind`` (see :class:`~reliable_flow.records.ScheduledEffect`).
    Each store is read in its own read transaction (on PostgreSQL a
    read-only REPEATABLE READ snapshot), so each half is internally
    consistent; the two halves are *not* one atomic picture (no transaction
    spans two stores).  Take it while no worker runs if you need the two to
    line up.
    """
    out: dict[str, Any] = {}
    producer = open_producer(producer_location)
    try:
        with producer.read() as reads:
            outbox: dict[str, list[dict[str, Any]]] = {}
            for entry in reads.outbox():
                outbox.setdefault(entry.flow_id, []).append(asdict(entry))
            out["producer"] = {
                "protocol": reads.protocol_name(),
                "flows": {f: as_flow_dict(reads.flow_state(f)) for f in reads.flows()},
                "outbox": outbox,
                "operator_actions": [a.as_dict() for a in reads.operator_actions()],
            }
    finally:
        producer.close()
    consumer = open_consumer(consumer_location)
    try:
        with consumer.read() as view:
            meta = view.meta()
            # A flow whose rows were all pruned keeps its projection: list both.
            flows = sorted(set(view.flows()) | set(view.projected_flows()))
            out["consumer"] = {
                "protocol": meta.get("protocol"),
                "name": meta.get("name"),
                "order": meta.get("order", "strict"),  # each consumer's own order (issue 32)
                "projections": {f: view.projection(f) for f in flows},
                "inbox": {f: [asdict(row.entry()) for row in view.inbox_rows(f)] for f in flows},
                "effects": {f: [asdict(e) for e in view.effects(f)] for f in flows},
                "effect_outbox": [asdict(e) for e in with_waits(view, view.effect_list())],
                "effect_actions": [a.as_dict() for a in view.effect_actions()],
                "schedules": [s.as_dict() for s in view.schedules()],
                "schedule_actions": [a.as_dict() for a in view.schedule_actions()],
            }
    finally:
        consumer.close()
    return out
