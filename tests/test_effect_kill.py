"""SIGKILL an effect executor at random moments while it calls a fake external
service; afterwards the service's own log must show that no effect was lost
or performed twice, and every effect the executor could not settle must be
parked as ``unknown``.

The service (``children/fake_service.py``) runs in a process of its own for
the whole campaign, on a Unix socket, and appends every call it receives
(with its key) to a log, fsynced before it answers.  It fails some calls
before doing anything (``{"error": "retry"}`` -> ``RetryLater``), performs
some and answers, and performs some but answers only after the caller's
timeout (``OutcomeUnknown``).  Requests carry a deadline and the service
refuses one read past it, so nothing is performed on behalf of a caller who
gave up (see its docstring).

The executor (``children/effect_kill_worker.py``) is forked again and again
and killed with SIGKILL after a random delay: while it opens the consumer
file, claims, calls, reconciles or records.  Between two incarnations the
test adds work when the backlog runs low (flows whose three applied steps
each schedule one effect), so kills keep landing on a busy executor, and it
notes which effect the killed incarnation left ``running``.  After the last
kill one executor in the test process runs everything that is left to the
end (its clock set past every lease and backoff), and the test checks, per
configuration of the one effect:

* ``reconcile`` (``reconcile=`` asks the service's status; service without
  dedup): 0 lost and 0 performed twice -- every effect succeeded, every key
  performed exactly once, with the result the service returned for it;
* ``idempotent`` (``idempotent=True``; the service deduplicates by key):
  every effect succeeded and every key was performed exactly once as the
  service's dedup saw it (raw calls of a key may be more);
* ``neither`` (service without dedup): no key performed twice; every effect
  either succeeded (performed exactly once, with that result) or is parked
  as ``unknown``; nothing left pending, running or in doubt.

Each campaign must also really have exercised doubt: at least one
perform-then-time-out, and at least one kill of an incarnation in the
middle of an effect (with enough kills: one after the service performed and
before the outcome was recorded), else it proves nothing and fails.

Every configuration runs on both engines: a SQLite consumer file, and
PostgreSQL schemas of the session's private server (``tests/pg_cluster.py``;
the executor child is given the consumer's location string and opens its own
connection; a killed client's open transaction is rolled back by the server).
The checks are the same, read through the public API.

Default: 300 kills per configuration on SQLite, 900 in all (50-65 s on two
cores); 60 per configuration on PostgreSQL, 180 in all (a PostgreSQL
incarnation costs more to open, and the SQLite campaign covers the kill
timings; the PostgreSQL one shows the same contract under the server's
rollback of killed clients).  ``RELIABLE_FLOW_KILLS=N`` sets the count per
configuration of the default SQLite tests (PostgreSQL's scales with it, a
fifth); ``RELIABLE_FLOW_SOAK=1`` runs the opt-in soak tests with 1000 kills
per configuration.  The seed is printed; ``RELIABLE_FLOW_SEED=<seed>``
replays the same kill delays, the same work and the same sequence of the
service's draws (where each kill lands, and which call meets which draw,
depend on timing and are not exactly reproducible).

The concurrent configurations (issue 20), ``reconcile-c16``,
``idempotent-c16`` and ``neither-c16``
(:func:`test_effect_kill_concurrent_loses_nothing_doubles_nothing`, both
engines): the same service, the same three ways of settling doubt and the
same checks, but every executor child runs at ``concurrency=16`` with a
1.5 s lease, and two of them are alive at once (a lease that ran out while
its executor lived would be taken over by the other).  The apply handler
schedules, per step, the plain-function effect or the ``async def`` one
(with an ``async def`` reconcile), as a quick call, a long one (the service
works longer than the lease before deciding; the function heartbeats) or a
slow one (past the effects' ``timeout=``: recorded in doubt while it runs,
its late outcome discarded); the service's "retry" answers carry a
``Retry-After`` (``RetryLater(after=)``).  The service decides a long or
slow call only for a caller still connected, so a killed caller has nothing
performed after its death.  Each round starts incarnations up to two, waits
0-1.6 s (the first round 4.2-4.6 s, its first effects slow and long, so
calls surely time out and outlive the lease) and kills one of them at random (so some live long enough to finish
long and slow calls); the last one is killed too.  Besides :func:`check`,
:func:`check_concurrent` asserts that no call or reconcile of a key reached
the service while another call of it was in progress for a live caller, that
no live executor lost a claim, and that the campaign did call both
functions, answer long calls past the lease, heartbeat, time calls out,
discard late outcomes and settle doubt the configuration's way.  Default:
12 kills per configuration on each engine (about 45 s on SQLite, 65 s on
PostgreSQL on two cores); ``RELIABLE_FLOW_C_KILLS=N`` sets it;
``RELIABLE_FLOW_SOAK=1`` runs 200 per configuration (SQLite).
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
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from children import effect_kill_worker as worker
from reliable_flow import Consumer, Producer, relay
from reliable_flow._effects.executor import EffectExecutor
from reliable_flow._handlers import ApplyContext
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, child_env

SERVICE = CHILDREN / "fake_service.py"
WORKER = CHILDREN / "effect_kill_worker.py"
DEFAULT_KILLS = 300  # per configuration on SQLite: 900 in all
POSTGRES_KILLS = 60  # per configuration on PostgreSQL: 180 in all
SOAK_KILLS = 1000  # per configuration
MAX_KILL_DELAY = 0.08  # seconds after "ready"
EARLY_KILL_SHARE = 0.1  # kills that may land while the child starts and opens the consumer file
INITIAL_FLOWS = 12  # x 3 applied steps = 36 effects to start with
REFILL_FLOWS = 6  # added when fewer than BACKLOG_LOW effects are still to settle
BACKLOG_LOW = 15
P_FAIL, P_LATE = 0.2, 0.12  # the service's draws for a perform: fail before / perform, answer late
WAIT = 30.0  # any single wait (a child's "ready", a killed child's exit, the service) before failing
FINAL_PASSES = 10_000  # the clean run's passes before it counts as a hang
# The concurrent configurations (issue 20): two incarnations alive at once, each concurrency=16.
CONCURRENT_KILLS = 12  # per configuration, on each engine
CONCURRENT_SOAK_KILLS = 200  # per configuration, RELIABLE_FLOW_SOAK=1
C_LIVE = 2  # incarnations alive at once: a lease that ran out would be taken over
C_MAX_KILL_DELAY = 1.6  # seconds after the newest incarnation is "ready"
C_INITIAL_FLOWS = 20  # x 3 = 60 effects to start with
C_REFILL_FLOWS = 12
C_BACKLOG_LOW = 40
P_LONG, P_SLOW = 0.25, 0.12  # an effect's kind of call (else quick); sync or async: even odds
FINAL_SECONDS = 120.0  # the concurrent clean run's time before it counts as a hang
FIRST_ROUND = (4.2, 4.6)  # the first round's kill delay: past a slow call's deadline
FIRST = {"F00000": [("call_service_sync", "slow"), ("call_service_async", "slow"), ("call_service_sync", "long")],
         "F00001": [("call_service_async", "long"), ("call_service_sync", "quick"), ("call_service_async", "quick")]}
STEPS = ("reserved", "confirmed", "released")
UNSETTLED = ("pending", "running", "in_doubt")
Location = Path | str  # a SQLite file, or a postgresql://...#schema location


def kill_count(default: int) -> int:
    value = os.environ.get("RELIABLE_FLOW_KILLS")
    return int(value) if value else default


def chosen_seed() -> int:
    value = os.environ.get("RELIABLE_FLOW_SEED")
    return int(value) if value else random.SystemRandom().randrange(2**32)


def schedule_call(ctx: ApplyContext) -> None:
    """The apply handler: every applied step schedules one call of the service."""
    ctx.schedule(worker.EFFECT, {"flow": ctx.event.flow_id, "step": ctx.event.kind})


# -- the service ------------------------------------------------------------------------


class FakeService:
    """``fake_service.py`` in its own process; stopped (stdin closed) by :meth:`stop`."""

    def __init__(self, log_path: Path, seed: int, dedup: bool, max_seconds: float) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rf-fx-"))  # a short path: Unix socket paths are limited
        self.socket = str(self.dir / "service.sock")
        self.log_path = log_path
        self.stderr_path = log_path.with_suffix(".stderr")
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVICE), "--socket", self.socket, "--log", str(log_path), "--seed", str(seed),
                 "--dedup", str(int(dedup)), "--p-fail", str(P_FAIL), "--p-late", str(P_LATE),
                 "--late-delay", "0.1", "--max-seconds", str(max_seconds)],
                env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        if not ready or self.proc.stdout.readline() != b"ready\n":
            self.stop()
            pytest.fail(f"the fake service never became ready: {self.stderr_path.read_text()}")

    def pipe_fds(self) -> list[int]:
        """The parent's ends of the service's pipes (a forked child closes them)."""
        return [f.fileno() for f in (self.proc.stdin, self.proc.stdout) if f is not None and not f.closed]

    def stop(self) -> str:
        """Close its stdin (it stops), wait for it; what it printed.  Safe to call twice."""
        out = b""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=WAIT)
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait(timeout=WAIT)
            if self.proc.stdout is not None and not self.proc.stdout.closed:
                out = self.proc.stdout.read()
                self.proc.stdout.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return out.decode()


@dataclass
class ServiceLog:
    """The service's log, read after it stopped."""

    entries: list[dict[str, Any]]

    @classmethod
    def read(cls, path: Path) -> ServiceLog:
        lines = path.read_text().splitlines() if path.exists() else []
        return cls([json.loads(line) for line in lines])

    def outcomes(self) -> Counter[str]:
        return Counter(e["outcome"] for e in self.entries)

    def performances(self) -> dict[str, list[dict[str, Any]]]:
        """Key -> every call of it that performed, in order."""
        out: dict[str, list[dict[str, Any]]] = {}
        for e in self.entries:
            if e["performed"]:
                out.setdefault(e["key"], []).append(e)
        return out



