"""The receive-and-apply mode: ``Consumer(..., apply_on_receive=True)``.

An arriving event that is its flow's next step and applies cleanly is
stored already applied, in the receive transaction.  Everything else takes
the default path: stored pending, decided by ``apply_next`` exactly as a
consumer without the mode would decide.  So the end state never depends on
the mode; these tests hold it to that.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

import pytest

from engine_reads import rows, store_exists
from reliable_flow import (
    ApplyContext,
    AppSchema,
    Consumer,
    EffectRegistry,
    Producer,
    RetryLater,
    relay,
    relay_batch,
)
from reliable_flow.protocol import PayloadError
from reliable_flow.reservation import RESERVATION
from support import commit, envelope

A1, A2, A3 = envelope("A1", "A", 1), envelope("A2", "A", 2), envelope("A3", "A", 3)


@pytest.fixture
def applying(new_store: Any) -> Any:
    c = Consumer(new_store("applying"), RESERVATION, apply_on_receive=True)
    yield c
    c.close()


def _state(c: Consumer, flows: list[str]) -> dict[str, Any]:
    """Everything a flow's apply leaves behind, comparable across files."""
    return {
        f: (c.projection(f), [asdict(e) for e in c.applied(f)], [(e.event_id, e.state, e.reason) for e in c.inbox(f)])
        for f in flows
    }


def test_the_next_step_is_applied_in_the_receive_commit(applying: Consumer) -> None:
    r = applying.receive(A1)
    assert (r.status, r.applied) == ("accepted", True)
    assert applying.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert [e.event_id for e in applying.applied("A")] == ["A1"]
    assert [e.state for e in applying.inbox("A")] == ["applied"]
    assert applying.apply_next("A").status == "idle"
    assert applying.open_flows() == []


def test_the_default_consumer_does_not_apply_on_receive(consumer: Consumer) -> None:
    r = consumer.receive(A1)
    assert (r.status, r.applied) == ("accepted", False)
    assert consumer.projection("A") is None and consumer.inbox("A")[0].state == "pending"


def test_after_a_gap_the_later_event_waits_and_only_the_next_one_is_applied(applying: Consumer) -> None:
    assert applying.receive(A2).applied is False
    assert applying.apply_next("A").status == "gap"
    assert applying.receive(A1).applied is True  # fills the gap: applied on arrival
    assert [e.state for e in applying.inbox("A")] == ["applied", "pending"]  # A2 is not drained along
    assert applying.drain("A").applied == 1
    assert applying.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}


def test_a_duplicate_and_conflicts_are_answered_as_without_the_mode(applying: Consumer) -> None:
    assert applying.receive(A1).applied is True
    again = applying.receive(A1)
    assert (again.status, again.applied) == ("duplicate", False)
    other = applying.receive(envelope("A1", "A", 1, amount=9))
    assert other.status == "id_conflict" and not other.applied
    slot = applying.receive(envelope("X1", "A", 1))
    assert slot.status == "sequence_conflict" and not slot.applied
    assert [e.event_id for e in applying.applied("A")] == ["A1"]


@pytest.mark.parametrize("event, reason", [
    (envelope("A1", "A", 1, schema=2), "unsupported_schema"),
    (envelope("A1", "A", 1, kind="released"), "invalid_transition"),
])
def test_an_event_that_would_block_is_stored_pending_and_blocks_in_apply_next(
    new_store: Any, event: dict[str, Any], reason: str
) -> None:
    with Consumer(new_store("c"), RESERVATION, schemas=[1], apply_on_receive=True) as c:
        r = c.receive(event)
        assert (r.status, r.applied) == ("accepted", False)
        assert [(e.state, e.reason) for e in c.inbox("A")] == [("pending", None)]
        blocked = c.apply_next("A")
        assert (blocked.status, blocked.reason) == ("blocked", reason)
        assert c.projection("A") is None and c.applied("A") == []


def test_a_handler_payload_error_leaves_nothing_of_the_apply_and_blocks_later(new_store: Any) -> None:
    calls: list[str] = []

    def picky(ctx: ApplyContext) -> None:
        calls.append(ctx.event.event_id)
        ctx.execute("INSERT INTO seen VALUES (?)", (ctx.event.event_id,))
        if ctx.event.payload["amount"] > 5:
            raise PayloadError("amount", "too large for this handler")

    app = AppSchema("seen", [["CREATE TABLE seen(id TEXT)"]])
    with Consumer(new_store("c"), RESERVATION, handlers=[picky], app_schema=app, apply_on_receive=True) as c:
        assert c.receive(envelope("A1", "A", 1, amount=9)).applied is False
        assert calls == ["A1"]
        assert rows(c.location, "SELECT count(*) FROM seen") == [(0,)]  # the handler's write rolled back
        assert c.inbox("A")[0].state == "pending" and c.projection("A") is None
        blocked = c.apply_next("A")
        assert (blocked.status, blocked.reason) == ("blocked", "invalid_payload")
        assert c.receive(envelope("B1", "B", 1)).applied is True
        assert rows(c.location, "SELECT id FROM seen") == [("B1",)]


