"""The Redis transport under faults (issue 22): a producer and its relay on
one side, ``reliable-flow bridge`` and a SQLite consumer on the other, Redis
in between; processes are SIGKILLed at random, ``redis-server`` too (it
restarts EMPTY: no persistence, the transport must not need it), the network
is cut and made lossy.  Afterwards everything drains and the files must show
the issue's invariants.

The processes (every one separate, started and killed by the test):

* the producer (``children/transport_producer.py advance``): commits the
  events of a few dozen flows (1-3 reservation steps each, seeded), spread
  over the faults; not killed (its outbox is the durable buffer);
* the relay worker: ``python -m reliable_flow run --to URL --consumer remote``
  (the CLI) in the same-host test; in the two-host test the child
  ``transport_producer.py worker``, a ``Worker`` over
  ``RedisReceiver(url, "remote", timeout=2)`` -- ``run --to`` has no option
  for the receiver's timeout (10 s), and with it each partition would cost
  15 s and more of the run;
* the bridge: ``python -m reliable_flow bridge CONSUMER --redis URL --name
  remote --handlers children.transport_app:HANDLERS --effects
  children.transport_app:EFFECTS --concurrency 8``: it stores and applies,
  and its executor runs the effect each applied event schedules
  (``children/transport_app.py``; at ``--concurrency 1`` a bridge with no
  requests coming settles about two effects a second, see
  :data:`EFFECT_CONCURRENCY`);
  restarted half the time under the same ``--bridge-name`` (it re-reads its
  own pending requests), half under a new one (the pending requests are
  taken over after ``--claim-after``);
* ``redis-server`` (``tests/redis_server.py``);
* the fake external service (``children/fake_service.py``, reconcile
  configuration: no dedup; it fails some calls and answers some only after the
  caller's timeout), in the test's own namespace on a Unix socket, logging
  every call it receives.

Faults, one at a time, in a seeded random order with random gaps: SIGKILL of
the bridge, of the worker and of ``redis-server``, each restarted after a
short random pause; in the two-host test also an nftables drop-all partition
of a few seconds and a few seconds of 30 % random packet loss on the veths.

Then the producer's last event is committed, the faults are cleared, the
worker is stopped with SIGTERM (it must exit 0), ``run --to ... --until-idle``
(the CLI) relays what is left, the bridge applies and runs every effect and
is stopped with SIGTERM (exit 0), and the test checks, reading the files and
the service's log:

* every committed event accepted: the producer's delivery state towards
  ``remote`` is ``accepted`` for every outbox event;
* 0 lost: every committed event is in the consumer's inbox, applied, and no
  event is there that the producer did not commit;
* 0 applied twice and per-flow order kept: each flow's applied records are
  exactly its events 1..n, in that order; its projection is at seq n, in the
  producer's state;
* the effect outbox's exactly-once: one effect per applied event, every one
  ``succeeded``, and the service performed every key exactly once, with the
  result the consumer recorded (and nothing else);
* the faults really happened (each kind counted) and sends really failed and
  were retried (some delivery has more than one attempt).

Same host (``redis``): Redis on a Unix socket, every process in this
network namespace.  Two hosts (``redis`` and ``netns``, root): two network
namespaces joined by a veth pair (``tests/netns.py``); the producer and the
worker in host A, ``redis-server`` (bound to B's veth address only) and the
bridge in host B, so every request and answer crosses the veth; the files are
in this run's temporary directory (one filesystem), the producer's touched
only by A's processes and the consumer's only by B's.

Every wait has a deadline and fails showing the tails of the processes'
stderr.  Default: about 300 events and 9 faults on one host (30 s), 280
events and 13 faults on two (50 s): under 1.5 minutes in all on two cores.
``RELIABLE_FLOW_SOAK=1`` also runs the opt-in soak tests, sized by
:data:`SOAK_ONE_HOST` and :data:`SOAK_TWO_HOSTS` (about 1,200 events and 45
faults each).  The seed is printed;
``RELIABLE_FLOW_SEED=<seed>`` replays the same plan and fault order (where a
kill lands depends on timing).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from children import transport_app
from children.transport_producer import STEPS, plan
from redis_server import MISSING, RedisServer, redis_required
from reliable_flow import Consumer, Producer
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, child_env, chosen_seed

PRODUCER = CHILDREN / "transport_producer.py"
SERVICE = CHILDREN / "fake_service.py"
CONSUMER_NAME = "remote"
APP = "children.transport_app"
STARTUP = 3.0  # seconds a process may take to start its loop (import, open the store)
WAIT = 30.0  # a process's start, a SIGTERM'd process's exit
DRAIN = 150.0  # the final relay (until idle) and the consumer's catching up, each
QUIET = 10.0  # the consumer unchanged this long after the final relay: nothing more is coming
CLI_LEASE = 12.0  # run --to: longer than RedisReceiver's default 10 s timeout
CHILD_TIMEOUT, CHILD_LEASE = 2.0, 5.0  # the two-host worker child's receiver timeout and relay lease
CLAIM_AFTER = 2.0
# A bridge pass waits up to 0.5 s for requests (Bridge's block, no CLI option) before it pumps its
# executor, which starts at most --concurrency calls a pass: at 1, effects settle at ~2/s once the
# requests stop, and the default run would spend most of its time there.
EFFECT_CONCURRENCY = 8
P_FAIL, P_LATE = 0.1, 0.05  # the fake service's draws: fail before / perform and answer late


@dataclass(frozen=True)
class Size:
    flows: int
    pace: float  # seconds between two commits
    kills: int  # of each process (bridge, worker, redis-server)
    partitions: int = 0
    drops: int = 0  # periods of 30 % loss
    gap: tuple[float, float] = (1.2, 2.5)  # seconds between two faults


DEFAULT_ONE_HOST = Size(flows=150, pace=0.07, kills=3)
DEFAULT_TWO_HOSTS = Size(flows=140, pace=0.08, kills=3, partitions=2, drops=2)
SOAK_ONE_HOST = Size(flows=600, pace=0.05, kills=15)
SOAK_TWO_HOSTS = Size(flows=600, pace=0.05, kills=12, partitions=6, drops=3)
def soak(test: Any) -> Any:
    """An opt-in soak (RELIABLE_FLOW_SOAK=1): marked ``soak``, so its skip is no failure under the REQUIRE_* variables."""
    skip = pytest.mark.skipif(not os.environ.get("RELIABLE_FLOW_SOAK"), reason="soak run: set RELIABLE_FLOW_SOAK=1")
    return pytest.mark.soak(skip(test))


def _need_redis() -> None:
    if MISSING is not None:
        if redis_required():
            pytest.fail(MISSING, pytrace=False)
        pytest.skip(MISSING)


# -- processes -----------------------------------------------------------------------------


class Proc:
    """One role (bridge, worker, producer), started again after each kill;
    every incarnation's stdout and stderr appended to one log file.
    ``host``: a ``tests/netns.Host`` to run in, or None (this namespace)."""

    def __init__(self, role: str, argv: Callable[[], list[str]], log: Path, env: dict[str, str],
                 host: Any = None) -> None:
        self.role, self.argv, self.log, self.env, self.host = role, argv, log, env, host
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnations = 0
        self.kills = 0
        self.started = 0.0
        self.log_from = 0  # where this incarnation's lines begin in the log

    def start(self) -> None:
        assert not self.alive(), f"{self.role} is already running"
        self.incarnations += 1
        self.started = time.monotonic()
        self.log_from = self.log.stat().st_size if self.log.exists() else 0
        argv = self.argv()
        with open(self.log, "ab") as out:
            out.write(f"=== {self.role} incarnation {self.incarnations}: {' '.join(argv)}\n".encode())
            out.flush()
            if self.host is None:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env)
            else:
                self.proc = self.host.popen(argv, stdout=out, stderr=out, env=self.env)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def announced(self, marker: str) -> bool:
        """Whether this incarnation has written ``marker`` to its log (e.g. the
        line a command prints once it has checked its servers and begins)."""
        with open(self.log, "rb") as f:
            f.seek(self.log_from)
            return marker.encode() in f.read()

    def kill(self) -> None:
        """SIGKILL (as a crash would) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.kills += 1
        if self.proc is not None:
            self.proc.wait(WAIT)

    def terminate(self, timeout: float = WAIT) -> int | None:
        """SIGTERM and wait; the exit code, or None when it had to be killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(WAIT)
            return None

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, chars: int = 2500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class Service:
    """``fake_service.py`` in its own process (this namespace), on a Unix socket;
    ``p_fail``, ``p_late`` and ``more`` (further options) as that script takes them."""

    def __init__(self, log_path: Path, seed: int, *, p_fail: float = P_FAIL, p_late: float = P_LATE,
                 more: tuple[str, ...] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rf-tx-"))  # a short path: Unix socket paths are limited
        self.socket = str(self.dir / "service.sock")
        self.log_path = log_path
        self.stderr = log_path.with_suffix(".stderr")
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVICE), "--socket", self.socket, "--log", str(log_path), "--seed", str(seed),
                 "--dedup", "0", "--p-fail", str(p_fail), "--p-late", str(p_late), "--late-delay", "0.1",
                 "--max-seconds", "1800", *more],
                env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        if not ready or self.proc.stdout.readline() != b"ready\n":
            self.stop()
            pytest.fail(f"the fake service never became ready: {self.stderr.read_text()}")

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)
            if self.proc.stdout is not None and not self.proc.stdout.closed:
                self.proc.stdout.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def performances(self) -> tuple[dict[str, list[Any]], Counter[str]]:
        """Key -> the result of each call of it that performed; outcomes counted."""
        performed: dict[str, list[Any]] = {}
        outcomes: Counter[str] = Counter()
        for line in self.log_path.read_text().splitlines() if self.log_path.exists() else ():
            entry = json.loads(line)
            outcomes[entry["outcome"]] += 1
            if entry["performed"]:
                performed.setdefault(entry["key"], []).append(entry["result"])
        return performed, outcomes


# -- one campaign ------------------------------------------------------------------------


@dataclass
class Campaign:
    """The processes of one run, the faults made and what they did."""

    seed: int
    size: Size
    tmp: Path
    redis: RedisServer
    url: str
    hosts: Any = None  # a tests/netns.Hosts for the two-host run
    faults: Counter[str] = field(default_factory=Counter)
    procs: dict[str, Proc] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)

    @property
    def producer_path(self) -> Path:
        return self.tmp / "producer.db"

    @property
    def consumer_path(self) -> Path:
        return self.tmp / "consumer.db"

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.began:7.2f}s {what}")

    def diagnosis(self) -> str:
        parts = [f"seed {self.seed}; faults {dict(self.faults)}", "timeline:\n" + "\n".join(self.timeline[-30:])]
        for proc in self.procs.values():
            parts.append(f"--- {proc.role} (incarnations {proc.incarnations}, log {proc.log}):\n{proc.tail()}")
        parts.append(f"--- redis-server:\n{self.redis._log_tail()[-1500:]}")
        return "\n".join(parts)

    def fail(self, message: str) -> None:
        pytest.fail(f"{message}\n{self.diagnosis()}", pytrace=False)

    def wait_for(self, what: str, done: Callable[[], bool], timeout: float, step: float = 0.25) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(step)

    def expect_alive(self, *roles: str) -> None:
        for role in roles:
            proc = self.procs[role]
            if not proc.alive():
                code = proc.proc.returncode if proc.proc is not None else None
                self.fail(f"the {role} exited by itself (code {code}), nobody killed it")


def run_campaign(campaign: Campaign, service: Service, *, worker_argv: Callable[[], list[str]],
                 a_host: Any = None, b_host: Any = None) -> None:
    """Start everything, inject the faults while the producer commits, drain, check."""
    size, rng = campaign.size, random.Random(f"{campaign.seed}:faults")
    env = child_env(**{transport_app.SOCKET_ENV: service.socket})

    def bridge_argv() -> list[str]:
        return [sys.executable, "-m", "reliable_flow", "bridge", str(campaign.consumer_path), "--redis", campaign.url,
                "--name", CONSUMER_NAME, "--bridge-name", "bridge-1", "--handlers", f"{APP}:HANDLERS",
                "--effects", f"{APP}:EFFECTS", "--effect-lease", str(transport_app.EFFECT_LEASE),
                "--concurrency", str(EFFECT_CONCURRENCY),
                "--claim-after", str(CLAIM_AFTER), "--report-every", "0"]

    def producer_argv() -> list[str]:
        return [sys.executable, str(PRODUCER), "advance", str(campaign.producer_path), str(campaign.seed),
                str(size.flows), str(size.pace)]

    procs = campaign.procs
    procs["bridge"] = Proc("bridge", bridge_argv, campaign.tmp / "bridge.log", env, b_host)
    procs["worker"] = Proc("worker", worker_argv, campaign.tmp / "worker.log", env, a_host)
    procs["producer"] = Proc("producer", producer_argv, campaign.tmp / "producer.log", env, a_host)
    try:
        procs["bridge"].start()
        # The bridge announces the consumer in Redis: then a worker can start.
        campaign.wait_for("the bridge to announce the consumer", lambda: bool(campaign.redis.command(
            "HGET", f"rf:{{{CONSUMER_NAME}}}:consumer", "uid")) or not procs["bridge"].alive(), WAIT)
        campaign.expect_alive("bridge")
        procs["worker"].start()
        procs["producer"].start()
        campaign.note("started")
        inject_faults(campaign, rng)
        drain(campaign, a_host)
    finally:
        for proc in procs.values():
            proc.kill()
        if campaign.hosts is not None:
            campaign.hosts.clear_faults()
    check(campaign, service)


def fault_plan(size: Size, rng: random.Random) -> list[str]:
    plan_ = (["kill bridge", "kill worker", "kill redis"] * size.kills + ["partition"] * size.partitions
             + ["drop 30%"] * size.drops)
    rng.shuffle(plan_)
    return plan_


#: What `run --to` and `bridge` print once they have reached Redis and begin.
STARTED = {"worker": "run: relaying to", "bridge": "bridge: serving consumer"}


def wait_started(campaign: Any, roles: dict[str, str] = STARTED) -> None:
    """Each of ``roles`` has announced its start (or exited, which
    ``expect_alive`` then reports).  `run --to` and `bridge` check Redis once as
    they start (a wrong URL is a clear exit 2: test_transport_redis_refusals.py),
    so a fault that takes Redis away waits for a restarted one to be past it:
    one fault at a time.  A role run by a test's own child script (which
    prints no such line) is not waited for."""
    roles = {name: marker for name, marker in roles.items()
             if name in campaign.procs and marker.split(":")[0] in campaign.procs[name].argv()}
    for name, marker in roles.items():
        proc = campaign.procs[name]
        campaign.wait_for(f"the {name} to start", lambda p=proc, m=marker: p.announced(m) or not p.alive(), WAIT)
    campaign.expect_alive(*roles)


def inject_faults(campaign: Campaign, rng: random.Random) -> None:
    """One fault at a time, with random gaps; each killed process restarted
    after a short random pause.  Goes on (without faults) until the producer
    has committed its last event."""
    procs, size = campaign.procs, campaign.size
    for fault in fault_plan(size, rng):
        time.sleep(rng.uniform(*size.gap))
        campaign.expect_alive("bridge", "worker")
        campaign.note(fault)
        campaign.faults[fault] += 1
        if fault in ("kill redis", "partition"):
            wait_started(campaign)
        if fault == "kill redis":
            campaign.redis.kill()
            time.sleep(rng.uniform(0.2, 1.5))
            campaign.redis.start()  # empty: no persistence
        elif fault.startswith("kill "):
            proc = procs[fault.split()[1]]
            proc.kill()
            time.sleep(rng.uniform(0.2, 1.5))
            if proc.role == "bridge" and rng.random() < 0.5:
                # A new name in the group: the dead one's pending requests are claimed after CLAIM_AFTER.
                bridge_argv_name(proc, campaign)
            proc.start()
        elif fault == "partition":
            campaign.hosts.partition()
            time.sleep(rng.uniform(2.0, 4.0))
            campaign.hosts.heal()
        elif fault == "drop 30%":
            campaign.hosts.drop_randomly(30)
            time.sleep(rng.uniform(4.0, 6.0))
            campaign.hosts.clear_faults()
        campaign.note(f"{fault}: over")
    code = procs["producer"].wait(DRAIN)
    campaign.note(f"producer exited {code}")
    if code != 0:
        campaign.fail(f"the producer did not finish committing within {DRAIN:g}s after the faults (code {code})")
    campaign.expect_alive("bridge", "worker")


def bridge_argv_name(proc: Proc, campaign: Campaign) -> None:
    """Give the bridge's next incarnation a new ``--bridge-name``."""
    argv = proc.argv
    new = f"bridge-{proc.incarnations + 1}"

    def renamed() -> list[str]:
        out = argv()
        out[out.index("--bridge-name") + 1] = new
        return out

    proc.argv = renamed
    campaign.note(f"bridge restarts as {new}")


