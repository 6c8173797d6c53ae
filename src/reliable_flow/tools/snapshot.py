"""A read-only picture of a producer file and a consumer file."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..store.sqlite import SqliteInboxStore, SqliteOutboxStore
from ..store.sqlite.connection import PathLike

__all__ = ["snapshot"]


def snapshot(producer_path: PathLike, consumer_path: PathLike) -> dict[str, Any]:
    """Everything both files hold, grouped by flow, without writing to either.

    Plain dicts and lists (JSON-able), because this is a dump for tools.
    Each file is read in its own read transaction, so each half is
    internally consistent; the two halves are *not* one atomic picture (no
    transaction spans two SQLite files).  Take it while no worker runs if
    you need the two to line up.
    """
    out: dict[str, Any] = {}
    producer = SqliteOutboxStore(producer_path, None, readonly=True)
    try:
        with producer.read() as reads:
            outbox: dict[str, list[dict[str, Any]]] = {}
            for entry in reads.outbox():
                outbox.setdefault(entry.flow_id, []).append(asdict(entry))
            out["producer"] = {
                "protocol": reads.protocol_name(),
                "flows": {f: reads.flow(f) for f in reads.flows()},
                "outbox": outbox,
                "operator_actions": [_action(a) for a in reads.operator_actions()],
            }
    finally:
        producer.close()
    consumer = SqliteInboxStore(consumer_path, None, readonly=True)
    try:
        with consumer.read() as view:
            meta = view.meta()
            flows = view.flows()
            out["consumer"] = {
                "protocol": meta.get("protocol"),
                "name": meta.get("name"),
                "projections": {f: view.projection(f) for f in flows},
                "inbox": {f: [asdict(row) for row in view.inbox(f)] for f in flows},
                "effects": {f: [asdict(e) for e in view.effects(f)] for f in flows},
                "effect_outbox": [asdict(e) for e in view.effect_list()],
                "effect_actions": [asdict(a) for a in view.effect_actions()],
            }
    finally:
        consumer.close()
    return out


def _action(action: Any) -> dict[str, Any]:
    recorded = asdict(action)
    del recorded["previous_state"]  # not stored: only the return value of redeliver/skip has it
    return recorded
