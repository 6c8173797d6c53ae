"""The Worker: relays and applies continuously for several consumers, reports
progress, stops cleanly on stop() / SIGTERM / SIGINT, and survives SIGKILL
at any moment.

In-process tests use ``run(max_passes=...)`` or ``stop()``; the signal and
kill tests run the worker in a fresh interpreter (a small script written to
``tmp_path``) with an explicit environment and timeouts.

The kill test SIGKILLs a worker (with a feeder committing events and the
network re-sending some) at random moments, 30 times by default
(``RELIABLE_FLOW_WORKER_KILLS=N`` for more), restarting it each time, and
checks the files between incarnations.  The seed is printed;
``RELIABLE_FLOW_SEED=<seed>`` replays the same choices (the kill moments
themselves depend on timing).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import Consumer, DeliveryPolicy, Producer, Worker, WorkerStats
from reliable_flow.reservation import RESERVATION

KINDS = ("reserved", "confirmed", "released")
CHILD_TIMEOUT = 60
RELEASED = {"state": "released", "last_seq": 3, "held": 0}


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Unreachable(Consumer):
    """The transport to this consumer is down: every receive raises."""

    def receive(self, envelope_in: Any) -> Any:
        raise ConnectionError("connection refused")


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


def commit(producer: Producer, flow: str, upto: int = 3, amount: int = 3) -> None:
    for n in range(1, upto + 1):
        r = producer.advance(f"{flow}-{n}", flow, expected_seq=n - 1, kind=KINDS[n - 1], payload={"amount": amount})
        assert r.status == "committed", r


def rows(path: str | Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA query_only=ON")
        return conn.execute(sql).fetchall()


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Producer, Consumer, Consumer]]:
    with Producer(tmp_path / "producer.db", RESERVATION) as p, \
            Consumer(tmp_path / "projection.db", RESERVATION, name="projection") as a, \
            Consumer(tmp_path / "audit.db", RESERVATION, name="audit") as b:
        yield p, a, b


# -- in process ----------------------------------------------------------------------------


def test_a_worker_relays_and_applies_everything_for_several_consumers(
    two: tuple[Producer, Consumer, Consumer],
) -> None:
    producer, a, b = two
    for flow in ("A", "B", "C", "D"):
        commit(producer, flow)
    seen: list[dict[str, Any]] = []
    worker = Worker(producer, [a, b], idle_sleep=0, on_pass=lambda s: seen.append(s.as_dict()))
    stats = worker.run(max_passes=3, handle_signals=False)
    assert isinstance(stats, WorkerStats) and stats is worker.stats
    assert stats.as_dict() == {
        "passes": 3, "relayed": {"accepted": 24, "idle": 6}, "applied": 24, "stops": {},
        "errors": 0, "last_error": None,
    }
    assert [s["passes"] for s in seen] == [1, 2, 3]
    assert seen[0]["applied"] == 24 and seen[1]["applied"] == 24  # all done in the first pass
    for c in (a, b):
        for flow in "ABCD":
            assert c.projection(flow) == RELEASED
            assert [e.seq for e in c.effects(flow)] == [1, 2, 3]
    assert all(e.accepted for e in producer.outbox())
    assert worker.stopping is False


def test_small_batches_take_several_passes_and_count_every_step(two: tuple[Producer, Consumer, Consumer]) -> None:
    producer, a, b = two
    for flow in ("A", "B"):
        commit(producer, flow)
    worker = Worker(producer, [a, b], relay_batch=2, apply_limit=1, idle_sleep=0)
    assert worker.run_once() == 2 + 1 + 2 + 1  # 2 relays and 1 apply for each consumer
    stats = worker.run(max_passes=10, handle_signals=False)
    assert stats.relayed["accepted"] == 12 and stats.applied == 12
    assert all(c.projection(f) == RELEASED for c in (a, b) for f in "AB")


def test_a_consumer_that_raises_is_recorded_and_the_others_go_on(tmp_path: Path) -> None:
    clock = Clock()
    policy = DeliveryPolicy(clock=clock, random=lambda: 1.0, backoff_base=10.0)
    with Producer(tmp_path / "p.db", RESERVATION) as producer, \
            Unreachable(tmp_path / "down.db", RESERVATION, name="down") as down, \
            Consumer(tmp_path / "up.db", RESERVATION, name="up") as up:
        commit(producer, "A")
        worker = Worker(producer, [down, up], policy=policy, idle_sleep=0)
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


class FailsForFlow(Consumer):
    """The transport drops every event of one flow (e.g. its partition is down)."""

    bad_flow = "STUCK"

    def receive(self, envelope_in: Any) -> Any:
        if json.loads(envelope_in)["flow_id"] == self.bad_flow:
            raise ConnectionError(f"partition of {self.bad_flow} unreachable")
        return super().receive(envelope_in)


def test_a_flow_that_keeps_failing_does_not_hold_back_the_workers_other_flows(tmp_path: Path) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=5, backoff_base=0.5, backoff_cap=30.0, clock=clock, random=lambda: 1.0)
    healthy = [f"H{i:02d}" for i in range(50)]
    with Producer(tmp_path / "p.db", RESERVATION) as producer, \
            FailsForFlow(tmp_path / "c.db", RESERVATION) as c:
        commit(producer, "STUCK")  # the oldest events of all
        for flow in healthy:
            commit(producer, flow)

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


def test_the_worker_waits_out_a_full_inbox_and_drops_nothing(tmp_path: Path) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=5, backoff_base=0.5, backoff_cap=2.0, clock=clock, random=lambda: 1.0)
    flows = [f"F{i}" for i in range(6)]
    with Producer(tmp_path / "p.db", RESERVATION) as producer, \
            Consumer(tmp_path / "c.db", RESERVATION, max_inbox=2) as c:
        for flow in flows:  # F0-1, F0-2, F0-3, F1-1, ...: F0-3 arrives while F0-1 and F0-2 fill the inbox
            commit(producer, flow, amount=4)

        def tick(stats: WorkerStats) -> None:
            clock.t += 0.5

        worker = Worker(producer, [c], policy=policy, relay_batch=4, apply_limit=1, idle_sleep=0, on_pass=tick)
        stats = worker.run(max_passes=200, handle_signals=False)
        assert stats.errors > 0 and "InboxFull" in (stats.last_error or "")
        assert all(c.projection(f) == {"state": "released", "last_seq": 3, "held": 0} for f in flows)
        assert all(e.accepted for e in producer.outbox())
        assert rows(c.path, "SELECT count(*), count(DISTINCT event_id) FROM effect") == [(18, 18)]


def test_gaps_and_conflicts_are_counted_not_fatal(two: tuple[Producer, Consumer, Consumer]) -> None:
    producer, a, b = two
    a.receive({"event_id": "G-2", "flow_id": "G", "seq": 2, "kind": "confirmed", "schema": 1,
               "payload": {"amount": 3}})  # seq 1 of G never comes: a gap
    a.receive({"event_id": "A-1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1,
               "payload": {"amount": 9}})  # another A-1: the producer's A-1 conflicts
    commit(producer, "A", 1)
    worker = Worker(producer, [a, b], idle_sleep=0)
    stats = worker.run(max_passes=2, handle_signals=False)
    assert stats.relayed["id_conflict"] == 1 and stats.relayed["accepted"] == 1
    assert stats.stops["gap"] == 2  # G stops at its gap once per pass
    assert producer.outbox()[0].deliveries["projection"].state == "set_aside"


def test_stop_returns_after_the_current_step(two: tuple[Producer, Consumer, Consumer], tmp_path: Path) -> None:
    producer, _, b = two
    commit(producer, "A")
    commit(producer, "B")
    with StopsAfter(tmp_path / "projection.db", RESERVATION, name="projection") as a:
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
        assert rows(a.path, "SELECT count(*) FROM inbox") == [(3,)]
        assert b.flows() == []


def test_stop_from_on_pass_and_run_restores_signal_handlers(two: tuple[Producer, Consumer, Consumer]) -> None:
    producer, a, b = two
    commit(producer, "A")
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


def test_worker_needs_distinct_consumers(two: tuple[Producer, Consumer, Consumer], tmp_path: Path) -> None:
    producer, a, _ = two
    with pytest.raises(ValueError, match="at least one"):
        Worker(producer, [])
    with Consumer(tmp_path / "projection.db", RESERVATION) as again, pytest.raises(ValueError, match="distinct"):
        Worker(producer, [a, again])


# -- child processes -------------------------------------------------------------------------

CHILD = r'''
import json, os, random, sys, time
from reliable_flow import Consumer, DeliveryPolicy, Producer, Worker
from reliable_flow.reservation import RESERVATION

STEPS = ("reserved", "confirmed", "released")
FLOWS = ["F%02d" % i for i in range(20)]
CONFLICT = ("projection", "F07-1")  # the projection inbox holds another F07-1


def amount(flow):
    return 1 + int(flow[1:])


def open_all(d):
    producer = Producer(os.path.join(d, "producer.db"), RESERVATION)
    consumers = [Consumer(os.path.join(d, name + ".db"), RESERVATION, name=name) for name in ("projection", "audit")]
    return producer, consumers


def signal_mode(d):
    producer, consumers = open_all(d)

    def on_pass(stats):
        if stats.passes == 1:
            print("running", flush=True)

    worker = Worker(producer, consumers, policy=DeliveryPolicy(lease_seconds=30), relay_batch=10,
                    apply_limit=2, idle_sleep=0.05, on_pass=on_pass)
    stats = worker.run()
    print(json.dumps(stats.as_dict()), flush=True)
    for c in consumers:
        c.close()
    producer.close()
    return 0


def seq_of(producer, flow):
    found = producer.flow(flow)
    return 0 if found is None else found["seq"]


def settled(producer):
    if any(seq_of(producer, f) < 3 for f in FLOWS):
        return False
    return all(
        len(e.deliveries) == 2 and all(d.state in ("accepted", "set_aside") for d in e.deliveries.values())
        for e in producer.outbox()
    )


def kill_mode(d, seed, finish):
    rng = random.Random(seed)
    producer, consumers = open_all(d)
    policy = DeliveryPolicy(lease_seconds=0.2, backoff_base=0.01, backoff_cap=0.05)
    worker = Worker(producer, consumers, policy=policy, relay_batch=rng.randint(1, 8),
                    apply_limit=rng.randint(1, 3), idle_sleep=0)
    quota = 60 if finish else rng.randint(1, 4)  # events this incarnation may commit
    print("ready", flush=True)
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        for _ in range(rng.randint(0, 2)):
            open_flows = [f for f in FLOWS if seq_of(producer, f) < 3]
            if quota <= 0 or not open_flows:
                break
            flow = rng.choice(open_flows)
            seq = seq_of(producer, flow)
            r = producer.advance("%s-%d" % (flow, seq + 1), flow, expected_seq=seq, kind=STEPS[seq],
                                 payload={"amount": amount(flow)})
            if r.status != "committed":
                print("advance answered", r, file=sys.stderr)
                return 2
            quota -= 1
        if rng.random() < 0.3:  # the network delivers a committed event again
            ids = [e.event_id for e in producer.outbox()]
            if ids:
                event_id, consumer = rng.choice(ids), rng.choice(consumers)
                status = consumer.receive(producer.event(event_id)).status
                allowed = {"accepted", "duplicate"} | ({"id_conflict"} if (consumer.name, event_id) == CONFLICT else set())
                if status not in allowed:
                    print("receive answered", status, "for", event_id, file=sys.stderr)
                    return 2
        work = worker.run_once()
        if finish and work == 0 and settled(producer):
            print("done", json.dumps(worker.stats.as_dict()), flush=True)
            return 0
    return 3


if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "signal":
        sys.exit(signal_mode(d))
    sys.exit(kill_mode(d, int(sys.argv[3]), mode == "finish"))
'''


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    path = tmp_path / "worker_child.py"
    path.write_text(CHILD, encoding="utf-8")
    return path


def wait_for_line(proc: subprocess.Popen[str], expected: str, timeout: float = 30) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no {expected!r} from the child within {timeout} s"
    line = proc.stdout.readline()
    assert line.strip() == expected, (line, proc.poll())


def check_files_agree(d: Path) -> dict[str, Any]:
    """No half transaction anywhere: marks, inbox rows, effects and projections line up."""
    marks = rows(
        d / "producer.db",
        "SELECT d.consumer, o.event_id, o.body FROM delivery d JOIN outbox o ON o.pos = d.pos "
        "WHERE d.state = 'accepted'",
    )
    out: dict[str, Any] = {"accepted_marks": len(marks), "effects": 0}
    for name in ("projection", "audit"):
        path = d / f"{name}.db"
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
def test_a_worker_process_stops_cleanly_on_a_signal(tmp_path: Path, child_script: Path, sig: signal.Signals) -> None:
    with Producer(tmp_path / "producer.db", RESERVATION) as producer:
        for i in range(60):
            commit(producer, f"S{i:03d}")
    for name in ("projection", "audit"):
        Consumer(tmp_path / f"{name}.db", RESERVATION, name=name).close()
    with subprocess.Popen(
        [sys.executable, str(child_script), "signal", str(tmp_path)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path,
    ) as proc:
        try:
            wait_for_line(proc, "running")
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=CHILD_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert err == ""
    stats = json.loads(out.strip().splitlines()[-1])
    agree = check_files_agree(tmp_path)
    relayed = stats["relayed"]
    assert relayed.get("accepted", 0) + relayed.get("duplicate", 0) == agree["accepted_marks"]
    assert stats["applied"] == agree["effects"]
    assert 0 < stats["applied"] < 360  # stopped in the middle of the work
    # A new worker picks up where the stopped one left off.
    with Producer(tmp_path / "producer.db", RESERVATION) as producer, \
            Consumer(tmp_path / "projection.db", RESERVATION) as a, Consumer(tmp_path / "audit.db", RESERVATION) as b:
        Worker(producer, [a, b], relay_batch=1000, apply_limit=10, idle_sleep=0).run(max_passes=2, handle_signals=False)
        assert all(e.accepted for e in producer.outbox())
    assert check_files_agree(tmp_path)["effects"] == 360


_SIGNAL_IN_WAIT = r"""
import signal, sys, time
from reliable_flow import Consumer, Producer, Worker
from reliable_flow.reservation import RESERVATION

