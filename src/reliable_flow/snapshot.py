"""A read-only picture of a producer file and a consumer file."""

from __future__ import annotations

from typing import Any

from .consumer import read_effects, read_inbox, read_projection
from .db import Database, PathLike
from .producer import read_flow, read_operator_actions, read_outbox
from .schema import CONSUMER, PRODUCER

__all__ = ["snapshot"]


def snapshot(producer_path: PathLike, consumer_path: PathLike) -> dict[str, Any]:
    """Everything both files hold, grouped by flow, without writing to either.

    Each file is read in its own read transaction, so each half is
    internally consistent; the two halves are *not* one atomic picture (no
    transaction spans two SQLite files).  Take it while no worker runs if
    you need the two to line up.
    """
    out: dict[str, Any] = {}
    producer = Database(producer_path, PRODUCER, readonly=True)
    try:
        with producer.read() as conn:
            flows = [r[0] for r in conn.execute("SELECT flow_id FROM flow ORDER BY flow_id")]
            outbox: dict[str, list[dict[str, Any]]] = {}
            for entry in read_outbox(conn):
                outbox.setdefault(entry["flow_id"], []).append(entry)
            out["producer"] = {
                "protocol": dict(conn.execute("SELECT key, value FROM meta")).get("protocol"),
                "flows": {f: read_flow(conn, f) for f in flows},
                "outbox": outbox,
                "operator_actions": read_operator_actions(conn),
            }
    finally:
        producer.close()
    consumer = Database(consumer_path, CONSUMER, readonly=True)
    try:
        with consumer.read() as conn:
            meta = dict(conn.execute("SELECT key, value FROM meta"))
            flows = [r[0] for r in conn.execute("SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")]
            out["consumer"] = {
                "protocol": meta.get("protocol"),
                "name": meta.get("name"),
                "projections": {f: read_projection(conn, f) for f in flows},
                "inbox": {f: read_inbox(conn, f) for f in flows},
                "effects": {f: read_effects(conn, f) for f in flows},
            }
    finally:
        consumer.close()
    return out
