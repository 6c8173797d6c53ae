"""The Worker: relays and applies continuously for several consumers, reports
progress, stops cleanly on stop() / SIGTERM / SIGINT, and survives SIGKILL
at any moment.

In-process tests use ``run(max_passes=...)`` or ``stop()``; the signal and
kill tests run the worker in a fresh interpreter (``children/worker_child.py``)
with an explicit environment and timeouts.

The kill test SIGKILLs a worker (with a feeder committing events and the
network re-sending some) at random moments, 30 times by default
(``RELIABLE_FLOW_WORKER_KILLS=N`` for more), restarting it each time, and
checks the files between incarnations.  The seed is printed;
``RELIABLE_FLOW_SEED=<seed>`` replays the same choices (the kill moments
themselves depend on timing).

Every test runs on both engines (the ``at`` fixture; the child gets the
stores' locations), but the regression of a signal inside the idle wait, which
is about signal handling only; the kill test kills 10 times by default on
PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import rows
from reliable_flow import Consumer, DeliveryPolicy, Producer, Worker
from reliable_flow._loop import UNTIL_IDLE_MAX_SLEEP
from reliable_flow.records import PassResult, WorkerStats
from reliable_flow.reservation import RESERVATION
from support import (
    CHILD_TIMEOUT,
    CHILDREN,
    KINDS,
    Clock,
    Unreachable,
    child_env,
    child_process,
    chosen_seed,
    commit,
    run_cli,
    run_script,
)

WORKER_CHILD = CHILDREN / "worker_child.py"
At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine
RELEASED = {"state": "released", "last_seq": 3, "held": 0}


def worker_env() -> dict[str, str]:
    """The environment of the worker child processes and the CLI: no crash point, no bytecode written."""
    return child_env(PYTHONDONTWRITEBYTECODE="1")


class StopsAfter(Consumer):
    """Calls ``worker.stop()`` from inside its n-th receive (after storing it)."""

    worker: Worker
    n = 3
    calls = 0

    def receive(self, envelope_in: Any) -> Any:
        result = super().receive(envelope_in)
        self.calls += 1
        if self.calls == self.n:
            self.worker.stop()
        return result


@pytest.fixture
def two(at: At) -> Iterator[tuple[Producer, Consumer, Consumer]]:
    with Producer(at("producer"), RESERVATION) as p, \
            Consumer(at("projection"), RESERVATION, name="projection") as a, \
            Consumer(at("audit"), RESERVATION, name="audit") as b:
        for name in ("projection", "audit"):  # two consumers: each registered explicitly
            p.admin.register_consumer(name, actor="test", reason="one of two consumers")
        yield p, a, b


# -- in process ----------------------------------------------------------------------------


def test_a_worker_relays_and_applies_everything_for_several_consumers(
    two: tuple[Producer, Consumer, Consumer],
) -> None:
    producer, a, b = two
    for flow in ("A", "B", "C", "D"):
        commit(producer, flow, sep="-")
    seen: list[dict[str, Any]] = []
    worker = Worker(producer, [a, b], idle_sleep=0, on_pass=lambda s: seen.append(s.as_dict()))
    stats = worker.run(max_passes=3, handle_signals=False)
    assert isinstance(stats, WorkerStats) and stats is worker.stats
    assert stats.as_dict() == {
        "passes": 3, "relayed": {"accepted": 24, "idle": 6}, "applied": 24, "stops": {},
        "errors": 0, "last_error": None, "effects": {},
    }
    assert [s["passes"] for s in seen] == [1, 2, 3]
    assert seen[0]["applied"] == 24 and seen[1]["applied"] == 24  # all done in the first pass
    for c in (a, b):
        for flow in "ABCD":
            assert c.projection(flow) == RELEASED
            assert [e.seq for e in c.applied(flow)] == [1, 2, 3]
    assert all(e.accepted for e in producer.outbox())
    assert worker.stopping is False


def test_small_batches_take_several_passes_and_count_every_step(two: tuple[Producer, Consumer, Consumer]) -> None:
    producer, a, b = two
    for flow in ("A", "B"):
        commit(producer, flow, sep="-")
    # The two-step path (relay, then an apply pass) is what this test counts.
    worker = Worker(producer, [a, b], relay_batch=2, apply_limit=1, idle_sleep=0, apply_on_receive=False)
    assert worker.run_once().work == 2 + 1 + 2 + 1  # 2 relays and 1 apply for each consumer
    stats = worker.run(max_passes=10, handle_signals=False)
    assert stats.relayed["accepted"] == 12 and stats.applied == 12
    assert all(c.projection(f) == RELEASED for c in (a, b) for f in "AB")


def test_by_default_the_worker_applies_on_arrival_and_the_apply_pass_finds_the_rest(
    two: tuple[Producer, Consumer, Consumer],
) -> None:
    producer, a, b = two
    for flow in ("A", "B"):
        commit(producer, flow, sep="-")
    # G-2 waits at a gap in 'projection': applied by neither path until G-1 comes.
    a.receive({"event_id": "G-2", "flow_id": "G", "seq": 2, "kind": "confirmed", "schema": 1,
               "payload": {"amount": 3}})
    worker = Worker(producer, [a, b], relay_batch=2, apply_limit=1, idle_sleep=0)
    assert worker.run_once().work == (2 + 2) * 2  # each relay applied its event: a relay step and an apply step
    assert a.open_flows() == ["G"] and b.open_flows() == []
    stats = worker.run(max_passes=10, handle_signals=False)
    assert stats.relayed["accepted"] == 12 and stats.applied == 12
    assert all(c.projection(f) == RELEASED for c in (a, b) for f in "AB")
    assert stats.stops["gap"] > 0 and a.inbox("G")[0].state == "pending"
    assert rows(a.location, "SELECT count(*) FROM effect") == [(6,)]
    assert a.metrics().applied == 6  # counted by the consumer too


def test_a_consumer_that_raises_is_recorded_and_the_others_go_on(at: At) -> None:
    clock = Clock()
    policy = DeliveryPolicy(clock=clock, random=lambda: 1.0, backoff_base=10.0)
    with Producer(at("p"), RESERVATION) as producer, \
            Unreachable(at("down"), RESERVATION, name="down",
                        exc=lambda n: ConnectionError("connection refused")) as down, \
            Consumer(at("up"), RESERVATION, name="up") as up:
        commit(producer, "A", sep="-")
        worker = Worker(producer, [down, up], policy=policy, idle_sleep=0, register=True)
        stats = worker.run(max_passes=4, handle_signals=False)
        # One failed send per pass ends that consumer's turn; each event backs
        # off on its own, and the fourth pass finds nothing due for 'down'.
        assert stats.errors == 3 and stats.relayed["idle"] == 4 + 1
        assert stats.last_error == "down: ConnectionError: connection refused"
        assert up.projection("A") == RELEASED and stats.applied == 3
        deliveries = [e.deliveries["down"] for e in producer.outbox()]
        assert [(d.state, d.attempts, d.due_at) for d in deliveries] == [("pending", 1, 1010.0)] * 3
        clock.t += 10.0
        worker.run(max_passes=1, handle_signals=False)
        assert stats.errors == 4


def test_a_pass_says_when_the_worker_next_has_work(at: At) -> None:
    clock = Clock()
    policy = DeliveryPolicy(clock=clock, random=lambda: 1.0, backoff_base=3.0)
    with Producer(at("p"), RESERVATION) as producer, \
            Unreachable(at("down"), RESERVATION, name="down", exc=lambda n: ConnectionError("refused")) as down:
        worker = Worker(producer, [down], policy=policy, idle_sleep=0, register=True)
        assert worker.run_once() == PassResult(0, None)  # nothing committed: nothing waits
        producer.advance("A-1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        first = worker.run_once()  # the send fails: the event backs off 3 s
        assert first.work == 0 and first.wake_in == pytest.approx(3.0)
        clock.t += 2.0
        assert worker.run_once().wake_in == pytest.approx(1.0)
        clock.t += 60.0  # due long ago; it fails again and backs off 6 s (capped at the loop's look-again bound)
        assert worker.run_once().wake_in == pytest.approx(min(6.0, UNTIL_IDLE_MAX_SLEEP))
    with Producer(at("p2"), RESERVATION) as producer, Consumer(at("c2"), RESERVATION) as consumer:
        commit(producer, "B", sep="-")
        worker = Worker(producer, [consumer], idle_sleep=0)
        done = worker.run_once()
        assert done.work > 0 and done.wake_in == 0.0
        assert worker.run_once() == PassResult(0, None)


def test_a_flow_that_keeps_failing_does_not_hold_back_the_workers_other_flows(at: At) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=5, backoff_base=0.5, backoff_cap=30.0, clock=clock, random=lambda: 1.0)
    healthy = [f"H{i:02d}" for i in range(50)]
    with Producer(at("p"), RESERVATION) as producer, \
            Unreachable(at("c"), RESERVATION, fail_flows={"STUCK"},
                        exc=lambda n: ConnectionError("partition of STUCK unreachable")) as c:
        commit(producer, "STUCK", sep="-")  # the oldest events of all
        for flow in healthy:
            commit(producer, flow, sep="-")

        def tick(stats: WorkerStats) -> None:
            clock.t += 0.5  # each pass takes half a second of (injected) time
            if all(c.projection(f) == RELEASED for f in healthy):
                worker.stop()

        worker = Worker(producer, [c], policy=policy, relay_batch=10, idle_sleep=0, on_pass=tick)
        stats = worker.run(max_passes=100, handle_signals=False)
        assert worker.stopping, stats.as_dict()  # every healthy flow done within 100 passes
        assert stats.relayed["accepted"] == 150 and stats.applied == 150
        assert stats.errors > 3  # STUCK was retried, with backoff ...
        assert stats.errors < stats.passes  # ... but not on every pass
        assert stats.last_error == "default: ConnectionError: partition of STUCK unreachable"
        assert c.projection("STUCK") is None
        assert [e.state for e in producer.outbox("STUCK")] == ["pending"] * 3


def test_the_worker_waits_out_a_full_inbox_and_drops_nothing(at: At) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=5, backoff_base=0.5, backoff_cap=2.0, clock=clock, random=lambda: 1.0)
    flows = [f"F{i}" for i in range(6)]
    with Producer(at("p"), RESERVATION) as producer, \
            Consumer(at("c"), RESERVATION, max_inbox=2) as c:
        for flow in flows:  # F0-1, F0-2, F0-3, F1-1, ...: F0-3 arrives while F0-1 and F0-2 fill the inbox
            commit(producer, flow, amount=4, sep="-")

        def tick(stats: WorkerStats) -> None:
            clock.t += 0.5

        # Two-step: applying on arrival would keep the inbox from ever filling up.
        worker = Worker(producer, [c], policy=policy, relay_batch=4, apply_limit=1, idle_sleep=0, on_pass=tick,
                        apply_on_receive=False)
        stats = worker.run(max_passes=200, handle_signals=False)
        # A full inbox is an answer, not an error: counted as refused, waited out.
        assert stats.relayed["refused"] > 0 and (stats.errors, stats.last_error) == (0, None)
        assert all(c.projection(f) == {"state": "released", "last_seq": 3, "held": 0} for f in flows)
        assert all(e.accepted for e in producer.outbox())
        assert rows(c.location, "SELECT count(*), count(DISTINCT event_id) FROM effect") == [(18, 18)]


def test_gaps_and_conflicts_are_counted_not_fatal(two: tuple[Producer, Consumer, Consumer]) -> None:
    producer, a, b = two
    a.receive({"event_id": "G-2", "flow_id": "G", "seq": 2, "kind": "confirmed", "schema": 1,
               "payload": {"amount": 3}})  # seq 1 of G never comes: a gap
    a.receive({"event_id": "A-1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1,
               "payload": {"amount": 9}})  # another A-1: the producer's A-1 conflicts
    commit(producer, "A", 1, sep="-")
    worker = Worker(producer, [a, b], idle_sleep=0)
    stats = worker.run(max_passes=2, handle_signals=False)
    assert stats.relayed["id_conflict"] == 1 and stats.relayed["accepted"] == 1
    assert stats.stops["gap"] == 2  # G stops at its gap once per pass
    assert producer.outbox()[0].deliveries["projection"].state == "set_aside"


def test_stop_returns_after_the_current_step(two: tuple[Producer, Consumer, Consumer], at: At) -> None:
    producer, _, b = two
    commit(producer, "A", sep="-")
    commit(producer, "B", sep="-")
    with StopsAfter(at("projection"), RESERVATION, name="projection") as a:
        worker = Worker(producer, [a, b], idle_sleep=60)
        a.worker = worker
        started = time.monotonic()
        stats = worker.run(handle_signals=False)  # would sleep 60 s if stop() were lost
        assert time.monotonic() - started < 30
        assert worker.stopping is True
        # The third relay finished (stored and marked); nothing after it ran.
        assert stats.relayed["accepted"] == 3 and stats.applied == 0 and stats.passes == 0
        marks = [getattr(e.deliveries.get("projection"), "state", None) for e in producer.outbox()]
        assert marks == ["accepted"] * 3 + ["pending"] * 3
        assert rows(a.location, "SELECT count(*) FROM inbox") == [(3,)]
        assert b.flows() == []


def test_stop_from_on_pass_and_run_restores_signal_handlers(two: tuple[Producer, Consumer, Consumer]) -> None:
    producer, a, b = two
    commit(producer, "A", sep="-")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    during: list[Any] = []
    worker = Worker(producer, [a, b], idle_sleep=60)

    def on_pass(stats: WorkerStats) -> None:
        during.append(signal.getsignal(signal.SIGTERM))
        worker.stop()

    worker._on_pass = on_pass  # the attribute the constructor stores
    stats = worker.run()
    assert stats.passes == 1 and stats.applied == 6
    assert during and during[0] not in (before[signal.SIGTERM], signal.SIG_DFL)  # run() installed its own
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"relay_batch": 0}, "relay_batch"), ({"relay_batch": True}, "relay_batch"),
        ({"relay_batch": 1.5}, "relay_batch"), ({"apply_limit": 0}, "apply_limit"),
        ({"apply_limit": "3"}, "apply_limit"), ({"idle_sleep": -1}, "idle_sleep"),
        ({"idle_sleep": True}, "idle_sleep"), ({"idle_sleep": "1"}, "idle_sleep"),
    ],
)
def test_worker_rejects_bad_settings(two: tuple[Producer, Consumer, Consumer], kwargs: dict[str, Any], match: str) -> None:
    producer, a, _ = two
    with pytest.raises(ValueError, match=match):
        Worker(producer, [a], **kwargs)


def test_worker_needs_distinct_consumers(two: tuple[Producer, Consumer, Consumer], at: At) -> None:
    producer, a, _ = two
    with pytest.raises(ValueError, match="at least one"):
        Worker(producer, [])
    with Consumer(at("projection"), RESERVATION) as again, pytest.raises(ValueError, match="distinct"):
        Worker(producer, [a, again])


# -- child processes -------------------------------------------------------------------------

def stores(at: At, labels: tuple[str, ...] = ("producer", "projection", "audit")) -> str:
    """worker_child.py's DIR argument naming each store (either engine)."""
    return json.dumps({label: at(label) for label in labels})


