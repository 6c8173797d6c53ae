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
from reliable_flow._executor import EffectExecutor
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
                      max_seconds: float) -> Incarnation:
    """Fork an executor child (fast); a subprocess instead if this process has threads."""
    error_path = tmp_path / f"{owner}.error"
    if threading.active_count() > 1:  # fork only a process without threads
        with open(error_path, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(consumer_path), service.socket, config, owner, str(max_seconds)],
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
                       lambda: os.write(write_fd, b"ready\n"), max_seconds)
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
              rng: random.Random) -> int:
    """Commit, relay and apply three steps of ``n`` new flows: 3n effects scheduled."""
    with Producer(producer_path, RESERVATION) as producer, \
            Consumer(consumer_path, RESERVATION, handlers=[schedule_call],
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
        return [e.key for e in consumer.effect_outbox(state="running")
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
            if executor.run_once() == 0:
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
        elif outcomes:
            phases["after a refused call, before record"] += 1
        else:
            phases["claimed, before the call reached the service"] += 1
    phases["idle or outside a call"] = campaign.kills - len(campaign.running_at_kill)
    return phases


def check(campaign: Campaign, consumer_path: Location, log: ServiceLog, kills: int) -> None:
    """Every effect against the service's log; prints the report line first."""
    config, seed = campaign.config, campaign.seed
    where = f"seed {seed}, {campaign.engine}, {config}"
    with Consumer(consumer_path, RESERVATION) as consumer:
        effects = {e.key: e for e in consumer.effect_outbox()}
        counts = consumer.effect_counts()
    outcomes = log.outcomes()
    performed = log.performances()
    twice = {key: [e["result"] for e in calls] for key, calls in performed.items() if len(calls) > 1}
    # A call of a key the service had already performed, that it did not refuse
    # by its deadline (sent after the performance): a blind re-run.
    done_at: dict[str, int] = {}
    resent: Counter[str] = Counter()
    for e in log.entries:
        if e["op"] == "perform" and e["key"] in done_at and e["outcome"] != "expired":
            resent[e["key"]] += 1
        if e["performed"]:
            done_at.setdefault(e["key"], e["n"])
    unknown = sorted(key for key, e in effects.items() if e.state == "unknown")
    unknown_performed = [key for key in unknown if key in performed]
    phases = kill_phases(campaign, log)
    calls = sum(n for o, n in outcomes.items() if o not in ("status", "garbled"))
    print(f"effect kill test [{campaign.engine}, {config}]: seed={seed} kills={campaign.kills} (early {campaign.early_kills}; "
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




def engine_kills(engine: str) -> int:
    """The default test's kills per configuration: 300 on SQLite, 60 on PostgreSQL (scaled by RELIABLE_FLOW_KILLS)."""
    kills = kill_count(DEFAULT_KILLS)
    return kills if engine == "sqlite" else max(1, POSTGRES_KILLS * kills // DEFAULT_KILLS)


@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_effect_kill_loses_nothing_doubles_nothing(tmp_path: Path, engine: str, config: str) -> None:
    run_campaign(tmp_path, config, engine_kills(engine), chosen_seed(), engine)


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("RELIABLE_FLOW_SOAK"), reason="soak run: set RELIABLE_FLOW_SOAK=1")
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_effect_kill_soak(tmp_path: Path, config: str) -> None:
    run_campaign(tmp_path, config, kill_count(SOAK_KILLS), chosen_seed())
