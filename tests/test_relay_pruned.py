"""A relay next to a pruner and other relays of the same consumer (issue 18e).

A relay picks its events with their bodies in one read (``next_due``), so
an event that another relay delivered and a pruner removed is either not
picked at all, or picked with its body and sent once more (the inbox
answers ``duplicate``); the relay never raises for it, and records no
failure or backoff for it (nor for the events it did not get to send).
(Before, positions and bodies were two reads, and an event pruned in
between had to be skipped.)

First the interleaving made deterministic: the pick of the relay under
test first lets another relay (its own Producer and Consumer objects on the
same stores) deliver and a pruner prune.  Then the real thing: relay
threads and a pruner thread on one producer, bounded.  Both on both engines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import new_location
from reliable_flow import Consumer, DeliveryPolicy, Producer, relay, relay_batch
from reliable_flow.reservation import RESERVATION
from support import commit

LEASED = DeliveryPolicy(lease_seconds=30.0, wait_for_due=False)
Stores = tuple[Producer, Producer, Consumer, Consumer]


@pytest.fixture
def stores(engine: str, tmp_path: Path) -> Iterator[Stores]:
    """The relay under test's producer and consumer, and another relay's own objects on the same stores."""
    p_at, c_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION) as consumer, \
            Producer(p_at, RESERVATION) as other, Consumer(c_at, RESERVATION) as other_consumer:
        yield producer, other, consumer, other_consumer


def before_the_pick(monkeypatch: pytest.MonkeyPatch, producer: Producer,
                    meanwhile: Callable[[], None]) -> list[int]:
    """Run ``meanwhile`` once, just before the next pick of a relay
    (``next_due``; with a lease, its check that anything is due, before
    the claim).  Returns the limits that pick asked for (filled in when it
    happens)."""
    view = type(producer.store.latest)
    asked: list[int] = []
    original = view.next_due

    def read(self: Any, consumer: str, horizon: float, limit: int) -> Any:
        if not asked:
            asked.append(limit)
            meanwhile()
        return original(self, consumer, horizon, limit)

    monkeypatch.setattr(view, "next_due", read)
    return asked


def failures(producer: Producer) -> list[tuple[str, int, str | None]]:
    """Every stored delivery that records a failed send: (event, attempts, error)."""
    return [(e.event_id, d.attempts, d.last_error) for e in producer.outbox() for d in e.deliveries.values()
            if d.last_error is not None]


@pytest.mark.parametrize("policy", [None, LEASED], ids=["plain", "leased"])
def test_relay_batch_skips_events_delivered_and_pruned_before_it_picks(
    stores: Stores, monkeypatch: pytest.MonkeyPatch, policy: DeliveryPolicy | None,
) -> None:
    producer, other, consumer, other_consumer = stores
    commit(producer, "A", 3)

    def meanwhile() -> None:
        assert relay_batch(other, other_consumer, 2).counts == {"accepted": 2}  # A1, A2
        assert other.admin.prune(0, actor="ops", reason="retention").events == 2

    asked = before_the_pick(monkeypatch, producer, meanwhile)
    result = relay_batch(producer, consumer, 10, policy=policy)
    assert asked == [10 if policy is None else 1]
    assert [(r.status, r.event_id) for r in result.results] == [("accepted", "A3")]
    assert result.counts == {"accepted": 1} and result.refused == 0
    assert [(e.event_id, e.state) for e in producer.outbox()] == [("A3", "accepted")]
    assert failures(producer) == []
    assert [(row.event_id, row.state) for row in consumer.inbox("A")] == [
        ("A1", "pending"), ("A2", "pending"), ("A3", "pending")]


def test_relay_batch_picks_a_new_event_when_every_older_one_was_pruned(
    stores: Stores, monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, other, consumer, other_consumer = stores
    commit(producer, "A", 2)

    def meanwhile() -> None:
        assert relay_batch(other, other_consumer).counts == {"accepted": 2}
        assert other.admin.prune(0, actor="ops", reason="retention").events == 2
        commit(other, "B", 1)

    before_the_pick(monkeypatch, producer, meanwhile)
    result = relay_batch(producer, consumer, 10, policy=LEASED)
    assert [(r.status, r.event_id) for r in result.results] == [("accepted", "B1")]
    assert relay_batch(producer, consumer, 10, policy=LEASED).idle
    assert failures(producer) == []


def test_relay_batch_is_idle_when_every_event_was_pruned(
    stores: Stores, monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, other, consumer, other_consumer = stores
    commit(producer, "A", 2)

    def meanwhile() -> None:
        relay_batch(other, other_consumer)
        other.admin.prune(0, actor="ops", reason="retention")

    asked = before_the_pick(monkeypatch, producer, meanwhile)
    assert relay_batch(producer, consumer).idle
    assert asked and producer.outbox() == [] and failures(producer) == []


def test_a_leased_relay_takes_the_next_event_when_its_claimed_one_was_pruned(
    stores: Stores, monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, other, consumer, other_consumer = stores
    commit(producer, "A", 2)

    def meanwhile() -> None:
        # A plain relay does not wait for leases: it delivers the claimed A1.
        assert relay(other, other_consumer).event_id == "A1"
        assert other.admin.prune(0, actor="ops", reason="retention").events == 1

    asked = before_the_pick(monkeypatch, producer, meanwhile)
    r = relay(producer, consumer, policy=LEASED)
    assert asked == [1]
    assert (r.status, r.event_id) == ("accepted", "A2")
    assert relay(producer, consumer, policy=LEASED).status == "idle"
    assert failures(producer) == []


# -- the real race ----------------------------------------------------------------------------

FLOWS = 40  # 3 events each
ROUNDS = 400  # a relay's calls at most: the race is bounded
WINDOW = 0.02  # seconds between a relay's pick and its send


@pytest.fixture
def slow_body_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[Producer], None]:
    """Widen the window between a relay's pick and its send: every pick
    (``next_due``) of the given producer's engine sleeps a few milliseconds
    after its read (the thread lets the others run, as the scheduler may at
    any time).  Nothing else is changed: the reads, the race and the stores
    are real."""
    def widen(producer: Producer) -> None:
        view = type(producer.store.latest)
        original = view.next_due

        def read(self: Any, consumer: str, horizon: float, limit: int) -> Any:
            picked = original(self, consumer, horizon, limit)
            time.sleep(WINDOW)
            return picked
        monkeypatch.setattr(view, "next_due", read)
    return widen


def test_relays_and_a_pruner_in_threads_never_raise_nor_record_a_false_failure(
    engine: str, tmp_path: Path, slow_body_reads: Callable[[Producer], None],
) -> None:
    p_at, c_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION):
        slow_body_reads(producer)
        producer.admin.register_consumer("default", actor="test", reason="relays race a pruner")
        for n in range(FLOWS):
            commit(producer, f"F{n}", 3)
    errors: list[BaseException] = []
    done = threading.Event()
    start = threading.Barrier(4)

    def relaying(call: Callable[[Producer, Consumer], bool]) -> None:
        try:
            with Producer(p_at, RESERVATION) as p, Consumer(c_at, RESERVATION) as c:
                start.wait(30)
                for _ in range(ROUNDS):
                    if not call(p, c):
                        return
        except BaseException as exc:  # noqa: BLE001 - reported by the test, never swallowed
            errors.append(exc)

    def pruning() -> None:
        try:
            with Producer(p_at, RESERVATION) as p:
                start.wait(30)
                while not done.is_set():
                    p.admin.prune(0, batch_size=5, actor="ops", reason="retention")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    relays = [
        lambda p, c: not relay_batch(p, c, 4).idle,
        lambda p, c: not relay_batch(p, c, 3).idle,
        lambda p, c: relay(p, c, policy=LEASED).status != "idle",
    ]
    threads = [threading.Thread(target=relaying, args=(call,)) for call in relays]
    pruner = threading.Thread(target=pruning)
    for t in [*threads, pruner]:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    pruner.join(60)
    assert not any(t.is_alive() for t in [*threads, pruner]), "a racer hung"
    assert errors == [], errors
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION) as consumer:
        assert failures(producer) == []  # no backoff for an event nobody failed to send
        assert relay_batch(producer, consumer, 1000).idle  # everything was delivered
        assert sorted(e.event_id for f in consumer.flows() for e in consumer.inbox(f)) == sorted(
            f"F{n}{seq}" for n in range(FLOWS) for seq in (1, 2, 3))
