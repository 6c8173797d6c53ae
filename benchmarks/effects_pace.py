"""Effects at an agent's pace: calls/s of the effect executor at concurrency
1, 4, 16, 64 (sync and async calls), beside DBOS Transact's queue, and a
worker's delivery latency while slow calls are in flight.

    python benchmarks/effects_pace.py                  # full run (minutes: concurrency 1 is 400 x 0.2 s)
    python benchmarks/effects_pace.py --quick          # smoke run (40 effects x 0.05 s; figures not to quote)
    python benchmarks/effects_pace.py --no-peer        # without DBOS
    python benchmarks/effects_pace.py --write-results  # also write benchmarks/RESULTS-effects.md

Throughput: for each concurrency N and each kind (sync: ``time.sleep``;
async: ``await asyncio.sleep``), fresh SQLite producer and consumer files;
``--effects`` flows are advanced, relayed and applied (one ``call`` effect
scheduled per flow) before the clock starts; then
``EffectExecutor(consumer, concurrency=N).run_once(limit=effects)`` is timed
until every call has ended and its outcome is recorded.  Afterwards every
effect must be ``succeeded`` and the function must have been called exactly
once per effect (counted in the function), else the script exits 3.
The ideal is min(N, effects) / sleep calls/s; target >= 0.8x up to N = 16,
>= 0.5x above.

Peer: the same workload on DBOS Transact's queue with a SQLite system
database, in a benchmark-only virtual environment (``benchmarks/.venv-dbos``,
made here with ``python -m venv`` and ``pip install dbos`` when missing;
never an extra of the package), one ``peer_dbos.py`` process per
measurement.  If it cannot be installed or run, its rows say why.

Latency: one Worker (``run()`` in its own thread, ``idle_sleep``
``--idle-sleep``) over a producer and a consumer whose handler schedules a
slow effect for ``asked`` flows; an executor with concurrency 16.  The main
thread advances ``ping`` events one at a time (through its own Producer) and
polls its own Consumer's projection every 0.5 ms: latency = advance
returned -> projection visible.  Rounds alternate three conditions: no call
in flight; 16 sync calls in flight; 16 async calls in flight (held until the
block ends, checked at every event).  Target: p99 with calls in flight within
100 ms of p99 with none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import machine  # noqa: E402
from reliable_flow import (  # noqa: E402
    ApplyContext,
    Consumer,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Producer,
    Worker,
    relay_batch,
)
from reliable_flow.protocol import Protocol, by_kind, exact, text  # noqa: E402

RESULTS = os.path.join(HERE, "RESULTS-effects.md")
PEER_SCRIPT = os.path.join(HERE, "peer_dbos.py")
PEER_VENV = os.path.join(HERE, ".venv-dbos")
KINDS = ("sync", "async")
LATENCY_TARGET_MS = 100.0

ASK = Protocol(
    name="ask",
    initial="new",
    transitions={"new": ["asked", "ping"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "ping": exact({"q": text()})})},
)


def log(line: str = "") -> None:
    print(line, flush=True)


def target_of(n: int) -> float:
    return 0.8 if n <= 16 else 0.5


# -- throughput: the library ------------------------------------------------------------------


@dataclass
class Run:
    side: str
    kind: str
    concurrency: int
    effects: int
    sleep: float
    seconds: float | None = None
    cpu: float | None = None
    most_in_flight: int = 0
    missing: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return None if self.seconds is None else self.effects / self.seconds

    @property
    def ideal(self) -> float:
        return min(self.concurrency, self.effects) / self.sleep

    @property
    def ratio(self) -> float | None:
        return None if self.rate is None else self.rate / self.ideal


class Tally:
    """Calls per key and calls in flight, thread-safe."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.now = self.most = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self, key: str) -> None:
        with self.lock:
            self.now -= 1
            self.calls[key] += 1


def _schedule(producer: Producer, consumer: Consumer, count: int, kind: str = "asked", prefix: str = "F") -> list[str]:
    """Advance ``count`` new flows in one batch, relay and apply them all."""
    flows = [f"{prefix}{i}" for i in range(count)]
    with producer.batch() as b:
        for flow in flows:
            b.advance(f"{flow}-1", flow, expected_seq=0, kind=kind, payload={"q": flow})
    accepted = 0
    while True:
        results = relay_batch(producer, consumer, limit=100, register=True).results
        accepted += sum(1 for r in results if str(r.status) in ("accepted", "RelayStatus.ACCEPTED"))
        if not results or all(str(r.status) in ("idle", "RelayStatus.IDLE") for r in results):
            break
    consumer.process_all(batch_size=100)
    for flow in flows:
        if consumer.projection(flow) is None:
            raise SystemExit(f"setup: flow {flow} was not applied")
    return flows


