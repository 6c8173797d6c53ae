"""PostgreSQL beside SQLite: the same end-to-end cases, and many producer processes.

    python benchmarks/postgres.py                  # everything, a few minutes
    python benchmarks/postgres.py --quick          # smoke run (small sizes, figures not to quote)
    python benchmarks/postgres.py --only e2e       # or: --only producers
    python benchmarks/postgres.py --write-results  # also write benchmarks/RESULTS-postgres.md

Starts its own private PostgreSQL server (``initdb`` into a temporary
directory, Unix socket only, through ``tests/pg_cluster.py``; as root the
server runs as the ``postgres`` user) and stops it at the end.  ``run.py``
needs no server and does not import this file.

Two parts, each in interleaved rounds on fresh stores (a new SQLite
directory, a new PostgreSQL schema), medians and the spread over rounds:

* ``e2e``: advance -> relay -> apply_next one event at a time, the same with
  ``Consumer(..., apply_on_receive=True)``, and batched (``producer.batch()``
  of 100, ``relay_batch(limit=100)``, ``process_all(batch_size=100)``), on
  SQLite files and on PostgreSQL schemas, all sides of a case interleaved in
  small blocks in every round.
* ``producers``: 1, 2, 4 and 8 producer processes, each advancing its own
  flows into ONE outbox (one SQLite file; one PostgreSQL schema) for a fixed
  time window; events/s in total, and the scaling factor against one
  process, paired by round.

See benchmarks/README.md ("PostgreSQL") for how to read the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import cases
from common import STEPS, Event, Sample, machine, make_events, median, new_id
from reliable_flow import Consumer, Producer, relay
from reliable_flow.errors import DatabaseBusy
from reliable_flow.reservation import RESERVATION
from run import Load, interleave

SQLITE, POSTGRES = "SQLite", "PostgreSQL"
ENGINES = (SQLITE, POSTGRES)
TWO_STEP, RNA, BATCHED = "two-step", "receive-and-apply", "batched"
MODE_TITLES = {
    TWO_STEP: "end to end, unbatched (advance; relay; apply_next)",
    RNA: "end to end, unbatched, `apply_on_receive=True` (advance; relay)",
    BATCHED: "end to end, batched (100): `batch()`; `relay_batch`; `process_all(batch_size=100)`",
}
COUNTS = (1, 2, 4, 8)
DATABASE = "rf_bench"
RESULTS = os.path.join(HERE, "RESULTS-postgres.md")
SHOWN_SETTINGS = (
    "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "wal_level", "shared_buffers",
    "wal_buffers", "max_wal_size", "checkpoint_timeout", "max_connections", "max_locks_per_transaction",
    "work_mem", "default_transaction_isolation",
)


def _load_pg_cluster() -> Any:
    """``tests/pg_cluster.py`` by path: the tests' private-server helper."""
    path = os.path.join(ROOT, "tests", "pg_cluster.py")
    spec = importlib.util.spec_from_file_location("rf_pg_cluster", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Sizes:
    e2e: int = 200  # events per side per round, unbatched
    batched: int = 3000  # events per side per round, batched (chunks of 100)
    block: int = 10  # unbatched: events per interleaving block
    batched_block: int = 5  # batched: batches per interleaving block
    window: float = 4.0  # producers: seconds each measurement runs

    @classmethod
    def quick(cls) -> Sizes:
        return cls(e2e=30, batched=500, block=5, batched_block=1, window=1.5)


class Server:
    """The private server, one database, a fresh schema per store."""

    def __init__(self) -> None:
        self.cluster = _load_pg_cluster().PgCluster()
        self._names = 0

    def start(self) -> None:
        self.cluster.start()
        self.cluster.create_database(DATABASE)

    def location(self, label: str) -> str:
        self._names += 1
        return self.cluster.dsn(DATABASE, schema=f"b{self._names}_{label}")

    def sql(self, text: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.cluster.dsn(DATABASE), autocommit=True) as conn:
            cur = conn.execute(text)
            return cur.fetchall() if cur.description is not None else []

    def checkpoint(self) -> None:
        """Write the server's dirty pages now, not during the next timed section."""
        self.sql("CHECKPOINT")

    def drop(self, location: str) -> None:
        schema = location.rsplit("#", 1)[1]
        self.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def settings(self) -> dict[str, str]:
        out = {"server_version": self.sql("SHOW server_version")[0][0]}
        for name in SHOWN_SETTINGS:
            out[name] = self.sql(f"SHOW {name}")[0][0]
        return out

    def stop(self) -> None:
        self.cluster.destroy()  # pg_ctl stop -m immediate (as the postgres user when root), rm -r


# -- part 1: end to end, both engines, interleaved -------------------------------------------------


class Stores:
    """Where one side's producer and consumer live, created fresh, removed after the round."""

    def __init__(self, engine: str, server: Server, tmp: str, label: str) -> None:
        self.engine = engine
        self._server = server
        if engine == SQLITE:
            self.dir = tempfile.mkdtemp(prefix=label + "-", dir=tmp)
            self.producer = os.path.join(self.dir, "producer.db")
            self.consumer = os.path.join(self.dir, "consumer.db")
        else:
            self.producer = server.location(f"{label}_p")
            self.consumer = server.location(f"{label}_c")

    def remove(self) -> None:
        if self.engine == SQLITE:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            self._server.drop(self.producer)
            self._server.drop(self.consumer)


def _advance(producer: Any, e: Event) -> Any:
    return producer.advance(e.event_id, e.flow_id, expected_seq=e.seq - 1, kind=e.kind, payload=e.payload)


def _check_projections(consumer: Consumer, events: list[Event], what: str) -> None:
    last: dict[str, int] = {}
    for e in events:
        last[e.flow_id] = e.seq
    wrong = [f for f, seq in last.items() if (consumer.projection(f) or {}).get("last_seq") != seq]
    if wrong:
        raise AssertionError(f"{what}: {len(wrong)} flows not applied to their last event, e.g. {wrong[0]}")


def open_side(mode: str, stores: Stores, sizes: Sizes, rng: random.Random) -> cases.Session:
    """One side: a bound, warmed pair on ``stores``, its units ready to run."""
    warm = make_events(3, rng)
    events = make_events(sizes.batched if mode == BATCHED else sizes.e2e, rng)
    producer = Producer(stores.producer, RESERVATION)
    rna = mode == RNA
    consumer = Consumer(stores.consumer, RESERVATION, apply_on_receive=rna) if rna else Consumer(
        stores.consumer, RESERVATION
    )
    for e in warm:  # binds the consumer, fills statement caches
        assert _advance(producer, e).status == "committed"
        assert relay(producer, consumer).status == "accepted"
        if not rna:
            assert consumer.apply_next(e.flow_id).status == "applied"
    shape = cases.Sizes()
    if mode == BATCHED:
        session = cases.Batched(shape).library(producer, consumer, events)
    elif mode == TWO_STEP:
        session = cases.EndToEnd(shape).library(producer, consumer, events)
    else:
        results: list[Any] = []

        def unit(e: Event) -> None:
            results.append(_advance(producer, e))
            results.append(relay(producer, consumer))

        def check() -> None:
            cases._expect(results[0::2], "committed", "advance")
            cases._expect(results[1::2], "accepted", "relay")

        session = cases.Session({"main": [lambda e=e: unit(e) for e in events]}, 1, [], check)
    inner = session.check

    def check_all() -> None:
        inner()
        _check_projections(consumer, warm + events, f"{stores.engine} {mode}")

    session.check = check_all
    session.closers += [producer.close, consumer.close]
    return session


@dataclass
class E2E:
    """Samples per (engine, mode), rounds in order."""

    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)

    def us(self, engine: str, mode: str) -> float:
        return median(s.us_per_event for s in self.samples[(engine, mode)])

    def cpu(self, engine: str, mode: str) -> float:
        return median(s.cpu_us_per_event for s in self.samples[(engine, mode)])

    def rates(self, engine: str, mode: str) -> list[float]:
        return [1e6 / s.us_per_event for s in self.samples[(engine, mode)]]

    def ratios(self, mode: str) -> list[float]:
        """PostgreSQL time / SQLite time per event, paired by round."""
        pg, lite = self.samples[(POSTGRES, mode)], self.samples[(SQLITE, mode)]
        return [a.us_per_event / b.us_per_event for a, b in zip(pg, lite)]