# -- the executor's incarnations --------------------------------------------------------


@dataclass
class Incarnation:
    """One executor child: forked (or, in a process with threads, a subprocess)."""

    pid: int
    ready_fd: int
    owner: str
    error_path: Path
    proc: subprocess.Popen[bytes] | None = None
    code: int | None = None  # its exit code, once reaped

    def wait_ready(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.ready_fd], [], [], timeout)
        return bool(ready) and os.read(self.ready_fd, 6) == b"ready\n"

    def kill_and_wait(self, timeout: float) -> int:
        """SIGKILL it (a no-op if it already exited) and reap it, once; its exit code."""
        if self.code is None:
            self.code = self._kill_and_wait(timeout)
        return self.code

    def _kill_and_wait(self, timeout: float) -> int:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            return self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                pytest.fail(f"killed executor {self.pid} did not die within {timeout}s")
            time.sleep(0.001)

    def error(self) -> str:
        """What the child reported when it failed (its traceback or stderr), if anything."""
        return self.error_path.read_text() if self.error_path.exists() else "(nothing reported)"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdout.close()  # type: ignore[union-attr]
        else:
            os.close(self.ready_fd)


def start_incarnation(consumer_path: Location, service: FakeService, config: str, owner: str, tmp_path: Path,
                      max_seconds: float, events_path: Path | None = None) -> Incarnation:
    """Fork an executor child (fast); a subprocess instead if this process has threads."""
    error_path = tmp_path / f"{owner}.error"
    events = [] if events_path is None else [str(events_path)]
    if threading.active_count() > 1:  # fork only a process without threads
        with open(error_path, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(consumer_path), service.socket, config, owner, str(max_seconds),
                 *events],
                env=child_env(), stdout=subprocess.PIPE, stderr=stderr,
            )
        assert proc.stdout is not None
        return Incarnation(proc.pid, proc.stdout.fileno(), owner, error_path, proc)
    read_fd, write_fd = os.pipe()
    inherited = service.pipe_fds()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: opens its own files, never returns
        code = 1
        try:
            os.close(read_fd)
            for fd in inherited:
                os.close(fd)
            worker.run(str(consumer_path), service.socket, config, owner,
                       lambda: os.write(write_fd, b"ready\n"), max_seconds, *events)
            code = 0
        except BaseException:  # noqa: BLE001 - reported to the parent through the file
            with open(error_path, "w") as f:
                f.write(traceback.format_exc())
        finally:
            os._exit(code)
    os.close(write_fd)
    return Incarnation(pid, read_fd, owner, error_path)


