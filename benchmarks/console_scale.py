"""The operator console at scale (issue 31, item 5): page times with a
million events and a hundred thousand effects, and what an open console
costs the worker.

    python benchmarks/console_scale.py                          # both engines, 1,000,000 events, 100,000 effects
    python benchmarks/console_scale.py --events 20000 --effects 2000 --requests 30 --pings 60   # a quick run
    python benchmarks/console_scale.py --engine sqlite          # one engine
    python benchmarks/console_scale.py --engine postgres --build-procs 2   # build in 2 processes
    python benchmarks/console_scale.py --write-results          # also write benchmarks/RESULTS-console.md
    python benchmarks/console_scale.py --write-results --append # ... adding this run's tables to it

Build (not timed as a result, only reported): a producer and a consumer
(SQLite files, or schemas on a private PostgreSQL server started from
``tests/pg_cluster.py``) filled through the public API in bulk:
``producer.batch()`` of 1,000 advances, ``relay_batch(limit=1000)`` to a
consumer with ``apply_on_receive=True``, and ``EffectExecutor(concurrency=16).run(until_idle=True)``.
``--effects`` flows of ``--events / --effects`` events each, every event
with a ``correlation_id`` in its meta; the last event of each flow schedules
one effect (``notify`` or ``bill``, alternating); one ``bill`` in 200 fails
for good (dead: the attention list is longer than the overview shows).
The build logs the seconds spent advancing, relaying and executing.  On
PostgreSQL the private server runs the build phase with
``full_page_writes=off`` and a larger WAL allowance (``BUILD_SETTINGS``),
then is vacuumed, checkpointed and restarted with its durable settings
before anything is measured.

Then a ``Worker`` (its own thread, ``idle_sleep=0.01``) and an
``EffectExecutor`` (its own thread, concurrency 4) run, the main thread
advances ``ping`` events (each scheduling one more effect) one at a time,
and the console is served by ``reliable-flow console`` in its own process
(read only, a threaded server), asked over HTTP:

* Pages: ``--requests`` rounds of the overview ``/``, an effects page
  (``/effects?state=succeeded&name=bill&after=<a key at random>``) and a flow
  page (``/flows/<a flow at random>``), back to back from one client, while
  pings run; p50 / p95 per page (the whole response read).  Target: p95
  under 200 ms.
* Latency: a ping's ``advance`` returned -> the consumer's projection
  visible (polled every 2 ms), ``--pings`` per condition in 4 alternating
  blocks: console closed; console open and refreshing (the overview, an
  effects page and a flow page, each fetched every 2 s from its own thread,
  as three browser tabs with live refresh).  Target: p99 with the console
  refreshing within 10% of p99 without.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.error import HTTPError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import machine
from reliable_flow import (
    ApplyContext,
    Consumer,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    PermanentFailure,
    Producer,
    Worker,
    relay_batch,
)
from reliable_flow.protocol import Protocol, by_kind, exact, text

RESULTS = os.path.join(HERE, "RESULTS-console.md")
PAGE_TARGET_MS = 200.0
LATENCY_TARGET = 1.10
REFRESH_S = 2.0
CHUNK = 1000

SCALE = Protocol(
    name="scale",
    initial="new",
    transitions={"new": ["step"], "step": ["step"]},
    schemas={1: by_kind({"step": exact({"n": text()})})},
)


def log(line: str = "") -> None:
    print(line, flush=True)


def flow_id(i: int) -> str:
    return f"F{i:07d}"


class Effects:
    """The workload's effects and its handler: per flow one effect, on its last event."""

    def __init__(self, per_flow: int) -> None:
        self.per_flow = per_flow
        self.registry = EffectRegistry()
        self.registry.register("notify", lambda call: None)
        self.registry.register("bill", self.bill, max_attempts=1)

    @staticmethod
    def bill(call: EffectCall) -> None:
        if call.payload["i"] % 200 == 1:
            raise PermanentFailure("card declined")

    def handler(self, ctx: ApplyContext) -> None:
        ping = ctx.event.flow_id.startswith("P")
        if ping or ctx.event.seq == self.per_flow:
            i = int(ctx.event.flow_id[1:])
            ctx.schedule("notify" if ping or i % 2 == 0 else "bill", {"i": i})

    def consumer(self, location: str) -> Consumer:
        return Consumer(location, SCALE, handlers=(self.handler,), effects=self.registry, apply_on_receive=True)