def run_e2e(server: Server, sizes: Sizes, rounds: int, tmp: str, log: Callable[[str], None], load: Load) -> E2E:
    out = E2E()
    groups = (((TWO_STEP, RNA), sizes.block), ((BATCHED,), sizes.batched_block))
    for r in range(rounds):
        for modes, block in groups:
            keys = [(engine, mode) for engine in ENGINES for mode in modes]
            if r % 2:
                keys.reverse()
            stores: list[Stores] = []
            sessions: dict[tuple[str, str], cases.Session] = {}
            server.checkpoint()
            try:
                for engine, mode in keys:
                    stores.append(Stores(engine, server, tmp, f"r{r}_{mode[:3]}_{engine[:2].lower()}"))
                    # every side gets the same events (same seed) on its own stores
                    sessions[(engine, mode)] = open_side(mode, stores[-1], sizes, random.Random(1000 + r))
                samples = interleave(sessions, block, offset=r)  # type: ignore[arg-type]
                for session in sessions.values():
                    session.check()
            finally:
                for session in sessions.values():
                    session.close()
                for s in stores:
                    s.remove()
            for (key, _phase), sample in samples.items():
                out.samples.setdefault(key, []).append(sample)  # type: ignore[arg-type]
            load.sample()
            log(f"  round {r + 1}/{rounds}: us/event (client CPU) " + ", ".join(
                f"{engine} {mode} {samples[((engine, mode), 'main')].us_per_event:.0f} "
                f"({samples[((engine, mode), 'main')].cpu_us_per_event:.0f})" for engine, mode in keys
            ))
    return out


