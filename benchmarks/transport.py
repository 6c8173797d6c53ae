"""Events/s over the Redis transport beside in-process relay, at batch 1, 10 and 100.

    python benchmarks/transport.py                  # 1,000 events per side, 3 rounds (a minute or two)
    python benchmarks/transport.py --quick          # smoke run: 200 events, 1 round (figures not to quote)
    python benchmarks/transport.py --events 5000 --rounds 5
    python benchmarks/transport.py --write-results  # also write benchmarks/RESULTS-transport.md

What a producer on one host and a SQLite consumer on another get from
``reliable_flow.transport.redis``: events sent by a relay in this process,
through a ``RedisReceiver``, a private ``redis-server`` and a ``Bridge`` in
**another process** (``python -m reliable_flow bridge CONSUMER --redis URL
--name NAME``, receive-and-apply: each event is stored and applied in the
inbox commit), answered and marked in the producer file.  Three sides, the
same events (``common.make_events``: the reservation protocol, a new flow
every three events, random hex ids), fresh SQLite files for each side:

* **in-process**: ``relay`` / ``relay_batch`` straight to
  ``consumer.applying()`` in this process (what ``Worker`` does with a
  local consumer): the floor the transport is compared with;
* **Redis, Unix socket**: the server's Unix socket (``unix:///...``);
* **Redis, TCP 127.0.0.1**: the same server over loopback TCP
  (``redis://127.0.0.1:PORT/0``), what a second host adds minus the wire.

For each batch size (1: ``relay``, one request per event; 10 and 100:
``relay_batch(limit=...)``, one request of that many events) and each round,
the sides get fresh files and fresh bridges; an untimed warm-up flow of
three events goes through each side first (it also waits until the bridge
has announced its consumer).  The events are then advanced into the three
producers a block of ``--block`` events at a time (untimed, one
``producer.batch()`` commit per block), and each block is relayed side after
side, the order rotated every block, so a machine whose fsync latency swings
treats every side alike; a side's time is the sum of its blocks.  The
relay's own default: no lease (``policy=None``), on every side.

One redis-server (the Debian package's, started by ``tests/redis_server.py``
in a temporary directory: Unix socket and 127.0.0.1, ``save ""``,
``appendonly no``) serves both Redis sides, each under its own consumer
name; it is stopped at the end, also on Ctrl-C or an error.

Every side is checked after its run, on reopened files: every event
committed, accepted and applied exactly once, in seq order, every
projection at its flow's last seq, nothing pending in the inbox; and for
the Redis sides, from the bridge's final counts (``bridge: stopped: {...}``
on its standard error), every request answered, every event answered
``accepted`` exactly once, nothing expired, malformed or reclaimed, and no
answer ignored by the receiver.  A lost or doubled event exits 3.

Reported: events/s per side and batch size (the median over rounds), the
per-round figures, and the transport / in-process ratio (the median of the
per-round ratios).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from common import Event, machine, make_events
from reliable_flow import Consumer, Producer, relay, relay_batch
from reliable_flow.reservation import RESERVATION

RESULTS = os.path.join(HERE, "RESULTS-transport.md")
BATCHES = (1, 10, 100)
SIDES = ("local", "unix", "tcp")
LABEL = {"local": "in-process", "unix": "Redis, Unix socket", "tcp": "Redis, TCP 127.0.0.1"}
NAME = "bench"
ANNOUNCE_TIMEOUT = 60.0


class Lost(Exception):
    """An event was lost, doubled or answered something unexpected."""


def log(line: str = "") -> None:
    print(line, flush=True)


@dataclass
class Figures:
    """One side at one batch size: wall seconds per round for ``events`` events."""

    seconds: list[float] = field(default_factory=list)
    events: int = 0

    @property
    def rates(self) -> list[float]:
        return [self.events / s for s in self.seconds]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


# -- the sides ----------------------------------------------------------------------------------


def _expect(what: str, status: object, wanted: str, applied: bool, event_id: object) -> None:
    if status != wanted or not applied:
        raise Lost(f"{what} {event_id} answered {status!r} (applied={applied}), expected {wanted!r}, applied")


class Side:
    """A producer file, and a receiver for one consumer (in this process or behind a bridge)."""

    def __init__(self, kind: str, where: str, url: str | None) -> None:
        self.kind = kind
        self.where = where
        self.url = url
        self.name = f"{NAME}-{kind}-{os.path.basename(where)}"  # fresh keys in Redis too
        self.producer = Producer(os.path.join(where, "producer.db"), RESERVATION)
        self.consumer: Consumer | None = None
        self.bridge: subprocess.Popen[bytes] | None = None
        self.receiver: Any = None
        self.stats: dict[str, Any] = {}
        if kind == "local":
            self.consumer = Consumer(self.consumer_path, RESERVATION, name=self.name)
            self.receiver = self.consumer.applying()
        else:
            assert url is not None
            from reliable_flow.transport.redis import RedisReceiver

            with open(self.bridge_log, "wb") as err:
                self.bridge = subprocess.Popen(
                    [sys.executable, "-m", "reliable_flow", "bridge", self.consumer_path, "--redis", url,
                     "--name", self.name, "--report-every", "0"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    start_new_session=True)  # a Ctrl-C in the terminal reaches this script, which stops it
            self.receiver = RedisReceiver(url, self.name)

    @property
    def consumer_path(self) -> str:
        return os.path.join(self.where, "consumer.db")

    @property
    def bridge_log(self) -> str:
        return os.path.join(self.where, "bridge.log")

    def announced(self) -> None:
        """Wait until the bridge has announced its consumer (or exited)."""
        if self.bridge is None:
            return
        client = self.receiver._client  # the receiver's own connection: the same server, the same URL
        key = f"rf:{{{self.name}}}:consumer"
        deadline = time.monotonic() + ANNOUNCE_TIMEOUT
        while not client.hget(key, "uid"):
            if self.bridge.poll() is not None:
                raise RuntimeError(f"the bridge exited ({self.bridge.returncode}):\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bridge did not announce {self.name!r} within {ANNOUNCE_TIMEOUT:g} s")
            time.sleep(0.02)

    def advance(self, events: Sequence[Event]) -> None:
        with self.producer.batch() as b:
            results = [b.advance(e.event_id, e.flow_id, expected_seq=e.seq - 1, kind=e.kind, payload=e.payload)
                       for e in events]
        for e, r in zip(events, results):
            if r.status != "committed":
                raise Lost(f"advance {e.event_id} answered {r.status!r}")

    def send(self, count: int, batch: int) -> None:
        """Relay ``count`` due events, ``batch`` per call; each must be accepted and applied."""
        producer, receiver = self.producer, self.receiver
        if batch == 1:
            for _ in range(count):
                r = relay(producer, receiver)
                _expect("relay", r.status, "accepted", r.applied, r.event_id)
            return
        sent = 0
        while sent < count:
            got = relay_batch(producer, receiver, limit=min(batch, count - sent))
            if not got.results:
                raise Lost(f"relay_batch answered idle with {count - sent} events still due")
            for r in got.results:
                _expect("relay_batch", r.status, "accepted", r.applied, r.event_id)
            sent += len(got.results)

    def close(self) -> None:
        """Close the files; stop the bridge (SIGTERM) and keep its final counts."""
        with contextlib.suppress(Exception):
            self.producer.close()
        if self.consumer is not None:
            self.consumer.close()
        if self.bridge is None:
            return
        ignored = getattr(self.receiver, "ignored", 0)
        with contextlib.suppress(Exception):
            self.receiver.close()
        if self.bridge.poll() is None:
            self.bridge.send_signal(signal.SIGTERM)
            try:
                self.bridge.wait(30)
            except subprocess.TimeoutExpired:
                self.bridge.kill()
                self.bridge.wait(30)
        text = self._log_tail(100_000)
        for line in text.splitlines():
            if line.startswith("bridge: stopped: "):
                self.stats = json.loads(line[len("bridge: stopped: "):])
        self.stats["receiver_ignored"] = ignored
        self.stats["exit"] = self.bridge.returncode

    def _log_tail(self, size: int = 3000) -> str:
        try:
            with open(self.bridge_log, encoding="utf-8", errors="replace") as f:
                return f.read()[-size:]
        except OSError:
            return ""


def check(side: Side, events: Sequence[Event]) -> None:
    """Every event committed, accepted and applied exactly once, in seq order; nothing pending;
    the bridge answered every request, each event accepted once, nothing refused or expired."""
    flows: dict[str, list[str]] = {}
    for e in events:
        flows.setdefault(e.flow_id, []).append(e.event_id)
    with (
        Producer(os.path.join(side.where, "producer.db"), RESERVATION) as producer,
        Consumer(side.consumer_path, RESERVATION) as consumer,
    ):
        if len(consumer.flows()) != len(flows):
            raise Lost(f"{side.kind}: {len(consumer.flows())} flows applied, expected {len(flows)}")
        for flow_id, ids in flows.items():
            outbox = producer.outbox(flow_id)
            if [o.event_id for o in outbox] != ids or not all(o.accepted for o in outbox):
                raise Lost(f"{side.kind}: flow {flow_id}: outbox {[(o.event_id, o.accepted) for o in outbox]}, "
                           f"expected {ids} accepted")
            applied = [a.event_id for a in consumer.applied(flow_id)]
            if applied != ids:
                raise Lost(f"{side.kind}: flow {flow_id}: applied {applied}, expected {ids} once each, in order")
            projection = consumer.projection(flow_id) or {}
            if projection.get("last_seq") != len(ids):
                raise Lost(f"{side.kind}: flow {flow_id}: projection {projection}, expected last_seq {len(ids)}")
            pending = [i.event_id for i in consumer.inbox(flow_id) if str(i.state) != "applied"]
            if pending:
                raise Lost(f"{side.kind}: flow {flow_id}: inbox rows not applied: {pending}")
    if side.bridge is None:
        return
    s = side.stats
    wanted = {"accepted": len(events)}
    problems = []
    if s.get("exit") != 0:
        problems.append(f"exit code {s.get('exit')}")
    if s.get("received") != wanted:
        problems.append(f"received {s.get('received')}, expected {wanted}")
    if s.get("applied") != len(events):
        problems.append(f"applied {s.get('applied')}, expected {len(events)}")
    if s.get("requests") != s.get("answered"):
        problems.append(f"{s.get('requests')} requests, {s.get('answered')} answered")
    for key in ("expired", "malformed", "reclaimed", "errors", "receiver_ignored"):
        if s.get(key):
            problems.append(f"{key} {s.get(key)}")
    if problems:
        raise Lost(f"{side.kind}: the bridge's counts: " + "; ".join(problems) + f" ({s})")


# -- the measurement ------------------------------------------------------------------------------


def measure(n: int, rounds: int, block: int, seed: int, tmp: str, urls: dict[str, str],
            batches: Sequence[int]) -> dict[int, dict[str, Figures]]:
    figures = {b: {name: Figures(events=n) for name in SIDES} for b in batches}
    for r in range(rounds):
        rng = random.Random(seed + r)
        warm = make_events(3, rng)  # one flow, untimed: opens the files, waits for the bridge
        events = make_events(n, rng)  # the same events for every side and batch size
        for bi, batch in enumerate(batches):
            sides: dict[str, Side] = {}
            seconds = dict.fromkeys(SIDES, 0.0)
            try:
                for name in SIDES:
                    sides[name] = Side(name, tempfile.mkdtemp(prefix=f"{name}-", dir=tmp), urls.get(name))
                for side in sides.values():
                    side.announced()
                    side.advance(warm)
                    side.send(len(warm), batch)
                gc.collect()
                for i, start in enumerate(range(0, n, block)):
                    chunk = events[start:start + block]
                    for side in sides.values():
                        side.advance(chunk)
                    k = (r + bi + i) % len(SIDES)
                    for name in SIDES[k:] + SIDES[:k]:
                        started = time.perf_counter()
                        sides[name].send(len(chunk), batch)
                        seconds[name] += time.perf_counter() - started
            finally:
                for side in sides.values():
                    side.close()
            for name, side in sides.items():
                check(side, [*warm, *events])
                shutil.rmtree(side.where, ignore_errors=True)
                figures[batch][name].seconds.append(seconds[name])
            log(f"round {r + 1} batch {batch:>3}: " + "  ".join(
                f"{LABEL[name]} {n / seconds[name]:7.0f} events/s" for name in SIDES) + "  (checked)")
    return figures


# -- the report -----------------------------------------------------------------------------------


def ratios(figures: dict[str, Figures], name: str) -> list[float]:
    return [t / loc for t, loc in zip(figures[name].rates, figures["local"].rates)]


def table(figures: dict[int, dict[str, Figures]]) -> str:
    rows = [
        ("| batch | in-process events/s | Redis Unix socket events/s | Redis TCP events/s "
         "| Unix / in-process | TCP / in-process | requests per side |"),
        "|---|---|---|---|---|---|---|",
    ]
    for batch, sides in figures.items():
        n = sides["local"].events
        how = "`relay`" if batch == 1 else f"`relay_batch(limit={batch})`"
        rows.append(
            f"| {batch} ({how}) | {sides['local'].rate:.0f} | {sides['unix'].rate:.0f} | {sides['tcp'].rate:.0f} | "
            f"{statistics.median(ratios(sides, 'unix')):.2f}x | {statistics.median(ratios(sides, 'tcp')):.2f}x | "
            f"{-(-n // batch)} |")
    return "\n".join(rows)


def per_round(figures: dict[int, dict[str, Figures]]) -> str:
    rows = ["| batch | side | events/s per round | ms per request (median) |", "|---|---|---|---|"]
    for batch, sides in figures.items():
        for name in SIDES:
            f = sides[name]
            per = " ".join(f"{x:.0f}" for x in f.rates)
            ms = statistics.median(s / -(-f.events // batch) * 1e3 for s in f.seconds)
            rows.append(f"| {batch} | {LABEL[name]} | {per} | {ms:.2f} |")
    return "\n".join(rows)


def markdown(info: dict[str, str], figures: dict[int, dict[str, Figures]], n: int, rounds: int, block: int,
             quick: bool, elapsed: float, command: str) -> str:
    out = [
        "# Over the Redis transport vs in-process relay",
        "",
        (f"Generated by `{command}` — do not edit by hand; re-run to refresh. What is measured: the docstring of "
         "[transport.py](transport.py) and [README.md](README.md#over-the-redis-transport-transportpy)."),
        "",
        (f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}; "
         f"{info['redis']}; filesystem {info['filesystem']}."),
        "",
        (f"**Date:** {info['date']}. Total run time {elapsed:.0f} s{' (quick: figures not to quote)' if quick else ''}. "
         f"Load: {info['load']}."),
        "",
        (f"{n} events per side, batch size and round, relayed from a producer in this process: **in-process** "
         "to `consumer.applying()` in the same process; **Redis** through a `RedisReceiver`, a private "
         "redis-server (its Unix socket, or TCP on 127.0.0.1) and `reliable-flow bridge` in another process "
         "(receive-and-apply), answered and marked. Fresh SQLite files for every side, batch size and round "
         f"(WAL, `synchronous=FULL`); {rounds} rounds; the events advanced untimed and relayed in blocks of "
         f"{block}, the sides' order rotated every block. Every event checked: committed, accepted and applied "
         "exactly once, in seq order; every request answered, nothing expired, refused or taken over."),
        "",
        table(figures),
        "",
        "Events/s: the median over rounds; the ratios: the median of the per-round ratios. Per round:",
        "",
        per_round(figures),
        "",
    ]
    return "\n".join(out)


# -- running ----------------------------------------------------------------------------------------


def _redis_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                             check=False).stdout.split()
        version = next((w.split("=", 1)[1] for w in out if w.startswith("v=")), "?")
    except (OSError, subprocess.SubprocessError):
        version = "?"
    import redis

    return f"redis-server {version}, redis-py {redis.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, help="events per side, batch size and round (default 1000; --quick 200)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 events, 1 round")
    parser.add_argument("--block", type=int, default=200, help="events per interleaved block (default 200)")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--tmp", metavar="DIR", help="where the files go (default: system temp)")
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS-transport.md")
    args = parser.parse_args(argv)
    n = args.events or (200 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 3)
    if n < 1 or rounds < 1 or args.block < 1:
        parser.error("--events, --rounds and --block must be >= 1")
    try:
        import reliable_flow.transport.redis  # noqa: F401
        from redis_server import MISSING, RedisServer, free_port
    except ImportError as exc:
        log(f"the Redis transport is not importable (pip install -e '.[redis]'): {exc}")
        return 2
    if MISSING is not None:
        log(MISSING)
        return 2

    tmp = tempfile.mkdtemp(prefix="reliable-flow-transport-", dir=args.tmp)
    started = time.perf_counter()
    info = machine(tmp)
    load_before = os.getloadavg()
    server = RedisServer(bind="127.0.0.1", port=free_port())
    info["redis"] = _redis_version(server.binary)
    log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    log(f"{n} events per side, batch sizes {', '.join(map(str, BATCHES))}, {rounds} rounds, blocks of {args.block}")
    stop: Callable[[], None] = server.destroy
    try:
        server.start()
        urls = {"unix": server.unix_url(), "tcp": server.tcp_url()}
        log(f"redis-server at {urls['unix']} and {urls['tcp']}")
        figures = measure(n, rounds, args.block, args.seed, tmp, urls, BATCHES)
    except Lost as exc:
        log(f"FAILED: {exc}")
        return 3
    finally:
        stop()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    info["load"] = (f"{load_before[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
                    f"(1-minute load average, {os.cpu_count()} logical CPUs)")
    log("")
    log(table(figures))
    log("")
    log(per_round(figures))
    log("")
    log(f"total {elapsed:.0f} s; load {info['load']}")
    if args.write_results:
        command = "python benchmarks/transport.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(RESULTS, "w", encoding="utf-8") as f:
            f.write(markdown(info, figures, n, rounds, args.block, args.quick, elapsed, command.strip()))
        log(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