def library_run(kind: str, n: int, effects: int, sleep: float, tmp: str) -> Run:
    where = tempfile.mkdtemp(prefix=f"lib-{kind}-{n}-", dir=tmp)
    tally = Tally()
    if kind == "sync":
        def call(c: EffectCall) -> str:
            tally.enter()
            time.sleep(sleep)
            tally.leave(c.key)
            return "done"
    else:
        async def call(c: EffectCall) -> str:  # type: ignore[misc]
            tally.enter()
            await asyncio.sleep(sleep)
            tally.leave(c.key)
            return "done"

    registry = EffectRegistry()
    registry.register("call", call)

    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("call", {"q": ctx.event.payload["q"]}, key=f"k-{ctx.event.flow_id}")

    with (
        Producer(os.path.join(where, "producer.db"), ASK) as producer,
        Consumer(os.path.join(where, "consumer.db"), ASK, name="tools", handlers=[handler],
                 effects=registry) as consumer,
    ):
        flows = _schedule(producer, consumer, effects)
        executor = EffectExecutor(consumer, concurrency=n)
        cpu0, t0 = time.process_time(), time.perf_counter()
        taken = executor.run_once(limit=effects).work
        while taken < effects:  # never expected: run_once(limit) takes all that are due
            more = executor.run_once(limit=effects - taken).work
            if more == 0:
                break
            taken += more
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        states = Counter(str(consumer.scheduled_effect(f"k-{f}").state) for f in flows)  # type: ignore[union-attr]
        problems = []
        if states != Counter({"succeeded": effects}):
            problems.append(f"effect states {dict(states)}")
        if sum(tally.calls.values()) != effects or len(tally.calls) != effects:
            doubled = sum(1 for v in tally.calls.values() if v > 1)
            problems.append(f"{sum(tally.calls.values())} calls for {effects} effects "
                            f"({len(tally.calls)} distinct, {doubled} called more than once)")
        if executor.in_flight:
            problems.append(f"{executor.in_flight} calls still in flight")
        if problems:
            raise Lost(f"library {kind} concurrency {n}: " + "; ".join(problems))
    shutil.rmtree(where, ignore_errors=True)
    return Run("reliable_flow", kind, n, effects, sleep, seconds, cpu, tally.most,
               extra={"taken": taken, "outcomes": dict(executor.stats.outcomes)})


class Lost(Exception):
    """Work lost or done twice: the benchmark fails."""


# -- throughput: the peer ---------------------------------------------------------------------


