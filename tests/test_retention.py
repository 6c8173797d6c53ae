"""Retention: pruning old finished events keeps deduplication exact.

A pruned event leaves a tombstone (id, flow, seq, SHA-256 of its canonical
body), so after pruning a re-sent event is still ``duplicate`` /
``id_conflict`` (consumer) or ``existing`` / ``conflict`` (producer), and a
new event for a pruned slot is ``sequence_conflict``.  Nothing still
pending, set aside, blocked or unapplied is ever pruned; a big backlog is
pruned in bounded steps.  On both engines (the ``at`` fixture); v3 files of
both kinds upgrading and the SQLite query plans are in
``tests/sqlite/test_retention_sqlite.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine_reads import count, new_location, rows
from reliable_flow import Consumer, Producer, relay
from reliable_flow import _envelope as envelope
from reliable_flow._retention import prune_older_than
from reliable_flow.records import PruneResult
from reliable_flow.reservation import RESERVATION
from reliable_flow.statuses import ActionTarget
from support import KINDS, Clock, commit, relay_log
from support import envelope as env

At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine

LATER = 10_000.0  # seconds after the events were written: every one is old


def later() -> float:
    return time.time() + LATER


def body(event_id: str, flow_id: str, seq: int, amount: int = 3) -> str:
    return envelope.make(event_id=event_id, flow_id=flow_id, seq=seq, kind=KINDS[seq - 1], schema=1,
                         payload={"amount": amount}).body


@pytest.fixture
def pair(at: At):  # type: ignore[no-untyped-def]
    clock = Clock(1000.0)
    with Producer(at("p"), RESERVATION) as p, Consumer(at("c"), RESERVATION, clock=clock) as c:
        yield p, c, clock


def run_through(p: Producer, c: Consumer, *flows: str) -> None:
    for flow in flows:
        commit(p, flow)
    relay_log(p, c)
    c.process_all()


# -- the answers after pruning --------------------------------------------------------------------


def test_consumer_answers_duplicate_id_conflict_and_sequence_conflict_after_pruning(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, clock = pair
    run_through(p, c, "A")
    result = c.admin.prune(10, now=clock.t + 100, actor="ops", reason="retention")
    assert (result.events, result.effect_records, result.complete) == (3, 3, True)
    assert c.inbox("A") == [] and c.applied("A") == []
    assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
    assert count(c.location, "inbox_tombstone") == 3

    same = c.receive(body("A2", "A", 2))
    assert same.status == "duplicate"
    other = c.receive(body("A2", "A", 2, amount=9))
    assert other.status == "id_conflict" and "pruned" in (other.reason or "")
    moved = c.receive(body("A2", "B", 1))  # the pruned id at another flow: still the same id
    assert moved.status == "id_conflict"
    slot = c.receive(body("X2", "A", 2))
    assert slot.status == "sequence_conflict" and "pruned" in (slot.reason or "")
    # Nothing of it was stored, and nothing is applied twice.
    assert c.inbox("A") == [] and c.open_flows() == [] and c.apply_next("A").status == "idle"
    # receive_many and a capped inbox (the max_inbox path) answer the same.
    assert [r.status for r in c.receive_many([body("A1", "A", 1), body("Y1", "A", 1)])] == [  # type: ignore[union-attr]
        "duplicate", "sequence_conflict"]


def test_capped_consumer_answers_from_tombstones_too(at: At) -> None:
    clock = Clock(1000.0)
    with Consumer(at("c"), RESERVATION, clock=clock, max_inbox=2) as c:
        for seq in (1, 2, 3):
            assert c.receive(body(f"A{seq}", "A", seq)).status == "accepted"
            assert c.apply_next("A").status == "applied"
        assert c.admin.prune(0, now=clock.t + 1, actor="ops", reason="retention").events == 3
        assert c.receive(body("A1", "A", 1)).status == "duplicate"
        assert c.receive(body("A1", "A", 1, amount=5)).status == "id_conflict"
        assert c.receive(body("Z3", "A", 3)).status == "sequence_conflict"


def test_producer_answers_existing_and_conflict_after_pruning(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, _ = pair
    run_through(p, c, "A", "B")
    result = p.admin.prune(10, now=later(), actor="ops", reason="retention")
    assert (result.events, result.deliveries, result.complete) == (6, 6, True)
    assert p.outbox() == [] and p.event("A2") is None
    assert p.flow("A") == {"state": "released", "seq": 3, "amount": 3}

    again = p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
    assert (again.status, again.seq) == ("existing", 2) and "pruned" in (again.reason or "")
    other = p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 4})
    assert (other.status, other.seq) == ("conflict", 2) and "pruned" in (other.reason or "")
    # A pruned id cannot be reused for a new step of a live flow either.
    reused = p.advance("A2", "C", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert reused.status == "conflict"
    assert p.outbox() == [] and p.flows() == ["A", "B"]
    # The flow goes on past its pruned events.
    assert p.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
    assert relay_log(p, c) == ["C1 accepted"]


def test_in_a_batch_a_pruned_id_is_existing(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, _ = pair
    run_through(p, c, "A")
    p.admin.prune(0, now=later(), actor="ops", reason="retention")
    with p.batch() as b:
        r = b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert (r.status, r.seq) == ("existing", 1)


# -- what is never pruned --------------------------------------------------------------------------


def test_the_producer_never_prunes_what_a_consumer_still_waits_for(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p, Consumer(at("c"), RESERVATION) as c, \
            Consumer(at("d"), RESERVATION, name="d") as d:
        commit(p, "A")
        assert p.admin.prune(0, now=later(), actor="ops", reason="retention").events == 0  # no consumer registered yet: all owed to the first
        relay_log(p, c)
        p.admin.register_consumer("d", actor="ops", reason="second reader")
        assert p.admin.prune(0, now=later(), actor="ops", reason="retention").events == 0  # still pending for d
        d.receive(body("A1", "A", 1, amount=7))  # d holds another A1: the relay sets A1 aside for d
        relay_log(p, d)
        assert [e.state for e in p.outbox(consumer="d")] == ["set_aside", "accepted", "accepted"]
        assert p.admin.prune(0, now=later(), actor="ops", reason="retention").events == 2
        assert [e.event_id for e in p.outbox()] == ["A1"]
        p.admin.skip("A1", consumer="d", actor="ops", reason="d is wrong")
        assert p.admin.prune(0, now=later(), actor="ops", reason="retention").events == 1
        assert p.outbox() == [] and count(p.location, "outbox_tombstone") == 3


def test_the_producer_keeps_events_younger_than_the_horizon(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, _ = pair
    run_through(p, c, "A")
    assert p.admin.prune(3600, actor="ops", reason="retention").events == 0  # committed just now
    assert len(p.outbox()) == 3


def test_the_consumer_never_prunes_pending_blocked_or_young_rows(pair) -> None:  # type: ignore[no-untyped-def]
    _p, c, clock = pair
    c.receive(env("A1", "A", 1))
    c.receive(env("A2", "A", 2, amount=9))  # blocked: the amount must stay 3
    c.receive(env("B2", "B", 2))  # pending behind a gap
    clock.t = 2000.0
    c.receive(env("C1", "C", 1))
    for flow in ("A", "B", "C"):
        c.drain(flow)
    assert c.stuck("A").wait == "blocked"
    assert c.admin.prune(500, now=2100.0, actor="ops", reason="retention").events == 1  # A1 only: C1 is applied but young
    assert [(e.event_id, e.state) for e in c.inbox("A")] == [("A2", "blocked")]
    assert [e.event_id for e in c.inbox("B")] == ["B2"] and [e.event_id for e in c.inbox("C")] == ["C1"]
    assert c.admin.prune(0, now=2100.0, actor="ops", reason="retention").events == 1  # now C1
    assert sorted(c.open_flows()) == ["A", "B"]


def test_a_skipped_and_a_replaced_row_are_pruned_once_their_flow_is_past_them(pair) -> None:  # type: ignore[no-untyped-def]
    _p, c, clock = pair
    c.receive(env("A1", "A", 1))
    c.receive(env("A2", "A", 2, amount=9))
    c.drain("A")
    c.admin.replace_event("A2", env("A2-fix", "A", 2), actor="ops", reason="fix")
    assert c.admin.prune(0, now=clock.t + 1, actor="ops", reason="retention").events == 1  # A2 replaced, but its slot is not applied yet
    c.drain("A")
    c.receive(env("A3", "A", 3, amount=8))
    c.drain("A")
    c.admin.skip_event("A3", actor="ops", reason="skip")
    assert c.admin.prune(0, now=clock.t + 1, actor="ops", reason="retention").events == 3
    assert c.inbox("A") == []
    assert c.receive(body("A2", "A", 2, amount=9)).status == "duplicate"  # the replaced one
    assert c.receive(body("A2-fix", "A", 2)).status == "duplicate"
    assert c.receive(body("A3", "A", 3, amount=8)).status == "duplicate"


def test_pruned_effect_outbox_rows_are_only_finished_ones(at: At) -> None:
    from reliable_flow import EffectExecutor, EffectRegistry, PermanentFailure

    effects = EffectRegistry()
    effects.register("ok", lambda call: "done")

    def bad(call):  # type: ignore[no-untyped-def]
        raise PermanentFailure("no")
    effects.register("bad", bad)

    def handler(ctx):  # type: ignore[no-untyped-def]
        ctx.schedule("ok", {})
        ctx.schedule("bad", {})
    clock = Clock(1000.0)
    with Consumer(at("c"), RESERVATION, handlers=[handler], effects=effects, clock=clock) as c:
        c.receive(env("A1", "A", 1))
        c.drain("A")
        EffectExecutor(c).run_once()
        states = sorted(e.state for e in c.scheduled_effects())
        assert states == ["dead", "succeeded"]
        result = c.admin.prune(0, now=later(), actor="ops", reason="retention")  # the executor stamps effects with its own clock (time.time)
        assert (result.events, result.effect_records, result.effect_rows) == (1, 1, 1)
        assert [e.state for e in c.scheduled_effects()] == ["dead"]  # waits for an operator


# -- bounded steps ---------------------------------------------------------------------------------


def test_a_big_backlog_is_pruned_in_bounded_steps_and_recorded(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, clock = pair
    run_through(p, c, *(f"F{i}" for i in range(10)))  # 30 events
    first = p.admin.prune(0, now=later(), batch_size=7, limit=10, actor="ops", reason="retention")
    assert (first.events, first.transactions, first.complete) == (10, 2, False)
    rest = p.admin.prune(0, now=later(), batch_size=7, actor="ops", reason="retention")
    assert (rest.events, rest.transactions, rest.complete) == (20, 3, True)
    assert rows(p.location, "SELECT sum(events), count(*) FROM prune_action") == [(30, 5)]
    done = c.admin.prune(0, now=clock.t + 1, batch_size=8, actor="ops", reason="retention")
    assert (done.events, done.transactions, done.complete) == (30, 4, True)
    assert rows(c.location, "SELECT sum(events), sum(effect_records) FROM prune_action") == [(30, 30)]
    assert isinstance(done, PruneResult)
    nothing = c.admin.prune(0, now=clock.t + 1, actor="ops", reason="retention")
    assert (nothing.events, nothing.transactions, nothing.complete) == (0, 1, True)


@pytest.mark.parametrize("bad", [{"older_than": -1}, {"older_than": True}, {"older_than": float("nan")},
                                 {"older_than": 1, "batch_size": 0}, {"older_than": 1, "limit": 0},
                                 {"older_than": "1"}])
def test_prune_refuses_bad_arguments(pair, bad) -> None:  # type: ignore[no-untyped-def]
    p, c, _ = pair
    run_through(p, c, "A")
    named = next(k for k in ("batch_size", "limit") if k in bad) if len(bad) > 1 else "older_than"
    for side in (p, c):
        with pytest.raises(ValueError, match=named):
            side.admin.prune(**bad, actor="ops", reason="retention")
        assert count(side.location, "prune_action") == 0  # refused before anything was written


# -- the tombstone itself ------------------------------------------------------------------------------


def test_a_tombstone_keeps_the_sha256_of_the_canonical_body(pair) -> None:  # type: ignore[no-untyped-def]
    import hashlib

    p, c, clock = pair
    run_through(p, c, "A")
    p.admin.prune(0, now=later(), actor="ops", reason="retention")
    c.admin.prune(0, now=clock.t + 1, actor="ops", reason="retention")
    for path, table in ((p.location, "outbox_tombstone"), (c.location, "inbox_tombstone")):
        stored = rows(path, f"SELECT event_id, flow_id, seq, body_hash FROM {table} ORDER BY seq")
        assert [(r[0], r[1], r[2]) for r in stored] == [("A1", "A", 1), ("A2", "A", 2), ("A3", "A", 3)]
        assert [bytes(r[3]) for r in stored] == [
            hashlib.sha256(body(f"A{seq}", "A", seq).encode()).digest() for seq in (1, 2, 3)]
    assert relay(p, c).status == "idle"


def test_compare_matches_an_event_the_producer_pruned_through_its_tombstone(pair) -> None:  # type: ignore[no-untyped-def]
    from reliable_flow._tools.compare import compare_files

    p, c, clock = pair
    run_through(p, c, "A", "B")
    p.admin.prune(0, now=later(), actor="ops", reason="retention")  # the consumer keeps its rows, the producer only tombstones
    assert compare_files(p.location, [c.location])["differences"] == 0
    c.admin.prune(0, now=clock.t + 1, actor="ops", reason="retention")
    assert compare_files(p.location, [c.location])["differences"] == 0


# -- forgetting tombstones -----------------------------------------------------------------------


def test_forgotten_tombstones_stop_the_growth_and_a_resent_event_is_still_refused(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, clock = pair
    run_through(p, c, "A")
    first = c.admin.prune(10, now=clock.t + 100, actor="ops", reason="retention")
    assert (first.events, first.tombstones_forgotten) == (3, 0)
    producer_first = p.admin.prune(10, now=later(), actor="ops", reason="retention")
    assert producer_first.events == 3 and count(p.location, "outbox_tombstone") == 3
    # Much later, a second prune forgets what was pruned more than forget_after ago.
    result = c.admin.prune(10, now=clock.t + 100_000, forget_after=1_000, actor="ops", reason="retention")
    assert result.tombstones_forgotten == 3 and count(c.location, "inbox_tombstone") == 0
    assert p.admin.prune(10, now=later() + 100_000, forget_after=1_000, actor="ops", reason="retention").tombstones_forgotten == 3
    assert count(p.location, "outbox_tombstone") == 0
    # A re-sent old event is no longer "duplicate", but it is never stored or applied again.
    again = c.receive(body("A2", "A", 2))
    assert again.status == "sequence_conflict"
    assert c.inbox("A") == [] and c.apply_next("A").status == "idle"
    assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
    # And the producer never commits it twice: the flow has moved past its seq.
    assert p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}).status == "stale"
    assert [e.event_id for e in p.outbox("A")] == []


def test_recent_tombstones_are_kept_when_forgetting(pair) -> None:  # type: ignore[no-untyped-def]
    p, c, clock = pair
    run_through(p, c, "A")
    c.admin.prune(10, now=clock.t + 100, actor="ops", reason="retention")
    assert c.admin.prune(10, now=clock.t + 500, forget_after=1_000, actor="ops", reason="retention").tombstones_forgotten == 0
    assert c.receive(body("A2", "A", 2)).status == "duplicate"


@pytest.mark.parametrize("forget_after", [5, -1, float("inf"), True])
def test_forget_after_must_be_a_finite_number_not_below_older_than(pair, forget_after) -> None:  # type: ignore[no-untyped-def]
    _, c, clock = pair
    with pytest.raises(ValueError, match="forget_after"):
        c.admin.prune(10, now=clock.t, forget_after=forget_after, actor="ops", reason="retention")


def test_a_pruned_event_id_cannot_come_back_as_a_replacement(pair) -> None:  # type: ignore[no-untyped-def]
    from reliable_flow.errors import InvalidEnvelope

    p, c, clock = pair
    run_through(p, c, "A")
    c.admin.prune(10, now=clock.t + 100, actor="ops", reason="retention")
    c.receive(env("B1", "B", 1))
    c.receive(env("B2", "B", 2, amount=9))  # blocked: the amount must stay 3
    assert c.process_all()["B"].stop == "blocked"
    with pytest.raises(InvalidEnvelope, match="pruned"):
        c.admin.replace_event("B2", env("A1", "B", 2), actor="ops", reason="reuse of a pruned id")
    assert [(r.event_id, r.state) for r in c.inbox("B")] == [("B1", "applied"), ("B2", "blocked")]
    assert c.receive(body("A1", "A", 1)).status == "duplicate"  # the tombstone still answers


# -- every pruning transaction is recorded (both engines) --------------------------------------------


def _recorded(location: str) -> list[tuple[int, float]]:
    return [(int(n), float(h)) for n, h in rows(location, "SELECT events, horizon FROM prune_action ORDER BY id")]


def test_every_pruning_transaction_is_recorded_also_forgetting_and_finding_nothing(
    engine: str, tmp_path: Path,
) -> None:
    p_at, c_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    with Producer(p_at, RESERVATION) as p, Consumer(c_at, RESERVATION) as c:
        commit(p, "A")
        at = later()
        unbound = p.admin.prune(0, now=at, actor="ops", reason="retention")  # no consumer yet: nothing may go, the pass is still recorded
        assert (unbound.events, unbound.transactions) == (0, 1)
        relay_log(p, c)
        c.process_all()
        for side in (p, c):
            pruned = side.admin.prune(0, now=at, batch_size=2, actor="ops", reason="retention")
            assert (pruned.events, pruned.transactions) == (3, 2)
            idle = side.admin.prune(0, now=at, actor="ops", reason="retention")
            assert (idle.events, idle.transactions) == (0, 1)
            forgot = side.admin.prune(0, now=at + 100, batch_size=2, forget_after=50, actor="ops", reason="retention")
            assert (forgot.events, forgot.tombstones_forgotten, forgot.transactions) == (0, 3, 3)
        # (events, horizon): two steps, a pass that found nothing, then a
        # pass that found nothing and two forgetting steps (horizon: their cutoff).
        steps = [(2, at), (1, at), (0, at), (0, at + 100), (0, at + 50), (0, at + 50)]
        assert _recorded(str(p_at)) == [(0, at), *steps]
        assert _recorded(str(c_at)) == steps


# -- each prune is an operator action: who, when, why (both engines) ---------------------------------


def test_each_prune_is_recorded_once_with_who_and_why_in_its_first_transaction(
    engine: str, tmp_path: Path,
) -> None:
    p_at, c_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    clock = Clock(1000.0)
    with Producer(p_at, RESERVATION) as p, Consumer(c_at, RESERVATION, clock=clock) as c:
        run_through(p, c, "A", "B")  # 6 events
        at = later()
        for side, now in ((p, at), (c, clock.t + 1)):
            for bad in ({"actor": " "}, {"reason": ""}, {"actor": None}):
                with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
                    side.admin.prune(0, now=now, **{"actor": "ops", "reason": "why", **bad})  # type: ignore[arg-type]
            assert count(side.location, "prune_action") == 0 and side.admin.retention_actions() == []
            many = side.admin.prune(0, now=now, batch_size=2, actor="alice", reason="INC-9: disk at 90%")
            assert (many.events, many.transactions) == (6, 4)  # three steps and one that found nothing
            side.admin.prune(10, now=now + 100, forget_after=50, actor="cron", reason="nightly")
            first, second = side.admin.retention_actions()
            assert (first.target, first.action, first.actor, first.reason) == (
                ActionTarget.RETENTION, "prune", "alice", "INC-9: disk at 90%")
            assert (first.horizon, first.forget_before) == (now, None)
            assert (second.horizon, second.forget_before, second.actor) == (now + 90, now + 50, "cron")
            assert first.as_dict() == {"at": first.at, "action": "prune", "horizon": now, "forget_before": None,
                                       "actor": "alice", "reason": "INC-9: disk at 90%"}
        assert c.admin.retention_actions()[0].at == clock.t  # stamped with the consumer's clock
        assert abs(p.admin.retention_actions()[0].at - time.time()) < 60


def test_the_record_commits_with_the_first_step_or_not_at_all(pair) -> None:  # type: ignore[no-untyped-def]
    """A first transaction that fails before its commit leaves neither a
    removed row nor a record: the record is written in the same unit."""
    p, c, _ = pair
    run_through(p, c, "A")

    class Stepping:
        """The store's unit, noting whether a step ran in it."""

        def __init__(self, unit: Any) -> None:
            self.unit, self.stepped = unit, False

        def record_action(self, action: Any) -> None:
            self.unit.record_action(action)

        def prune_step(self, *args: Any) -> Any:
            self.stepped = True
            return self.unit.prune_step(*args)

    @contextmanager
    def failing() -> Iterator[Any]:
        with p.store.write() as unit:
            seen = Stepping(unit)
            yield seen
            if seen.stepped:
                raise RuntimeError("the process died before COMMIT")

    with pytest.raises(RuntimeError):
        prune_older_than(failing, 0, later(), 10, None, actor="ops", reason="why", at=time.time())
    assert p.admin.retention_actions() == [] and count(p.location, "prune_action") == 0
    assert count(p.location, "outbox") == 3
