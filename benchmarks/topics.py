"""Topics and subscriptions (issue 32): what a partial subscriber costs, and
what routing costs ``advance``.

Two measurements, each side on fresh files, the sides interleaved in small
blocks within each round (as every benchmark here), the median of the
per-round ratios reported, with wall and CPU time:

* ``partial``: one producer with topics, ten kinds (a new flow every ten
  events, one of each kind); a full subscriber (every event) and a
  subscriber to the topic of one kind (10% of the events).  The cost of
  each consumer per *producer* event, as a ``Worker`` with ``relay_batch=100``
  spends it on a backlog: after each block of 1,000 producer events,
  ``relay_batch`` (limit 100) to the consumer's receive-and-apply view
  (``consumer.applying()``) until idle, and an apply pass
  (``process_all(batch_size=100)``), over the same committed events.
  (A pass costs its commits whatever it carries: with passes of 100
  producer events the 10% subscriber's passes carry 10 events each, and the
  ratio measures the commits, not the subscription.)
  Target: the partial subscriber at most 15% of the full one.
* ``advance``: ``producer.advance`` one event per transaction (durable,
  like every advance), with 5 topics and 5 subscribers (each subscribed to
  one topic; every event goes to one of them), against 1 topic and 1
  subscriber (every event to it).  Target: within 1.2x.  A producer without
  topics and one consumer is shown as well (the path from before topics).

    python benchmarks/topics.py                 # default sizes, 5 rounds
    python benchmarks/topics.py --quick         # a smoke run (figures not to quote)
    python benchmarks/topics.py --write-results # also write benchmarks/RESULTS-topics.md
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from reliable_flow import Consumer, Producer, Topic, relay_batch
from reliable_flow.protocol import Protocol

KINDS = tuple(f"step.k{i}" for i in range(10))
#: Every kind from every state, so any subset of a flow's events applies.
BENCH = Protocol(name="bench-topics", initial="new", transitions={s: KINDS for s in ("new", *KINDS)},
                 schemas={1: lambda kind, payload: dict(payload)})
WHO = {"actor": "bench", "reason": "benchmark"}
Clock = tuple[float, float]  # (wall, cpu) seconds


def _now() -> Clock:
    return time.perf_counter(), time.process_time()


def _since(start: Clock) -> Clock:
    wall, cpu = _now()
    return wall - start[0], cpu - start[1]


def _add(a: Clock, b: Clock) -> Clock:
    return a[0] + b[0], a[1] + b[1]


def _events(n: int, start: int = 0) -> list[tuple[str, str, int, str]]:
    """(event id, flow, expected seq, kind): a new flow every ten events."""
    return [(f"E{i}", f"F{i // 10}", i % 10, KINDS[i % 10]) for i in range(start, start + n)]


# -- partial: a consumer of 10% against a full one ------------------------------------------------


def partial_round(folder: Path, events: int, block: int) -> dict[str, Clock]:
    """``block`` producer events (advanced in batches of 100), then each
    consumer's pass over them, the consumers' order alternating."""
    topics = [Topic("one-kind", kinds={KINDS[0]}), Topic("all", kinds=set(KINDS))]
    with Producer(folder / "p.db", BENCH, topics=topics) as p, \
            Consumer(folder / "full.db", BENCH, name="full") as full, \
            Consumer(folder / "part.db", BENCH, name="part") as part:
        p.admin.register_consumer("full", topics=["all"], **WHO)
        p.admin.register_consumer("part", topics=["one-kind"], **WHO)
        spent = {"full": (0.0, 0.0), "part": (0.0, 0.0)}
        for n in range(0, events, block):
            for m in range(n, min(n + block, events), 100):
                with p.batch() as b:
                    for event_id, flow, seq, kind in _events(min(100, events - m), m):
                        b.advance(event_id, flow, expected_seq=seq, kind=kind, payload={})
            order = (("full", full), ("part", part)) if (n // block) % 2 == 0 else (("part", part), ("full", full))
            for name, consumer in order:
                start = _now()
                # As a Worker relays: batches of 100 to the receive-and-apply
                # view until idle, then an apply pass.
                while not relay_batch(p, consumer.applying(), limit=100).idle:
                    pass
                consumer.process_all(batch_size=100)
                spent[name] = _add(spent[name], _since(start))
        applied = {name: sum(len(c.applied(f)) for f in c.flows()) for name, c in (("full", full), ("part", part))}
        assert applied == {"full": events, "part": events // 10}, applied
        return {name: (w / events, c / events) for name, (w, c) in spent.items()}


# -- advance: 5 topics and 5 subscribers against 1 and 1 ------------------------------------------


def _advancer(folder: Path, label: str, topics: int | None) -> Producer:
    if topics is None:
        p = Producer(folder / f"{label}.db", BENCH)
        p.admin.register_consumer("c0", **WHO)
        return p
    declared = [Topic(f"t{i}", kinds={k for j, k in enumerate(KINDS) if j % topics == i}) for i in range(topics)]
    p = Producer(folder / f"{label}.db", BENCH, topics=declared)
    for i in range(topics):
        p.admin.register_consumer(f"c{i}", topics=[f"t{i}"], **WHO)
    return p


def advance_round(folder: Path, events: int, block: int) -> dict[str, Clock]:
    sides = {"five": _advancer(folder, "five", 5), "one": _advancer(folder, "one", 1),
             "none": _advancer(folder, "none", None)}
    spent = {name: (0.0, 0.0) for name in sides}
    try:
        for n in range(0, events, block):
            chunk = _events(min(block, events - n), n)
            names = list(sides) if (n // block) % 2 == 0 else list(reversed(sides))
            for name in names:
                p = sides[name]
                start = _now()
                for event_id, flow, seq, kind in chunk:
                    p.advance(event_id, flow, expected_seq=seq, kind=kind, payload={})
                spent[name] = _add(spent[name], _since(start))
        for name, p in sides.items():
            pending = sum(c.backlog for c in p.admin.consumers())
            assert pending == events, (name, pending)
    finally:
        for p in sides.values():
            p.close()
    return {name: (w / events, c / events) for name, (w, c) in spent.items()}


# -- the run --------------------------------------------------------------------------------------


def rounds(run: Callable[[Path], dict[str, Clock]], count: int, tmp: str | None) -> list[dict[str, Clock]]:
    out = []
    for _ in range(count):
        with tempfile.TemporaryDirectory(prefix="rf-topics-", dir=tmp) as folder:
            out.append(run(Path(folder)))
    return out


def _ratio(results: list[dict[str, Clock]], a: str, b: str, i: int) -> float:
    return statistics.median(r[a][i] / r[b][i] for r in results)


def _us(results: list[dict[str, Clock]], side: str, i: int) -> float:
    return statistics.median(r[side][i] for r in results) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--events", type=int, default=5000, help="producer events per round (partial)")
    ap.add_argument("--advances", type=int, default=600, help="advances per side per round (advance)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.events, args.advances = 3, 2000, 200
    part = rounds(lambda f: partial_round(f, args.events, 1000), args.rounds, args.tmp)
    adv = rounds(lambda f: advance_round(f, args.advances, 20), args.rounds, args.tmp)
    rows = [
        ("10% subscriber / full subscriber, per producer event", "part", "full", part, "<= 0.15"),
        ("advance: 5 topics, 5 subscribers / 1 topic, 1 subscriber", "five", "one", adv, "<= 1.2"),
        ("advance: 1 topic, 1 subscriber / no topics, 1 consumer", "one", "none", adv, "(shown)"),
    ]
    lines = [
        "# Topics (issue 32)",
        "",
        (f"`python benchmarks/topics.py{' --quick' if args.quick else ''}`: {args.rounds} rounds, "
         f"{args.events:,} producer events (partial), {args.advances:,} advances per side (advance); "
         f"medians of the per-round ratios. {platform.platform()}, Python {platform.python_version()}, "
         f"SQLite {sqlite3.sqlite_version}, {time.strftime('%Y-%m-%d')}."),
        "",
        "| comparison | us/event (wall) | us/event (CPU) | ratio wall | ratio CPU | target |",
        "|---|---|---|---|---|---|",
    ]
    for label, a, b, results, target in rows:
        lines.append(
            f"| {label} | {_us(results, a, 0):,.1f} / {_us(results, b, 0):,.1f} | "
            f"{_us(results, a, 1):,.1f} / {_us(results, b, 1):,.1f} | {_ratio(results, a, b, 0):.3f} | "
            f"{_ratio(results, a, b, 1):.3f} | {target} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.write_results:
        (Path(__file__).parent / "RESULTS-topics.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