# -- work -------------------------------------------------------------------------------


def add_flows(producer_path: Location, consumer_path: Location, config: str, socket: str, first: int, n: int,
              rng: random.Random, handler: Any = schedule_call) -> int:
    """Commit, relay and apply three steps of ``n`` new flows: 3n effects scheduled."""
    with Producer(producer_path, RESERVATION) as producer, \
            Consumer(consumer_path, RESERVATION, handlers=[handler],
                     effects=worker.build_effects(config, socket, "scheduler")) as consumer:
        for i in range(first, first + n):
            flow_id, amount = f"F{i:05d}", rng.randint(1, 9)
            for seq, kind in enumerate(STEPS, start=1):
                result = producer.advance(f"{flow_id}-{seq}", flow_id, expected_seq=seq - 1, kind=kind,
                                          payload={"amount": amount})
                assert result.status == "committed", result
        for _ in range(10 * n + 1):
            if relay(producer, consumer).status == "idle":
                break
        else:
            pytest.fail("relay never went idle")
        applied = sum(r.applied for r in consumer.process_all().values())
        assert applied == 3 * n, applied
    return first + n


def unsettled(consumer_path: Location) -> int:
    with Consumer(consumer_path, RESERVATION) as consumer:
        counts = consumer.effect_counts()
    return sum(counts[s] for s in UNSETTLED)


def left_running(consumer_path: Location, owner: str) -> list[str]:
    """Keys of the effects the incarnation ``owner`` left running (at most one)."""
    with Consumer(consumer_path, RESERVATION) as consumer:
        # An executor claims as "<its policy's owner>/<its own hex>".
        return [e.key for e in consumer.scheduled_effects(state="running")
                if e.lease_owner is not None and e.lease_owner.rpartition("/")[0] == owner]


