"""relay(): statuses, setting aside conflicting events without starving other
flows, explicit delivery, per-consumer delivery state, and snapshot()."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

import reliable_flow
from engine_reads import allow_inserts, integrity_error, reject_inserts, rows
from reliable_flow import Consumer, Producer, relay, snapshot
from reliable_flow.reservation import RESERVATION
from support import commit, envelope, outbox_entry


def raw_inbox(path: str) -> list[tuple[Any, ...]]:
    return rows(path, "SELECT event_id, flow_id, seq, body, state FROM inbox ORDER BY event_id")


def raw_delivery(path: str) -> list[tuple[Any, ...]]:
    return rows(
        path,
        "SELECT d.consumer, o.event_id, d.state, d.last_status, d.attempts "
        "FROM delivery d JOIN outbox o ON o.pos = d.pos ORDER BY d.consumer, d.pos",
    )


@pytest.fixture
def audit(new_store: Any) -> Iterator[Consumer]:
    c = Consumer(new_store("audit"), RESERVATION, name="audit")
    yield c
    c.close()


# -- statuses ---------------------------------------------------------------------------


def test_relay_idle_when_nothing_is_committed(producer: Producer, consumer: Consumer) -> None:
    r = relay(producer, consumer)
    assert (r.status, r.event_id, r.flow_id, r.seq) == ("idle", None, None, None)


def test_relay_accepted_only_after_the_consumer_owns_it(producer: Producer, consumer: Consumer) -> None:
    commit(producer, "A", 1)
    assert outbox_entry(producer, "A1").accepted is False
    r = relay(producer, consumer)
    assert (r.status, r.event_id, r.flow_id, r.seq) == ("accepted", "A1", "A", 1)
    rows = raw_inbox(consumer.location)
    assert [(row[0], row[4]) for row in rows] == [("A1", "pending")]
    event = producer.event("A1")
    assert event is not None
    e = outbox_entry(producer, "A1")
    assert (e.accepted, e.state, e.last_status) == (True, "accepted", "accepted")
    assert list(e.deliveries) == ["default"]
    d = e.deliveries["default"]
    assert (d.state, d.last_status, d.attempts) == ("accepted", "accepted", 1)
    assert relay(producer, consumer).status == "idle"
    assert consumer.projection("A") is None  # accepted is not applied


def test_relay_does_not_mark_when_the_consumer_fails_to_store(producer: Producer, consumer: Consumer) -> None:
    commit(producer, "A", 1)
    reject_inserts(consumer.location, "inbox", "no room")
    with pytest.raises(integrity_error(consumer.location)) as failed:
        relay(producer, consumer)
    assert raw_inbox(consumer.location) == []
    e = outbox_entry(producer, "A1")
    assert (e.accepted, e.state, e.last_status) == (False, "pending", None)
    assert e.deliveries["default"].attempts == 1  # the failed send is recorded
    assert (e.deliveries["default"].last_error or "").startswith(f"{type(failed.value).__name__}: ")
    assert producer.store.in_transaction() is False
    assert consumer.store.in_transaction() is False
    allow_inserts(consumer.location, "inbox")
    # (a plain relay may wait out a backoff; an explicit one sends now)
    r = relay(producer, consumer, event_id="A1")
    assert (r.status, r.event_id) == ("accepted", "A1")
    assert [(row[0], row[4]) for row in raw_inbox(consumer.location)] == [("A1", "pending")]
    assert outbox_entry(producer, "A1").accepted is True


def test_relay_duplicate_when_the_inbox_already_has_it(producer: Producer, consumer: Consumer) -> None:
    commit(producer, "A", 1)
    event = producer.event("A1")
    assert event is not None
    assert consumer.receive(event).status == "accepted"
    r = relay(producer, consumer)
    assert (r.status, r.event_id) == ("duplicate", "A1")
    e = outbox_entry(producer, "A1")
    assert (e.accepted, e.state, e.last_status) == (True, "accepted", "duplicate")
    assert len(raw_inbox(consumer.location)) == 1
    assert relay(producer, consumer).status == "idle"
    # an explicit re-send of an accepted event is a duplicate and stays accepted
    assert relay(producer, consumer, event_id="A1").status == "duplicate"
    assert outbox_entry(producer, "A1").deliveries["default"].attempts == 2


@pytest.mark.parametrize(
    ("planted", "status"),
    [
        (envelope("A1", "A", 1, amount=5), "id_conflict"),
        (envelope("X1", "A", 1), "sequence_conflict"),
    ],
    ids=["id_conflict", "sequence_conflict"],
)
def test_relay_conflict_is_set_aside_and_never_accepted(
    producer: Producer, consumer: Consumer, planted: dict[str, Any], status: str
) -> None:
    assert consumer.receive(planted).status == "accepted"
    inbox_before = raw_inbox(consumer.location)
    commit(producer, "A", 1)
    r = relay(producer, consumer)
    assert (r.status, r.event_id, r.flow_id, r.seq) == (status, "A1", "A", 1)
    assert r.reason
    e = outbox_entry(producer, "A1")
    assert (e.accepted, e.state, e.last_status) == (False, "set_aside", status)
    assert e.deliveries["default"].state == "set_aside"
    assert raw_inbox(consumer.location) == inbox_before  # the planted event is kept as it was
    # never re-selected by a plain relay
    assert relay(producer, consumer).status == "idle"
    assert relay(producer, consumer).status == "idle"
    # an explicit relay still gets the conflict and still does not mark it
    r = relay(producer, consumer, event_id="A1")
    assert (r.status, r.event_id) == (status, "A1")
    e = outbox_entry(producer, "A1")
    assert (e.accepted, e.state, e.last_status) == (False, "set_aside", status)
    assert e.deliveries["default"].attempts == 2
    assert raw_inbox(consumer.location) == inbox_before


def test_poison_isolation_other_flows_keep_flowing(producer: Producer, consumer: Consumer) -> None:
    assert consumer.receive(envelope("A1", "A", 1, amount=9)).status == "accepted"
    commit(producer, "A", 1)
    commit(producer, "B", 1)
    first = relay(producer, consumer)
    assert (first.status, first.event_id) == ("id_conflict", "A1")
    second = relay(producer, consumer)
    assert (second.status, second.event_id) == ("accepted", "B1")
    assert relay(producer, consumer).status == "idle"
    # later events, in the poisoned flow and others, are still delivered
    commit(producer, "C", 1)
    r = producer.advance("B2", "B", expected_seq=1, kind="confirmed", payload={"amount": 3})
    assert r.status == "committed"
    assert [relay(producer, consumer).event_id for _ in range(2)] == ["C1", "B2"]
    assert relay(producer, consumer).status == "idle"
    assert [(e.event_id, e.state) for e in producer.outbox()] == [
        ("A1", "set_aside"), ("B1", "accepted"), ("C1", "accepted"), ("B2", "accepted"),
    ]
    assert consumer.process_all()["B"].applied == 2


def test_explicit_relay_delivers_the_chosen_event(producer: Producer, consumer: Consumer) -> None:
    commit(producer, "A", 1)
    commit(producer, "B", 1)
    r = relay(producer, consumer, event_id="B1")
    assert (r.status, r.event_id, r.flow_id, r.seq) == ("accepted", "B1", "B", 1)
    assert outbox_entry(producer, "B1").accepted is True
    assert outbox_entry(producer, "A1").accepted is False
    assert [row[0] for row in raw_inbox(consumer.location)] == ["B1"]
    assert relay(producer, consumer).event_id == "A1"
    assert relay(producer, consumer).status == "idle"


def test_explicit_relay_of_an_unknown_event_raises(producer: Producer, consumer: Consumer) -> None:
    commit(producer, "A", 1)
    with pytest.raises(reliable_flow.errors.UnknownEvent) as info:
        relay(producer, consumer, event_id="nope")
    assert isinstance(info.value, LookupError)
    assert raw_inbox(consumer.location) == []
    assert outbox_entry(producer, "A1").accepted is False
    assert producer.store.in_transaction() is False


# -- several consumers ------------------------------------------------------------------


def test_two_files_with_the_default_name_are_a_mismatch(
    producer: Producer, consumer: Consumer, new_store: Any
) -> None:
    commit(producer, "A", 2)
    assert relay(producer, consumer).status == "accepted"
    delivery_before = raw_delivery(producer.location)
    with Consumer(new_store("other"), RESERVATION) as other:
        assert other.name == consumer.name == "default"
        with pytest.raises(reliable_flow.errors.ConsumerMismatch):
            relay(producer, other)
        assert producer.store.in_transaction() is False
        # a second Producer object on the same file knows the binding too
        with Producer(producer.location, RESERVATION) as again, pytest.raises(reliable_flow.errors.ConsumerMismatch):
            relay(again, other, event_id="A2")
        assert raw_inbox(other.location) == []
    assert raw_delivery(producer.location) == delivery_before
    # the rightful consumer keeps going
    assert relay(producer, consumer).event_id == "A2"


def test_distinct_consumer_names_each_get_every_event(
    producer: Producer, consumer: Consumer, audit: Consumer
) -> None:
    commit(producer, "A")
    assert [relay(producer, consumer).status for _ in range(4)] == ["accepted"] * 3 + ["idle"]
    r = relay(producer, audit, register=True)
    assert (r.status, r.event_id) == ("accepted", "A1")

    assert [e.accepted for e in producer.outbox("A", consumer="default")] == [True, True, True]
    assert [e.accepted for e in producer.outbox("A", consumer="audit")] == [True, False, False]
    assert [e.state for e in producer.outbox("A", consumer="audit")] == ["accepted", "pending", "pending"]
    assert [e.accepted for e in producer.outbox("A")] == [True, False, False]
    deliveries = [e.deliveries for e in producer.outbox("A")]
    assert [(d["default"].state, d["audit"].state) for d in deliveries] == [
        ("accepted", "accepted"), ("accepted", "pending"), ("accepted", "pending"),
    ]

    assert [relay(producer, audit).event_id for _ in range(3)] == ["A2", "A3", None]
    assert all(e.accepted for e in producer.outbox("A"))
    # events committed after both are registered are pending for both
    commit(producer, "B", 1)
    assert outbox_entry(producer, "B1", "audit").state == "pending"
    assert outbox_entry(producer, "B1", "default").state == "pending"
    assert relay(producer, audit).event_id == "B1"
    assert outbox_entry(producer, "B1", "audit").accepted is True
    assert outbox_entry(producer, "B1", "default").accepted is False
    assert outbox_entry(producer, "B1").accepted is False
    assert relay(producer, consumer).event_id == "B1"
    for c in (consumer, audit):
        c.process_all()
        assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
        assert c.projection("B") == {"state": "reserved", "last_seq": 1, "held": 3}


def test_set_aside_for_one_consumer_is_pending_for_another(
    producer: Producer, consumer: Consumer, audit: Consumer
) -> None:
    assert consumer.receive(envelope("A1", "A", 1, amount=8)).status == "accepted"
    commit(producer, "A", 1)
    assert relay(producer, consumer).status == "id_conflict"
    assert outbox_entry(producer, "A1", "default").state == "set_aside"
    producer.admin.register_consumer("audit", actor="test", reason="a second consumer")
    assert outbox_entry(producer, "A1", "audit").state == "pending"
    assert relay(producer, audit).status == "accepted"
    assert outbox_entry(producer, "A1", "audit").accepted is True
    overall = outbox_entry(producer, "A1")
    assert (overall.accepted, overall.state) == (False, "set_aside")


def test_consumer_registered_after_commits_receives_all(
    producer: Producer, audit: Consumer
) -> None:
    commit(producer, "A")
    commit(producer, "B", 2)
    got = []
    for _ in range(6):
        r = relay(producer, audit)
        got.append((str(r.status), r.event_id))
    assert got == [("accepted", e) for e in ("A1", "A2", "A3", "B1", "B2")] + [("idle", None)]
    assert all(e.accepted for e in producer.outbox(consumer="audit"))
    results = audit.process_all()
    assert {f: (d.applied, d.stop) for f, d in results.items()} == {"A": (3, "idle"), "B": (2, "idle")}


# -- snapshot ---------------------------------------------------------------------------


def test_snapshot_matches_what_happened(producer: Producer, consumer: Consumer) -> None:
    commit(producer, "A")
    commit(producer, "B", 1)
    assert consumer.receive(envelope("B1", "B", 1, amount=5)).status == "accepted"  # poison B1
    statuses = [(str(r.status), r.event_id) for r in (relay(producer, consumer) for _ in range(5))]
    assert statuses == [("accepted", "A1"), ("accepted", "A2"), ("accepted", "A3"), ("id_conflict", "B1"), ("idle", None)]
    assert consumer.drain("A", limit=2).stop == "limit"

    inbox_before = raw_inbox(consumer.location)
    delivery_before = raw_delivery(producer.location)
    snap = snapshot(producer.location, consumer.location)
    assert raw_inbox(consumer.location) == inbox_before
    assert raw_delivery(producer.location) == delivery_before

    p, c = snap["producer"], snap["consumer"]
    assert p["protocol"] == "reservation"
    assert p["flows"] == {
        "A": {"state": "released", "seq": 3, "amount": 3},
        "B": {"state": "reserved", "seq": 1, "amount": 3},
    }
    assert sorted(p["outbox"]) == ["A", "B"]
    assert [(e["event_id"], e["seq"], e["accepted"], e["state"]) for e in p["outbox"]["A"]] == [
        ("A1", 1, True, "accepted"), ("A2", 2, True, "accepted"), ("A3", 3, True, "accepted"),
    ]
    b1 = p["outbox"]["B"][0]
    assert (b1["event_id"], b1["accepted"], b1["state"], b1["last_status"]) == ("B1", False, "set_aside", "id_conflict")
    assert p["outbox"]["A"] == [dataclasses.asdict(e) for e in producer.outbox("A")]
    assert p["outbox"]["B"] == [dataclasses.asdict(e) for e in producer.outbox("B")]

    assert (c["protocol"], c["name"]) == ("reservation", "default")
    assert c["projections"] == {"A": {"state": "confirmed", "last_seq": 2, "held": 3}, "B": None}
    assert c["inbox"]["A"] == [
        {"event_id": "A1", "seq": 1, "state": "applied", "reason": None, "meta": {}},
        {"event_id": "A2", "seq": 2, "state": "applied", "reason": None, "meta": {}},
        {"event_id": "A3", "seq": 3, "state": "pending", "reason": None, "meta": {}},
    ]
    assert c["inbox"]["B"] == [{"event_id": "B1", "seq": 1, "state": "pending", "reason": None, "meta": {}}]
    assert c["effects"] == {
        "A": [
            {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved"},
            {"event_id": "A2", "flow_id": "A", "seq": 2, "kind": "confirmed"},
        ],
        "B": [],
    }
    for flow in ("A", "B"):
        assert c["inbox"][flow] == [dataclasses.asdict(r) for r in consumer.inbox(flow)]
        assert c["effects"][flow] == [dataclasses.asdict(e) for e in consumer.applied(flow)]
        assert c["projections"][flow] == consumer.projection(flow)

    # the same picture with both objects closed
    p_path, c_path = producer.location, consumer.location
    producer.close()
    consumer.close()
    assert snapshot(p_path, c_path) == snap


def test_snapshot_refuses_swapped_files(producer: Producer, consumer: Consumer) -> None:
    with pytest.raises(reliable_flow.errors.WrongFile):
        snapshot(consumer.location, producer.location)