def wait_for_line(proc: subprocess.Popen[str], expected: str, timeout: float = 30) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no {expected!r} from the child within {timeout} s"
    line = proc.stdout.readline()
    assert line.strip() == expected, (line, proc.poll())


def check_files_agree(d: Path | At) -> dict[str, Any]:
    """No half transaction anywhere: marks, inbox rows, effects and projections line up.
    ``d``: the directory of the SQLite files, or ``at`` (the stores of either engine)."""
    where: At = d if callable(d) else (lambda label: str(d / f"{label}.db"))
    marks = rows(
        where("producer"),
        "SELECT d.consumer, o.event_id, o.body FROM delivery d JOIN outbox o ON o.pos = d.pos "
        "WHERE d.state = 'accepted'",
    )
    out: dict[str, Any] = {"accepted_marks": len(marks), "effects": 0}
    for name in ("projection", "audit"):
        path = where(name)
        inbox = {e: b for e, b in rows(path, "SELECT event_id, body FROM inbox")}
        for consumer, event_id, body in marks:
            if consumer == name:
                assert inbox.get(event_id) == body, (name, event_id)  # accepted mark => inbox row
        applied = sorted(e for (e,) in rows(path, "SELECT event_id FROM inbox WHERE state = 'applied'"))
        effects = sorted(e for (e,) in rows(path, "SELECT event_id FROM effect"))
        assert applied == effects, name
        for flow, last_seq, count, top in rows(
            path,
            "SELECT p.flow_id, p.last_seq, count(e.id), max(e.seq) FROM projection p "
            "JOIN effect e ON e.flow_id = p.flow_id GROUP BY p.flow_id",
        ):
            assert last_seq == count == top, (name, flow)
        out["effects"] += len(effects)
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_process_stops_cleanly_on_a_signal(tmp_path: Path, at: At, sig: signal.Signals) -> None:
    with Producer(at("producer"), RESERVATION) as producer:
        for i in range(60):
            commit(producer, f"S{i:03d}", sep="-")
    for name in ("projection", "audit"):
        Consumer(at(name), RESERVATION, name=name).close()
    with child_process([sys.executable, str(WORKER_CHILD), "signal", stores(at)],
                       env=worker_env(), cwd=tmp_path) as proc:
        wait_for_line(proc, "running")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, err
    assert err == ""
    stats = json.loads(out.strip().splitlines()[-1])
    agree = check_files_agree(at)
    relayed = stats["relayed"]
    assert relayed.get("accepted", 0) + relayed.get("duplicate", 0) == agree["accepted_marks"]
    assert stats["applied"] == agree["effects"]
    assert 0 < stats["applied"] < 360  # stopped in the middle of the work
    # A new worker picks up where the stopped one left off.
    with Producer(at("producer"), RESERVATION) as producer, \
            Consumer(at("projection"), RESERVATION) as a, Consumer(at("audit"), RESERVATION) as b:
        Worker(producer, [a, b], relay_batch=1000, apply_limit=10, idle_sleep=0).run(max_passes=2, handle_signals=False)
        assert all(e.accepted for e in producer.outbox())
    assert check_files_agree(at)["effects"] == 360


