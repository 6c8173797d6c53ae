"""The event loop's lag while events flow: the sync API called from the loop
against ``reliable_flow.aio``.

    python benchmarks/aio_lag.py                  # 2,000 events per side, 3 rounds, each also pinned (two minutes)
    python benchmarks/aio_lag.py --quick          # smoke run: 200 events, 1 round (figures not to quote)
    python benchmarks/aio_lag.py --events 5000 --rounds 5
    python benchmarks/aio_lag.py --one-cpu        # only the run with the process pinned to one CPU
    python benchmarks/aio_lag.py --no-one-cpu     # only the normal run (half the time)
    python benchmarks/aio_lag.py --write-results  # also write benchmarks/RESULTS-aio.md

What an asyncio application feels is the loop's *lag*: how late a task that
wants to run wakes up.  A ticker task sleeps 1 ms in a loop
(``await asyncio.sleep(0.001)``) and records, for every tick, the lag =
actual wake time - expected wake time (``time.perf_counter()``), while on
the same loop ``--events`` events (default 2,000; the reservation protocol,
a new flow every three events, random hex ids, built before the clock
starts) flow one at a time through ``advance`` -> ``relay`` ->
``apply_next``:

* **sync API on the loop**: ``reliable_flow.Producer`` / ``Consumer`` /
  ``relay`` called directly from a coroutine, with ``await
  asyncio.sleep(0)`` after each event (what agent code that calls a sync
  library between its own awaits does): the loop is blocked for each
  event's three transactions.
* **reliable_flow.aio**: ``await producer.advance(...)``, ``await
  relay(producer, consumer)``, ``await consumer.apply_next(flow)`` with
  ``AsyncProducer`` / ``AsyncConsumer``: the transactions run on each
  object's own thread while the loop awaits.

Each side gets fresh SQLite files (WAL, ``synchronous=FULL``, the library's
defaults; the consumer in its default two-step mode), the same events, and
an untimed warm-up flow of three events.  Within a round the two sides run
interleaved in blocks of ``--block`` events (default 50; the order swapped
every block), as ``run.py`` does, so a machine whose fsync latency swings
from one second to the next treats both alike; a side's time is the sum of
its blocks, and the ticker's lags are kept only while one of its blocks
runs.  A third row, **idle loop**, is the ticker alone for one second: the
floor of the measurement (the loop's timer granularity, and the machine's
noise).  Lag percentiles pool every tick of every round; events/s is the
median over rounds (default 3), and the async/sync ratio the median of the
per-round ratios.

Each run also times one hop by itself: a read of ``flow`` for an unknown
id (a few microseconds of SQLite), 500 times through ``Producer`` called
on the loop and 500 times awaited through ``AsyncProducer``, interleaved
in blocks of 50: the difference, per call, is what one trip loop ->
store thread -> loop costs.

**One CPU.**  By default every round runs twice: as above, and in a child
process pinned to one CPU (``--one-cpu``: the child calls
``os.sched_setaffinity(0, {cpu})`` first thing, before any thread is
started -- on Linux the call binds only the calling thread, and the store
threads inherit its mask -- so the loop and every store thread share that
CPU), the two alternating round by round (which goes first swapped every
round) so that a machine whose load drifts treats both alike.  The pinned
run is the diagnosis, not a way to meet the target: an awaited call wakes
a store thread, and its answer wakes the loop; on a small VM the woken
thread often runs on the other CPU, where the wake-up is slow and the call
itself runs slower (its caches cold there).  With both on one CPU each
hand-off is a switch on the same CPU.  The report says how each face's
events/s moved when pinned: an async face that gains shows that cost.
Linux only (elsewhere the pinned run is left out, with the reason).

Every side is checked after its run, on reopened files: each event
``committed``, ``accepted`` and ``applied`` exactly once, in seq order,
every projection at its flow's last seq, nothing pending.  A lost or
doubled event exits 3 (in the pinned child too).

Targets (issue 21): p99 lag under 5 ms with ``reliable_flow.aio``; its
events/s at least 0.8x the sync face's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import Event, machine, make_events
from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION

RESULTS = os.path.join(HERE, "RESULTS-aio.md")
TICK = 0.001
HOP_CALLS = 500
HOP_BLOCK = 50
LAG_TARGET_MS = 5.0
RATIO_TARGET = 0.8
SIDES = ("sync", "aio")
LABEL = {"idle": "idle loop (ticker only)", "sync": "sync API on the loop", "aio": "reliable_flow.aio"}


class Lost(Exception):
    """An event was lost, doubled or answered something unexpected."""


def log(line: str = "") -> None:
    print(line, flush=True)


@dataclass
class Side:
    name: str
    lags: list[float] = field(default_factory=list)  # seconds, every tick of every round
    seconds: list[float] = field(default_factory=list)  # pipeline wall time per round
    events: int = 0  # per round

    @property
    def rates(self) -> list[float]:
        return [self.events / s for s in self.seconds]

    @property
    def rate(self) -> float | None:
        return statistics.median(self.rates) if self.seconds else None

    def pct(self, p: float) -> float:
        """The p-th percentile of the lags, in ms (nearest rank)."""
        ordered = sorted(self.lags)
        rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        return ordered[rank] * 1e3

    @property
    def max_ms(self) -> float:
        return max(self.lags) * 1e3


@dataclass
class Run:
    """A measurement (one round or several): the sides, and the hop per round
    (microseconds per read of ``flow``, "sync" / "aio")."""

    sides: dict[str, Side]
    hops: list[dict[str, float]]
    cpu: int | None = None  # the CPU the process was pinned to, None: not pinned

    @property
    def hop_us(self) -> dict[str, float]:
        """Median over rounds of each face's microseconds per read."""
        return {name: statistics.median(h[name] for h in self.hops) for name in SIDES}

    def to_json(self) -> str:
        return json.dumps({"sides": {k: asdict(v) for k, v in self.sides.items()}, "hops": self.hops,
                           "cpu": self.cpu})

    @classmethod
    def from_json(cls, text: str) -> Run:
        data = json.loads(text)
        return cls({k: Side(**v) for k, v in data["sides"].items()}, data["hops"], data["cpu"])

    @classmethod
    def merge(cls, runs: Sequence[Run]) -> Run:
        """Rounds measured apart (interleaved with the other run's), as one run."""
        sides = {name: Side(name) for name in runs[0].sides}
        for run in runs:
            for name, side in run.sides.items():
                sides[name].lags.extend(side.lags)
                sides[name].seconds.extend(side.seconds)
                sides[name].events = side.events
        return cls(sides, [h for run in runs for h in run.hops], runs[0].cpu)


