"""The seed's ordering scenarios: every arrival order of one flow, the 3-1-2
table, duplicates at every position, a schema upgrade, and flow isolation."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from engine_reads import rows
from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION
from support import KINDS

ORDERS = list(itertools.permutations(("A1", "A2", "A3")))
ORDER_IDS = ["".join(e[1] for e in order) for order in ORDERS]


def commit_flow(producer: Producer, flow: str, *, schemas: tuple[int, int, int] = (1, 1, 1)) -> None:
    for n, (kind, schema) in enumerate(zip(KINDS, schemas), start=1):
        payload = {"amount": 3} if schema == 1 else {"units": 3}
        r = producer.advance(f"{flow}{n}", flow, expected_seq=n - 1, kind=kind, payload=payload, schema=schema)
        assert (r.status, r.seq) == ("committed", n)


def raw_bodies(path: str) -> list[tuple[str, str]]:
    return rows(path, "SELECT event_id, body FROM inbox ORDER BY event_id")


def assert_released_once(consumer: Consumer) -> None:
    assert consumer.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
    assert [(e.event_id, e.seq, e.kind) for e in consumer.applied("A")] == [
        ("A1", 1, "reserved"), ("A2", 2, "confirmed"), ("A3", 3, "released"),
    ]


@pytest.mark.parametrize("order", ORDERS, ids=ORDER_IDS)
def test_every_arrival_order_ends_released_with_ordered_effects(
    producer: Producer, consumer: Consumer, order: tuple[str, ...]
) -> None:
    commit_flow(producer, "A")
    for event_id in order:
        r = relay(producer, consumer, event_id=event_id)
        assert (r.status, r.event_id) == ("accepted", event_id)
        consumer.drain("A")
        # Invariant: what is applied is a gap-free prefix of what was accepted.
        last_seq = (consumer.projection("A") or {"last_seq": 0})["last_seq"]
        arrived = {int(e[1]) for e in order[: order.index(event_id) + 1]}
        expected_prefix = 0
        while expected_prefix + 1 in arrived:
            expected_prefix += 1
        assert last_seq == expected_prefix
        assert [e.seq for e in consumer.applied("A")] == list(range(1, last_seq + 1))
    assert_released_once(consumer)
    assert relay(producer, consumer).status == "idle"
    assert all(e.accepted for e in producer.outbox("A"))


def test_arrival_3_then_1_then_2_table(producer: Producer, consumer: Consumer) -> None:
    commit_flow(producer, "A")
    table = []
    for event_id in ("A3", "A1", "A2"):
        assert relay(producer, consumer, event_id=event_id).status == "accepted"
        d = consumer.drain("A")
        table.append((d.applied, str(d.stop)))
    assert table == [(0, "gap"), (1, "gap"), (2, "idle")]
    assert_released_once(consumer)


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("order", ORDERS, ids=ORDER_IDS)
def test_duplicates_at_every_position_leave_one_effect_each(
    producer: Producer, consumer: Consumer, order: tuple[str, ...], position: int
) -> None:
    commit_flow(producer, "A")
    for i, event_id in enumerate(order):
        assert relay(producer, consumer, event_id=event_id).status == "accepted"
        if i == position:
            for again in order[: i + 1]:
                r = relay(producer, consumer, event_id=again)
                assert (r.status, r.event_id) == ("duplicate", again)
                envelope = producer.event(again)
                assert envelope is not None
                assert consumer.receive(envelope).status == "duplicate"
        consumer.drain("A")
        # once more after the drain: already applied events are duplicates too
        if i == position:
            assert relay(producer, consumer, event_id=order[0]).status == "duplicate"
            consumer.drain("A")
        effects = consumer.applied("A")
        assert len(effects) <= 3
        ids = [e.event_id for e in effects]
        assert len(ids) == len(set(ids))
    assert_released_once(consumer)
    assert len(consumer.inbox("A")) == 3


def test_schema_upgrade_blocks_then_applies_unchanged(producer: Producer, consumer: Consumer) -> None:
    commit_flow(producer, "A", schemas=(1, 2, 2))
    assert [relay(producer, consumer).status for _ in range(4)] == ["accepted"] * 3 + ["idle"]
    d = consumer.drain("A")
    assert (d.applied, d.stop) == (1, "blocked")
    assert d.last is not None
    assert (d.last.reason, d.last.seq, d.last.event_id) == ("unsupported_schema", 2, "A2")
    assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert [(r.seq, r.state, r.reason) for r in consumer.inbox("A")] == [
        (1, "applied", None), (2, "blocked", "unsupported_schema"), (3, "pending", None),
    ]
    path = consumer.location
    bodies_before = raw_bodies(path)
    consumer.close()

    with Consumer(path, RESERVATION, schemas={1, 2}) as upgraded:
        d = upgraded.drain("A")
        assert (d.applied, d.stop) == (2, "idle")
        assert upgraded.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
        assert [(e.event_id, e.kind) for e in upgraded.applied("A")] == [
            ("A1", "reserved"), ("A2", "confirmed"), ("A3", "released"),
        ]
        assert [r.state for r in upgraded.inbox("A")] == ["applied"] * 3
    assert raw_bodies(path) == bodies_before
    event = producer.event("A2")
    assert event is not None and event["payload"] == {"units": 3} and event["schema"] == 2


def test_flow_isolation_a_gap_does_not_hold_back_b(producer: Producer, consumer: Consumer) -> None:
    commit_flow(producer, "A")
    commit_flow(producer, "B")
    for event_id in ("A1", "A3", "B1", "B2", "B3"):
        assert relay(producer, consumer, event_id=event_id).status == "accepted"
    results = consumer.process_all()
    assert sorted(results) == ["A", "B"]
    assert (results["A"].applied, results["A"].stop) == (1, "gap")
    assert (results["B"].applied, results["B"].stop) == (3, "idle")
    assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert consumer.projection("B") == {"state": "released", "last_seq": 3, "held": 0}
    assert [e.event_id for e in consumer.applied("A")] == ["A1"]
    assert [e.event_id for e in consumer.applied("B")] == ["B1", "B2", "B3"]
    assert [(r.event_id, r.state) for r in consumer.inbox("A")] == [("A1", "applied"), ("A3", "pending")]
    # A2 is still undelivered, and delivering it completes A.
    outbox: dict[str, Any] = {e.event_id: e.accepted for e in producer.outbox("A")}
    assert outbox == {"A1": True, "A2": False, "A3": True}
    assert relay(producer, consumer).event_id == "A2"
    assert (consumer.drain("A").applied, consumer.projection("A")) == (
        2, {"state": "released", "last_seq": 3, "held": 0},
    )
