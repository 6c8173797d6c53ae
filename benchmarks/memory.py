"""Does the worker's resident size stay flat over a long run?

    python benchmarks/memory.py                     # 1,000,000 events (minutes: one fsync or more per event)
    python benchmarks/memory.py --events 200000     # a shorter run
    python benchmarks/memory.py --save              # also write benchmarks/memory.json for RESULTS.md

A child process (so that nothing of this script's own state is counted)
opens a producer and a consumer with the library, and runs the library's
``Worker`` over ``--events`` events: the producer commits events in batches
of ``--chunk`` (``producer.batch()``, flows of three steps, random ids), and
after each batch ``worker.run_once()`` runs until it has relayed and applied
everything (relay one event per call, as the worker does, then drain the
open flows).  Every ``--every`` events the child reads its resident set size
(``VmRSS`` in ``/proc/self/status``) and prints it.

The target (issue #13): resident size flat within +-10% after warm-up.  The
base is the first sample at or after ``--base`` events (100,000); every later
sample must lie within ``--tolerance`` of it.

With ``--save`` the result goes to ``benchmarks/memory.json``; ``run.py
--write-results`` puts it into RESULTS.md (a row of the summary table and a
"Memory" section), with the date and command it was measured with, since it
is not re-measured by run.py.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY_JSON = os.path.join(HERE, "memory.json")


def rss_kib() -> int:
    """Resident set size of this process, in KiB (Linux /proc)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(args: argparse.Namespace) -> int:
    """The measured process: prints one JSON line per sample, then a summary line."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from common import new_id
    from reliable_flow import Consumer, Producer, Worker
    from reliable_flow.reservation import RESERVATION

    producer = Producer(os.path.join(args.dir, "producer.db"), RESERVATION)
    rna = args.apply_on_receive and "apply_on_receive" in inspect.signature(Consumer).parameters
    if args.apply_on_receive and not rna:
        print(json.dumps({"error": "this Consumer has no apply_on_receive parameter"}), flush=True)
        return 2
    kwargs: dict[str, Any] = {"apply_on_receive": True} if rna else {}
    consumer = Consumer(os.path.join(args.dir, "consumer.db"), RESERVATION, **kwargs)
    worker = Worker(producer, [consumer], idle_sleep=0, register=True)
    rng = random.Random(7)
    steps = ("reserved", "confirmed", "released")
    done = 0
    next_sample = args.every
    started = time.perf_counter()
    flow_id, step, amount = "", 3, 0
    print(json.dumps({"events": 0, "rss_kib": rss_kib()}), flush=True)
    while done < args.events:
        n = min(args.chunk, args.events - done)
        with producer.batch() as batch:
            for _ in range(n):
                if step == 3:
                    flow_id, step, amount = "flow-" + new_id(rng, 64), 0, rng.randint(1, 1000)
                step += 1
                batch.advance(
                    new_id(rng),
                    flow_id,
                    expected_seq=step - 1,
                    kind=steps[step - 1],
                    payload={"amount": amount},
                )
        while worker.run_once().work:
            pass
        done += n
        if done >= next_sample or done == args.events:
            print(
                json.dumps(
                    {
                        "events": done,
                        "rss_kib": rss_kib(),
                        "seconds": time.perf_counter() - started,
                    }
                ),
                flush=True,
            )
            while next_sample <= done:
                next_sample += args.every
    stats = worker.stats
    relayed = sum(stats.relayed.values()) - stats.relayed.get("idle", 0)
    print(
        json.dumps(
            {
                "done": done,
                "relayed": relayed,
                "applied": stats.applied,
                "errors": stats.errors,
                # The Worker relays in the receive-and-apply mode by default
                # (Consumer.applying()), whatever the consumer's own flag.
                "apply_on_receive": rna or bool(getattr(worker, "apply_on_receive", False)),
                "seconds": time.perf_counter() - started,
            }
        ),
        flush=True,
    )
    producer.close()
    consumer.close()
    return 0


def parent(args: argparse.Namespace) -> int:
    tmp = tempfile.mkdtemp(prefix="reliable-flow-memory-", dir=args.tmp)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--dir",
        tmp,
        "--events",
        str(args.events),
        "--every",
        str(args.every),
        "--chunk",
        str(args.chunk),
    ] + (["--apply-on-receive"] if args.apply_on_receive else [])
    samples: list[tuple[int, int]] = []
    summary: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                record = json.loads(line)
                if "error" in record:
                    print(record["error"], file=sys.stderr)
                elif "rss_kib" in record:
                    samples.append((record["events"], record["rss_kib"]))
                    rate = (
                        f", {record['events'] / record['seconds']:,.0f} events/s"
                        if record.get("seconds")
                        else ""
                    )
                    print(
                        f"  {record['events']:>10,} events: RSS {record['rss_kib']:,} KiB{rate}",
                        flush=True,
                    )
                else:
                    summary = record
            code = proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if code != 0 or not summary:
        print(f"child failed (exit code {code})", file=sys.stderr)
        return 1
    if summary["applied"] < summary["done"]:  # the worker counts applies on arrival too
        print(f"not every event was applied: {summary}", file=sys.stderr)
        return 1
    after = [(n, kib) for n, kib in samples if n >= args.base]
    if not after:
        print(f"no sample at or after {args.base:,} events: run more events", file=sys.stderr)
        return 1
    base_events, base_kib = after[0]
    ratios = [kib / base_kib for _, kib in after]
    met = all(abs(r - 1) <= args.tolerance for r in ratios)
    result = {
        "events": summary["done"],
        "every": args.every,
        "base_events": base_events,
        "base_kib": base_kib,
        "tolerance": args.tolerance,
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "met": met,
        "samples": samples,
        "seconds": summary["seconds"],
        "events_per_second": summary["done"] / summary["seconds"],
        "relayed": summary["relayed"],
        "applied": summary["applied"],
        "errors": summary["errors"],
        "apply_on_receive": summary["apply_on_receive"],
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/memory.py " + " ".join(sys.argv[1:]),
        "how": (
            f"the library's `Worker` (relay one event per call, then drain the open flows; "
            f"{'receive-and-apply, the Worker default' if summary['apply_on_receive'] else 'two-step consumer'}) "
            f"over events committed by `producer.batch()` in batches of {args.chunk:,}, "
            f"`worker.run_once()` until idle after each batch."
        ),
    }
    print(
        f"{summary['done']:,} events in {summary['seconds']:.0f} s (parent wall {time.perf_counter() - started:.0f} s); "
        f"RSS after {base_events:,} events {base_kib:,} KiB; later samples "
        f"{min(ratios):.3f}x..{max(ratios):.3f}x of it: "
        f"{'flat' if met else 'NOT flat'} within ±{args.tolerance:.0%}"
    )
    if args.save:
        with open(MEMORY_JSON, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"wrote {MEMORY_JSON}")
    return 0 if met else 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events to run (default 1,000,000)"
    )
    parser.add_argument(
        "--every", type=int, default=50_000, help="sample RSS every N events (50,000)"
    )
    parser.add_argument(
        "--base", type=int, default=100_000, help="warm-up: base sample at N events (100,000)"
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.10, help="allowed deviation from the base (0.10)"
    )
    parser.add_argument(
        "--chunk", type=int, default=1_000, help="events per producer.batch() (1,000)"
    )
    parser.add_argument(
        "--apply-on-receive",
        action="store_true",
        help="run the worker with Consumer(..., apply_on_receive=True)",
    )
    parser.add_argument("--save", action="store_true", help="write benchmarks/memory.json")
    parser.add_argument(
        "--tmp", metavar="DIR", help="where to put the files (default: system temp)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.events < 1 or args.every < 1 or args.chunk < 1:
        parser.error("--events, --every and --chunk must be >= 1")
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
