"""The peer of ``effects_pace.py``: the same workload on DBOS Transact's queue.

Run ONLY with the python of the benchmark-only virtual environment that
``effects_pace.py`` creates (``benchmarks/.venv-dbos``, ``pip install dbos``);
``dbos`` is never a dependency or an extra of ``reliable_flow``.

    .venv-dbos/bin/python benchmarks/peer_dbos.py --effects 400 --sleep 0.2 \\
        --concurrency 16 --kind sync --dir /tmp/somewhere

One measurement per process (DBOS is a process-wide singleton): a fresh
SQLite system database in ``--dir``, a queue registered with
``DBOS.register_queue(name, concurrency=N)`` (DBOS 3.x; older releases
spelled it ``Queue(name, concurrency=N)``), ``--effects`` workflows of one
durable step each that sleeps ``--sleep`` seconds (``time.sleep`` in a plain
step, or ``await asyncio.sleep`` in an ``async def`` step and workflow).

So that enqueueing is not timed (the library side schedules its effects
before its clock starts too), the run has two phases on one system database:

1. DBOS launched listening to no queue of ours (``DBOS.listen_queues``):
   register the queue, enqueue every workflow (``DBOS.enqueue_workflow``),
   then ``DBOS.destroy()``;
2. DBOS launched again on the same database, now dequeuing: the clock starts
   when ``launch()`` returns (or at the first step's start, if earlier) and
   stops when every workflow's status is ``SUCCESS`` in the system database
   (read with plain ``sqlite3`` every 50 ms: reads more often slow DBOS's
   writers down, its SQLite file being in rollback-journal mode).

Prints one JSON object on stdout (the last line); diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sqlite3
import sys
import threading
import time
from collections import Counter

from dbos import DBOS, DBOSConfig  # type: ignore[import-not-found]

QUEUE = "effects_pace"

_lock = threading.Lock()
_calls: Counter[str] = Counter()
_first_start: list[float] = []
_sleep = 0.2


def _started() -> None:
    with _lock:
        if not _first_start:
            _first_start.append(time.perf_counter())


def _count(i: int) -> None:
    with _lock:
        _calls[str(i)] += 1


@DBOS.step()
def call_sync(i: int) -> int:
    _started()
    time.sleep(_sleep)
    _count(i)
    return i


@DBOS.workflow()
def effect_sync(i: int) -> int:
    return call_sync(i)


@DBOS.step()
async def call_async(i: int) -> int:
    _started()
    await asyncio.sleep(_sleep)
    _count(i)
    return i


@DBOS.workflow()
async def effect_async(i: int) -> int:
    return await call_async(i)


def _config(path: str) -> DBOSConfig:
    return {"name": "effects-pace-peer", "system_database_url": f"sqlite:///{path}", "log_level": "WARNING"}


def _succeeded(path: str) -> int:
    conn = sqlite3.connect(path, timeout=30)
    try:
        row = conn.execute(
            "SELECT count(*) FROM workflow_status WHERE queue_name = ? AND status = 'SUCCESS'", (QUEUE,)
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def _pragmas(path: str) -> dict[str, str]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return {p: str(conn.execute(f"PRAGMA {p}").fetchone()[0]) for p in ("journal_mode", "synchronous")}
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    global _sleep
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effects", type=int, default=400)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--kind", choices=("sync", "async"), required=True)
    parser.add_argument("--dir", required=True, help="where the SQLite system database goes (fresh)")
    parser.add_argument("--polling", type=float, default=0.05, help="the queue's polling_interval_sec")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--poll-done", type=float, default=0.05, help="how often the end is looked for (s)")
    args = parser.parse_args(argv)
    _sleep = args.sleep
    logging.getLogger("dbos").setLevel(logging.WARNING)
    import dbos as dbos_module  # the version, for the report

    path = os.path.join(args.dir, "dbos_system.sqlite")
    workflow = effect_sync if args.kind == "sync" else effect_async

    # Phase 1: register and enqueue; this process dequeues nothing of ours.
    t = time.perf_counter()
    DBOS(config=_config(path))
    DBOS.listen_queues(["effects_pace_not_this_one"])
    DBOS.launch()
    DBOS.register_queue(QUEUE, concurrency=args.concurrency, polling_interval_sec=args.polling)
    enqueue_started = time.perf_counter()
    for i in range(args.effects):
        DBOS.enqueue_workflow(QUEUE, workflow, i)
    enqueue_seconds = time.perf_counter() - enqueue_started
    DBOS.destroy()
    setup_seconds = time.perf_counter() - t
    if _calls:
        raise SystemExit(f"phase 1 ran {sum(_calls.values())} calls: it must only enqueue")

    # Phase 2: launch again, dequeuing; timed until every workflow succeeded.
    DBOS(config=_config(path))
    launch_started = time.perf_counter()
    DBOS.launch()
    launched = time.perf_counter()
    deadline = launched + args.timeout
    done = 0
    while True:
        done = _succeeded(path)
        if done >= args.effects or time.perf_counter() > deadline:
            break
        time.sleep(args.poll_done)
    ended = time.perf_counter()
    with _lock:
        first = _first_start[0] if _first_start else launched
    start = min(launched, first)
    seconds = ended - start
    DBOS.destroy(workflow_completion_timeout_sec=5)
    calls = sum(_calls.values())
    doubled = sum(1 for v in _calls.values() if v > 1)
    result = {
        "peer": f"DBOS Transact {getattr(dbos_module, '__version__', '') or _version()}",
        "kind": args.kind,
        "concurrency": args.concurrency,
        "effects": args.effects,
        "sleep": args.sleep,
        "polling_interval_sec": args.polling,
        "seconds": seconds,
        "calls_per_s": args.effects / seconds if seconds > 0 else None,
        "succeeded": done,
        "calls": calls,
        "distinct": len(_calls),
        "doubled": doubled,
        "launch_seconds": launched - launch_started,
        "enqueue_seconds": enqueue_seconds,
        "setup_seconds": setup_seconds,
        "sqlite": _pragmas(path) | {"version": sqlite3.sqlite_version},
        "ok": done == args.effects and calls == args.effects and len(_calls) == args.effects,
    }
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 3


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("dbos")
    except Exception:  # noqa: BLE001 - only for the label
        return "?"


if __name__ == "__main__":
    sys.exit(main())