# -- part 2: concurrent producer processes, one outbox ----------------------------------------------


def _producer_child(location: str, seed: int, window: float, barrier: Any, queue: Any) -> None:
    """Open a producer, wait for all, advance own new flows for ``window`` seconds."""
    try:
        rng = random.Random(seed)
        producer = Producer(location, RESERVATION)
        prefix = f"p{seed}-"
        flow, seq, busy = prefix + new_id(rng, 64), 0, 0
        producer.advance(new_id(rng), flow, expected_seq=0, kind="reserved", payload={"amount": 1})
        seq = 1
        barrier.wait()
        t0, c0 = time.perf_counter(), time.process_time()
        deadline, n = t0 + window, 0
        event_id = new_id(rng)
        while time.perf_counter() < deadline:
            if seq == len(STEPS):
                flow, seq = prefix + new_id(rng, 64), 0
            try:
                result = producer.advance(event_id, flow, expected_seq=seq, kind=STEPS[seq], payload={"amount": 1})
            except DatabaseBusy:
                busy += 1
                continue  # retry the same event: its id makes the retry safe
            if result.status != "committed":
                raise AssertionError(f"advance: {result!r}")
            seq, n, event_id = seq + 1, n + 1, new_id(rng)
        t1 = time.perf_counter()
        queue.put((t0, t1, n, time.process_time() - c0, busy, None))
        producer.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put((0.0, 0.0, 0, 0.0, 0, f"{type(exc).__name__}: {exc}"))


@dataclass
class Burst:
    """One measurement: ``n`` processes on one outbox for one window."""

    events: int
    seconds: float
    busy: int
    per_process: list[int]

    @property
    def rate(self) -> float:
        return self.events / self.seconds