d = sys.argv[1]
with Producer(d + "/producer.db", RESERVATION) as p, Consumer(d + "/c.db", RESERVATION) as c:
    installed = []
    worker = Worker(p, [c], idle_sleep=0, on_pass=lambda s: installed.append(signal.getsignal(signal.SIGTERM)))
    worker.run(max_passes=1)
    signal.signal(signal.SIGTERM, installed[0])  # the handler run() installs
    event = getattr(worker, "_stop", None)
    lock = getattr(event, "_cond", None)
    if lock is not None:
        # The main thread is inside Event.wait(), between taking the event's
        # lock and going to sleep on it, when SIGTERM arrives.
        with lock:
            signal.raise_signal(signal.SIGTERM)
            pass
    else:
        signal.raise_signal(signal.SIGTERM)
    for _ in range(500):
        if worker.stopping:
            break
        time.sleep(0.01)
    print("returned", worker.stopping, flush=True)
"""


def test_a_signal_during_the_idle_wait_cannot_deadlock_the_worker(tmp_path: Path) -> None:
    """Regression: the handler used to call Event.set(), whose lock is not
    reentrant; a signal landing while the main thread held it inside
    Event.wait() (the idle sleep) hung the worker, and every later SIGTERM too."""
    with subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_IN_WAIT, str(tmp_path)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path,
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

    def __init__(self, d: Path) -> None:
        self.d = d
        self.prev: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        p = self.d / "producer.db"
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
            c = self.d / f"{name}.db"
            state[name] = {
                "inbox": {e: (f, s, b, st, r) for e, f, s, b, st, r in rows(
                    c, "SELECT event_id, flow_id, seq, body, state, reason FROM inbox")},
                "effects": rows(c, "SELECT event_id, flow_id, seq, kind FROM effect ORDER BY id"),
                "projection": {f: (st, s) for f, st, s in rows(c, "SELECT flow_id, state, last_seq FROM projection")},
            }
        return state

    def check(self, where: str) -> dict[str, Any]:
        now = self.read()
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


def test_a_worker_survives_sigkill_at_any_moment(tmp_path: Path, child_script: Path) -> None:
    kills = int(os.environ.get("RELIABLE_FLOW_WORKER_KILLS", "30"))
    seed = int(os.environ.get("RELIABLE_FLOW_SEED") or random.randrange(2**32))
    print(f"worker kill test: seed={seed} kills={kills} (replay with RELIABLE_FLOW_SEED={seed})")
    rng = random.Random(seed)
    Producer(tmp_path / "producer.db", RESERVATION).close()
    with Consumer(tmp_path / "projection.db", RESERVATION, name="projection") as projection:
        assert projection.receive(PLANTED).status == "accepted"
    Consumer(tmp_path / "audit.db", RESERVATION, name="audit").close()
    invariants = Invariants(tmp_path)
    invariants.check("start")
    started = time.monotonic()
    for k in range(kills):
        where = f"seed={seed} kill {k}"
        with subprocess.Popen(
            [sys.executable, str(child_script), "kill", str(tmp_path), str(rng.randrange(2**32))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path,
        ) as proc:
            try:
                if rng.random() < 0.15:  # now and then while it starts and opens the files
                    time.sleep(rng.uniform(0.0, 0.3))
                else:
                    wait_for_line(proc, "ready")
                    time.sleep(rng.uniform(0.0, 0.25))
                proc.kill()
                _, err = proc.communicate(timeout=CHILD_TIMEOUT)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        assert proc.returncode == -signal.SIGKILL, (where, proc.returncode, err)
        invariants.check(where)
    killed_for = time.monotonic() - started

    finish = subprocess.run(
        [sys.executable, str(child_script), "finish", str(tmp_path), str(rng.randrange(2**32))],
        check=False, capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=CHILD_TIMEOUT + 30,
    )
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
    return subprocess.run(
        [sys.executable, "-m", "reliable_flow", *args], check=False, capture_output=True, text=True,
        env=child_env(), cwd=cwd, timeout=CHILD_TIMEOUT,
    )


@pytest.fixture
def cli_files(tmp_path: Path) -> list[str]:
    if cli("run", "--help", cwd=tmp_path).returncode != 0:
        pytest.skip("`python -m reliable_flow run` does not exist yet (the CLI has no run command)")
    with Producer(tmp_path / "producer.db", RESERVATION) as producer:
        commit(producer, "A")
        commit(producer, "B")
    for name in ("projection", "audit"):
        Consumer(tmp_path / f"{name}.db", RESERVATION, name=name).close()
    return ["--producer", str(tmp_path / "producer.db"),
            "--consumer", f"projection={tmp_path / 'projection.db'}", "--consumer", f"audit={tmp_path / 'audit.db'}"]


def stopped_stats(stderr: str) -> dict[str, Any]:
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("run: stopped: "), stderr
    return dict(json.loads(last[len("run: stopped: "):]))


def test_cli_run_once_relays_and_applies(tmp_path: Path, cli_files: list[str]) -> None:
    proc = cli("run", *cli_files, "--once", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    stats = stopped_stats(proc.stderr)
    assert (stats["passes"], stats["applied"], stats["relayed"]["accepted"], stats["errors"]) == (1, 12, 12, 0)
    with Producer(tmp_path / "producer.db", RESERVATION) as producer:
        assert all(e.accepted for e in producer.outbox())
    for name in ("projection", "audit"):
        with Consumer(tmp_path / f"{name}.db", RESERVATION) as c:
            assert c.projection("A") == c.projection("B") == RELEASED
    again = cli("run", *cli_files, "--once", cwd=tmp_path)
    assert again.returncode == 0 and stopped_stats(again.stderr)["applied"] == 0


def test_cli_run_refuses_a_consumer_file_under_another_name(tmp_path: Path, cli_files: list[str]) -> None:
    proc = cli("run", "--producer", str(tmp_path / "producer.db"),
               "--consumer", f"audit={tmp_path / 'projection.db'}", "--once", cwd=tmp_path)
    assert proc.returncode != 0
    assert "projection" in proc.stderr and "Traceback" not in proc.stderr
    with Producer(tmp_path / "producer.db", RESERVATION) as producer:
        assert not any(e.deliveries for e in producer.outbox())  # nothing was relayed


def test_cli_run_stops_cleanly_on_sigterm(tmp_path: Path, cli_files: list[str]) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "reliable_flow", "run", *cli_files, "--idle-sleep", "0.05", "--report-every", "0.01"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path,
    ) as proc:
        try:
            assert proc.stderr is not None
            ready, _, _ = select.select([proc.stderr], [], [], 30)
            assert ready, "no progress report from `run` within 30 s"
            first = proc.stderr.readline()
            assert first.startswith("run: {"), first
            proc.send_signal(signal.SIGTERM)
            _, rest = proc.communicate(timeout=CHILD_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
    stats = stopped_stats(first + rest)
    assert stats["passes"] >= 1 and stats["errors"] == 0
    assert check_files_agree(tmp_path)["effects"] == stats["applied"]