def test_a_signal_during_the_idle_wait_cannot_deadlock_the_worker(tmp_path: Path) -> None:
    """Regression: the handler used to call Event.set(), whose lock is not
    reentrant; a signal landing while the main thread held it inside
    Event.wait() (the idle sleep) hung the worker, and every later SIGTERM too."""
    with subprocess.Popen(
        [sys.executable, str(WORKER_CHILD), "signal-in-wait", str(tmp_path)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=worker_env(), cwd=tmp_path,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=4)
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGTERM would not help: the handler runs again and blocks again
            out, err = proc.communicate()
    assert (proc.returncode, out.strip()) == (0, "returned True"), err


# -- SIGKILL at random moments -------------------------------------------------------------

FLOWS = [f"F{i:02d}" for i in range(20)]
PLANTED = {"event_id": "F07-1", "flow_id": "F07", "seq": 1, "kind": "reserved", "schema": 1,
           "payload": {"amount": 999}}


class Invariants:
    """Reads the three files between incarnations and checks them against each
    other and against everything seen at earlier checks."""

    def __init__(self, at: At) -> None:
        self.at = at
        self.prev: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        p = self.at("producer")
        state: dict[str, Any] = {
            "flows": {f: (s, st) for f, s, st in rows(p, "SELECT flow_id, seq, state FROM flow")},
            "outbox": {e: (f, s, b) for e, f, s, b in rows(p, "SELECT event_id, flow_id, seq, body FROM outbox")},
            "delivery": {
                (c, e): st for c, e, st in rows(
                    p, "SELECT d.consumer, o.event_id, d.state FROM delivery d JOIN outbox o ON o.pos = d.pos"
                )
            },
        }
        for name in ("projection", "audit"):
            c = self.at(name)
            state[name] = {
                "inbox": {e: (f, s, b, st, r) for e, f, s, b, st, r in rows(
                    c, "SELECT event_id, flow_id, seq, body, state, reason FROM inbox")},
                "effects": rows(c, "SELECT event_id, flow_id, seq, kind FROM effect ORDER BY id"),
                "projection": {
                    f: (st, s) for f, st, s in rows(c, "SELECT flow_id, state, last_seq FROM projection")
                },
            }
        return state

    def check(self, where: str) -> dict[str, Any]:
        # Read until two reads agree: on PostgreSQL the backend of a client just SIGKILLed may still
        # be finishing its COMMIT, which could land between the reads of two tables.
        now, again = self.read(), self.read()
        for _ in range(50):
            if now == again:
                break
            time.sleep(0.1)
            now, again = again, self.read()
        outbox, delivery = now["outbox"], now["delivery"]
        planted_body = json.dumps(PLANTED, sort_keys=True, separators=(",", ":"))
        # committed: flow row and outbox rows together, gap-free
        for flow, (seq, state) in now["flows"].items():
            assert sorted(s for f, s, _ in outbox.values() if f == flow) == list(range(1, seq + 1)), (where, flow)
            assert state == KINDS[seq - 1], (where, flow)
        assert {f for f, _, _ in outbox.values()} == set(now["flows"]), where
        assert delivery.get(("projection", "F07-1")) != "accepted", where  # a conflict is never accepted
        for name in ("projection", "audit"):
            mine = now[name]
            inbox = mine["inbox"]
            for (consumer, event_id), state in delivery.items():
                if consumer == name and state == "accepted":
                    assert inbox[event_id][2] == outbox[event_id][2], (where, name, event_id)
            for event_id, (flow, seq, body, _, _) in inbox.items():
                if (name, event_id) == ("projection", "F07-1"):
                    assert body == planted_body, where
                else:  # only committed events ever reach an inbox
                    assert outbox[event_id] == (flow, seq, body), (where, name, event_id)
            effects = mine["effects"]
            assert len({e for e, *_ in effects}) == len(effects), (where, name)  # no effect twice
            applied = {e for e, (_, _, _, st, _) in inbox.items() if st == "applied"}
            assert applied == {e for e, *_ in effects}, (where, name)
            by_flow: dict[str, list[tuple[Any, ...]]] = {}
            for effect in effects:
                by_flow.setdefault(effect[1], []).append(effect)
            assert set(by_flow) == set(mine["projection"]), (where, name)
            for flow, done in by_flow.items():
                assert [s for _, _, s, _ in done] == list(range(1, len(done) + 1)), (where, name, flow)  # gap-free
                assert mine["projection"][flow] == (done[-1][3], len(done)), (where, name, flow)
                for event_id, _, seq, kind in done:
                    assert inbox[event_id][:2] == (flow, seq) and kind == KINDS[seq - 1], (where, name, event_id)
        if self.prev is not None:  # nothing committed, accepted, stored or applied is ever lost
            prev = self.prev
            assert prev["outbox"].items() <= outbox.items(), where
            for key, state in prev["delivery"].items():
                if state in ("accepted", "set_aside"):
                    assert delivery[key] == state, (where, key)
            for name in ("projection", "audit"):
                assert now[name]["effects"][: len(prev[name]["effects"])] == prev[name]["effects"], (where, name)
                assert set(prev[name]["inbox"]) <= set(now[name]["inbox"]), (where, name)
        self.prev = now
        return now


def test_a_worker_survives_sigkill_at_any_moment(tmp_path: Path, engine: str, at: At) -> None:
    # A volume knob: fewer kills on PostgreSQL by default (each incarnation
    # connects anew), RELIABLE_FLOW_WORKER_KILLS=N on both.
    kills = int(os.environ.get("RELIABLE_FLOW_WORKER_KILLS", "30" if engine == "sqlite" else "10"))
    seed = chosen_seed()
    print(f"worker kill test: seed={seed} kills={kills} (replay with RELIABLE_FLOW_SEED={seed})")
    rng = random.Random(seed)
    Producer(at("producer"), RESERVATION).close()
    with Consumer(at("projection"), RESERVATION, name="projection") as projection:
        assert projection.receive(PLANTED).status == "accepted"
    Consumer(at("audit"), RESERVATION, name="audit").close()
    invariants = Invariants(at)
    invariants.check("start")
    started = time.monotonic()
    for k in range(kills):
        where = f"seed={seed} kill {k}"
        with child_process([sys.executable, str(WORKER_CHILD), "kill", stores(at), str(rng.randrange(2**32))],
                           env=worker_env(), cwd=tmp_path) as proc:
            if rng.random() < 0.15:  # now and then while it starts and opens the files
                time.sleep(rng.uniform(0.0, 0.3))
            else:
                wait_for_line(proc, "ready")
                time.sleep(rng.uniform(0.0, 0.25))
            proc.kill()
            _, err = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == -signal.SIGKILL, (where, proc.returncode, err)
        invariants.check(where)
    killed_for = time.monotonic() - started

    finish = run_script(WORKER_CHILD, "finish", stores(at), str(rng.randrange(2**32)),
                        env=worker_env(), cwd=tmp_path, timeout=CHILD_TIMEOUT + 30)
    assert finish.returncode == 0, (seed, finish.returncode, finish.stderr)
    assert "done" in finish.stdout
    final = invariants.check(f"seed={seed} final")

    # Eventually: every committed event accepted by both consumers, except the conflict.
    assert len(final["outbox"]) == 60
    not_accepted = {key: state for key, state in final["delivery"].items() if state != "accepted"}
    assert not_accepted == {("projection", "F07-1"): "set_aside"}, seed
    audit, projection = final["audit"], final["projection"]
    assert len(audit["effects"]) == 60 and set(audit["projection"].values()) == {("released", 3)}
    assert {f: v for f, v in projection["projection"].items() if f != "F07"} == {
        f: ("released", 3) for f in FLOWS if f != "F07"
    }
    assert projection["projection"]["F07"] == ("reserved", 1)  # the planted F07-1, then F07-2 blocks
    assert projection["inbox"]["F07-2"][3:] == ("blocked", "invalid_payload")
    assert len(projection["effects"]) == 58
    print(f"worker kill test: {kills} kills in {killed_for:.1f} s")


# -- command line --------------------------------------------------------------------------


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=CHILD_TIMEOUT, env=worker_env())