def test_effects_scheduled_by_a_handler_on_arrival_are_in_the_same_commit(new_store: Any) -> None:
    effects = EffectRegistry()

    def notify(ctx: Any) -> None:
        raise RetryLater("never called here")

    effects.register("notify", notify)
    def schedule(ctx: ApplyContext) -> None:
        ctx.schedule("notify", {"flow": ctx.event.flow_id})

    with Consumer(new_store("c"), RESERVATION, handlers=[schedule], effects=effects,
                  apply_on_receive=True) as c:
        assert c.receive(A1).applied is True
        listed = c.scheduled_effects()
        assert [(e.name, e.state, e.event_id) for e in listed] == [("notify", "pending", "A1")]


def test_receive_many_applies_a_whole_run_of_next_steps(applying: Consumer) -> None:
    results = applying.receive_many([A1, A2, A3, envelope("B2", "B", 2)])
    assert [(r.status, r.applied) for r in results if r is not None] == [
        ("accepted", True), ("accepted", True), ("accepted", True), ("accepted", False)]
    assert applying.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
    assert applying.open_flows() == ["B"]


def test_relay_and_relay_batch_deliver_into_the_mode(producer: Producer, applying: Consumer) -> None:
    commit(producer, "A", 2)
    commit(producer, "B", 1)
    assert relay(producer, applying).status == "accepted"
    assert relay_batch(producer, applying, limit=10).counts == {"accepted": 2}
    assert applying.open_flows() == []
    assert all(e.accepted for e in producer.outbox())


def test_applying_view_turns_the_mode_on_for_one_receiver(producer: Producer, consumer: Consumer) -> None:
    view = consumer.applying()
    assert (view.name, view.uid, view.location) == (consumer.name, consumer.uid, consumer.location)
    commit(producer, "A", 1)
    assert relay(producer, view).status == "accepted"
    assert view.applied == 1 and consumer.inbox("A")[0].state == "applied"
    assert consumer.receive(A2).applied is False  # the consumer itself is still two-step


def test_a_full_inbox_still_lets_the_next_step_in_and_applies_it(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, max_inbox=1, apply_on_receive=True) as c:
        assert c.receive(envelope("B2", "B", 2)).applied is False  # fills the inbox
        r = c.receive(A1)  # A's next step: let in, and applied at once
        assert (r.status, r.applied) == ("accepted", True)
        assert c.metrics().inbox == {"pending": 1, "blocked": 0, "applied": 1, "skipped": 0, "replaced": 0, "superseded": 0}


@pytest.mark.parametrize("value", [1, "yes", None])
def test_the_flag_must_be_a_bool_and_nothing_is_created(new_store: Any, value: Any) -> None:
    location = new_store("c")
    with pytest.raises(TypeError, match="apply_on_receive"):
        Consumer(location, RESERVATION, apply_on_receive=value)
    assert not store_exists(location)


@pytest.mark.parametrize("seed", range(6))
def test_any_arrival_order_ends_in_the_same_state_as_the_two_step_consumer(new_store: Any, seed: int) -> None:
    """Shuffled arrivals with duplicates, a conflict and an unknown schema,
    into both consumers; after process_all the files agree row for row."""
    rng = random.Random(seed)
    events = [envelope(f"{f}{n}", f, n) for f in "ABCDE" for n in (1, 2, 3)]
    events += [envelope("C2", "C", 2), envelope("X1", "D", 1), envelope("E9", "F", 1, schema=2)]
    rng.shuffle(events)
    flows = sorted({e["flow_id"] for e in events})
    with Consumer(new_store("two"), RESERVATION, schemas=[1]) as two, \
            Consumer(new_store("one"), RESERVATION, schemas=[1], apply_on_receive=True) as one:
        for start in range(0, len(events), 4):
            chunk = events[start:start + 4]
            assert [r.status for r in two.receive_many(chunk)] == [r.status for r in one.receive_many(chunk)]
            if rng.random() < 0.3:
                two.process_all()
                one.process_all()
        two.process_all()
        one.process_all()
        assert _state(one, flows) == _state(two, flows)
        assert _state(one, ["F"])["F"][2] == [("E9", "blocked", "unsupported_schema")]
