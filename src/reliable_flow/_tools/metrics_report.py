"""``reliable-flow metrics``: the metrics snapshot of two stores (either
engine), read only, as text, JSON or the Prometheus text format."""

from __future__ import annotations

import time
from typing import Any

from ..metrics import ConsumerMetrics, ProducerMetrics, consumer_metrics, producer_metrics
from .stores import Location, open_consumer, open_producer

__all__ = ["format_metrics", "metrics_files"]


def metrics_files(
    producer_path: Location, consumer_path: Location, now: float | None = None
) -> tuple[ProducerMetrics, ConsumerMetrics]:
    """Both stores counted, each in one read transaction, opened read-only
    (SQLite ``mode=ro``, a read-only PostgreSQL session: nothing is written,
    not even a migration).  Each is a file path or a PostgreSQL location.
    The in-process counts (duplicates, applied per second) are None: no
    store keeps them."""
    at = time.time() if now is None else now
    return (_counted(open_producer(producer_path), producer_metrics, at),
            _counted(open_consumer(consumer_path), consumer_metrics, at))


def _counted(store: Any, count: Any, at: float) -> Any:
    try:
        with store.read() as reads:
            return count(reads, at)
    finally:
        store.close()


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def format_metrics(p: ProducerMetrics, c: ConsumerMetrics) -> str:
    """The two snapshots as plain text for a terminal."""
    lines = [f"producer: {p.events} events, {p.flows} flows"
             + (f", {p.unbound_events} not yet bound to a consumer" if p.unbound_events else "")]
    for name, d in p.consumers.items():
        lines.append(
            f"  to {name!r}: pending {d.pending} (untried {d.untried}, leased {d.leased}, failing {d.failing}, "
            f"oldest pending age {_age(d.oldest_pending_age)}), accepted {d.accepted}, "
            f"set_aside {d.set_aside}, skipped {d.skipped}, retries {d.retries}"
        )
    lines.append(f"consumer {c.consumer!r}: inbox " + ", ".join(f"{s} {n}" for s, n in c.inbox.items())
                 + f"; flows at a gap {c.gaps}")
    if c.blocked:
        lines.append("  blocked by reason: " + ", ".join(f"{r} {n}" for r, n in c.blocked.items()))
    lines.append("  effects: " + ", ".join(f"{s} {n}" for s, n in c.effects.items()))
    if c.duplicates is None:
        lines.append("  duplicates received and applied per second: counted by a running process only "
                     "(Consumer.metrics())")
    return "\n".join(lines)