def finish(consumer_path: Location, config: str, socket: str) -> dict[str, int]:
    """One clean executor, in this process, until nothing is left to settle.

    Its clock starts past every lease a killed child left and jumps past
    every backoff whenever nothing is due, so nothing waits for real time.
    """
    shift = [worker.LEASE + 1.0]
    policy = worker.policy(clock=lambda: time.time() + shift[0], owner="final")
    with Consumer(consumer_path, RESERVATION, effects=worker.build_effects(config, socket, "final")) as consumer:
        executor = EffectExecutor(consumer, policy=policy)
        for _ in range(FINAL_PASSES):
            if executor.run_once().work == 0:
                if sum(consumer.effect_counts()[s] for s in UNSETTLED) == 0:
                    return executor.stats.outcomes
                shift[0] += 1.0
        pytest.fail(f"the clean executor did not settle everything in {FINAL_PASSES} passes: "
                    f"{consumer.effect_counts()}")


# -- the campaign -----------------------------------------------------------------------


def new_stores(engine: str, tmp_path: Path) -> tuple[Location, Location]:
    """The producer's and the consumer's stores: SQLite files, or fresh PostgreSQL schemas."""
    if engine == "sqlite":
        return tmp_path / "producer.db", tmp_path / "consumer.db"
    from pg_cluster import pg_location

    return pg_location("fx_kill_p"), pg_location("fx_kill_c")


@dataclass
class Campaign:
    config: str
    seed: int
    engine: str = "sqlite"
    kills: int = 0
    early_kills: int = 0  # the kill may have landed before the child was ready
    incarnations: int = 0
    flows: int = 0
    running_at_kill: list[tuple[str, str]] = field(default_factory=list)  # (owner, key) left running
    final_outcomes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    kill_seconds: float = 0.0  # the concurrent campaign: until the last kill