# -- the ticker -------------------------------------------------------------------------------


class Ticker:
    """Sleeps ``TICK`` in a loop; records actual - expected wake while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.lags: list[float] = []
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            expected = time.perf_counter() + TICK
            await asyncio.sleep(TICK)
            lag = time.perf_counter() - expected
            if self.recording:
                self.lags.append(max(0.0, lag))

    def stop(self) -> None:
        self._stop = True


async def timed(ticker: Ticker, pipeline: Callable[[], Awaitable[None]]) -> tuple[float, list[float]]:
    """Run ``pipeline`` with the ticker recording; its wall time and the lags seen."""
    ticker.lags = []
    await asyncio.sleep(2 * TICK)  # the ticker is waiting on its timer
    ticker.recording = True
    started = time.perf_counter()
    await pipeline()
    seconds = time.perf_counter() - started
    ticker.recording = False
    return seconds, ticker.lags


# -- the two faces ----------------------------------------------------------------------------


def _expect(what: str, status: object, wanted: str, event: Event) -> None:
    if status != wanted:
        raise Lost(f"{what} {event.event_id} answered {status!r}, expected {wanted!r}")


class SyncFace:
    """``Producer`` / ``Consumer`` / ``relay`` called directly from a coroutine."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.producer = Producer(os.path.join(where, "producer.db"), RESERVATION)
        self.consumer = Consumer(os.path.join(where, "consumer.db"), RESERVATION)

    async def flow(self, events: Sequence[Event], pause: bool = True) -> None:
        producer, consumer = self.producer, self.consumer
        for e in events:
            r = producer.advance(e.event_id, e.flow_id, expected_seq=e.seq - 1, kind=e.kind, payload=e.payload)
            _expect("advance", r.status, "committed", e)
            _expect("relay", relay(producer, consumer).status, "accepted", e)
            _expect("apply_next", consumer.apply_next(e.flow_id).status, "applied", e)
            if pause:
                await asyncio.sleep(0)  # the agent's own awaits between events

    async def close(self) -> None:
        self.producer.close()
        self.consumer.close()