def drain(campaign: Campaign, a_host: Any) -> None:
    """SIGTERM the worker (exit 0), relay the rest with ``run --to --until-idle``,
    wait until the bridge applied everything and settled every effect, SIGTERM it."""
    procs = campaign.procs
    # A SIGTERM before the worker's loop has installed its handlers ends it the default way (-15):
    # give an incarnation started just now the time to get there.
    settle = procs["worker"].started + STARTUP - time.monotonic()
    if settle > 0:
        time.sleep(settle)
    code = procs["worker"].terminate()
    campaign.note(f"worker stopped by SIGTERM: {code}")
    if code != 0:
        campaign.fail(f"the worker did not stop cleanly on SIGTERM within {WAIT:g}s (code {code})")
    final = Proc("final relay", lambda: [
        sys.executable, "-m", "reliable_flow", "run", "--producer", str(campaign.producer_path), "--to", campaign.url,
        "--consumer", CONSUMER_NAME, "--lease", str(CLI_LEASE), "--idle-sleep", "0.1", "--until-idle",
        "--report-every", "0"], campaign.tmp / "final.log", procs["worker"].env, a_host)
    procs["final relay"] = final
    final.start()
    code = final.wait(DRAIN)
    campaign.note(f"run --until-idle exited {code}")
    if code != 0:
        campaign.fail(f"run --to --until-idle did not end with 0 within {DRAIN:g}s (code {code})")
    expected = sum(steps for steps, _amount in plan(campaign.seed, campaign.size.flows).values())

    seen: list[Any] = [None, time.monotonic()]

    def caught_up() -> bool:
        campaign.expect_alive("bridge")
        with Consumer(campaign.consumer_path, RESERVATION) as consumer:
            applied = sum(len(consumer.applied(f)) for f in consumer.flows())
            counts = consumer.effect_counts()
        settled = sum(n for state, n in counts.items() if state != "succeeded") == 0
        now = (applied, {state: n for state, n in sorted(counts.items()) if n})
        if now != seen[0]:
            seen[:] = [now, time.monotonic()]
            campaign.note(f"consumer: applied {applied} of {expected}, effects {now[1]}")
        # Done when everything is in; or when nothing moved for QUIET seconds with no effect
        # left to run (then the checks say what is missing, rather than a time-out).
        return settled and (applied >= expected or time.monotonic() - seen[1] > QUIET)

    campaign.wait_for(f"the bridge to apply {expected} events and settle their effects", caught_up, DRAIN, 0.5)
    settle = procs["bridge"].started + STARTUP - time.monotonic()
    if settle > 0:
        time.sleep(settle)
    code = procs["bridge"].terminate()
    campaign.note(f"bridge stopped by SIGTERM: {code}")
    if code != 0:
        campaign.fail(f"the bridge did not stop cleanly on SIGTERM within {WAIT:g}s (code {code})")