@pytest.fixture
def cli_files(tmp_path: Path, at: At) -> list[str]:
    if cli("run", "--help", cwd=tmp_path).returncode != 0:
        pytest.skip("`python -m reliable_flow run` does not exist yet (the CLI has no run command)")
    with Producer(at("producer"), RESERVATION) as producer:
        commit(producer, "A", sep="-")
        commit(producer, "B", sep="-")
    for name in ("projection", "audit"):
        Consumer(at(name), RESERVATION, name=name).close()
    return ["--producer", str(at("producer")),
            "--consumer", f"projection={at('projection')}", "--consumer", f"audit={at('audit')}",
            "--register"]


def stopped_stats(stderr: str) -> dict[str, Any]:
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("run: stopped: "), stderr
    return dict(json.loads(last[len("run: stopped: "):]))


def test_cli_run_once_relays_and_applies(tmp_path: Path, at: At, cli_files: list[str]) -> None:
    proc = cli("run", *cli_files, "--once", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    stats = stopped_stats(proc.stderr)
    assert (stats["passes"], stats["applied"], stats["relayed"]["accepted"], stats["errors"]) == (1, 12, 12, 0)
    with Producer(at("producer"), RESERVATION) as producer:
        assert all(e.accepted for e in producer.outbox())
    for name in ("projection", "audit"):
        with Consumer(at(name), RESERVATION) as c:
            assert c.projection("A") == c.projection("B") == RELEASED
    again = cli("run", *cli_files, "--once", cwd=tmp_path)
    assert again.returncode == 0 and stopped_stats(again.stderr)["applied"] == 0


def test_cli_run_refuses_a_consumer_file_under_another_name(tmp_path: Path, at: At, cli_files: list[str]) -> None:
    proc = cli("run", "--producer", str(at("producer")),
               "--consumer", f"audit={at('projection')}", "--once", cwd=tmp_path)
    assert proc.returncode != 0
    assert "projection" in proc.stderr and "Traceback" not in proc.stderr
    with Producer(at("producer"), RESERVATION) as producer:
        assert not any(e.deliveries for e in producer.outbox())  # nothing was relayed


def test_cli_run_stops_cleanly_on_sigterm(tmp_path: Path, at: At, cli_files: list[str]) -> None:
    with child_process(
        [sys.executable, "-m", "reliable_flow", "run", *cli_files, "--idle-sleep", "0.05", "--report-every", "0.01"],
        env=worker_env(), cwd=tmp_path,
    ) as proc:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        assert ready, "no progress report from `run` within 30 s"
        first = proc.stderr.readline()
        assert first.startswith("run: {"), first
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
    stats = stopped_stats(first + rest)
    assert stats["passes"] >= 1 and stats["errors"] == 0
    assert check_files_agree(at)["effects"] == stats["applied"]


# A protocol module whose import waits for a file "go" in the current directory: the command
# that imports it (--protocol held_protocol:RESERVATION) is still loading its options, before
# any store is open and before its loop installs its own signal handlers.
HELD_PROTOCOL = ("import pathlib, time\n"
                 "pathlib.Path('loading').touch()\n"
                 "while not pathlib.Path('go').exists():\n"
                 "    time.sleep(0.01)\n"
                 "from reliable_flow.reservation import RESERVATION\n")


@pytest.mark.parametrize(("command", "sig"), [
    ("run", signal.SIGTERM), ("run", signal.SIGINT), ("run --async", signal.SIGTERM),
    ("run --to", signal.SIGTERM), ("bridge", signal.SIGTERM),
], ids=["run-SIGTERM", "run-SIGINT", "run-async-SIGTERM", "run-to-SIGTERM", "bridge-SIGTERM"])
def test_cli_stops_cleanly_on_a_signal_before_its_loop_starts(
    tmp_path: Path, at: At, cli_files: list[str], request: pytest.FixtureRequest, command: str, sig: signal.Signals,
) -> None:
    """A signal right after start (here: while --protocol is imported) stops the command
    before its loop's first pass, as one during the loop does: ``stopped:``, exit 0; it
    used to kill the process (-15, or a KeyboardInterrupt traceback)."""
    url = request.getfixturevalue("redis_url") if command in ("run --to", "bridge") else ""
    argv = {"run": ["run", *cli_files], "run --async": ["run", "--async", *cli_files],
            "run --to": ["run", "--producer", at("producer"), "--to", url, "--consumer", "projection"],
            "bridge": ["bridge", at("projection"), "--redis", url]}[command]
    (tmp_path / "held_protocol.py").write_text(HELD_PROTOCOL)
    with child_process([sys.executable, "-m", "reliable_flow", *argv, "--protocol", "held_protocol:RESERVATION"],
                       env=worker_env(), cwd=tmp_path) as proc:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not (tmp_path / "loading").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tmp_path / "loading").exists() and proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        (tmp_path / "go").touch()
        _, err = proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    prefix = f"{command.split()[0]}: stopped: "
    assert last.startswith(prefix), err
    assert json.loads(last[len(prefix):])["passes"] == 0  # stopped before its first pass
    with Producer(at("producer"), RESERVATION) as producer:
        assert not any(e.deliveries for e in producer.outbox())  # nothing was relayed


def test_a_second_signal_while_starting_ends_the_command(tmp_path: Path, cli_files: list[str]) -> None:
    """The first SIGTERM while the command is still starting is kept for its loop; a
    second one acts as without the handler (an operator can always end a command stuck
    opening a store), here ending the process by SIGTERM."""
    (tmp_path / "held_protocol.py").write_text(HELD_PROTOCOL)
    with child_process([sys.executable, "-m", "reliable_flow", "run", *cli_files, "--protocol",
                        "held_protocol:RESERVATION"], env=worker_env(), cwd=tmp_path) as proc:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not (tmp_path / "loading").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tmp_path / "loading").exists() and proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()  # kept, not acted on
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGTERM)  # repeated: two signals in a row may arrive as one
            time.sleep(0.2)
        proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == -signal.SIGTERM
