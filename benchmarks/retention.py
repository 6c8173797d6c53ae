"""Long run with retention: do the files stop growing, and what does an event cost?

Runs ``--events`` events (reservation flows of 3 steps) through
``advance`` (a batch per block), ``relay_batch`` and ``process_all``, and
every ``--prune-every`` events prunes both files of everything older than
the last ``--keep`` events (``prune(0, now=<when that event was written>)``,
so the window is a count of events, independent of the machine's speed).
Prints, per checkpoint, the files' sizes (main file plus write-ahead log),
the rows kept, the tombstones, and the cost per event of the block (wall
and CPU microseconds, pruning included) and of the pruning alone.

    python benchmarks/retention.py                  # 50,000 events, pruning on
    python benchmarks/retention.py --no-prune       # the same without pruning, to compare
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from reliable_flow import Consumer, Producer, relay_batch
from reliable_flow.reservation import RESERVATION

KINDS = ("reserved", "confirmed", "released")


def size(path: Path) -> str:
    """The main file's KiB, and the write-ahead log's."""
    wal = path.with_name(path.name + "-wal")
    return f"{path.stat().st_size / 1024:,.0f} + {(wal.stat().st_size if wal.exists() else 0) / 1024:,.0f}"


def count(path: Path, table: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--block", type=int, default=300, help="events per advance batch / relay batch")
    ap.add_argument("--prune-every", type=int, default=3_000)
    ap.add_argument("--keep", type=int, default=3_000, help="the newest events kept at each prune")
    ap.add_argument("--report-every", type=int, default=5_000)
    ap.add_argument("--no-prune", action="store_true")
    ap.add_argument("--forget-after-events", type=int, default=None, metavar="N",
                    help="also forget tombstones of events more than N events old (prune(forget_after=))")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)

    folder = Path(args.dir or tempfile.mkdtemp(prefix="reliable-flow-retention-"))
    p_path, c_path = folder / "p.db", folder / "c.db"
    stamps: list[tuple[int, float]] = []  # (events written, time just before)
    print(f"# {args.events:,} events, block {args.block}, "
          + ("no pruning" if args.no_prune else f"prune every {args.prune_every:,} keeping the newest {args.keep:,}")
          + ("" if args.forget_after_events is None else
             f", forgetting tombstones older than {args.forget_after_events:,} events")
          + f"; files in {folder}")
    print("| events | producer KiB (file + WAL) | consumer KiB (file + WAL) | outbox rows | inbox rows | tombstones p / c "
          "| us/event (wall) | us/event (CPU) | prune us/event |")
    print("|---|---|---|---|---|---|---|---|---|")
    written = 0
    flow = 0
    with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION) as consumer:
        block_wall, block_cpu, prune_wall, block_events = time.perf_counter(), time.process_time(), 0.0, 0
        open_flows: list[tuple[str, int]] = []  # (flow, next step) still to advance
        while written < args.events:
            stamps.append((written, time.time()))
            n = min(args.block, args.events - written)
            with producer.batch() as b:
                for _ in range(n):
                    if not open_flows:
                        flow += 1
                        open_flows = [(f"F{flow}", 0)]
                    fid, step = open_flows.pop()
                    b.advance(f"{fid}-{step + 1}", fid, expected_seq=step, kind=KINDS[step], payload={"amount": 3})
                    if step + 1 < len(KINDS):
                        open_flows.append((fid, step + 1))
            while not relay_batch(producer, consumer, args.block).idle:
                pass
            consumer.process_all(batch_size=args.block)
            before, written = written, written + n
            block_events += n
            if not args.no_prune and written // args.prune_every > before // args.prune_every:
                horizon = [t for w, t in stamps if w <= written - args.keep]
                if horizon:
                    t0 = time.perf_counter()
                    forget = None
                    if args.forget_after_events is not None:
                        old = [t for w, t in stamps if w <= written - args.forget_after_events]
                        forget = max(0.0, horizon[-1] - old[-1]) if old else None
                    producer.admin.prune(0, now=horizon[-1], forget_after=forget, actor="ops", reason="retention")
                    consumer.admin.prune(0, now=horizon[-1], forget_after=forget, actor="ops", reason="retention")
                    prune_wall += time.perf_counter() - t0
            if written // args.report_every > before // args.report_every or written == args.events:
                wall = (time.perf_counter() - block_wall) / block_events * 1e6
                cpu = (time.process_time() - block_cpu) / block_events * 1e6
                print(f"| {written:,} | {size(p_path)} | {size(c_path)} "
                      f"| {count(p_path, 'outbox'):,} | {count(c_path, 'inbox'):,} "
                      f"| {count(p_path, 'outbox_tombstone'):,} / {count(c_path, 'inbox_tombstone'):,} "
                      f"| {wall:,.0f} | {cpu:,.0f} | {prune_wall / block_events * 1e6:,.1f} |")
                sys.stdout.flush()
                block_wall, block_cpu, prune_wall, block_events = time.perf_counter(), time.process_time(), 0.0, 0
    events = count(p_path, "outbox_tombstone") + count(p_path, "outbox")
    for path in (p_path, c_path):
        breakdown = _pages(path)
        if breakdown:
            parts = ", ".join(f"{name} {kib:,.0f}" for name, kib in breakdown)
            print(f"# {path.name} KiB in use by table (with its indexes): {parts}")
    for path, table in ((p_path, "outbox_tombstone"), (c_path, "inbox_tombstone")):
        tombs = count(path, table)
        used = dict(_pages(path)).get(table)
        if tombs and used is not None:
            print(f"# {table}: {tombs:,} tombstones in {used:,.0f} KiB = {used * 1024 / tombs:.0f} bytes each")
    print(f"# {events:,} events written")
    if args.dir is None:
        for path in folder.iterdir():
            os.unlink(path)
        folder.rmdir()
    return 0


def _pages(path: Path) -> list[tuple[str, float]]:
    """KiB of pages per table, its indexes counted in (empty when SQLite lacks dbstat)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        try:
            rows = conn.execute(
                "SELECT coalesce(m.tbl_name, s.name), sum(s.pgsize) FROM dbstat s "
                "LEFT JOIN sqlite_master m ON m.name = s.name GROUP BY 1 ORDER BY 2 DESC"
            ).fetchall()
        except sqlite3.Error:
            return []
        free = conn.execute("PRAGMA freelist_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0]
    return [(str(name), size / 1024) for name, size in rows] + [("(free pages)", free / 1024)]


if __name__ == "__main__":
    raise SystemExit(main())
