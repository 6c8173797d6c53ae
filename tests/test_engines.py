"""The core behaviour on both storage engines, through the public API only.

Every test here runs twice: on SQLite files and on PostgreSQL schemas (the
session's private server, ``tests/pg_cluster.py``; a fresh schema per
store).  They are representative assertions of the bigger per-feature
files (which run on SQLite): advance, receive and apply statuses, drain and
``process_all`` with ``batch_size``, ``producer.batch()``, ``relay`` and
``relay_batch`` with leases, the consumer registry, pruning with
tombstones, the receive-and-apply mode, the effect executor, and delivery
across engines (PostgreSQL -> SQLite and SQLite -> PostgreSQL).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_reads import ENGINES
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectExecutor,
    EffectRegistry,
    Producer,
    Worker,
    relay,
    relay_batch,
)
from reliable_flow.errors import NotResolvable, UnknownConsumer
from reliable_flow.reservation import RESERVATION
from support import KINDS, Clock, Unreachable, advance_step, commit, envelope, relay_log


@dataclass
class Engine:
    """Where one test's stores live: ``location(label)`` is a fresh store
    location of this engine (a file in ``tmp_path``, or a new PostgreSQL schema)."""

    name: str
    tmp: Path

    def location(self, label: str) -> Any:
        if self.name == "sqlite":
            return self.tmp / f"{label}.db"
        from pg_cluster import pg_location

        return pg_location(label)


def make_engine(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    if name == "postgres":
        pytest.importorskip("psycopg")
        request.getfixturevalue("pg_cluster")  # started (or skipped / failed) here
    return Engine(name, tmp_path)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    return make_engine(request.param, request, tmp_path)


@dataclass
class Locations:
    producer: Any
    consumer: Any


@pytest.fixture
def where(engine: Engine) -> Locations:
    """A producer location and a consumer location of the engine under test."""
    return Locations(engine.location("producer"), engine.location("consumer"))


@pytest.fixture
def p(where: Locations) -> Iterator[Producer]:
    with Producer(where.producer, RESERVATION) as producer:
        yield producer


@pytest.fixture
def c(where: Locations) -> Iterator[Consumer]:
    with Consumer(where.consumer, RESERVATION) as consumer:
        yield consumer


def advance(p: Any, event_id: str, flow: str, expected: int, amount: int = 3) -> Any:
    return p.advance(event_id, flow, expected_seq=expected, kind=KINDS[expected], payload={"amount": amount})


# -- advance ---------------------------------------------------------------------------------


def test_advance_answers_committed_existing_stale_and_conflict(p: Producer) -> None:
    assert (advance(p, "A1", "A", 0).status, advance(p, "A1", "A", 0).status) == ("committed", "existing")
    assert advance(p, "A1-other", "A", 0).status == "stale"  # the flow moved past expected_seq 0
    conflict = advance(p, "A1", "A", 0, amount=9)
    assert (conflict.status, conflict.seq) == ("conflict", 1)
    assert advance(p, "A2", "A", 1).status == "committed"
    assert p.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}
    assert [(e.event_id, e.seq, e.accepted) for e in p.outbox("A")] == [("A1", 1, False), ("A2", 2, False)]
    assert p.event("A1")["payload"] == {"amount": 3}
    assert p.flows() == ["A"]


def test_a_batch_commits_all_its_advances_or_none(p: Producer) -> None:
    with p.batch() as b:
        assert advance_step(b, "A1", "A", 1).status == "committed"
        assert advance_step(b, "A2", "A", 2).status == "committed"  # sees the batch's own A1
        assert advance_step(b, "B1", "B", 1).status == "committed"
        assert advance_step(b, "A1", "A", 1).status == "existing"
    assert [e.event_id for e in p.outbox()] == ["A1", "A2", "B1"]

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), p.batch() as b:
        assert advance_step(b, "C1", "C", 1).status == "committed"
        assert advance_step(b, "A3", "A", 3).status == "committed"
        raise Abandon
    assert p.flow("C") is None and p.flow("A")["seq"] == 2
    assert [e.event_id for e in p.outbox()] == ["A1", "A2", "B1"]


# -- receive and apply ------------------------------------------------------------------------


def test_receive_answers_accepted_duplicate_id_conflict_and_sequence_conflict(c: Consumer) -> None:
    assert c.receive(envelope("A1", "A", 1)).status == "accepted"
    assert c.receive(envelope("A1", "A", 1)).status == "duplicate"
    assert c.receive(envelope("A1", "A", 1, amount=9)).status == "id_conflict"
    assert c.receive(envelope("X1", "A", 1)).status == "sequence_conflict"
    many = c.receive_many([envelope("A2", "A", 2), envelope("A1", "A", 1), envelope("Y2", "A", 2)])
    assert [r.status for r in many] == ["accepted", "duplicate", "sequence_conflict"]  # type: ignore[union-attr]
    assert [(e.event_id, e.seq, e.state) for e in c.inbox("A")] == [("A1", 1, "pending"), ("A2", 2, "pending")]


def test_apply_next_answers_applied_gap_blocked_and_idle(c: Consumer) -> None:
    assert c.apply_next("A").status == "idle"
    c.receive(envelope("A2", "A", 2))
    assert c.apply_next("A").status == "gap"
    c.receive(envelope("A1", "A", 1))
    assert (c.apply_next("A").status, c.apply_next("A").status, c.apply_next("A").status) == (
        "applied", "applied", "idle")
    assert c.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}
    assert [(e.event_id, e.seq, e.kind) for e in c.applied("A")] == [("A1", 1, "reserved"), ("A2", 2, "confirmed")]
    c.receive(envelope("B1", "B", 1, kind="released"))  # not a legal first step
    blocked = c.apply_next("B")
    assert (blocked.status, blocked.reason, blocked.event_id) == ("blocked", "invalid_transition", "B1")
    assert c.inbox("B")[0].state == "blocked" and c.projection("B") is None
    assert c.open_flows() == ["B"]


@pytest.mark.parametrize("batch_size", [1, 2, 50])
def test_drain_and_process_all_with_a_batch_size(c: Consumer, batch_size: int) -> None:
    for flow in ("A", "B", "C"):
        for seq in (1, 2, 3):
            c.receive(envelope(f"{flow}{seq}", flow, seq))
    c.receive(envelope("D2", "D", 2))  # D waits at a gap
    drained = c.drain("A", limit=2, batch_size=batch_size)
    assert (drained.applied, drained.stop) == (2, "limit")
    result = c.process_all(batch_size=batch_size)
    assert {f: (r.applied, str(r.stop)) for f, r in result.items()} == {
        "A": (1, "idle"), "B": (3, "idle"), "C": (3, "idle"), "D": (0, "gap")}
    for flow in ("A", "B", "C"):
        assert c.projection(flow) == {"state": "released", "last_seq": 3, "held": 0}
        assert [e.seq for e in c.applied(flow)] == [1, 2, 3]
    assert c.open_flows() == ["D"]


# -- relaying ---------------------------------------------------------------------------------


def test_relay_and_relay_batch_deliver_each_event_once(p: Producer, c: Consumer) -> None:
    commit(p, "A")
    commit(p, "B", 2)
    assert relay(p, c).event_id == "A1"
    batch = relay_batch(p, c, limit=3)
    assert [(r.event_id, str(r.status)) for r in batch.results] == [
        ("A2", "accepted"), ("A3", "accepted"), ("B1", "accepted")]
    assert batch.counts == {"accepted": 3}
    assert [str(r.status) for r in relay_batch(p, c).results] == ["accepted"]
    assert relay(p, c).status == "idle" and relay_batch(p, c).results == ()
    assert relay(p, c, event_id="A1").status == "duplicate"
    assert all(e.accepted for e in p.outbox())
    c.receive(envelope("C1-planted", "C", 1))
    commit(p, "C", 1)
    assert relay_log(p, c) == ["C1 sequence_conflict"]
    (entry,) = p.outbox("C")
    assert (entry.accepted, entry.state) == (False, "set_aside")
    assert c.process_all()["A"].applied == 3


def test_a_lease_keeps_other_relays_off_until_it_expires(where: Locations, p: Producer) -> None:
    clock = Clock(1000.0)
    with Unreachable(where.consumer, RESERVATION, exc=lambda n: KeyboardInterrupt()) as dying, \
            Consumer(where.consumer, RESERVATION) as healthy, Producer(where.producer, RESERVATION) as other_p:
        commit(p, "A", 1)
        commit(p, "B", 1)
        with pytest.raises(KeyboardInterrupt):
            relay(p, dying, policy=DeliveryPolicy(lease_seconds=10, clock=clock, owner="relay-a"))
        record = p.outbox("A")[0].deliveries["default"]
        assert (record.state, record.lease_owner, record.due_at, record.attempts) == ("pending", "relay-a", 1010.0, 0)
        # Another relay (another producer object, another connection) skips the leased event.
        policy = DeliveryPolicy(lease_seconds=10, clock=clock, owner="relay-b")
        clock.t = 1005.0
        assert relay_log(other_p, healthy, policy=policy) == ["B1 accepted"]
        assert relay_batch(other_p, healthy, policy=policy).results == ()
        clock.t = 1010.0
        assert [(r.event_id, str(r.status)) for r in relay_batch(other_p, healthy, policy=policy).results] == [
            ("A1", "accepted")]
        assert p.outbox("A")[0].deliveries["default"].lease_owner is None
        assert [row.event_id for row in healthy.inbox("A")] == ["A1"]


# -- the consumer registry --------------------------------------------------------------------


def test_registration_from_the_first_event_and_from_now(engine: Engine, p: Producer, c: Consumer) -> None:
    commit(p, "A", 2)
    assert relay_log(p, c) == ["A1 accepted", "A2 accepted"]  # the first consumer registers itself
    with Consumer(engine.location("audit"), RESERVATION, name="audit") as audit, \
            Consumer(engine.location("late"), RESERVATION, name="late") as late:
        with pytest.raises(UnknownConsumer):
            relay(p, audit)
        p.admin.register_consumer("audit", actor="ops", reason="catch up")
        p.admin.register_consumer("late", from_now=True, actor="ops", reason="only new events")
        with pytest.raises(NotResolvable):
            p.admin.register_consumer("late", actor="ops", reason="again")
        commit(p, "B", 1)
        assert relay_log(p, audit) == ["A1 accepted", "A2 accepted", "B1 accepted"]
        assert relay_log(p, late) == ["B1 accepted"]
        assert relay_log(p, c) == ["B1 accepted"]
        entries = {e.name: (e.from_now, e.backlog) for e in p.admin.consumers()}
        assert entries == {"audit": (False, 0), "default": (False, 0), "late": (True, 0)}
        assert [(a.consumer, a.action) for a in p.admin.registry_actions()] == [
            ("default", "register"), ("audit", "register"), ("late", "register")]
        p.admin.remove_consumer("late", actor="ops", reason="gone")
        commit(p, "C", 1)
        assert [n for n in p.outbox("C")[0].deliveries] == ["audit", "default"]


# -- retention --------------------------------------------------------------------------------


def test_pruned_events_leave_tombstones_that_answer_duplicate_and_existing(p: Producer, where: Locations) -> None:
    clock = Clock(1000.0)
    with Consumer(where.consumer, RESERVATION, clock=clock) as c:
        commit(p, "A")
        relay_log(p, c)
        c.process_all()
        result = c.admin.prune(10, now=clock.t + 100, actor="ops", reason="retention")
        assert (result.events, result.effect_records, result.complete) == (3, 3, True)
        assert c.inbox("A") == [] and c.applied("A") == []
        assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
        assert c.receive(envelope("A2", "A", 2)).status == "duplicate"
        assert c.receive(envelope("A2", "A", 2, amount=9)).status == "id_conflict"
        assert c.receive(envelope("X2", "A", 2)).status == "sequence_conflict"
        assert c.apply_next("A").status == "idle"

        pruned = p.admin.prune(10, now=time.time() + 10_000, actor="ops", reason="retention")  # committed_at is the real time
        assert (pruned.events, pruned.deliveries) == (3, 3)
        assert p.outbox() == [] and p.event("A2") is None
        again = advance(p, "A2", "A", 1)
        assert (again.status, again.seq) == ("existing", 2)
        assert advance(p, "A2", "A", 1, amount=4).status == "conflict"
        assert relay(p, c, event_id=None).status == "idle"


# -- receive-and-apply, the worker ------------------------------------------------------------


def test_receive_and_apply_mode_and_the_applying_view(where: Locations, p: Producer) -> None:
    with Consumer(where.consumer, RESERVATION, apply_on_receive=True) as c:
        r = c.receive(envelope("A1", "A", 1))
        assert (r.status, r.applied) == ("accepted", True)
        assert c.receive(envelope("A3", "A", 3)).applied is False  # after a gap: stored pending
        assert c.receive(envelope("A1", "A", 1)).status == "duplicate"
        assert [e.state for e in c.inbox("A")] == ["applied", "pending"]
    with Consumer(where.consumer, RESERVATION) as plain:
        commit(p, "B", 2)
        view = plain.applying()
        assert relay_log(p, view) == ["B1 accepted", "B2 accepted"]
        assert view.applied == 2
        assert plain.projection("B") == {"state": "confirmed", "last_seq": 2, "held": 3}
        assert [e.event_id for e in plain.applied("B")] == ["B1", "B2"]
        assert plain.apply_next("B").status == "idle"


def test_the_worker_relays_and_applies_through_the_receive_and_apply_mode(p: Producer, c: Consumer) -> None:
    for flow in ("A", "B"):
        commit(p, flow)
    worker = Worker(p, [c], idle_sleep=0)
    while worker.run_once().work:
        pass
    assert worker.stats.relayed["accepted"] == 6
    # Each event was its flow's next step on arrival: applied in its receive
    # commit, so the apply pass found no open flow to drain.
    assert (worker.stats.applied, dict(worker.stats.stops)) == (6, {})
    for flow in ("A", "B"):
        assert c.projection(flow) == {"state": "released", "last_seq": 3, "held": 0}
        assert [e.event_id for e in c.applied(flow)] == [f"{flow}1", f"{flow}2", f"{flow}3"]
    assert all(e.accepted for e in p.outbox())


# -- effects ------------------------------------------------------------------------------------


def test_the_effect_executor_runs_a_scheduled_effect_once(where: Locations, p: Producer) -> None:
    clock = Clock(1000.0)
    calls: list[str] = []
    effects = EffectRegistry()
    effects.register("notify", lambda call: calls.append(call.key) or {"sent": call.payload["flow"]})

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("notify", {"flow": ctx.event.flow_id})

    with Consumer(where.consumer, RESERVATION, handlers=(handler,), effects=effects, clock=clock) as c:
        commit(p, "A", 2)
        relay_log(p, c)
        c.process_all()
        executor = EffectExecutor(c, policy=DeliveryPolicy(lease_seconds=30, clock=clock, random=lambda: 0.5))
        assert executor.run_once().work == 1
        assert executor.run_once().work == 0
        assert calls == ["default:A1:notify"]
        effect = c.scheduled_effect("default:A1:notify")
        assert (effect.state, effect.result, effect.attempts, effect.lease_owner) == (
            "succeeded", {"sent": "A"}, 1, None)


# -- across engines -------------------------------------------------------------------------


@pytest.mark.parametrize("pair", [
    pytest.param(("postgres", "sqlite"), marks=pytest.mark.postgres, id="postgres->sqlite"),
    pytest.param(("sqlite", "postgres"), marks=pytest.mark.postgres, id="sqlite->postgres"),
])
def test_delivery_across_engines(pair: tuple[str, str], request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source, target = (make_engine(name, request, tmp_path) for name in pair)
    with Producer(source.location("producer"), RESERVATION) as p, \
            Consumer(target.location("consumer"), RESERVATION) as c:
        for flow in ("A", "B"):
            commit(p, flow)
        assert relay(p, c).status == "accepted"
        assert relay_batch(p, c, limit=2).counts == {"accepted": 2}
        worker = Worker(p, [c], idle_sleep=0)
        while worker.run_once().work:
            pass
        assert relay(p, c, event_id="A1").status == "duplicate"
        for flow in ("A", "B"):
            assert c.projection(flow) == {"state": "released", "last_seq": 3, "held": 0}
            assert len(c.applied(flow)) == 3
        assert all(e.accepted for e in p.outbox())
        assert p.outbox()[0].deliveries["default"].last_status == "duplicate"