def _outbox_rows(engine: str, stores: Stores, server: Server) -> tuple[int, int]:
    if engine == SQLITE:
        conn = sqlite3.connect(stores.producer)
        try:
            row = conn.execute("SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM delivery)").fetchone()
        finally:
            conn.close()
    else:
        schema = stores.producer.rsplit("#", 1)[1]
        row = server.sql(f'SELECT (SELECT count(*) FROM "{schema}".outbox), (SELECT count(*) FROM "{schema}".delivery)')[0]
    return int(row[0]), int(row[1])


def burst(engine: str, n: int, server: Server, tmp: str, window: float, seed: int) -> Burst:
    stores = Stores(engine, server, tmp, f"burst_{n}_{engine[:2].lower()}")
    try:
        server.checkpoint()
        # One consumer registered and bound, so every advance also writes a delivery row.
        producer, consumer = Producer(stores.producer, RESERVATION), Consumer(stores.consumer, RESERVATION)
        assert producer.advance("warm", "warm", expected_seq=0, kind="reserved", payload={"amount": 1}).status == "committed"
        assert relay(producer, consumer).status == "accepted"
        producer.close()
        consumer.close()
        ctx = multiprocessing.get_context("fork")
        barrier, queue = ctx.Barrier(n), ctx.Queue()
        procs = [
            ctx.Process(target=_producer_child, args=(stores.producer, seed * 100 + i, window, barrier, queue))
            for i in range(n)
        ]
        for p in procs:
            p.start()
        got = [queue.get(timeout=window + 120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        errors = [g[5] for g in got if g[5]]
        if errors:
            raise RuntimeError(f"{engine}, {n} producers: {errors[0]}")
        start, end = min(g[0] for g in got), max(g[1] for g in got)
        events = sum(g[2] for g in got)
        rows, deliveries = _outbox_rows(engine, stores, server)
        if rows != events + n + 1 or deliveries != rows:
            raise AssertionError(f"{engine}, {n} producers: {rows} outbox rows, {deliveries} deliveries, "
                                 f"{events + n + 1} expected")
        return Burst(events, end - start, sum(g[4] for g in got), [g[2] for g in got])
    finally:
        stores.remove()


@dataclass
class Producers:
    window: float
    samples: dict[tuple[str, int], list[Burst]] = field(default_factory=dict)

    def rate(self, engine: str, n: int) -> float:
        return median(b.rate for b in self.samples[(engine, n)])

    def rates(self, engine: str, n: int) -> list[float]:
        return [b.rate for b in self.samples[(engine, n)]]

    def scaling(self, engine: str, n: int) -> list[float]:
        """Events/s with n processes / with 1 process, paired by round."""
        return [b.rate / a.rate for a, b in zip(self.samples[(engine, 1)], self.samples[(engine, n)])]

    def busy(self, engine: str, n: int) -> int:
        return sum(b.busy for b in self.samples[(engine, n)])

    def fairness(self, engine: str, n: int) -> float:
        """Median over rounds of (fewest events of one process / most)."""
        return median(min(b.per_process) / max(b.per_process) for b in self.samples[(engine, n)])


def run_producers(server: Server, sizes: Sizes, rounds: int, tmp: str, log: Callable[[str], None],
                  load: Load) -> Producers:
    out = Producers(sizes.window)
    for engine in ENGINES:  # untimed: the first processes of a run pay for cold caches
        burst(engine, 2, server, tmp, min(1.0, sizes.window), seed=999)
    for r in range(rounds):
        order = list(COUNTS[r % len(COUNTS):] + COUNTS[: r % len(COUNTS)])
        line = []
        for i, n in enumerate(order):
            engines = ENGINES if (r + i) % 2 == 0 else ENGINES[::-1]
            for engine in engines:
                b = burst(engine, n, server, tmp, sizes.window, seed=1000 * r + 10 * n + ENGINES.index(engine))
                out.samples.setdefault((engine, n), []).append(b)
                line.append(f"{engine} x{n} {b.rate:,.0f}/s" + (f" ({b.busy} busy)" if b.busy else ""))
            load.sample()
        log(f"  round {r + 1}/{rounds}: " + ", ".join(line))
    return out


# -- the report -----------------------------------------------------------------------------------


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _n(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _span(values: list[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(min(values))}..{fmt.format(max(values))}"


def e2e_table(e: E2E) -> str:
    rows = []
    for mode in (TWO_STEP, RNA, BATCHED):
        row = [MODE_TITLES[mode]]
        for engine in ENGINES:
            rates = e.rates(engine, mode)
            row += [f"{median(rates):,.0f} ({_span(rates)})", _n(e.us(engine, mode)), _n(e.cpu(engine, mode))]
        ratios = e.ratios(mode)
        row.append(f"{median(ratios):.2f}x ({_span(ratios, '{:.2f}')})")
        rows.append(row)
    return _md(
        ["case", "SQLite events/s (spread)", "SQLite us/event", "SQLite client CPU us/event",
         "PostgreSQL events/s (spread)", "PostgreSQL us/event", "PostgreSQL client CPU us/event",
         "PostgreSQL / SQLite time per event (spread)"],
        rows,
    )


def producers_table(p: Producers) -> str:
    rows = []
    for n in COUNTS:
        row = [str(n)]
        for engine in ENGINES:
            rates, scale = p.rates(engine, n), p.scaling(engine, n)
            row += [f"{median(rates):,.0f} ({_span(rates)})", f"{median(scale):.2f}x ({_span(scale, '{:.2f}')})",
                    f"{p.fairness(engine, n):.2f}", str(p.busy(engine, n))]
        rows.append(row)
    return _md(
        ["producer processes", "SQLite events/s (spread)", "SQLite vs 1 process", "SQLite fairness", "SQLite busy",
         "PostgreSQL events/s (spread)", "PostgreSQL vs 1 process", "PostgreSQL fairness", "PostgreSQL busy"],
        rows,
    )


def rounds_md(e: E2E | None, p: Producers | None) -> str:
    parts = []
    if e is not None:
        rows = [[f"{engine} {mode}", " ".join(f"{s.us_per_event:.0f}" for s in e.samples[(engine, mode)])]
                for mode in (TWO_STEP, RNA, BATCHED) for engine in ENGINES]
        parts.append(_md(["end to end: side", "us/event, round by round"], rows))
    if p is not None:
        rows = [[f"{engine} x{n}", " ".join(f"{b.rate:,.0f}" for b in p.samples[(engine, n)])]
                for n in COUNTS for engine in ENGINES]
        parts.append(_md(["producers: engine x processes", "events/s, round by round"], rows))
    return "\n\n".join(parts)


def markdown(info: dict[str, str], settings: dict[str, str], e: E2E | None, p: Producers | None,
             sizes: Sizes, rounds: int, load: Load, elapsed: float, argv: list[str], quick: bool) -> str:
    import psycopg

    others = load.others_cpus
    out = [
        "# PostgreSQL beside SQLite",
        "",
        f"Generated by `python benchmarks/postgres.py {' '.join(argv)}`".rstrip() + " — do not edit by hand; "
        "re-run to refresh. How the rounds run and how to read the tables: "
        "[README.md](README.md#postgresql-postgrespy).",
        "",
    ]
    if quick:
        out += ["**Quick run: small sizes, figures not to quote.**", ""]
    out += [
        (f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}; "
        f"psycopg {psycopg.__version__}; filesystem {info['filesystem']}."),
        "",
        f"**Date:** {info['date']}. Total run time {elapsed:.0f} s, {rounds} interleaved rounds per case.",
        "",
        f"**Load:** 1-minute load average {load.samples[0][0]:.2f} at the start, up to {load.max1:.2f} during "
        f"the run, on {os.cpu_count()} CPUs (this run, its server and its producer processes included)"
        + ("" if others is None else f"; other processes kept {others:.2f} CPUs busy on average") + ".",
        "",
        "**Server:** PostgreSQL " + settings["server_version"] + ", a private server started by this script "
        "(`initdb` into a temporary directory on the same filesystem as the SQLite files), local, reached over "
        "a Unix socket only (no TCP), on the same machine as the clients: the server's backends and the "
        "benchmark's processes share its CPUs. Settings (`SHOW`): "
        + ", ".join(f"`{k}` = {v}" for k, v in settings.items() if k != "server_version")
        + ". The store raises nothing: `synchronous_commit` stays on for every commit except those the "
        "library makes with `durable=False` (the relay's accepted mark, lease claims). SQLite: WAL, "
        "`synchronous=FULL`, as the library opens its files.",
        "",
    ]
    if e is not None:
        out += [
            "## End to end",
            "",
            (f"{sizes.e2e} events per side per round unbatched, {sizes.batched} batched; the four unbatched sides "
            f"(two engines x two consumer modes) interleaved in blocks of {sizes.block} events, the two batched "
            f"sides in blocks of {sizes.batched_block} batches. Events/s is the median over rounds (spread: "
            "smallest..largest round); us/event likewise. Client CPU is this process's CPU time: for SQLite it "
            "includes the database engine's work, for PostgreSQL it does not (the server's backends do it). The "
            "ratio is the median of the per-round ratios."),
            "",
            e2e_table(e),
            "",
        ]
    if p is not None:
        out += [
            "## Concurrent producer processes, one outbox",
            "",
            (f"Each process opens its own `Producer` on the same outbox (one SQLite file; one PostgreSQL schema), "
            f"waits for the others, then advances its own new flows (`reserved`, `confirmed`, `released`, one "
            f"commit each) for {sizes.window:g} s. One consumer is registered, so every advance also writes a "
            "delivery row. Events/s is all processes' events over the time from the first start to the last "
            "finish, median over rounds (spread: smallest..largest round); \"vs 1 process\" is the median of the "
            "per-round factors, each against the 1-process run of the same round and engine. Fairness: the "
            "fewest events of one process divided by the most (1.00: even). Busy: `DatabaseBusy` raised to a "
            "producer over all rounds (retried with the same event id). Counts and engines are rotated from "
            "round to round; every measurement uses a fresh outbox, and after each one the outbox is checked "
            "to hold exactly the events the processes committed, each with its delivery row."),
            "",
            producers_table(p),
            "",
        ]
    out += ["## Rounds", "", rounds_md(e, p), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 3 rounds")
    parser.add_argument("--only", action="append", choices=("e2e", "producers"), help="run only this part")
    parser.add_argument("--rounds", type=int, metavar="N", help="interleaved rounds (default 5, quick 3)")
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS-postgres.md")
    parser.add_argument("--tmp", metavar="DIR", help="where the SQLite files go (default: system temp)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    sizes = Sizes.quick() if args.quick else Sizes()
    selected = args.only or ["e2e", "producers"]

    def log(line: str) -> None:
        print(line, flush=True)

    tmp = tempfile.mkdtemp(prefix="reliable-flow-pgbench-", dir=args.tmp)
    started = time.perf_counter()
    load = Load()
    info = machine(tmp)
    server = Server()
    try:
        server.start()
        settings = server.settings()
        log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
        log("server: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        e = p = None
        if "e2e" in selected:
            log("e2e: SQLite vs PostgreSQL, two-step / receive-and-apply / batched")
            e = run_e2e(server, sizes, rounds, tmp, log, load)
            log(e2e_table(e))
        if "producers" in selected:
            log(f"producers: {', '.join(map(str, COUNTS))} processes on one outbox, {sizes.window:g} s each")
            p = run_producers(server, sizes, rounds, tmp, log, load)
            log(producers_table(p))
        load.sample()
        elapsed = time.perf_counter() - started
        log(f"total {elapsed:.0f} s")
        if args.write_results:
            with open(RESULTS, "w", encoding="utf-8") as f:
                f.write(markdown(info, settings, e, p, sizes, rounds, load, elapsed,
                                 argv if argv is not None else sys.argv[1:], args.quick))
            log(f"wrote {RESULTS}")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