def peer_python(quiet_log: list[str]) -> tuple[str | None, str]:
    """The benchmark-only venv's python with ``dbos`` installed (made if missing), or None and why."""
    py = os.path.join(PEER_VENV, "bin", "python")
    if not os.path.exists(py):
        log(f"peer: creating {PEER_VENV} (python -m venv; pip install dbos) ...")
        made = subprocess.run([sys.executable, "-m", "venv", PEER_VENV], capture_output=True, text=True)
        if made.returncode != 0:
            return None, f"python -m venv failed: {made.stderr.strip()[-300:]}"
    check = subprocess.run([py, "-c", "import dbos, importlib.metadata as m; print(m.version('dbos'))"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        inst = subprocess.run([py, "-m", "pip", "install", "-q", "dbos"], capture_output=True, text=True)
        if inst.returncode != 0:
            return None, "pip install dbos failed: " + (inst.stderr.strip().splitlines() or ["?"])[-1][:300]
        check = subprocess.run([py, "-c", "import dbos, importlib.metadata as m; print(m.version('dbos'))"],
                               capture_output=True, text=True)
        if check.returncode != 0:
            return None, "import dbos failed: " + (check.stderr.strip().splitlines() or ["?"])[-1][:300]
    quiet_log.append(check.stdout.strip())
    return py, check.stdout.strip()


def peer_run(py: str, kind: str, n: int, effects: int, sleep: float, tmp: str, polling: float) -> Run:
    where = tempfile.mkdtemp(prefix=f"dbos-{kind}-{n}-", dir=tmp)
    run = Run("DBOS", kind, n, effects, sleep)
    timeout = 120 + effects * sleep * 3 / min(n, effects) + effects * 0.5
    try:
        done = subprocess.run([py, PEER_SCRIPT, "--effects", str(effects), "--sleep", str(sleep),
                               "--concurrency", str(n), "--kind", kind, "--dir", where,
                               "--polling", str(polling)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        run.missing = f"timed out after {timeout:.0f} s"
        return run
    finally:
        pass
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        run.missing = f"peer exited {done.returncode}: {tail}"
        return run
    result = json.loads(lines[-1])
    if not result.get("ok"):
        raise Lost(f"DBOS {kind} concurrency {n}: {result}")
    run.seconds = float(result["seconds"])
    run.extra = result
    shutil.rmtree(where, ignore_errors=True)
    return run


# -- latency ----------------------------------------------------------------------------------


@dataclass
class Latency:
    condition: str
    samples: list[float] = field(default_factory=list)  # seconds
    in_flight_min: int | None = None
    in_flight_max: int | None = None

    def pct(self, p: float) -> float:
        values = sorted(self.samples)
        if not values:
            return float("nan")
        k = min(len(values) - 1, max(0, int(round(p / 100 * len(values) + 0.5)) - 1))
        return values[k] * 1000


class WorkerThread(threading.Thread):
    """Opens its own producer, consumer, executor and worker (a store belongs
    to the thread that opened it) and runs the worker until stopped."""

    def __init__(self, where: str, registry: EffectRegistry, idle_sleep: float, concurrency: int) -> None:
        super().__init__(name="bench-worker", daemon=True)
        self.where, self.registry, self.idle_sleep, self.concurrency = where, registry, idle_sleep, concurrency
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.worker: Worker | None = None
        self.executor: EffectExecutor | None = None

    def run(self) -> None:
        try:
            with (
                Producer(os.path.join(self.where, "producer.db"), ASK) as producer,
                Consumer(os.path.join(self.where, "consumer.db"), ASK, name="tools", handlers=[latency_handler],
                         effects=self.registry) as consumer,
            ):
                self.executor = EffectExecutor(consumer, concurrency=self.concurrency)
                self.worker = Worker(producer, [consumer], executors=[self.executor], idle_sleep=self.idle_sleep,
                                     register=True)
                self.ready.set()
                self.worker.run(handle_signals=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
            self.ready.set()


def latency_handler(ctx: ApplyContext) -> None:
    if ctx.event.kind == "asked":
        ctx.schedule(f"slow_{ctx.event.payload['q'].split('-')[0]}", {"q": ctx.event.flow_id},
                     key=f"k-{ctx.event.flow_id}")


def latency_run(events: int, rounds: int, idle_sleep: float, calls: int, hold_cap: float, tmp: str) -> dict[str, Latency]:
    where = tempfile.mkdtemp(prefix="latency-", dir=tmp)
    release = threading.Event()
    tally = Tally()

    def slow_sync(c: EffectCall) -> str:
        tally.enter()
        release.wait(hold_cap)
        tally.leave(c.key)
        return "done"

    async def slow_async(c: EffectCall) -> str:
        tally.enter()
        deadline = time.monotonic() + hold_cap
        while not release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tally.leave(c.key)
        return "done"

    registry = EffectRegistry()
    registry.register("slow_sync", slow_sync)
    registry.register("slow_async", slow_async)
    producer = Producer(os.path.join(where, "producer.db"), ASK)
    thread = WorkerThread(where, registry, idle_sleep, calls)
    thread.start()
    thread.ready.wait(30)
    if thread.error is not None:
        raise thread.error
    conditions = ["no call in flight", f"{calls} sync calls in flight", f"{calls} async calls in flight"]
    out = {c: Latency(c) for c in conditions}
    rng = random.Random(7)
    counter = [0]
    reader: Consumer | None = None

    def visible(flow: str, timeout: float = 30.0) -> float:
        assert reader is not None
        deadline = time.perf_counter() + timeout
        while reader.projection(flow) is None:
            if time.perf_counter() > deadline:
                raise Lost(f"latency: {flow} not applied within {timeout} s (worker: {thread.error})")
            time.sleep(0.0005)
        return time.perf_counter()

    def ping(record: Latency | None) -> None:
        counter[0] += 1
        flow = f"P{counter[0]}"
        time.sleep(rng.uniform(0, 2 * idle_sleep))  # land anywhere in the worker's idle sleep
        result = producer.advance(f"{flow}-1", flow, expected_seq=0, kind="ping", payload={"q": flow})
        t0 = time.perf_counter()
        if str(result.status) not in ("committed", "AdvanceStatus.COMMITTED"):
            raise Lost(f"latency: advance {flow} -> {result.status}")
        t1 = visible(flow)
        if record is not None:
            record.samples.append(t1 - t0)
            with tally.lock:
                now = tally.now
            record.in_flight_min = now if record.in_flight_min is None else min(record.in_flight_min, now)
            record.in_flight_max = now if record.in_flight_max is None else max(record.in_flight_max, now)

    try:
        # Warm-up: the worker registers the consumer and creates its file; then our reader opens it.
        counter[0] += 1
        producer.advance("W-1", "W", expected_seq=0, kind="ping", payload={"q": "W"})
        deadline = time.perf_counter() + 30
        while reader is None:
            try:
                candidate = Consumer(os.path.join(where, "consumer.db"), ASK, name="tools",
                                     handlers=[latency_handler], effects=registry)
            except Exception:  # noqa: BLE001 - the worker has not created it yet
                if time.perf_counter() > deadline:
                    raise
                time.sleep(0.05)
                continue
            reader = candidate
        visible("W")
        for _ in range(10):
            ping(None)
        per_block = max(1, events // rounds)
        batch = 0
        for r in range(rounds):
            order = conditions[r % 3:] + conditions[: r % 3]
            for cond in order:
                held: list[str] = []
                if cond != conditions[0]:
                    which = "sync" if "sync" in cond and "async" not in cond else "async"
                    batch += 1
                    release.clear()
                    with producer.batch() as b:
                        for i in range(calls):
                            flow = f"{which}-{batch}-{i}"
                            b.advance(f"{flow}-1", flow, expected_seq=0, kind="asked", payload={"q": flow})
                            held.append(flow)
                    deadline = time.perf_counter() + 30
                    while True:
                        with tally.lock:
                            if tally.now >= calls:
                                break
                        if time.perf_counter() > deadline:
                            raise Lost(f"latency: only {tally.now} of {calls} calls in flight after 30 s")
                        time.sleep(0.005)
                for _ in range(per_block):
                    ping(out[cond])
                if held:
                    release.set()
                    deadline = time.perf_counter() + 60
                    while True:
                        states = [reader.scheduled_effect(f"k-{f}") for f in held]
                        if all(s is not None and str(s.state) == "succeeded" for s in states):
                            break
                        if time.perf_counter() > deadline:
                            raise Lost(f"latency: slow calls not all succeeded: "
                                       f"{Counter(str(s.state) if s else None for s in states)}")
                        time.sleep(0.01)
        if sum(tally.calls.values()) != len(tally.calls) or len(tally.calls) != batch * calls:
            raise Lost(f"latency: {sum(tally.calls.values())} slow calls for {batch * calls} effects")
    finally:
        release.set()
        if thread.worker is not None:
            thread.worker.stop()
        thread.join(60)
        if reader is not None:
            reader.close()
        producer.close()
        shutil.rmtree(where, ignore_errors=True)
    if thread.error is not None:
        raise thread.error
    return out


# -- report -----------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ",.1f") -> str:
    return "—" if value is None else format(value, spec)


def throughput_table(runs: list[Run]) -> str:
    rows = ["| side | kind | concurrency | effects x sleep | seconds | calls/s | ideal calls/s | ratio | target | met | "
            "most in flight | CPU s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if r.missing is not None:
            rows.append(f"| {r.side} | {r.kind} | {r.concurrency} | {r.effects} x {r.sleep:g} s | — | missing: "
                        f"{r.missing} | {r.ideal:,.1f} | — | — | — | — | — |")
            continue
        met = "—" if r.side != "reliable_flow" else ("yes" if (r.ratio or 0) >= target_of(r.concurrency) else "**no**")
        target = f">= {target_of(r.concurrency):.1f}x" if r.side == "reliable_flow" else "(peer)"
        rows.append(f"| {r.side} | {r.kind} | {r.concurrency} | {r.effects} x {r.sleep:g} s | {fmt(r.seconds, '.2f')} | "
                    f"{fmt(r.rate)} | {r.ideal:,.1f} | {fmt(r.ratio, '.2f')}x | {target} | {met} | "
                    f"{r.most_in_flight if r.side == 'reliable_flow' else '—'} | {fmt(r.cpu, '.2f')} |")
    return "\n".join(rows)


def latency_table(lat: dict[str, Latency], idle_sleep: float) -> str:
    base = next(iter(lat.values()))
    rows = ["| condition | events | p50 ms | p99 ms | max ms | calls in flight (min..max) | p99 - p99 with none | "
            f"target (<= {LATENCY_TARGET_MS:.0f} ms) |",
            "|---|---|---|---|---|---|---|---|"]
    for i, (cond, l) in enumerate(lat.items()):
        diff = l.pct(99) - base.pct(99)
        met = "—" if i == 0 else ("yes" if diff <= LATENCY_TARGET_MS else "**no**")
        rows.append(f"| {cond} | {len(l.samples)} | {l.pct(50):.1f} | {l.pct(99):.1f} | {max(l.samples) * 1000:.1f} | "
                    f"{l.in_flight_min}..{l.in_flight_max} | {'—' if i == 0 else f'{diff:+.1f} ms'} | {met} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effects", type=int, help="effects per run (default 400; --quick 40)")
    parser.add_argument("--sleep", type=float, help="seconds each call sleeps (default 0.2; --quick 0.05)")
    parser.add_argument("--concurrency", default="1,4,16,64", help="comma-separated (default 1,4,16,64)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 40 effects x 0.05 s, 60 latency events")
    parser.add_argument("--no-peer", action="store_true", help="skip DBOS")
    parser.add_argument("--no-latency", action="store_true", help="skip the worker latency part")
    parser.add_argument("--peer-polling", type=float, default=0.05,
                        help="DBOS queue polling_interval_sec (default 0.05; DBOS's own default is 1.0)")
    parser.add_argument("--latency-events", type=int, help="events per condition (default 200; --quick 60)")
    parser.add_argument("--latency-rounds", type=int, default=4, help="rounds over the three conditions (default 4)")
    parser.add_argument("--idle-sleep", type=float, default=0.01, help="the worker's idle_sleep (default 0.01 s)")
    parser.add_argument("--tmp", metavar="DIR", help="where the files go (default: system temp)")
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS-effects.md")
    args = parser.parse_args(argv)
    effects = args.effects or (40 if args.quick else 400)
    sleep = args.sleep or (0.05 if args.quick else 0.2)
    counts = [int(x) for x in args.concurrency.split(",") if x.strip()]
    lat_events = args.latency_events or (60 if args.quick else 200)

    tmp = tempfile.mkdtemp(prefix="reliable-flow-effects-", dir=args.tmp)
    started = time.perf_counter()
    info = machine(tmp)
    log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    runs: list[Run] = []
    lat: dict[str, Latency] = {}
    peer_note = ""
    try:
        py: str | None = None
        if not args.no_peer:
            py, peer_note = peer_python([])
            log(f"peer: {'DBOS Transact ' + peer_note if py else 'missing: ' + peer_note}")
        for n in counts:
            for kind in KINDS:
                r = library_run(kind, n, effects, sleep, tmp)
                runs.append(r)
                log(f"reliable_flow {kind:5} concurrency {n:3}: {r.seconds:7.2f} s, {r.rate:8.1f} calls/s, "
                    f"{r.ratio:.2f}x of {r.ideal:.1f} (most in flight {r.most_in_flight}, CPU {r.cpu:.2f} s)")
                if args.no_peer:
                    continue
                if py is None:
                    p = Run("DBOS", kind, n, effects, sleep, missing=peer_note)
                else:
                    p = peer_run(py, kind, n, effects, sleep, tmp, args.peer_polling)
                runs.append(p)
                if p.missing:
                    log(f"DBOS          {kind:5} concurrency {n:3}: missing ({p.missing})")
                else:
                    log(f"DBOS          {kind:5} concurrency {n:3}: {p.seconds:7.2f} s, {p.rate:8.1f} calls/s, "
                        f"{p.ratio:.2f}x of {p.ideal:.1f} (enqueue, untimed: {p.extra['enqueue_seconds']:.2f} s)")
        if not args.no_latency:
            log(f"latency: {lat_events} events per condition, {args.latency_rounds} rounds, "
                f"worker idle_sleep {args.idle_sleep:g} s, 16 slow calls held in flight")
            lat = latency_run(lat_events, args.latency_rounds, args.idle_sleep, 16, 120.0, tmp)
    except Lost as exc:
        log(f"FAILED: {exc}")
        shutil.rmtree(tmp, ignore_errors=True)
        return 3
    elapsed = time.perf_counter() - started
    shutil.rmtree(tmp, ignore_errors=True)
    log("")
    log(throughput_table(runs))
    if lat:
        log("")
        log(latency_table(lat, args.idle_sleep))
    dbos_info = next((r.extra for r in runs if r.side == "DBOS" and r.missing is None), None)
    log("")
    log(f"total {elapsed:.0f} s")
    lib_missed = [r for r in runs if r.side == "reliable_flow" and (r.ratio or 0) < target_of(r.concurrency)]
    base = next(iter(lat.values())) if lat else None
    lat_missed = [c for i, (c, l) in enumerate(lat.items()) if i and base and l.pct(99) - base.pct(99) > LATENCY_TARGET_MS]
    if args.write_results:
        command = "python benchmarks/effects_pace.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(RESULTS, "w", encoding="utf-8") as f:
            f.write(markdown(info, runs, lat, args, effects, sleep, lat_events, dbos_info, peer_note, py_ok(runs),
                             elapsed, command.strip(), lib_missed, lat_missed))
        log(f"wrote {RESULTS}")
    return 0


def py_ok(runs: list[Run]) -> bool:
    return any(r.side == "DBOS" and r.missing is None for r in runs)


def markdown(info: dict[str, str], runs: list[Run], lat: dict[str, Latency], args: argparse.Namespace, effects: int,
             sleep: float, lat_events: int, dbos_info: dict[str, Any] | None, peer_note: str, peer_ran: bool,
             elapsed: float, command: str, lib_missed: list[Run], lat_missed: list[str]) -> str:
    out = [
        "# Effects at an agent's pace",
        "",
        f"Generated by `{command}` — do not edit by hand; re-run to refresh. What is measured: the docstring of "
        "[effects_pace.py](effects_pace.py) and [README.md](README.md#effects-at-an-agents-pace-effects_pacepy).",
        "",
        f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}; "
        f"filesystem {info['filesystem']}.",
        "",
        f"**Date:** {info['date']}. Total run time {elapsed:.0f} s{' (quick: figures not to quote)' if args.quick else ''}.",
        "",
        "## Calls per second",
        "",
        f"{effects} effects per run, one per flow, each call sleeping {sleep:g} s (sync: `time.sleep`; async: "
        "`await asyncio.sleep`), scheduled before the clock starts; the library side is "
        "`EffectExecutor(consumer, concurrency=N).run_once(limit=effects)` on fresh SQLite files, timed until every "
        "outcome is recorded. Ideal = min(N, effects) / sleep. One run per row; every run checked: all effects "
        "`succeeded`, the function called exactly once per effect.",
        "",
    ]
    if dbos_info is not None:
        out += [f"Peer: {dbos_info['peer']} in a benchmark-only virtual environment, `DBOS.register_queue(name, "
                f"concurrency=N, polling_interval_sec={dbos_info['polling_interval_sec']:g})` (DBOS's default polling "
                "is 1.0 s), SQLite system database (journal_mode "
                f"{dbos_info['sqlite']['journal_mode']}, synchronous {dbos_info['sqlite']['synchronous']}), one "
                "workflow of one step per effect, enqueued before the clock starts (see peer_dbos.py); timed from "
                "the dequeuing process's launch to every workflow `SUCCESS` in the system database.", ""]
    elif not args.no_peer:
        out += [f"Peer: missing — {peer_note}.", ""]
    out += [throughput_table(runs), ""]
    if lib_missed:
        out += ["Missed: " + "; ".join(f"{r.kind} concurrency {r.concurrency} ({r.ratio:.2f}x, target "
                                       f"{target_of(r.concurrency):.1f}x)" for r in lib_missed) + ".", ""]
    if lat:
        out += [
            "## Worker delivery latency while slow calls run",
            "",
            f"One `Worker` (`run()` in its own thread, `idle_sleep={args.idle_sleep:g}`), executor concurrency 16; "
            f"{lat_events} `ping` events per condition, advanced one at a time from the main thread after a random "
            f"pause of 0..{2 * args.idle_sleep:g} s; latency = `advance` returned -> the consumer's projection "
            f"visible (polled every 0.5 ms). {args.latency_rounds} rounds, conditions rotated; in the loaded "
            "conditions 16 calls are held in flight for the whole block (the column shows how many were in flight "
            "at each event). Target: p99 within 100 ms of p99 with no call in flight.",
            "",
            latency_table(lat, args.idle_sleep),
            "",
        ]
        if lat_missed:
            out += ["Missed: " + ", ".join(lat_missed) + ".", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