# -- the invariants ------------------------------------------------------------------------


def check(campaign: Campaign, service: Service) -> None:
    wanted = plan(campaign.seed, campaign.size.flows)
    events = {f"{flow}-{seq}": (flow, seq) for flow, (steps, _a) in wanted.items() for seq in range(1, steps + 1)}
    problems: list[str] = []
    with Producer(campaign.producer_path, RESERVATION) as producer:
        outbox = producer.outbox()
        states = {flow: producer.flow(flow) for flow in wanted}
    committed = {e.event_id for e in outbox}
    attempts = [e.deliveries[CONSUMER_NAME].attempts for e in outbox if CONSUMER_NAME in e.deliveries]
    if committed != set(events):
        problems.append(f"the producer committed {len(committed)} events, planned {len(events)}: "
                        f"missing {sorted(set(events) - committed)[:5]}, extra {sorted(committed - set(events))[:5]}")
    not_accepted = [(e.event_id, e.deliveries.get(CONSUMER_NAME)) for e in outbox
                    if CONSUMER_NAME not in e.deliveries or e.deliveries[CONSUMER_NAME].state != "accepted"]
    if not_accepted:
        problems.append(f"{len(not_accepted)} committed events not accepted by {CONSUMER_NAME}: {not_accepted[:3]}")

    with Consumer(campaign.consumer_path, RESERVATION) as consumer:
        flows = set(consumer.flows())
        inboxes = {flow: consumer.inbox(flow) for flow in flows}
        applied = {flow: consumer.applied(flow) for flow in flows}
        projections = {flow: consumer.projection(flow) for flow in flows}
        effects = consumer.scheduled_effects()
    if flows != set(wanted):
        problems.append(f"consumer flows differ: missing {sorted(set(wanted) - flows)[:5]}, "
                        f"extra {sorted(flows - set(wanted))[:5]}")
    lost = twice = disorder = 0
    for flow, (steps, _amount) in wanted.items():
        ids = [f"{flow}-{seq}" for seq in range(1, steps + 1)]
        inbox = inboxes.get(flow, [])
        if [r.event_id for r in inbox] != ids or any(r.state != "applied" for r in inbox):
            lost += 1
            problems.append(f"{flow}: inbox {[(r.event_id, r.seq, str(r.state)) for r in inbox]}, want {ids} applied")
        done = [(a.event_id, a.seq) for a in applied.get(flow, [])]
        if len({e for e, _s in done}) != len(done):
            twice += 1
            problems.append(f"{flow}: applied twice: {done}")
        elif [s for _e, s in done] != list(range(1, len(done) + 1)) or [e for e, _s in done] != ids[:len(done)]:
            disorder += 1
            problems.append(f"{flow}: applied out of order: {done}")
        elif len(done) != steps:
            lost += 1
            problems.append(f"{flow}: applied {done}, want all {steps}")
        projection = projections.get(flow) or {}
        if projection.get("last_seq") != steps or projection.get("state") != (states[flow] or {}).get("state") \
                or projection.get("state") != STEPS[steps - 1]:
            problems.append(f"{flow}: projection {projection}, want last_seq {steps} in the producer's state "
                            f"{states[flow]}")

    # The effect outbox: one effect per applied event, each performed exactly once at the service.
    performed, outcomes = service.performances()
    by_event = Counter(e.event_id for e in effects)
    if set(by_event) != set(events) or any(n != 1 for n in by_event.values()):
        problems.append(f"effects per event: {len(by_event)} events have effects (want {len(events)}), "
                        f"more than one: {[k for k, n in by_event.items() if n != 1][:5]}")
    unsettled = [(e.key, str(e.state)) for e in effects if e.state != "succeeded"]
    if unsettled:
        problems.append(f"{len(unsettled)} effects not succeeded: {unsettled[:5]}")
    keys = {e.key: e for e in effects}
    never = sorted(k for k in keys if k not in performed)
    doubled = {k: v for k, v in performed.items() if len(v) > 1}
    strangers = sorted(k for k in performed if k not in keys)
    wrong = sorted(k for k, e in keys.items() if k in performed and len(performed[k]) == 1
                   and e.result != performed[k][0])
    if never or doubled or strangers or wrong:
        problems.append(f"the service: never performed {never[:5]}, performed twice {dict(list(doubled.items())[:5])}, "
                        f"unknown keys {strangers[:5]}, result differs {wrong[:5]}")

    # Nothing crashed unseen, and the last bridge refused nothing (every request was one of ours).
    for proc in campaign.procs.values():
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        for sign in ("Traceback", "cannot go on"):
            if sign in text:
                at = text.index(sign)
                problems.append(f"the {proc.role}'s log shows {sign!r}: {text[max(0, at - 300):at + 1200]}")
    stopped = [line for line in campaign.procs["bridge"].tail(20_000).splitlines() if line.startswith("bridge: stopped: ")]
    bridge_stats = json.loads(stopped[-1][len("bridge: stopped: "):]) if stopped else {}
    if not stopped or bridge_stats.get("malformed") != 0:
        problems.append(f"the last bridge's totals: {stopped[-1:] or 'none printed'} (want malformed 0)")

    retried = sum(1 for n in attempts if n > 1)
    print(f"transport faults [{'two hosts' if campaign.hosts is not None else 'one host'}]: seed={campaign.seed} "
          f"faults={dict(sorted(campaign.faults.items()))} events={len(events)} flows={len(wanted)} "
          f"sends={sum(attempts)} (events sent more than once {retried}) incarnations="
          f"{ {r: p.incarnations for r, p in campaign.procs.items()} } effects={len(effects)} "
          f"service {dict(sorted(outcomes.items()))} lost={lost} applied twice={twice} out of order={disorder} "
          f"last bridge {bridge_stats.get('received')} reclaimed {bridge_stats.get('reclaimed')} "
          f"in {time.monotonic() - campaign.began:.1f}s", flush=True)
    print("  " + "; ".join(campaign.timeline), flush=True)
    if problems:
        campaign.fail(f"{len(problems)} invariant violations:\n" + "\n".join(problems[:40]))
    planned = Counter(fault_plan(campaign.size, random.Random(f"{campaign.seed}:faults")))
    assert campaign.faults == planned, (campaign.faults, planned)
    assert campaign.procs["bridge"].kills == campaign.size.kills, campaign.diagnosis()
    assert campaign.procs["worker"].kills == campaign.size.kills, campaign.diagnosis()
    assert retried > 0, f"no send ever failed and was retried: the faults proved nothing\n{campaign.diagnosis()}"


