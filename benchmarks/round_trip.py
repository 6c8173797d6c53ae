"""Round-trip latency of a tool call, across two hosts beside one host, at 10 calls/s.

    python benchmarks/round_trip.py                   # 30 s per side and idle sleep, 0.5 / 0.1 / 0.02 s (~4 min)
    python benchmarks/round_trip.py --quick           # smoke run: 8 s per side, idle sleep 0.5 only
    python benchmarks/round_trip.py --idle-sleep 0.5,0.05 --duration 60 --rate 20
    python benchmarks/round_trip.py --write-results   # also write benchmarks/RESULTS-round-trip.md

One round trip (issue 30): the agent on host A advances a step
(``asked``) -> the step is relayed to the consumer ``tools`` and applied,
which schedules the tool call ``look_up`` -> an effect executor performs
it -> its result comes home as the flow's next step (``Feedback(kind=
"answered")``) -> the agent sees it with ``await producer.wait(flow,
after_seq=1)``.  Latency: from just before the ``advance`` to the return
of ``wait``, in the agent's process.  The agent (an ``AsyncProducer`` in
this process) starts a new flow every 1/``--rate`` seconds on a fixed
schedule (an open loop: a slow round trip does not slow the next start),
for ``--duration`` seconds, after an untimed warm-up of 3 round trips.

Two sides, each with fresh SQLite files and its own processes:

* **one host**: ``reliable-flow run --producer agent.db --consumer
  tools=tools.db --handlers ... --effects ...`` in a process of its own: a
  ``Worker`` with the local consumer, whose ``EffectExecutor`` feeds the
  result into the local producer;
* **two hosts**: ``reliable-flow run --producer agent.db --to URL --consumer
  tools --serve-as agent`` (host A's worker: relays through Redis and serves
  the producer) and ``reliable-flow bridge tools.db --redis URL --producer
  URL#agent --effects ...`` (host B: applies, performs, feeds the result
  back through Redis to the serving worker), each in a process of its own,
  with a private ``redis-server`` (the Debian package's, started by
  ``tests/redis_server.py``: Unix socket, no persistence).

``--idle-sleep`` (a list) is given to both sides' ``run`` (the bridge has
no such setting: it waits for requests up to 0.5 s per pass).  The serving
worker answers fed-back steps on its pass, so at idle a result waits up to
``--idle-sleep`` on host A.  Each (idle sleep, side) runs once, the sides'
order swapped for every idle sleep.

Also reported, from the tools' own log (the wall clock of the moment the
tool ran, same machine): the two legs, advance -> tool performed, and tool
performed -> ``wait`` returned.  Every run is checked: every flow at seq 2
with its result step ``tools:<event>:look_up:result``, every tool call
performed exactly once, no ``wait`` timed out; a lost or doubled call exits 3.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from reliable_flow import ApplyContext, EffectCall, EffectRegistry, Feedback
from reliable_flow.protocol import Protocol, by_kind, exact, text

RESULTS = os.path.join(HERE, "RESULTS-round-trip.md")
SIDES = ("one", "two")
LABEL = {"one": "one host", "two": "two hosts (Redis)"}
WAIT_TIMEOUT = 30.0
CALL_LOG = "ROUND_TRIP_CALL_LOG"

# -- what both sides run (imported by `reliable-flow run` / `bridge` as round_trip:...) ---------

PROTOCOL = Protocol(
    name="round_trip", initial="new",
    transitions={"new": ["asked"], "asked": ["answered"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "answered": exact({"a": text()})})},
)


def look_up(call: EffectCall) -> dict[str, str]:
    """The tool: answers at once, and notes when it ran (its own log)."""
    with open(os.environ[CALL_LOG], "a", encoding="utf-8") as f:
        f.write(f"{call.key} {time.time():.6f}\n")
    return {"a": call.payload["q"].upper()}


EFFECTS = EffectRegistry()
EFFECTS.register("look_up", look_up, idempotent=True, feedback=Feedback(kind="answered"))


def schedule(ctx: ApplyContext) -> None:
    if ctx.event.kind == "asked":
        ctx.schedule("look_up", {"q": ctx.event.payload["q"]})


HANDLERS = [schedule]


class Lost(Exception):
    """A round trip lost, doubled or timed out."""


def log(line: str = "") -> None:
    print(line, flush=True)


# -- one measurement ------------------------------------------------------------------------------


@dataclass
class Run:
    side: str
    idle_sleep: float
    latencies: list[float] = field(default_factory=list)  # seconds, advance -> wait returned
    to_tool: list[float] = field(default_factory=list)  # advance -> tool performed
    to_home: list[float] = field(default_factory=list)  # tool performed -> wait returned
    late_starts: float = 0.0  # the largest lag of a scheduled start (the agent's own loop)
    timed_out: int = 0  # round trips whose result did not come home within the wait's timeout
    worker: dict[str, Any] = field(default_factory=dict)  # the worker's `stopped:` counts


def _children_env(call_log: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", **{CALL_LOG: call_log})


def _start(args: list[str], log_path: str, env: dict[str, str], ready: str | None) -> subprocess.Popen[bytes]:
    """``reliable-flow ARGS`` in a process (and session) of its own, once its
    log says ``ready`` (the warm-up round trips wait for the rest)."""
    with open(log_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "reliable_flow", *args], env=env, stdin=subprocess.DEVNULL,
                                stdout=err, stderr=err, start_new_session=True)
    deadline = time.monotonic() + 60
    while ready is not None and ready not in _read(log_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{args[0]} did not start:\n{_read(log_path)[-3000:]}")
        time.sleep(0.05)
    return proc


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stopped_counts(log_path: str) -> dict[str, Any]:
    for line in reversed(_read(log_path).splitlines()):
        if "stopped:" in line:
            try:
                return dict(json.loads(line.split("stopped:", 1)[1]))
            except ValueError:
                return {}
    return {}


async def _agent(producer: Any, rate: float, duration: float, run: Run,
                 wait_timeout: float) -> dict[str, tuple[float, float]]:
    """Start a round trip every 1/rate s for duration s; by flow, the wall clock
    (epoch) just before its advance and when its wait returned."""
    times: dict[str, tuple[float, float]] = {}

    async def one(flow: str, timed: bool) -> None:
        t0, e0 = time.perf_counter(), time.time()
        result = await producer.advance(f"{flow}-1", flow, expected_seq=0, kind="asked", payload={"q": flow})
        if result.status != "committed":
            raise Lost(f"advance {flow}: {result.status} {result.reason}")
        got = await producer.wait(flow, after_seq=1, timeout=wait_timeout if timed else 120.0)
        if got is None:
            if not timed:
                raise Lost(f"warm-up {flow}: no result within 120 s")
            run.timed_out += 1  # counted, not lost: its result is owed and fed later
            return
        if timed:
            run.latencies.append(time.perf_counter() - t0)
            times[flow] = (e0, time.time())

    for i in range(3):  # warm-up: both sides announced, the statements cached
        await one(f"W{i}", False)
    loop = asyncio.get_running_loop()
    begin, tasks, n = loop.time(), [], int(rate * duration)
    for i in range(n):
        due = begin + i / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        run.late_starts = max(run.late_starts, loop.time() - due)
        tasks.append(asyncio.create_task(one(f"R{i:05d}", True)))
    await asyncio.gather(*tasks)
    return times


def measure(side: str, idle_sleep: float, rate: float, duration: float, tmp: str, url: str | None,
            wait_timeout: float) -> Run:
    from reliable_flow.aio import AsyncProducer

    where = tempfile.mkdtemp(prefix=f"{side}-", dir=tmp)
    call_log = os.path.join(where, "calls.log")
    env = _children_env(call_log)
    agent_db, tools_db = os.path.join(where, "agent.db"), os.path.join(where, "tools.db")
    app = ["--protocol", "round_trip:PROTOCOL", "--handlers", "round_trip:HANDLERS", "--effects",
           "round_trip:EFFECTS"]
    procs: list[subprocess.Popen[bytes]] = []
    worker_log = os.path.join(where, "worker.log")
    run = Run(side, idle_sleep)
    try:
        # The agent's file exists before the worker opens it (with the protocol recorded).
        asyncio.run(_create(agent_db))
        if side == "one":
            procs.append(_start(["run", "--producer", agent_db, "--consumer", f"tools={tools_db}", *app,
                                 "--concurrency", "4", "--idle-sleep", repr(idle_sleep), "--register",
                                 "--report-every", "0"], worker_log, env, None))
        else:
            assert url is not None
            procs.append(_start(["bridge", tools_db, "--name", "tools", "--redis", url, *app, "--producer",
                                 f"{url}#agent", "--concurrency", "4", "--report-every", "0"],
                                os.path.join(where, "bridge.log"), env, "serving consumer"))
            procs.append(_start(["run", "--producer", agent_db, "--to", url, "--consumer", "tools", "--serve-as",
                                 "agent", "--protocol", "round_trip:PROTOCOL", "--idle-sleep", repr(idle_sleep),
                                 "--register", "--report-every", "0"], worker_log, env, "run:"))

        async def agent() -> dict[str, tuple[float, float]]:
            async with AsyncProducer(agent_db, PROTOCOL) as producer:
                return await _agent(producer, rate, duration, run, wait_timeout)

        times = asyncio.run(agent())
    finally:
        for proc in reversed(procs):
            _stop(proc)
    run.worker = _stopped_counts(worker_log)
    _check(run, agent_db, call_log, times)
    shutil.rmtree(where, ignore_errors=True)
    return run


async def _create(path: str) -> None:
    from reliable_flow.aio import AsyncProducer

    async with AsyncProducer(path, PROTOCOL):
        pass


def _check(run: Run, agent_db: str, call_log: str, times: dict[str, tuple[float, float]]) -> None:
    """Every flow answered once by its own result step, every call performed
    once; the two legs of each round trip from the tool's log."""
    from reliable_flow import Producer

    performed: dict[str, list[float]] = {}
    for line in _read(call_log).splitlines():
        key, at = line.split()
        performed.setdefault(key, []).append(float(at))
    doubled = [k for k, v in performed.items() if len(v) != 1]
    if doubled:
        raise Lost(f"{run.side}: performed more than once: {doubled[:5]}")
    with Producer(agent_db, PROTOCOL) as producer:
        for flow in producer.flows():  # also those that timed out: never a second result
            events = [e.event_id for e in producer.outbox(flow)]
            if len(events) > 2 or events[1:] not in ([], [f"tools:{flow}-1:look_up:result"]):
                raise Lost(f"{run.side}: flow {flow} has events {events}")
        for flow, (start, home) in sorted(times.items()):
            key = f"tools:{flow}-1:look_up"
            state = producer.flow(flow) or {}
            events = [e.event_id for e in producer.outbox(flow)]
            if state.get("seq") != 2 or events != [f"{flow}-1", f"{key}:result"] or key not in performed:
                raise Lost(f"{run.side}: flow {flow} at {state}, events {events}, performed {key in performed}")
            run.to_tool.append(performed[key][0] - start)
            run.to_home.append(home - performed[key][0])