class AioFace:
    """``AsyncProducer`` / ``AsyncConsumer`` / ``reliable_flow.aio.relay``, awaited."""

    def __init__(self, where: str) -> None:
        from reliable_flow.aio import AsyncConsumer, AsyncProducer
        from reliable_flow.aio import relay as arelay

        self.where = where
        self.relay = arelay
        self.producer = AsyncProducer(os.path.join(where, "producer.db"), RESERVATION)
        self.consumer = AsyncConsumer(os.path.join(where, "consumer.db"), RESERVATION)

    async def flow(self, events: Sequence[Event], pause: bool = True) -> None:
        producer, consumer, arelay = self.producer, self.consumer, self.relay
        for e in events:
            r = await producer.advance(e.event_id, e.flow_id, expected_seq=e.seq - 1, kind=e.kind,
                                       payload=e.payload)
            _expect("advance", r.status, "committed", e)
            _expect("relay", (await arelay(producer, consumer)).status, "accepted", e)
            _expect("apply_next", (await consumer.apply_next(e.flow_id)).status, "applied", e)

    async def close(self) -> None:
        await self.producer.close()
        await self.consumer.close()


FACES = {"sync": SyncFace, "aio": AioFace}


def check(where: str, events: Sequence[Event]) -> None:
    """Every event committed, accepted and applied exactly once, in seq order; nothing pending."""
    flows: dict[str, list[str]] = {}
    for e in events:
        flows.setdefault(e.flow_id, []).append(e.event_id)
    with (
        Producer(os.path.join(where, "producer.db"), RESERVATION) as producer,
        Consumer(os.path.join(where, "consumer.db"), RESERVATION) as consumer,
    ):
        if len(consumer.flows()) != len(flows):
            raise Lost(f"{len(consumer.flows())} flows applied, expected {len(flows)}")
        for flow_id, ids in flows.items():
            outbox = producer.outbox(flow_id)
            if [o.event_id for o in outbox] != ids or not all(o.accepted for o in outbox):
                raise Lost(f"flow {flow_id}: outbox {[(o.event_id, o.accepted) for o in outbox]}, expected {ids}")
            applied = [a.event_id for a in consumer.applied(flow_id)]
            if applied != ids:
                raise Lost(f"flow {flow_id}: applied {applied}, expected {ids} once each, in order")
            projection = consumer.projection(flow_id) or {}
            if projection.get("last_seq") != len(ids):
                raise Lost(f"flow {flow_id}: projection {projection}, expected last_seq {len(ids)}")
            pending = [i.event_id for i in consumer.inbox(flow_id) if str(i.state) != "applied"]
            if pending:
                raise Lost(f"flow {flow_id}: inbox rows not applied: {pending}")


