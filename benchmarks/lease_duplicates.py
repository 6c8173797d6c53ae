"""How many events do several relays over one outbox send more than once?

Six relay processes (by default) start together at a barrier, each with its
own Producer and its own Consumer object over one shared producer file and
one shared consumer file, and each loops ``relay(policy=...)`` until idle.
Every non-idle answer is one send (one ``consumer.receive`` call):
``accepted`` is the first send of an event, ``duplicate`` a later one.  The
inbox stores each event once whatever happens; the duplicate count is the
work leases save.

Run twice: with leases (``DeliveryPolicy(lease_seconds=30)``) and without
(``lease_seconds=None``) for comparison.  Standard library only::

    python benchmarks/lease_duplicates.py
    python benchmarks/lease_duplicates.py --events 1000 --relays 6 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

from reliable_flow import Consumer, DeliveryPolicy, Producer, relay
from reliable_flow.reservation import RESERVATION

KINDS = ("reserved", "confirmed", "released")


def _relay_loop(
    producer_path: str, consumer_path: str, lease: float | None, barrier: Any, results: Any, index: int
) -> None:
    try:
        with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
            policy = DeliveryPolicy(lease_seconds=lease)
            barrier.wait(timeout=120)
            started = time.monotonic()
            sends: list[tuple[str, str]] = []
            while True:
                r = relay(producer, consumer, policy=policy)
                if r.status == "idle":
                    break
                sends.append((str(r.event_id), str(r.status)))
            results.put((index, "ok", sends, started, time.monotonic()))
    except BaseException as exc:  # noqa: BLE001 - report instead of leaving the parent waiting
        results.put((index, "error", repr(exc), 0.0, 0.0))


def _prepare(directory: Path, events: int, steps: int) -> tuple[str, str]:
    producer_path, consumer_path = directory / "producer.db", directory / "consumer.db"
    flows = -(-events // steps)
    made = 0
    with Producer(producer_path, RESERVATION) as producer:
        for f in range(flows):
            for n in range(steps):
                if made == events:
                    break
                r = producer.advance(
                    f"F{f:05d}-{n + 1}", f"F{f:05d}", expected_seq=n, kind=KINDS[n], payload={"amount": 1}
                )
                assert r.status == "committed", r
                made += 1
    Consumer(consumer_path, RESERVATION).close()
    return str(producer_path), str(consumer_path)


def _count(path: str, sql: str) -> int:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA query_only=ON")
        return int(conn.execute(sql).fetchone()[0])


def run_once(events: int, steps: int, relays: int, lease: float | None, directory: Path) -> dict[str, Any]:
    producer_path, consumer_path = _prepare(directory, events, steps)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(relays), ctx.Queue()
    procs = [
        ctx.Process(target=_relay_loop, args=(producer_path, consumer_path, lease, barrier, results, i))
        for i in range(relays)
    ]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    errors = [r for r in reports if r[1] != "ok"]
    if errors:
        raise RuntimeError(f"relay processes failed: {errors}")
    statuses: Counter[str] = Counter()
    per_event: Counter[str] = Counter()
    per_process = []
    for _, _, sends, _, _ in sorted(reports):
        per_process.append(len(sends))
        for event_id, status in sends:
            statuses[status] += 1
            per_event[event_id] += 1
    wall = max(r[4] for r in reports) - min(r[3] for r in reports)
    sends_total = sum(statuses.values())
    return {
        "mode": "lease" if lease is not None else "no lease",
        "lease_seconds": lease,
        "events": events,
        "relays": relays,
        "sends": sends_total,
        "accepted_sends": statuses["accepted"],
        "duplicate_sends": statuses["duplicate"],
        "other_answers": {k: v for k, v in statuses.items() if k not in ("accepted", "duplicate")},
        "events_sent_more_than_once": sum(1 for n in per_event.values() if n > 1),
        "max_sends_of_one_event": max(per_event.values(), default=0),
        "events_never_sent": events - len(per_event),
        "inbox_rows": _count(consumer_path, "SELECT count(*) FROM inbox"),
        "accepted_marks": _count(producer_path, "SELECT count(*) FROM delivery WHERE state = 'accepted'"),
        "sends_per_process": per_process,
        "wall_seconds": round(wall, 3),
        "sends_per_second": round(sends_total / wall, 1) if wall > 0 else None,
    }


def _table(runs: list[dict[str, Any]]) -> str:
    cols = [
        ("mode", "mode"), ("events", "events"), ("relays", "relays"), ("sends", "sends"),
        ("duplicate_sends", "duplicate sends"), ("events_sent_more_than_once", "events sent >1x"),
        ("max_sends_of_one_event", "max sends/event"), ("inbox_rows", "inbox rows"),
        ("accepted_marks", "accepted marks"), ("wall_seconds", "wall s"),
    ]
    header = [title for _, title in cols]
    body = [[str(run[key]) for key, _ in cols] for run in runs]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="events in the outbox (default 1000)")
    parser.add_argument("--steps", type=int, default=1, choices=(1, 2, 3), help="events per flow (default 1)")
    parser.add_argument("--relays", type=int, default=6, help="relay processes (default 6)")
    parser.add_argument("--lease", type=float, default=30.0, help="lease seconds of the lease run (default 30)")
    parser.add_argument("--no-compare", action="store_true", help="skip the run without leases")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--dir", help="keep the files in this directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.events < 1 or args.relays < 1:
        parser.error("--events and --relays must be >= 1")

    modes: list[float | None] = [args.lease] + ([] if args.no_compare else [None])
    runs = []
    with tempfile.TemporaryDirectory(prefix="lease-dup-") as tmp:
        base = Path(args.dir) if args.dir else Path(tmp)
        for lease in modes:
            directory = base / ("lease" if lease is not None else "no-lease")
            directory.mkdir(parents=True, exist_ok=False)
            runs.append(run_once(args.events, args.steps, args.relays, lease, directory))
    out = {
        "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version, "cpus": os.cpu_count(),
        "runs": runs,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.relays} relay processes, {args.events} events, one shared consumer file "
              f"(Python {out['python']}, SQLite {out['sqlite']}, {out['cpus']} CPUs)")
        print(_table(runs))
        print("duplicate send = a second (or later) send of an event; the inbox answers 'duplicate' "
              "and stores nothing.")
    ok = all(r["inbox_rows"] == r["events"] == r["accepted_marks"] and r["events_never_sent"] == 0 for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