def build(p_at: str, c_at: str, events: int, flows: int, fx: Effects, procs: int = 1) -> float:
    """Fill both stores; seconds taken.  ``procs`` > 1: after a first chunk
    (which creates the stores and registers the consumer), that many
    processes each advance, relay and execute a disjoint range of flows
    (relays and executors of one consumer may run side by side); a last
    relay and executor pass then drains whatever is left."""
    t0 = time.perf_counter()
    per = fx.per_flow
    if procs <= 1:
        _build_range(p_at, c_at, 0, flows, per)
        return time.perf_counter() - t0
    first = max(1, min(flows, CHUNK // per))
    _build_range(p_at, c_at, 0, first, per)
    step = -(-(flows - first) // procs)
    ranges = [(p_at, c_at, lo, min(flows, lo + step), per) for lo in range(first, flows, step)]
    with multiprocessing.get_context("spawn").Pool(len(ranges)) as pool:
        pool.starmap(_build_range, ranges)
    with Producer(p_at, SCALE) as producer, fx.consumer(c_at) as consumer:
        while not relay_batch(producer, consumer, limit=CHUNK).idle:
            pass
        executor = EffectExecutor(consumer, fx.registry, concurrency=16)
        executor.run(until_idle=True, handle_signals=False, limit=500, idle_sleep=0.0)
        executor.close()
    return time.perf_counter() - t0


def _build_range(p_at: str, c_at: str, lo: int, hi: int, per: int) -> None:
    """Flows ``lo`` to ``hi`` (excluded): advanced in batches of CHUNK events,
    relayed and their effects executed after each batch."""
    t0 = time.perf_counter()
    fx = Effects(per)
    spent = {"advance": 0.0, "relay": 0.0, "execute": 0.0}
    with Producer(p_at, SCALE) as producer, fx.consumer(c_at) as consumer:
        executor = EffectExecutor(consumer, fx.registry, concurrency=16)
        done = 0
        order = [(i, seq) for i in range(lo, hi) for seq in range(1, per + 1)]
        for start in range(0, len(order), CHUNK):
            t = time.perf_counter()
            with producer.batch() as batch:
                for i, seq in order[start:start + CHUNK]:
                    batch.advance(f"{flow_id(i)}-{seq}", flow_id(i), expected_seq=seq - 1, kind="step",
                                  payload={"n": str(seq)}, meta={"correlation_id": f"order-{i // 3}"})
            spent["advance"] += time.perf_counter() - t
            t = time.perf_counter()
            while not relay_batch(producer, consumer, limit=CHUNK, register=True).idle:
                pass
            spent["relay"] += time.perf_counter() - t
            t = time.perf_counter()
            executor.run(until_idle=True, handle_signals=False, limit=500, idle_sleep=0.0)
            spent["execute"] += time.perf_counter() - t
            done += min(CHUNK, len(order) - start)
            if done % 100_000 < CHUNK or done == len(order):
                log(f"    flows {lo:,}-{hi:,}: built {done:,} / {len(order):,} events ({time.perf_counter() - t0:.0f} s: "
                    + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()) + ")")
        executor.close()


class Running(threading.Thread):
    """A Worker or an EffectExecutor on objects of its own, in its own thread."""

    def __init__(self, what: str, p_at: str, c_at: str, fx: Effects) -> None:
        super().__init__(daemon=True)
        self.what, self.p_at, self.c_at, self.fx = what, p_at, c_at, fx
        self.ready, self.error, self.runner = threading.Event(), None, None

    def run(self) -> None:
        try:
            with self.fx.consumer(self.c_at) as consumer:
                if self.what == "worker":
                    with Producer(self.p_at, SCALE) as producer:
                        self.runner = Worker(producer, [consumer], idle_sleep=0.01)
                        self.ready.set()
                        self.runner.run(handle_signals=False)
                else:
                    self.runner = EffectExecutor(consumer, self.fx.registry, concurrency=4)
                    self.ready.set()
                    self.runner.run(handle_signals=False, idle_sleep=0.05)
                    self.runner.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
            self.ready.set()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        self.join(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str) -> float:
    """Seconds to read the whole answer (a 503 from a page with attention items is an answer too)."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
    except HTTPError as exc:
        exc.read()
        if exc.code != 503:
            raise
    return time.perf_counter() - t0


@dataclass
class Result:
    engine: str
    events: int
    effects: int
    build_s: float = 0.0
    pages: dict[str, list[float]] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


def measure(engine: str, p_at: str, c_at: str, args: argparse.Namespace, flows: int, fx: Effects,
            after_build: Any = None) -> Result:
    res = Result(engine, args.events, args.effects)
    log(f"[{engine}] building {args.events:,} events, {flows:,} effects ...")
    res.build_s = build(p_at, c_at, args.events, flows, fx, args.build_procs)
    log(f"[{engine}] built in {res.build_s:.0f} s")
    if after_build is not None:
        after_build()
    threads = [Running("worker", p_at, c_at, fx), Running("executor", p_at, c_at, fx)]
    for t in threads:
        t.start()
        t.ready.wait(60)
        if t.error is not None:
            raise t.error
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "reliable_flow", "console", p_at, c_at, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    base = f"http://127.0.0.1:{port}"
    rng = random.Random(31)
    try:
        _wait_up(base, server)
        keys = [f"default:{flow_id(i)}-{fx.per_flow}:bill" for i in range(1, flows, 2)]
        pages = {
            "overview": lambda: "/",
            "effects list": lambda: f"/effects?state=succeeded&name=bill&after={rng.choice(keys)}",
            "flow": lambda: f"/flows/{flow_id(rng.randrange(flows))}",
        }
        with Pinger(p_at, c_at, fx) as pinger:
            done = threading.Event()
            client = threading.Thread(target=_client, args=(base, pages, args.requests, res.pages, done), daemon=True)
            client.start()
            while not done.is_set():  # pings keep the worker and the executor busy meanwhile
                pinger.ping()
            client.join()
            if len(res.pages) < len(pages) or not all(len(s) == args.requests for s in res.pages.values()):
                raise RuntimeError("the page client failed (see above)")
            log(f"[{engine}] pages: " + "; ".join(f"{n} p50 {pct(s, .5):.0f} ms p95 {pct(s, .95):.0f} ms"
                                                   for n, s in res.pages.items()))
            res.latency = {"console closed": [], "console open, refreshing": []}
            per_block = max(1, args.pings // 4)
            for block in range(8):
                cond = list(res.latency)[block % 2]
                tabs_stop = threading.Event()
                tabs = [threading.Thread(target=_tab, args=(base, path, tabs_stop), daemon=True)
                        for path in pages.values()] if block % 2 else []
                for t in tabs:
                    t.start()
                for _ in range(per_block):
                    res.latency[cond].append(pinger.ping())
                tabs_stop.set()
                for t in tabs:
                    t.join()
            log(f"[{engine}] latency: " + "; ".join(f"{n} p50 {pct(s, .5):.1f} ms p99 {pct(s, .99):.1f} ms"
                                                     for n, s in res.latency.items()))
    finally:
        server.terminate()
        server.wait(30)
        for t in threads:
            t.stop()
    for t in threads:
        if t.error is not None:
            raise t.error
    return res


def _wait_up(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            fetch(base + "/healthz")
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the console did not start: {server.stderr.read() if server.stderr else ''}")
            time.sleep(0.2)


def _client(base: str, pages: dict[str, Any], requests: int, out: dict[str, list[float]],
            done: threading.Event) -> None:
    """The page timings: each page once to warm up, then ``requests`` rounds back to back."""
    try:
        for name, path in pages.items():
            fetch(base + path())
            out[name] = []
        for _ in range(requests):
            for name, path in pages.items():
                out[name].append(fetch(base + path()))
    finally:
        done.set()


def _tab(base: str, path: Any, stop: threading.Event) -> None:
    """One browser tab with live refresh: the page's JSON twin every REFRESH_S."""
    while not stop.is_set():
        api = path()
        fetch(base + ("/api/overview" if api == "/" else "/api" + api))
        stop.wait(REFRESH_S)


class Pinger:
    """Advances ``ping`` events one at a time and waits for each to be applied."""

    def __init__(self, p_at: str, c_at: str, fx: Effects) -> None:
        self.producer = Producer(p_at, SCALE)
        self.reader = Consumer(c_at, SCALE)
        self.n, self.rng = 0, random.Random(7)

    def __enter__(self) -> Pinger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.producer.close()
        self.reader.close()

    def ping(self) -> float:
        self.n += 1
        flow = f"P{self.n:07d}"
        time.sleep(self.rng.uniform(0, 0.02))  # land anywhere in the worker's idle sleep
        self.producer.advance(f"{flow}-1", flow, expected_seq=0, kind="step", payload={"n": "1"})
        t0 = time.perf_counter()
        deadline = t0 + 60
        while self.reader.projection(flow) is None:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"ping {flow} not applied within 60 s")
            time.sleep(0.002)
        return time.perf_counter() - t0



def load_pg_cluster() -> Any:
    path = os.path.join(ROOT, "tests", "pg_cluster.py")
    spec = importlib.util.spec_from_file_location("rf_pg_cluster", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The private server's settings for the build phase only (bulk loading, as
#: PostgreSQL's "Populating a Database" advises); measured with them reset.
#: Not ``fsync=off``: the library refuses such a server (StorageError on
#: opening), and it sets ``synchronous_commit=on`` per session when the
#: server has it off, so neither can shorten the build.
BUILD_SETTINGS = {"full_page_writes": "off", "max_wal_size": "'4GB'", "checkpoint_timeout": "'30min'"}
DURABLE = ("fsync", "synchronous_commit", "full_page_writes")
BUILD_NOTE = ("**PostgreSQL build phase:** the private server runs with `full_page_writes=off`, `max_wal_size=4GB` "
              "and `checkpoint_timeout=30min` while the stores are filled (through the same public API; `fsync` "
              "and `synchronous_commit` stay on: the library refuses a server without them); then "
              "`VACUUM ANALYZE`, `CHECKPOINT`, the settings reset and the server restarted: **everything "
              "measured runs with the durable settings** (`fsync`, `synchronous_commit`, `full_page_writes` "
              "checked `on` with `SHOW` after the restart).")


def pg_check_built(cluster: Any, events: int) -> None:
    """Every event in the producer's outbox and the consumer's inbox (a
    build in several processes leaves none out); the tables' sizes logged."""
    import psycopg

    with psycopg.connect(cluster.dsn("rf_console"), autocommit=True) as conn:
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                  for t in ("producer.outbox", "consumer.inbox")}
        sizes = conn.execute(
            "SELECT n.nspname || '.' || c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' "
            "AND n.nspname IN ('producer', 'consumer') ORDER BY 2 DESC LIMIT 6").fetchall()
    log("[postgres] built: " + ", ".join(f"{t} {n:,} rows" for t, n in counts.items()) + "; largest: "
        + ", ".join(f"{t} {b / 2**20:.0f} MB" for t, b in sizes))
    if any(n != events for n in counts.values()):
        raise RuntimeError(f"the build left events out: {counts}, expected {events:,} each")


def pg_build_settings(cluster: Any, fast: bool) -> None:
    """``fast``: the bulk-load settings, reloaded; else reset to the durable
    ones, the database vacuumed and checkpointed, and the server restarted."""
    import psycopg

    admin = cluster.dsn("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        for name, value in BUILD_SETTINGS.items():
            conn.execute(f"ALTER SYSTEM SET {name} = {value}" if fast else f"ALTER SYSTEM RESET {name}")
        conn.execute("SELECT pg_reload_conf()")
    if fast:
        return
    t0 = time.perf_counter()
    with psycopg.connect(cluster.dsn("rf_console"), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    cluster.restart()
    with psycopg.connect(admin, autocommit=True) as conn:
        now = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in DURABLE}
    if any(value != "on" for value in now.values()):
        raise RuntimeError(f"the server did not come back with the durable settings: {now}")
    log(f"[postgres] vacuumed, checkpointed, restarted with {now} in {time.perf_counter() - t0:.0f} s")


def report(results: list[Result], facts: dict[str, str], args: argparse.Namespace, load: str) -> str:
    lines = ["# The operator console at scale", "",
             "Generated by `python benchmarks/console_scale.py --write-results` — do not edit by hand; re-run to "
             "refresh. What is measured: the docstring of [console_scale.py](console_scale.py).", "",
             f"**Machine:** {facts['platform']}; {facts['cpu']} (**shared with other jobs during the run**; "
             f"load average {load}); {facts['python']}; SQLite {facts['sqlite']}; filesystem {facts['filesystem']}.",
             "", f"**Date:** {facts['date']}. Command: `python benchmarks/console_scale.py {' '.join(sys.argv[1:])}`.",
             *(["", BUILD_NOTE] if any(r.engine == "postgres" for r in results) else []),
             "", "## Page times (worker, executor and pings running)", "",
             f"{args.requests} requests per page, back to back over HTTP to `reliable-flow console` (its own "
             "process, a threaded server). Target: p95 under 200 ms.", "",
             "| engine | events | effects | build s | page | p50 ms | p95 ms | max ms | target met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name, s in r.pages.items():
            lines.append(f"| {r.engine} | {r.events:,} | {r.effects:,} | {r.build_s:.0f} | {name} | "
                         f"{pct(s, .5):.1f} | {pct(s, .95):.1f} | {max(s) * 1000:.1f} | "
                         f"{'yes' if pct(s, .95) < PAGE_TARGET_MS else '**no**'} |")
    lines += ["", "## Worker delivery latency, console closed vs open and refreshing", "",
              "A ping's advance returned -> its projection visible; 4 alternating blocks per condition; the open "
              "console: three tabs (overview, effects page, flow page) refreshing every 2 s. Target: p99 open within "
              "10% of p99 closed.", "",
              "| engine | condition | pings | p50 ms | p99 ms | max ms | p99 ratio | target met |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        closed, opened = (r.latency[k] for k in ("console closed", "console open, refreshing"))
        ratio = pct(opened, .99) / pct(closed, .99)
        for name, s in r.latency.items():
            is_open = s is opened
            lines.append(f"| {r.engine} | {name} | {len(s)} | {pct(s, .5):.1f} | {pct(s, .99):.1f} | "
                         f"{max(s) * 1000:.1f} | {f'{ratio:.2f}x' if is_open else '—'} | "
                         f"{('yes' if ratio <= LATENCY_TARGET else '**no**') if is_open else '—'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--effects", type=int, default=100_000)
    ap.add_argument("--engine", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--pings", type=int, default=400)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--build-procs", type=int, default=1,
                    help="build in this many processes over disjoint ranges of flows (the rows are the same)")
    ap.add_argument("--write-results", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="with --write-results: add this run's tables to RESULTS-console.md (another scale or engine)")
    args = ap.parse_args()
    if args.events < args.effects or args.effects < 2:
        ap.error("--events must be at least --effects, and --effects at least 2")
    flows = args.effects
    fx = Effects(args.events // flows)
    args.events = flows * fx.per_flow
    tmp = tempfile.mkdtemp(prefix="rf-console-", dir=args.tmp)
    results = []
    try:
        if args.engine in ("sqlite", "both"):
            results.append(measure("sqlite", os.path.join(tmp, "p.db"), os.path.join(tmp, "c.db"), args, flows, fx))
        if args.engine in ("postgres", "both"):
            cluster = load_pg_cluster().PgCluster()
            cluster.start()
            try:
                cluster.create_database("rf_console")
                pg_build_settings(cluster, fast=True)
                results.append(measure("postgres", cluster.dsn("rf_console", schema="producer"),
                                       cluster.dsn("rf_console", schema="consumer"), args, flows, fx,
                                       after_build=lambda: (pg_check_built(cluster, args.events),
                                                            pg_build_settings(cluster, fast=False))))
            finally:
                cluster.destroy()
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        text_ = report(results, machine(tmp), args, load)
        log(text_)
        if args.write_results:
            if args.append and os.path.exists(RESULTS):  # a run's own section, its title left out
                with open(RESULTS, "a") as f:
                    f.write("\n---\n\n" + text_.split("\n", 2)[2].lstrip("\n").split("\n", 2)[2])
            else:
                with open(RESULTS, "w") as f:
                    f.write(text_)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    missed = any(pct(s, .95) >= PAGE_TARGET_MS for r in results for s in r.pages.values())
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