# -- the tests -------------------------------------------------------------------------------


def one_host(tmp_path: Path, size: Size) -> None:
    _need_redis()
    seed = chosen_seed()
    print(f"seed {seed} (RELIABLE_FLOW_SEED={seed} replays the plan)")
    redis = RedisServer()
    service: Service | None = None
    try:
        redis.start()
        service = Service(tmp_path / "service.log", seed)
        campaign = Campaign(seed, size, tmp_path, redis, redis.url())

        def worker_argv() -> list[str]:
            return [sys.executable, "-m", "reliable_flow", "run", "--producer", str(campaign.producer_path),
                    "--to", campaign.url, "--consumer", CONSUMER_NAME, "--lease", str(CLI_LEASE),
                    "--idle-sleep", "0.1", "--report-every", "0"]

        run_campaign(campaign, service, worker_argv=worker_argv)
    finally:
        if service is not None:
            service.stop()
        redis.destroy()


def two_hosts(tmp_path: Path, size: Size) -> None:
    _need_redis()
    from netns import Hosts, require_netns

    require_netns()
    seed = chosen_seed()
    print(f"seed {seed} (RELIABLE_FLOW_SEED={seed} replays the plan)")
    service: Service | None = None
    with Hosts() as hosts:
        redis = RedisServer(bind=hosts.b.address, netns=hosts.b)
        try:
            redis.start()
            service = Service(tmp_path / "service.log", seed)
            campaign = Campaign(seed, size, tmp_path, redis, redis.tcp_url(), hosts=hosts)

            def worker_argv() -> list[str]:
                return [sys.executable, str(PRODUCER), "worker", str(campaign.producer_path), campaign.url,
                        CONSUMER_NAME, str(CHILD_TIMEOUT), str(CHILD_LEASE)]

            run_campaign(campaign, service, worker_argv=worker_argv, a_host=hosts.a, b_host=hosts.b)
        finally:
            if service is not None:
                service.stop()
            redis.destroy()


@pytest.mark.redis
def test_one_host_kills_of_bridge_worker_and_redis_lose_nothing_double_nothing(tmp_path: Path) -> None:
    one_host(tmp_path, DEFAULT_ONE_HOST)


@pytest.mark.redis
@pytest.mark.netns
def test_two_hosts_kills_partitions_and_loss_lose_nothing_double_nothing(tmp_path: Path) -> None:
    two_hosts(tmp_path, DEFAULT_TWO_HOSTS)


@soak
@pytest.mark.redis
def test_soak_one_host(tmp_path: Path) -> None:
    one_host(tmp_path, SOAK_ONE_HOST)


@soak
@pytest.mark.redis
@pytest.mark.netns
def test_soak_two_hosts(tmp_path: Path) -> None:
    two_hosts(tmp_path, SOAK_TWO_HOSTS)