async def hop(tmp: str) -> dict[str, float]:
    """Microseconds per read of ``flow`` (an unknown id): the sync face on the
    loop against the async face, interleaved in blocks; the median of the blocks."""
    from reliable_flow.aio import AsyncProducer

    where = tempfile.mkdtemp(prefix="hop-", dir=tmp)
    sync = Producer(os.path.join(where, "sync.db"), RESERVATION)
    aio = AsyncProducer(os.path.join(where, "aio.db"), RESERVATION)
    per: dict[str, list[float]] = {"sync": [], "aio": []}
    try:
        for _ in range(HOP_BLOCK):  # warm: the statement caches
            sync.flow("none")
            await aio.flow("none")
        for i in range(HOP_CALLS // HOP_BLOCK):
            for name in (("sync", "aio") if i % 2 == 0 else ("aio", "sync")):
                started = time.perf_counter()
                if name == "sync":
                    for _ in range(HOP_BLOCK):
                        sync.flow("none")
                else:
                    for _ in range(HOP_BLOCK):
                        await aio.flow("none")
                per[name].append((time.perf_counter() - started) / HOP_BLOCK * 1e6)
    finally:
        sync.close()
        await aio.close()
        shutil.rmtree(where, ignore_errors=True)
    return {name: statistics.median(values) for name, values in per.items()}


async def measure(n: int, rounds: int, block: int, seed: int, tmp: str, first: int = 0) -> Run:
    """Rounds ``first`` .. ``first + rounds - 1`` (round r's events from seed + r)."""
    sides = {name: Side(name) for name in ("idle", *SIDES)}
    ticker = Ticker()
    ticking = asyncio.create_task(ticker.run())
    try:
        ticker.lags = []
        ticker.recording = True
        await asyncio.sleep(1.0)
        ticker.recording = False
        sides["idle"].lags = list(ticker.lags)
        for r in range(first, first + rounds):
            rng = random.Random(seed + r)
            warm = make_events(3, rng)  # one flow, untimed: opens the files, fills the statement caches
            events = make_events(n, rng)  # the same events for both sides (each has its own files)
            faces = {name: FACES[name](tempfile.mkdtemp(prefix=f"{name}-", dir=tmp)) for name in SIDES}
            seconds = dict.fromkeys(SIDES, 0.0)
            lags: dict[str, list[float]] = {name: [] for name in SIDES}
            try:
                for face in faces.values():
                    await face.flow(warm, pause=False)
                gc.collect()
                for i, start in enumerate(range(0, n, block)):
                    chunk = events[start:start + block]
                    for name in (SIDES if (r + i) % 2 == 0 else SIDES[::-1]):
                        s, seen = await timed(ticker, lambda f=faces[name], c=chunk: f.flow(c))
                        seconds[name] += s
                        lags[name].extend(seen)
            finally:
                for face in faces.values():
                    await face.close()
            for name, face in faces.items():
                check(face.where, [*warm, *events])
                shutil.rmtree(face.where, ignore_errors=True)
                side = sides[name]
                side.events = n
                side.seconds.append(seconds[name])
                side.lags.extend(lags[name])
                ordered = sorted(x * 1e3 for x in lags[name])
                log(f"round {r + 1} {LABEL[name]:<22} {seconds[name]:6.2f} s  {n / seconds[name]:7.0f} events/s  "
                    f"{len(ordered):5} ticks  lag p50 {ordered[len(ordered) // 2] if ordered else 0:6.2f} ms  "
                    f"max {ordered[-1] if ordered else 0:7.2f} ms  (checked)")
    finally:
        ticker.stop()
        await ticking
    hop_us = await hop(tmp)
    log(f"hop: a read of flow {hop_us['sync']:.0f} us sync on the loop, {hop_us['aio']:.0f} us awaited")
    return Run(sides, [hop_us])


# -- the report -------------------------------------------------------------------------------


def ratios(sides: dict[str, Side]) -> list[float]:
    return [a / s for a, s in zip(sides["aio"].rates, sides["sync"].rates)]


def ratio(sides: dict[str, Side]) -> float:
    return statistics.median(ratios(sides))


def table(sides: dict[str, Side], rounds: int) -> str:
    rows = [
        "| side | events x rounds | events/s (median) | events/s per round | ticks | lag p50 ms | lag p99 ms | lag max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("idle", *SIDES):
        s = sides[name]
        if not s.lags:
            continue
        if name == "idle":
            rows.append(f"| {LABEL[name]} | — | — | — | {len(s.lags)} | {s.pct(50):.2f} | {s.pct(99):.2f} | "
                        f"{s.max_ms:.2f} |")
            continue
        per = " ".join(f"{x:.0f}" for x in s.rates)
        rows.append(f"| {LABEL[name]} | {s.events} x {rounds} | {s.rate:.0f} | {per} | {len(s.lags)} | "
                    f"{s.pct(50):.2f} | {s.pct(99):.2f} | {s.max_ms:.2f} |")
    return "\n".join(rows)


def targets(run: Run, pinned: Run | None) -> tuple[str, list[str]]:
    r = ratios(run.sides)
    median = ratio(run.sides)
    p99 = run.sides["aio"].pct(99)
    lines = [
        "| target | measured | met |",
        "|---|---|---|",
        f"| p99 lag with `reliable_flow.aio` < {LAG_TARGET_MS:g} ms | {p99:.2f} ms | {'yes' if p99 < LAG_TARGET_MS else '**no**'} |",
        (f"| events/s `reliable_flow.aio` / sync API >= {RATIO_TARGET:g}x | {median:.2f}x "
        f"({min(r):.2f}..{max(r):.2f} over rounds) | {'yes' if median >= RATIO_TARGET else '**no**'} |"),
    ]
    if pinned is not None:
        pr = ratios(pinned.sides)
        lines.append(f"| (the diagnosis, not a target) the same ratio, the process pinned to CPU {pinned.cpu} | "
                     f"{ratio(pinned.sides):.2f}x ({min(pr):.2f}..{max(pr):.2f} over rounds) | — |")
    missed = []
    if p99 >= LAG_TARGET_MS:
        missed.append(f"p99 lag {p99:.2f} ms (target < {LAG_TARGET_MS:g} ms)")
    if median < RATIO_TARGET:
        missed.append(f"events/s ratio {median:.2f}x (target >= {RATIO_TARGET:g}x)")
    return "\n".join(lines), missed


def hops(runs: Sequence[Run]) -> str:
    rows = [
        "| run | events/s aio / sync | a read of `flow`, sync API on the loop | the same, awaited | one hop (the difference) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        where = "normal (unpinned)" if run.cpu is None else f"the process pinned to CPU {run.cpu}"
        rows.append(f"| {where} | {ratio(run.sides):.2f}x | {run.hop_us['sync']:.0f} µs | {run.hop_us['aio']:.0f} µs | "
                    f"{run.hop_us['aio'] - run.hop_us['sync']:.0f} µs |")
    return "\n".join(rows)


def gap_us(sides: dict[str, Side]) -> float:
    """Microseconds per event the async face takes more than the sync face (medians of events/s)."""
    aio, sync = sides["aio"].rate, sides["sync"].rate
    assert aio is not None and sync is not None
    return 1e6 / aio - 1e6 / sync


def cause(run: Run, pinned: Run | None, skipped: str | None) -> str:
    """Where the events/s ratio comes from, from this run's figures."""
    unpinned = ratio(run.sides)
    met = "met" if unpinned >= RATIO_TARGET else "missed"
    hop_us = run.hop_us["aio"] - run.hop_us["sync"]
    text = f"**Events/s ratio:** {unpinned:.2f}x unpinned (target {RATIO_TARGET:g}x: {met})"
    if pinned is None:
        text += f"; the run pinned to one CPU was left out ({skipped})."
    else:
        text += f", {ratio(pinned.sides):.2f}x with the whole process on one CPU."
    text += (f" **Where the time goes:** per event the async face takes {gap_us(run.sides):.0f} µs more than the "
             "sync face. Four hand-offs between threads (three loop -> store thread -> loop, and in the relay the "
             f"producer's thread -> the consumer's and back) at about {hop_us:.0f} µs each for a bare read "
             f"(\"One hop\" below) make about {4 * hop_us:.0f} µs of it; the rest is the calls themselves "
             "running slower on a thread that has just been woken (caches cold, often on the other CPU).")
    if pinned is None:
        return text
    p, u = pinned.sides, run.sides
    sync_x = p["sync"].rate / u["sync"].rate  # type: ignore[operator]
    aio_x = p["aio"].rate / u["aio"].rate  # type: ignore[operator]
    text += (f" With the whole process on one CPU (its rounds interleaved with these) the gap is "
             f"{gap_us(p):.0f} µs per event: the sync face ran at {sync_x:.2f}x its unpinned events/s, the async "
             f"face at {aio_x:.2f}x.")
    if aio_x >= 1.05:
        text += (" The async face gains from having its threads on one CPU (a hand-off is then a switch on the "
                 "same CPU, caches warm): that part of its cost is waking a thread on the other CPU.")
    else:
        text += " The async face did not gain from one CPU on this run"
        text += ("; the ratio moved because the sync face lost." if sync_x <= 0.95 else
                 ": its cost is the hand-offs themselves, on one CPU as on two.")
    return text


def markdown(info: dict[str, str], run: Run, pinned: Run | None, skipped: str | None, n: int, rounds: int,
             block: int, quick: bool, elapsed: float, command: str) -> str:
    target_table, missed = targets(run, pinned)
    out = [
        "# The event loop's lag: sync API on the loop vs reliable_flow.aio",
        "",
        (f"Generated by `{command}` — do not edit by hand; re-run to refresh. What is measured: the docstring of "
        "[aio_lag.py](aio_lag.py) and [README.md](README.md#the-event-loops-lag-aio_lagpy)."),
        "",
        (f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}; "
        f"filesystem {info['filesystem']}."),
        "",
        (f"**Date:** {info['date']}. Total run time {elapsed:.0f} s{' (quick: figures not to quote)' if quick else ''}. "
        f"Load: {info['load']}; the idle-loop row is this machine's floor for the lag."),
        "",
        (f"{n} events per side and round, one at a time through `advance` -> `relay` -> `apply_next`, on fresh "
        f"SQLite files; {rounds} rounds, the two sides interleaved in blocks of {block} events (order swapped every "
        "block). A ticker task on the same loop sleeps "
        f"{TICK * 1e3:g} ms in a loop; lag = actual - expected wake, every tick of the timed window, pooled over "
        "rounds. Every event checked: committed, accepted and applied exactly once, in seq order."),
        "",
        table(run.sides, rounds),
        "",
        target_table,
        "",
    ]
    if missed:
        out += ["Missed: " + "; ".join(missed) + ".", ""]
    out += [cause(run, pinned, skipped), ""]
    if pinned is not None:
        out += [
            f"## The same, the process pinned to CPU {pinned.cpu}",
            "",
            ("`--one-cpu`: a child process that calls `os.sched_setaffinity(0, {cpu})` before it starts any "
            "thread, so the loop and every store thread share one CPU. The diagnosis, not a setting the library "
            "makes."),
            "",
            table(pinned.sides, rounds),
            "",
        ]
    out += [
        "## One hop",
        "",
        (f"A read of `flow` (an unknown id), {HOP_CALLS} calls per face, interleaved in blocks of {HOP_BLOCK}; "
        "median microseconds per call. The awaited call's extra time is one trip loop -> store thread -> loop."),
        "",
        hops([run] if pinned is None else [run, pinned]),
        "",
    ]
    return "\n".join(out)


# -- running -----------------------------------------------------------------------------------


def pin(cpu: int) -> int:
    """Bind this process to one CPU (-1: the first it may use); before any thread starts."""
    if cpu < 0:
        cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # on Linux: this thread only; the threads it starts inherit the mask
    return cpu


def pinned_child(args: argparse.Namespace, n: int, r: int, tmp: str) -> tuple[Run | None, str | None, int]:
    """Round ``r`` in a child pinned to one CPU: (its run, why not, exit code)."""
    out = os.path.join(tmp, f"one-cpu-{r}.json")
    command = [sys.executable, os.path.abspath(__file__), "--one-cpu", "--events", str(n), "--rounds", "1",
               "--first", str(r), "--block", str(args.block), "--seed", str(args.seed), "--tmp", tmp,
               "--json", out]
    log("")
    log("the same, in a child process pinned to one CPU: " + " ".join(command[1:]))
    code = subprocess.call(command)
    if code != 0:
        return None, f"the pinned child exited {code}", code
    with open(out, encoding="utf-8") as f:
        return Run.from_json(f.read()), None, 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, help="events per side and round (default 2000; --quick 200)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 events, 1 round")
    parser.add_argument("--block", type=int, default=50, help="events per interleaved block (default 50)")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--tmp", metavar="DIR", help="where the files go (default: system temp)")
    parser.add_argument("--one-cpu", nargs="?", type=int, const=-1, metavar="CPU",
                        help="only the run with the process pinned to one CPU (default: the first it may use)")
    parser.add_argument("--no-one-cpu", action="store_true", help="leave out the run pinned to one CPU")
    parser.add_argument("--json", metavar="FILE", help=argparse.SUPPRESS)  # the pinned child's figures
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)  # the pinned child's round
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS-aio.md")
    args = parser.parse_args(argv)
    cpu: int | None = None
    if args.one_cpu is not None:
        if not hasattr(os, "sched_setaffinity"):
            parser.error("--one-cpu needs os.sched_setaffinity (Linux)")
        if args.write_results or args.no_one_cpu:
            parser.error("--one-cpu runs the pinned measurement alone: no --write-results, no --no-one-cpu")
        cpu = pin(args.one_cpu)  # first thing: no thread of this process is running yet
    n = args.events or (200 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    if n < 1 or rounds < 1 or args.block < 1:
        parser.error("--events, --rounds and --block must be >= 1")
    try:
        import reliable_flow.aio  # noqa: F401
    except ImportError as exc:
        log(f"reliable_flow.aio is not importable: {exc}")
        return 2

    tmp = tempfile.mkdtemp(prefix="reliable-flow-aio-", dir=args.tmp)
    started = time.perf_counter()
    info = machine(tmp)
    load_before = os.getloadavg()
    log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    log(f"{n} events per side, {rounds} rounds, ticker every {TICK * 1e3:g} ms"
        + ("" if cpu is None else f"; the process pinned to CPU {cpu}"))
    pinned: Run | None = None
    skipped: str | None = None
    if args.no_one_cpu:
        skipped = "--no-one-cpu"
    elif not hasattr(os, "sched_setaffinity"):
        skipped = "os.sched_setaffinity is Linux only"
    try:
        if cpu is not None or skipped is not None:
            run = asyncio.run(measure(n, rounds, args.block, args.seed, tmp, args.first))
        else:  # round by round, the pinned child's rounds between the normal ones (first one, then the other)
            runs, children = [], []
            for r in range(rounds):
                for which in (("normal", "pinned") if r % 2 == 0 else ("pinned", "normal")):
                    if which == "normal":
                        runs.append(asyncio.run(measure(n, 1, args.block, args.seed, tmp, r)))
                    elif skipped is None:
                        child, skipped, code = pinned_child(args, n, r, tmp)
                        if code == 3:
                            return 3
                        if child is not None:
                            children.append(child)
            run = Run.merge(runs)
            pinned = Run.merge(children) if skipped is None else None
        run.cpu = cpu
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(run.to_json())
    except Lost as exc:
        log(f"FAILED: {exc}")
        return 3
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    info["load"] = (f"{load_before[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
                    f"(1-minute load average, {os.cpu_count()} logical CPUs)")
    target_table, _ = targets(run, pinned)
    log("")
    log(table(run.sides, rounds))
    log("")
    if pinned is not None:
        log(f"pinned to CPU {pinned.cpu}:")
        log(table(pinned.sides, rounds))
        log("")
    log(target_table)
    log("")
    log(hops([run] if pinned is None else [run, pinned]))
    log("")
    if cpu is None:
        log(cause(run, pinned, skipped))
        log("")
    log(f"total {elapsed:.0f} s; load {info['load']}")
    if args.write_results:
        command = "python benchmarks/aio_lag.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(RESULTS, "w", encoding="utf-8") as f:
            f.write(markdown(info, run, pinned, skipped, n, rounds, args.block, args.quick, elapsed, command.strip()))
        log(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