def pct(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# -- the report -------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return "timeout" if seconds == math.inf else f"{seconds * 1000:.0f}"


def _all(r: Run) -> list[float]:
    """Every round trip's latency, a timed-out one as infinite."""
    return r.latencies + [math.inf] * r.timed_out


def table(runs: list[Run]) -> str:
    rows = [("| idle sleep | side | round trips | not home in time | p50 ms | p90 ms | p99 ms | max ms "
            "| advance -> tool p50 / p99 ms | tool -> home p50 / p99 ms |"),
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        every = _all(r)
        rows.append(
            f"| {r.idle_sleep:g} s | {LABEL[r.side]} | {len(every)} | {r.timed_out} | {_ms(pct(every, 50))} "
            f"| {_ms(pct(every, 90))} | {_ms(pct(every, 99))} | {_ms(max(every))} "
            f"| {_leg(r.to_tool)} | {_leg(r.to_home)} |")
    return "\n".join(rows)


def _leg(values: list[float]) -> str:
    return f"{_ms(pct(values, 50))} / {_ms(pct(values, 99))}" if values else "-"


def workers(runs: list[Run]) -> str:
    rows = ["| idle sleep | side | the worker's `stopped:` counts (host A) |", "|---|---|---|"]
    for r in runs:
        shown = {k: v for k, v in r.worker.items() if k in ("passes", "relayed", "served", "errors", "last_error")}
        rows.append(f"| {r.idle_sleep:g} s | {LABEL[r.side]} | `{json.dumps(shown, sort_keys=True)}` |")
    return "\n".join(rows)


def markdown(info: dict[str, str], runs: list[Run], rate: float, duration: float, quick: bool, elapsed: float,
             command: str) -> str:
    return "\n".join([
        "# Round trip of a tool call: two hosts beside one host",
        "",
        (f"Generated by `{command}` — do not edit by hand; re-run to refresh. What is measured: the docstring of "
         "[round_trip.py](round_trip.py) and [README.md](README.md#round-trip-of-a-tool-call-round_trippy)."),
        "",
        (f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}; "
         f"{info['redis']}; filesystem {info['filesystem']}."),
        "",
        (f"**Date:** {info['date']}. Total run time {elapsed:.0f} s{' (quick: figures not to quote)' if quick else ''}. "
         f"Load: {info['load']}."),
        "",
        (f"{rate:g} round trips per second for {duration:g} s per side and idle sleep (an open loop, after 3 "
         "untimed ones): the agent (`AsyncProducer` in the benchmark's process) advances `asked`, the tool "
         "`look_up` runs once the step is applied, its result comes home as `answered`, and `await "
         "producer.wait(flow, after_seq=1)` returns. **One host**: `reliable-flow run` with the local consumer "
         "and its effects, feeding the local producer. **Two hosts**: `reliable-flow run --to URL --serve-as "
         "agent` (host A) and `reliable-flow bridge --producer URL#agent` (host B), a private redis-server on a "
         "Unix socket. Each in processes of their own, fresh SQLite files (WAL, `synchronous=FULL`). Every "
         "round trip checked: its result step in its flow once, the tool performed once."),
        "",
        table(runs),
        "",
        ("Latency: from just before `advance` to the return of `wait`. The legs, from the tool's own log "
         "(the wall clock when it ran): advance -> tool performed, tool performed -> `wait` returned."),
        "",
        workers(runs),
        "",
    ])


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
    parser.add_argument("--rate", type=float, default=10.0, help="round trips started per second (default 10)")
    parser.add_argument("--duration", type=float, help="seconds per side and idle sleep (default 30; --quick 8)")
    parser.add_argument("--idle-sleep", help="the workers' --idle-sleep values, comma-separated "
                                             "(default 0.5,0.1,0.02; --quick 0.5)")
    parser.add_argument("--wait-timeout", type=float, default=WAIT_TIMEOUT,
                        help=f"seconds a round trip's wait gives up after, counted as not home in time "
                             f"(default {WAIT_TIMEOUT:g})")
    parser.add_argument("--quick", action="store_true", help="smoke run (figures not to quote)")
    parser.add_argument("--tmp", metavar="DIR", help="where the files go (default: system temp)")
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS-round-trip.md")
    args = parser.parse_args(argv)
    duration = args.duration or (8.0 if args.quick else 30.0)
    try:
        sleeps = [float(v) for v in (args.idle_sleep or ("0.5" if args.quick else "0.5,0.1,0.02")).split(",")]
    except ValueError:
        parser.error(f"--idle-sleep: comma-separated seconds, got {args.idle_sleep!r}")
    if not (math.isfinite(args.rate) and args.rate > 0 and math.isfinite(duration) and duration > 0) or \
            not all(math.isfinite(v) and v >= 0 for v in sleeps):
        parser.error("--rate and --duration must be > 0, --idle-sleep values >= 0")
    try:
        import reliable_flow.transport.redis  # noqa: F401
        from redis_server import MISSING, RedisServer
    except ImportError as exc:
        log(f"the Redis transport is not importable (pip install -e '.[redis]'): {exc}")
        return 2
    if MISSING is not None:
        log(MISSING)
        return 2
    from common import machine

    tmp = tempfile.mkdtemp(prefix="reliable-flow-round-trip-", dir=args.tmp)
    started = time.perf_counter()
    info = machine(tmp)
    load_before = os.getloadavg()
    server = RedisServer()
    info["redis"] = _redis_version(server.binary)
    log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    runs: list[Run] = []
    try:
        server.start()
        for i, idle in enumerate(sleeps):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                server.command("FLUSHALL")  # a fresh name space for each run
                log(f"idle sleep {idle:g} s, {LABEL[side]}: {args.rate:g}/s for {duration:g} s ...")
                run = measure(side, idle, args.rate, duration, tmp, server.unix_url(), args.wait_timeout)
                runs.append(run)
                every = _all(run)
                log(f"  p50 {_ms(pct(every, 50))} ms, p99 {_ms(pct(every, 99))} ms, max {_ms(max(every))} ms, "
                    f"{run.timed_out} not home within {args.wait_timeout:g} s; "
                    f"worker {json.dumps(run.worker, sort_keys=True)}")
    except Lost as exc:
        log(f"FAILED: {exc}")
        return 3
    finally:
        server.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    info["load"] = (f"{load_before[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
                    f"(1-minute load average, {os.cpu_count()} logical CPUs)")
    runs.sort(key=lambda r: (-r.idle_sleep, SIDES.index(r.side)))
    log("")
    log(table(runs))
    log("")
    log(workers(runs))
    log(f"total {elapsed:.0f} s; load {info['load']}")
    if args.write_results:
        command = "python benchmarks/round_trip.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(RESULTS, "w", encoding="utf-8") as f:
            f.write(markdown(info, runs, args.rate, duration, args.quick, elapsed, command.strip()))
        log(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