def run_campaign(tmp_path: Path, config: str, kills: int, seed: int, engine: str = "sqlite") -> None:
    print(f"\neffect kill test [{engine}, {config}]: RELIABLE_FLOW_SEED={seed} RELIABLE_FLOW_KILLS={kills}",
          flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    budget = 120.0 + 1.0 * kills  # the whole campaign's watchdog
    producer_path, consumer_path = new_stores(engine, tmp_path)
    log_path = tmp_path / "service.log"
    campaign = Campaign(config, seed, engine)
    service = FakeService(log_path, rng.randrange(2**32), config == "idempotent", budget + 60)
    current: Incarnation | None = None
    try:
        campaign.flows = add_flows(producer_path, consumer_path, config, service.socket, 0, INITIAL_FLOWS, rng)
        while campaign.kills < kills:
            assert time.monotonic() - started < budget, f"seed {seed}: campaign watchdog ({budget:.0f}s) fired"
            if unsettled(consumer_path) < BACKLOG_LOW:
                campaign.flows = add_flows(producer_path, consumer_path, config, service.socket, campaign.flows,
                                           REFILL_FLOWS, rng)
            owner = f"inc-{campaign.incarnations}"
            where = f"seed {seed}, {config}, incarnation {campaign.incarnations}"
            campaign.incarnations += 1
            current = start_incarnation(consumer_path, service, config, owner, tmp_path, budget)
            early = rng.random() < EARLY_KILL_SHARE
            if early:  # kill timing only: may land before it opened the file
                time.sleep(rng.uniform(0, 0.03))
            else:
                if not current.wait_ready(WAIT):
                    current.kill_and_wait(WAIT)
                    pytest.fail(f"{where}: the executor never became ready:\n{current.error()}")
                time.sleep(rng.uniform(0, MAX_KILL_DELAY))
            code = current.kill_and_wait(WAIT)
            assert code == -signal.SIGKILL, f"{where}: the executor exited {code} before the kill:\n{current.error()}"
            current.close()
            current = None
            campaign.kills += 1
            campaign.early_kills += early
            campaign.running_at_kill += [(owner, key) for key in left_running(consumer_path, owner)]
        campaign.final_outcomes = dict(finish(consumer_path, config, service.socket))
    finally:
        if current is not None:
            current.kill_and_wait(WAIT)
            current.close()
        stopped = service.stop()
    campaign.seconds = time.monotonic() - started
    assert stopped.startswith("stopped after"), (stopped, service.stderr_path.read_text())
    check(campaign, consumer_path, ServiceLog.read(log_path), kills)


def kill_phases(campaign: Campaign, log: ServiceLog) -> Counter[str]:
    """Where each kill landed, as far as the file and the service's log tell.

    ``idle or outside a call``: the incarnation left nothing running (it was
    starting, idle, in a claim transaction that did not commit, or between
    two effects).  Otherwise it died between a committed claim and the
    recorded outcome: ``before the call reached the service`` (no call of
    the key from it in the log), or after the service ``refused`` it,
    ``performed`` it, answered from its ``dedup``, or answered a ``reconcile``.
    """
    phases: Counter[str] = Counter()
    seen: dict[tuple[str, str], list[str]] = {}
    for e in log.entries:
        seen.setdefault((e["owner"], e["key"]), []).append(e["outcome"])
    for owner, key in campaign.running_at_kill:
        outcomes = seen.get((owner, key), [])
        if "status" in outcomes:
            phases["during reconcile"] += 1
        elif "performed" in outcomes or "late" in outcomes:
            phases["after perform, before record"] += 1
        elif "dedup" in outcomes:
            phases["after a dedup answer, before record"] += 1
        elif "abandoned" in outcomes:
            phases["during a long call (abandoned by the service)"] += 1
        elif outcomes:
            phases["after a refused call, before record"] += 1
        else:
            phases["claimed, before the call reached the service"] += 1
    # (a concurrent incarnation may die holding several: the phases count effects, this one kills)
    phases["idle or outside a call"] = campaign.kills - len({owner for owner, _ in campaign.running_at_kill})
    return phases


def check(campaign: Campaign, consumer_path: Location, log: ServiceLog, kills: int) -> None:
    """Every effect against the service's log; prints the report line first."""
    config, seed = worker.split_config(campaign.config)[0], campaign.seed  # how doubt is settled
    where = f"seed {seed}, {campaign.engine}, {campaign.config}"
    with Consumer(consumer_path, RESERVATION) as consumer:
        effects = {e.key: e for e in consumer.scheduled_effects()}
        counts = consumer.effect_counts()
    outcomes = log.outcomes()
    performed = log.performances()
    twice = {key: [e["result"] for e in calls] for key, calls in performed.items() if len(calls) > 1}
    # A call of a key the service had already performed, that it did not refuse
    # by its deadline (sent after the performance): a blind re-run.  (A held
    # call is logged when decided: one read before the performance is not.)
    done_at: dict[str, int] = {}
    performed_at: dict[str, float] = {}
    resent: Counter[str] = Counter()
    for e in log.entries:
        if e["op"] == "perform" and e["key"] in done_at and e["outcome"] != "expired" \
                and not ("read_at" in e and e["key"] in performed_at and e["read_at"] < performed_at[e["key"]]):
            resent[e["key"]] += 1
        if e["performed"]:
            done_at.setdefault(e["key"], e["n"])
            if "at" in e:
                performed_at.setdefault(e["key"], e["at"])
    unknown = sorted(key for key, e in effects.items() if e.state == "unknown")
    unknown_performed = [key for key in unknown if key in performed]
    phases = kill_phases(campaign, log)
    calls = sum(n for o, n in outcomes.items() if o not in ("status", "garbled"))
    print(f"effect kill test [{campaign.engine}, {campaign.config}]: seed={seed} kills={campaign.kills} (early {campaign.early_kills}; "
          f"{', '.join(f'{p} {n}' for p, n in sorted(phases.items()))}) incarnations={campaign.incarnations} "
          f"effects={len(effects)} service calls={calls} performed={sum(len(v) for v in performed.values())} "
          f"(answer late {outcomes['late']}) failed={outcomes['fail']} expired={outcomes['expired']} "
          f"dedup={outcomes['dedup']} re-sent after performed={sum(resent.values())} status={outcomes['status']} "
          f"garbled={outcomes['garbled']} succeeded={counts['succeeded']} unknown={len(unknown)} "
          f"(of which performed {len(unknown_performed)}) performed twice={len(twice)} "
          f"final run {campaign.final_outcomes} in {campaign.seconds:.1f}s", flush=True)

    # Nothing performed twice, nothing performed that nobody scheduled, nothing lost from the outbox.
    assert not twice, f"{where}: performed twice: {dict(list(twice.items())[:5])} ({len(twice)} keys)"
    assert set(performed) <= set(effects), f"{where}: the service performed keys nobody scheduled"
    assert len(effects) == 3 * campaign.flows, (where, len(effects), campaign.flows)
    # Nothing is left to settle, and nothing went dead, expired or anywhere else.
    assert {s: n for s, n in counts.items() if n and s not in ("succeeded", "unknown")} == {}, (where, counts)
    for key, effect in effects.items():
        if effect.state == "succeeded":  # performed exactly once, and recorded with that performance's result
            assert key in performed, f"{where}: {key} succeeded but the service never performed it"
            assert effect.result == performed[key][0]["result"], (where, key, effect.result, performed[key])
    if config == "idempotent":  # re-runs by key are the point: the service's dedup absorbs them
        assert counts["succeeded"] == len(effects), f"{where}: lost (parked as unknown): {unknown[:5]}"
    else:  # never called again once performed: reconciled, or parked
        assert not resent, f"{where}: called again after it was performed: {dict(resent.most_common(5))}"
    if config == "reconcile":  # 0 lost
        assert counts["succeeded"] == len(effects), f"{where}: lost (parked as unknown): {unknown[:5]}"
    if config == "neither":  # every doubtful effect parked as unknown
        assert counts["succeeded"] + counts["unknown"] == len(effects), (where, counts)

    # The campaign really exercised doubt.
    assert outcomes["late"] >= 1, f"{where}: no call was performed and then timed out: proves nothing"
    assert campaign.running_at_kill, f"{where}: no kill landed while an effect was running: proves nothing"
    if kills >= 50:
        assert phases["after perform, before record"] >= 1, f"{where}: no kill after a perform, before its record"
        exercised = {"reconcile": sum(e.get("status_performed", False) for e in log.entries),
                     "idempotent": outcomes["dedup"], "neither": len(unknown_performed)}[config]
        assert exercised >= 1, f"{where}: the doubt was never settled the {config} way"


CONFIG_PARAMS = [pytest.param(c, id=c) for c in worker.CONFIGS]
CONCURRENT_PARAMS = [pytest.param(c, id=c) for c in worker.CONCURRENT_CONFIGS]




# -- the concurrent campaign (issue 20) ------------------------------------------------------


def schedule_mixed(seed: int) -> Any:
    """The apply handler of the concurrent campaign: every applied step
    schedules one call, of the sync or the async effect, quick, long or
    slow (with its hold), drawn from the seed and the step (so the same
    seed schedules the same calls)."""
    def schedule(ctx: ApplyContext) -> None:
        rng = random.Random(f"{seed}:{ctx.event.flow_id}:{ctx.event.kind}")
        name = worker.SYNC_EFFECT if rng.random() < 0.5 else worker.ASYNC_EFFECT
        draw = rng.random()
        kind = "long" if draw < P_LONG else "slow" if draw < P_LONG + P_SLOW else "quick"
        if ctx.event.flow_id in FIRST:  # the first incarnations surely time calls out and heartbeat
            name, kind = FIRST[ctx.event.flow_id][STEPS.index(ctx.event.kind)]
        ctx.schedule(name, {"flow": ctx.event.flow_id, "step": ctx.event.kind, "kind": kind,
                            "hold": worker.hold_for(kind, rng)})

    return schedule


def left_held(consumer_path: Location, owner: str) -> list[str]:
    """Keys of the effects the incarnation ``owner`` held when it was killed:
    a call or reconcile in progress (``running``), or a call past its
    timeout still running (``in_doubt``, still leased to it)."""
    with Consumer(consumer_path, RESERVATION) as consumer:
        return [e.key for state in ("running", "in_doubt") for e in consumer.scheduled_effects(state=state)
                if e.lease_owner is not None and e.lease_owner.rpartition("/")[0] == owner]


def stop_threads(executor: EffectExecutor, before: set[threading.Thread]) -> None:
    """Let the threads ``executor`` started in this process end (its event
    loop, its calls' threads), so the next campaign forks its children again."""
    executor.close()  # its event loop thread would stay
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith("reliable_flow-"):
            thread.join(WAIT)


def finish_concurrent(consumer_path: Location, config: str, socket: str) -> dict[str, int]:
    """:func:`finish` at ``concurrency=16``: one clean executor, in this
    process, until nothing is left to settle and no call is in flight.

    Its clock starts past every lease a killed child left and jumps past
    every backoff whenever nothing is due and nothing is in flight; the
    calls themselves (long, slow, timed out) take their real time.
    """
    shift = [worker.C_LEASE + 1.0]
    before = set(threading.enumerate())
    policy = worker.policy_for(config, clock=lambda: time.time() + shift[0], owner="final")
    with Consumer(consumer_path, RESERVATION, effects=worker.build_effects(config, socket, "final")) as consumer:
        executor = EffectExecutor(consumer, policy=policy, concurrency=worker.CONCURRENCY)
        try:
            end = time.monotonic() + FINAL_SECONDS
            while time.monotonic() < end:
                if executor.run_once().work == 0:
                    if executor.in_flight:  # a call past its timeout: held until it returns
                        time.sleep(0.01)
                    elif sum(consumer.effect_counts()[s] for s in UNSETTLED) == 0:
                        return executor.stats.outcomes
                    else:
                        shift[0] += 1.0
            pytest.fail(f"the clean executor did not settle everything in {FINAL_SECONDS:.0f}s: "
                        f"{consumer.effect_counts()} (in flight {executor.in_flight})")
        finally:
            stop_threads(executor, before)


def read_events(tmp_path: Path) -> list[dict[str, Any]]:
    """What the incarnations reported (a killed one's last line may be cut)."""
    out = []
    for path in sorted(tmp_path.glob("*.events")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def run_concurrent_campaign(tmp_path: Path, config: str, kills: int, seed: int, engine: str = "sqlite") -> None:
    """The campaign of a concurrent configuration: :data:`C_LIVE`
    incarnations alive at once, each at ``concurrency=16``; each round starts
    incarnations up to that number, waits a random delay and kills one of
    them (a random one, so some live long enough to finish long and slow
    calls); after the last round the survivor is killed too.  ``kills``
    counts them all."""
    print(f"\neffect kill test [{engine}, {config}]: RELIABLE_FLOW_SEED={seed} RELIABLE_FLOW_KILLS={kills}",
          flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    budget = 180.0 + 6.0 * kills  # the whole campaign's watchdog
    producer_path, consumer_path = new_stores(engine, tmp_path)
    log_path = tmp_path / "service.log"
    campaign = Campaign(config, seed, engine)
    base, _ = worker.split_config(config)
    handler = schedule_mixed(seed)
    service = FakeService(log_path, rng.randrange(2**32), base == "idempotent", budget + 60)
    live: list[Incarnation] = []

    def kill(victim: Incarnation, early: bool) -> None:
        where = f"seed {seed}, {config}, {victim.owner}"
        code = victim.kill_and_wait(WAIT)
        assert code == -signal.SIGKILL, f"{where}: the executor exited {code} before the kill:\n{victim.error()}"
        victim.close()
        live.remove(victim)
        campaign.kills += 1
        campaign.early_kills += early
        campaign.running_at_kill += [(victim.owner, key) for key in left_held(consumer_path, victim.owner)]

    try:
        campaign.flows = add_flows(producer_path, consumer_path, config, service.socket, 0, C_INITIAL_FLOWS, rng,
                                   handler)
        while campaign.kills < kills - (C_LIVE - 1):
            assert time.monotonic() - started < budget, f"seed {seed}: campaign watchdog ({budget:.0f}s) fired"
            if unsettled(consumer_path) < C_BACKLOG_LOW:
                campaign.flows = add_flows(producer_path, consumer_path, config, service.socket, campaign.flows,
                                           C_REFILL_FLOWS, rng, handler)
            new: list[Incarnation] = []
            while len(live) < C_LIVE:
                owner = f"inc-{campaign.incarnations}"
                campaign.incarnations += 1
                incarnation = start_incarnation(consumer_path, service, config, owner, tmp_path, budget,
                                                tmp_path / f"{owner}.events")
                live.append(incarnation)
                new.append(incarnation)
            if new and campaign.kills > 0 and rng.random() < EARLY_KILL_SHARE:  # kill timing only: may land before it opened the store
                time.sleep(rng.uniform(0, 0.03))
                kill(new[-1], early=True)
                continue
            for incarnation in new:
                if not incarnation.wait_ready(WAIT):
                    incarnation.kill_and_wait(WAIT)
                    pytest.fail(f"seed {seed}, {config}, {incarnation.owner}: the executor never became ready:\n"
                                f"{incarnation.error()}")
            time.sleep(rng.uniform(*FIRST_ROUND) if campaign.kills == 0 else rng.uniform(0, C_MAX_KILL_DELAY))
            kill(rng.choice(live), early=False)
        while live:
            kill(live[0], early=False)
        campaign.kill_seconds = time.monotonic() - started
        campaign.final_outcomes = dict(finish_concurrent(consumer_path, config, service.socket))
    finally:
        for incarnation in live:
            incarnation.kill_and_wait(WAIT)
            incarnation.close()
        stopped = service.stop()
    campaign.seconds = time.monotonic() - started
    assert stopped.startswith("stopped after"), (stopped, service.stderr_path.read_text())
    log = ServiceLog.read(log_path)
    check(campaign, consumer_path, log, kills)
    check_concurrent(campaign, consumer_path, log, read_events(tmp_path))


def check_concurrent(campaign: Campaign, consumer_path: Location, log: ServiceLog,
                     events: list[dict[str, Any]]) -> None:
    """No two calls of a key at once, no lease lost by a live executor, and
    what the concurrent campaign must really have exercised (the
    invariants themselves are :func:`check`'s); prints its report line first."""
    where = f"seed {campaign.seed}, {campaign.engine}, {campaign.config}"
    base = worker.split_config(campaign.config)[0]
    with Consumer(consumer_path, RESERVATION) as consumer:
        effects = {e.key: e for e in consumer.scheduled_effects()}
    calls = [e for e in events if e.get("ev") == "call"]
    kinds = Counter((e["kind"], "async" if _effect_name(e["key"]) == worker.ASYNC_EFFECT else "sync")
                    for e in log.entries if e["op"] == "perform" and e.get("kind"))
    long_kept = [e for e in calls if e["kind"] == "long" and e["end"] == "answered"
                 and e["seconds"] > worker.C_LEASE]
    slow_late = [e for e in calls if e["kind"] == "slow" and e["seconds"] > worker.C_TIMEOUT]
    timed_out = sum(e.get("ev") == "timed_out" for e in events)
    lease_lost = sum(e.get("ev") == "lease_lost" for e in events) + sum(e["lease_lost"] for e in calls)
    beats = sum(e["beats"] for e in calls)
    longest_beat = max((e["longest_beat"] for e in calls), default=0.0)
    drivers = Counter(e["driver"] for e in events if e.get("ev") == "start")
    final = campaign.final_outcomes
    print(f"effect kill test [{campaign.engine}, {campaign.config}]: calls by kind/function "
          f"{dict(sorted(kinds.items()))} abandoned={log.outcomes()['abandoned']} "
          f"long calls answered past the lease={len(long_kept)} heartbeats={beats} "
          f"(longest wait {longest_beat:.3f}s) timed out={timed_out} (+{final.get('timed_out', 0)} final) "
          f"slow calls returned past the timeout={len(slow_late)} "
          f"(+{final.get('late_outcome_discarded', 0)} final discarded) lease lost={lease_lost} "
          f"drivers={dict(drivers)} kills took {campaign.kill_seconds:.1f}s, the final run "
          f"{campaign.seconds - campaign.kill_seconds:.1f}s", flush=True)
    overlapping = overlaps(log)
    assert not overlapping, (f"{where}: {len(overlapping)} calls or reconciles of a key read while another call of "
                             f"it was in progress for a caller still alive: {overlapping[:3]}")
    assert lease_lost == 0, f"{where}: a live executor lost {lease_lost} claims (a lease ran out while it lived)"
    assert {"sync", "async"} <= {f for _, f in kinds}, f"{where}: not both functions were called: {kinds}"
    assert long_kept, f"{where}: no long call outlived the lease and was answered: heartbeats prove nothing"
    assert beats >= 1, f"{where}: no heartbeat"
    assert timed_out + final.get("timed_out", 0) >= 1, f"{where}: no call timed out"
    assert slow_late or final.get("late_outcome_discarded", 0), f"{where}: no late outcome was discarded"
    unknown_performed = [e.key for e in effects.values() if e.state == "unknown" and e.key in log.performances()]
    exercised = {"reconcile": sum(e.get("status_performed", False) for e in log.entries),
                 "idempotent": log.outcomes()["dedup"], "neither": len(unknown_performed)}[base]
    assert exercised >= 1, f"{where}: the doubt was never settled the {base} way"
    assert drivers["pump"] >= 1 and drivers["run_once"] >= 1, f"{where}: not both drivers ran: {drivers}"


def overlaps(log: ServiceLog) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs (a, b) of requests of one key where ``b`` (a call or a reconcile)
    was read while ``a``, a call whose caller was still connected when it
    was decided, was in progress (read, not yet decided): two executors
    calling one effect at once, which a held claim must prevent, whether or
    not both performed."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for e in log.entries:
        if "read_at" in e:
            by_key.setdefault(e["key"], []).append(e)
    return [(a, b) for calls in by_key.values() for a in calls
            if a["op"] == "perform" and a["outcome"] not in ("abandoned", "expired")
            for b in calls if b is not a and a["read_at"] < b["read_at"] < a["at"]]


def _effect_name(key: str) -> str:
    """The effect's name from its default key ``<consumer>:<event id>:<name>``."""
    return key.rpartition(":")[2]


def engine_kills(engine: str) -> int:
    """The default test's kills per configuration: 300 on SQLite, 60 on PostgreSQL (scaled by RELIABLE_FLOW_KILLS)."""
    kills = kill_count(DEFAULT_KILLS)
    return kills if engine == "sqlite" else max(1, POSTGRES_KILLS * kills // DEFAULT_KILLS)


def concurrent_kills(default: int) -> int:
    """The concurrent campaign's kills per configuration: ``RELIABLE_FLOW_C_KILLS=N`` sets it."""
    value = os.environ.get("RELIABLE_FLOW_C_KILLS")
    return max(C_LIVE, int(value)) if value else default


@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_effect_kill_loses_nothing_doubles_nothing(tmp_path: Path, engine: str, config: str) -> None:
    run_campaign(tmp_path, config, engine_kills(engine), chosen_seed(), engine)


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("RELIABLE_FLOW_SOAK"), reason="soak run: set RELIABLE_FLOW_SOAK=1")
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_effect_kill_soak(tmp_path: Path, config: str) -> None:
    run_campaign(tmp_path, config, kill_count(SOAK_KILLS), chosen_seed())


@pytest.mark.parametrize("config", CONCURRENT_PARAMS)
def test_effect_kill_concurrent_loses_nothing_doubles_nothing(tmp_path: Path, engine: str, config: str) -> None:
    """Issue 20: two executors alive at once, ``concurrency=16``, sync and
    async functions, long calls kept by heartbeats, calls past ``timeout=``."""
    run_concurrent_campaign(tmp_path, config, concurrent_kills(CONCURRENT_KILLS), chosen_seed(), engine)


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("RELIABLE_FLOW_SOAK"), reason="soak run: set RELIABLE_FLOW_SOAK=1")
@pytest.mark.parametrize("config", CONCURRENT_PARAMS)
def test_effect_kill_concurrent_soak(tmp_path: Path, config: str) -> None:
    run_concurrent_campaign(tmp_path, config, concurrent_kills(CONCURRENT_SOAK_KILLS), chosen_seed())
