"""The outbox store's contract (:mod:`reliable_flow._store.outbox`), for every engine.

Each test states one promise of a method's docstring and checks it only
through the store interface: ``write()`` units, ``read()`` snapshots,
``latest`` reads, ``location``, ``close``/``reopen``, ``in_transaction``
and the binding memo.
"""

from __future__ import annotations

import threading
import time

import pytest
from contract_support import (
    add_consumer,
    append,
    bind,
    contract_problems,
    env,
    event_body,
    flow,
    offers,
    protocol_members,
    protocol_properties,
)

from reliable_flow._envelope import make
from reliable_flow._store import FlowState, OutboxReads, OutboxStore, OutboxUnit, StoredEvent
from reliable_flow.delivery import Retry
from reliable_flow.records import DeliveryRecord, OperatorAction, OutboxEntry
from reliable_flow.statuses import ActionTarget, DeliveryState

PENDING = DeliveryState.PENDING
ACCEPTED = DeliveryState.ACCEPTED
SET_ASIDE = DeliveryState.SET_ASIDE
SKIPPED = DeliveryState.SKIPPED


class Boom(Exception):
    """Raised by a test to abandon a unit of work."""





def record(store, event_id: str, consumer: str) -> DeliveryRecord:
    """The delivery record of ``event_id`` towards ``consumer``, as committed."""
    [entry] = [e for e in store.latest.outbox() if e.event_id == event_id]
    return entry.deliveries[consumer]


def entry_of(store, event_id: str, consumer: str | None = None) -> OutboxEntry:
    [entry] = [e for e in store.latest.outbox(consumer=consumer) if e.event_id == event_id]
    return entry


def state(store, event_id: str, consumer: str) -> DeliveryState | None:
    with store.write() as unit:
        found = unit.delivery_state(event_id, consumer)
    return None if found is None else found[1]



# -- the store object -------------------------------------------------------------------


def test_units_and_snapshots_offer_every_protocol_method(outbox):
    with outbox.write() as unit:
        for name in protocol_members(OutboxUnit):
            assert offers(unit, name, protocol_properties(OutboxUnit, OutboxReads)), name
        assert unit.lost is None
    with outbox.read() as reads:
        for name in protocol_members(OutboxReads):
            assert offers(reads, name, protocol_properties(OutboxUnit, OutboxReads)), name
    for name in protocol_members(OutboxReads):
        assert offers(outbox.latest, name, protocol_properties(OutboxUnit, OutboxReads)), name


# Public members an engine's producer store offers beyond the contract, each
# documented: the PostgreSQL schema the store's tables live in.
OUTBOX_STORE_EXTRAS = {"schema"}


def test_the_engine_classes_offer_exactly_the_contract(outbox):
    """Strict: every member of OutboxUnit (views: a unit, a snapshot and
    ``latest`` are one class) and of OutboxStore, with the contract's
    parameter names, kinds and defaults; and nothing public beyond it but
    the documented extras."""
    with outbox.write() as unit:
        assert contract_problems(unit, (OutboxUnit,)) == []
    assert contract_problems(outbox, (OutboxStore,), OUTBOX_STORE_EXTRAS) == []


def test_the_strict_contract_check_can_fail(outbox):
    class Renamed(type(outbox.latest)):  # type: ignore[misc]
        def next_due(self, consumer, until, limit):  # a parameter renamed
            return []

        def bodies(self, positions):  # a member outside the contract
            return {}

    view = Renamed.__new__(Renamed)
    view.lost = None
    assert contract_problems(view, (OutboxUnit,)) == [
        ("Renamed.next_due(self, consumer, until, limit) differs from the contract's "
         "next_due(self, consumer: 'str', horizon: 'float', limit: 'int') -> 'list[tuple[int, str]]'"),
        "Renamed.bodies is public but not in the contract",
    ]


def test_protocol_name_is_the_one_the_store_was_created_for(outbox_store):
    store = outbox_store(protocol="orders-v1")
    assert store.latest.protocol_name() == "orders-v1"
    with store.read() as reads:
        assert reads.protocol_name() == "orders-v1"


def test_add_meta_records_a_key_once_and_the_first_value_stays(outbox_store):
    store = outbox_store()
    assert store.latest.meta_value("protocol_path") is None
    with store.write() as unit:
        assert unit.add_meta("protocol_path", "app:FIRST") == "app:FIRST"
    with store.write() as unit:
        assert unit.add_meta("protocol_path", "app:SECOND") == "app:FIRST"
    with pytest.raises(Boom), store.write() as unit:
        unit.add_meta("other", "x")
        raise Boom
    assert store.latest.meta_value("other") is None  # rolled back with its unit
    with store.read() as reads:
        assert reads.meta_value("protocol_path") == "app:FIRST"
        assert reads.meta_value("protocol") == reads.protocol_name()


def test_location_names_where_the_data_lives(outbox_store):
    first = outbox_store()
    second = outbox_store()
    assert isinstance(first.location, str) and first.location
    assert first.location != second.location
    append(first, env("E1"))
    again = outbox_store(same_as=first)
    assert again.location == first.location
    assert event_body(again.latest, "E1") == env("E1").body
    assert event_body(second.latest, "E1") is None


def due(reads, consumer: str, horizon: float, limit: int) -> list[int]:
    """The positions ``next_due`` picks (without their bodies)."""
    return [pos for pos, _ in reads.next_due(consumer, horizon, limit)]


def test_a_fresh_store_is_empty(outbox):
    reads = outbox.latest
    assert reads.flows() == []
    assert reads.outbox() == []
    assert reads.operator_actions() == []
    assert due(reads, "c", 1e12, 10) == []
    with outbox.write() as unit:
        assert unit.backlog(100) == 0
        assert unit.bound_uid("c") is None


# -- events -----------------------------------------------------------------------------


def test_find_event_gives_position_seq_and_canonical_body(outbox):
    a, b = env("A1", "A", 1), env("B7", "B", 7)
    pos_a, pos_b = append(outbox, a, b)
    assert pos_a < pos_b
    assert outbox.latest.find_event("A1") == StoredEvent(pos_a, 1, a.body)
    assert outbox.latest.find_event("B7") == StoredEvent(pos_b, 7, b.body)
    assert outbox.latest.find_event("nope") is None


def test_find_event_and_flow_answers_find_event_then_flow_state(outbox):
    """One call for advance's two reads: the same answers as the two calls,
    also for what the same unit wrote before it."""
    a = env("A1", "A", 1)
    [pos] = append(outbox, a)
    with outbox.write() as unit:
        unit.put_flow("A", 1, "created", '{"n": 1}')
    with outbox.write() as unit:
        assert unit.find_event_and_flow("A1", "A") == (StoredEvent(pos, 1, a.body), FlowState("created", 1, {"n": 1}))
        assert unit.find_event_and_flow("A2", "A") == (None, FlowState("created", 1, {"n": 1}))
        assert unit.find_event_and_flow("B1", "B") == (None, None)
        unit.put_flow("B", 1, "created", "{}")
        unit.append_event(env("B1", "B", 1))
        stored, state = unit.find_event_and_flow("B1", "B")
        assert stored is not None and stored.seq == 1 and state == FlowState("created", 1, {})
        unit.put_flow("A", 2, "paid", '{"n": 2}')
        assert unit.find_event_and_flow("A2", "A") == (None, FlowState("paid", 2, {"n": 2}))
    with outbox.write() as unit:
        assert unit.find_event_and_flow("A2", "A") == (None, FlowState("paid", 2, {"n": 2}))


def test_positions_follow_commit_order_across_units_and_flows(outbox):
    [p1] = append(outbox, env("X1", "X", 1))
    [p2] = append(outbox, env("A1", "A", 1))
    [p3] = append(outbox, env("X2", "X", 2))
    assert p1 < p2 < p3
    assert [e.event_id for e in outbox.latest.outbox()] == ["X1", "A1", "X2"]


def test_event_bodies_by_id_and_by_position(outbox):
    e1, e2, e3 = env("E1", seq=1), env("E2", seq=2), env("E3", seq=3)
    p1, p2, p3 = append(outbox, e1, e2, e3)
    reads = outbox.latest
    assert event_body(reads, "E2") == e2.body
    assert event_body(reads, "E4") is None
    bind(outbox, "c1")
    assert reads.next_due("c1", 0, 10) == [(p1, e1.body), (p2, e2.body), (p3, e3.body)]


def test_next_due_gives_the_bodies_of_many_events(outbox):
    bind(outbox, "c1")
    envs = [env(f"E{i}", seq=i) for i in range(1, 1201)]
    positions = append(outbox, *envs)
    found = outbox.latest.next_due("c1", 0, 2000)
    assert found == [(p, e.body) for p, e in zip(positions, envs)]


def test_a_taken_event_id_raises_and_stores_nothing(outbox, integrity_error):
    original = env("E1", "F", 1)
    [pos] = append(outbox, original)
    with pytest.raises(integrity_error), outbox.write() as unit:
        unit.append_event(make(event_id="E1", flow_id="G", seq=5, kind="other", schema=1,
                               payload={"x": 1}))
    assert outbox.latest.find_event("E1") == StoredEvent(pos, 1, original.body)
    assert [(e.event_id, e.flow_id, e.seq) for e in outbox.latest.outbox()] == [("E1", "F", 1)]


def test_a_taken_flow_and_seq_raises_and_stores_nothing(outbox, integrity_error):
    original = env("E1", "F", 1)
    [pos] = append(outbox, original)
    with pytest.raises(integrity_error), outbox.write() as unit:
        unit.append_event(env("E2", "F", 1))
    assert outbox.latest.find_event("E2") is None
    assert outbox.latest.find_event("E1") == StoredEvent(pos, 1, original.body)
    assert [e.event_id for e in outbox.latest.outbox()] == ["E1"]


def test_the_same_seq_in_another_flow_is_not_taken(outbox):
    append(outbox, env("A1", "A", 1), env("B1", "B", 1))
    assert [(e.flow_id, e.seq) for e in outbox.latest.outbox()] == [("A", 1), ("B", 1)]


# -- flows ------------------------------------------------------------------------------


def test_put_flow_creates_then_replaces_the_flow_row(outbox):
    with outbox.write() as unit:
        assert unit.flow_state("F") is None
        unit.put_flow("F", 1, "open", '{"amount": 3, "who": "ann"}')
        unit.append_event(env("F1", "F", 1))
        assert unit.flow_state("F") == FlowState("open", 1, {"amount": 3, "who": "ann"})
    assert flow(outbox.latest, "F") == {"state": "open", "seq": 1, "amount": 3, "who": "ann"}
    with outbox.write() as unit:
        unit.put_flow("F", 2, "closed", '{"total": 9}')
        unit.append_event(env("F2", "F", 2))
    assert flow(outbox.latest, "F") == {"state": "closed", "seq": 2, "total": 9}
    with outbox.write() as unit:
        assert unit.flow_state("F") == FlowState("closed", 2, {"total": 9})
    assert flow(outbox.latest, "G") is None


def test_flows_lists_every_flow_once_sorted(outbox):
    for flow_id in ("b", "c", "a"):
        with outbox.write() as unit:
            unit.put_flow(flow_id, 1, "open", "{}")
            unit.append_event(env(flow_id + "1", flow_id, 1))
    with outbox.write() as unit:
        unit.put_flow("b", 2, "open", "{}")
        unit.append_event(env("b2", "b", 2))
    assert outbox.latest.flows() == ["a", "b", "c"]


# -- consumers and pending deliveries ---------------------------------------------------


def test_add_consumer_binds_the_name_to_the_uid(outbox):
    with outbox.write() as unit:
        assert unit.bound_uid("c1") is None
        add_consumer(unit, "c1", "uid-1")
        add_consumer(unit, "c2", "uid-2")
        assert unit.bound_uid("c1") == "uid-1"
    with outbox.write() as unit:
        assert unit.bound_uid("c1") == "uid-1"
        assert unit.bound_uid("c2") == "uid-2"
        assert unit.bound_uid("c3") is None


def test_append_event_is_pending_for_every_bound_consumer(outbox):
    bind(outbox, "c1", "c2")
    [pos] = append(outbox, env("E1"))
    with outbox.write() as unit:
        assert unit.delivery_state("E1", "c1") == (pos, PENDING)
        assert unit.delivery_state("E1", "c2") == (pos, PENDING)
        assert unit.pending_failures("c1", pos) == 0
    assert sorted(entry_of(outbox, "E1").deliveries) == ["c1", "c2"]
    fresh = record(outbox, "E1", "c1")
    assert fresh == DeliveryRecord(PENDING, None, 0, None, fresh.due_at, None)
    assert due(outbox.latest, "c1", 0, 10) == [pos]  # due at once


def test_an_event_is_pending_for_no_consumer_bound_later_until_add_consumer(outbox):
    [p1] = append(outbox, env("E1", seq=1))
    bind(outbox, "early")
    [p2] = append(outbox, env("E2", seq=2))
    with outbox.write() as unit:
        add_consumer(unit, "late", "uid-late")
        # Within the unit that binds it, every committed event is pending for it.
        assert unit.delivery_state("E1", "late") == (p1, PENDING)
    assert due(outbox.latest, "late", 0, 10) == [p1, p2]


def test_an_unbound_consumer_has_no_deliveries(outbox):
    bind(outbox, "c1")
    [p1] = append(outbox, env("E1"))
    assert state(outbox, "E1", "c2") is None
    assert due(outbox.latest, "c2", 1e12, 10) == []
    assert entry_of(outbox, "E1").deliveries.keys() == {"c1"}
    with outbox.write() as unit:
        assert unit.pending_failures("c2", p1) is None


def test_add_consumer_makes_every_committed_event_pending_for_it(outbox):
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    bind(outbox, "old")
    with outbox.write() as unit:
        unit.mark("old", [(p1, "ok")], [(p2, "conflict")], 1.0)
    bind(outbox, "new")
    with outbox.write() as unit:
        assert [unit.delivery_state(e, "new") for e in ("E1", "E2", "E3")] == [
            (p1, PENDING), (p2, PENDING), (p3, PENDING)]
        # ... and leaves the other consumers' deliveries as they were.
        assert [unit.delivery_state(e, "old")[1] for e in ("E1", "E2", "E3")] == [
            ACCEPTED, SET_ASIDE, PENDING]
    assert due(outbox.latest, "new", 0, 10) == [p1, p2, p3]


def test_delivery_state_of_an_unknown_event_is_none(outbox):
    bind(outbox, "c1")
    append(outbox, env("E1"))
    assert state(outbox, "E2", "c1") is None


# -- backlog ----------------------------------------------------------------------------


def test_backlog_counts_events_before_any_consumer_up_to_cap(outbox):
    append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        assert unit.backlog(10) == 3
        assert unit.backlog(3) == 3
        assert unit.backlog(2) == 2
        assert unit.backlog(1) == 1


def test_backlog_counts_pending_deliveries_over_all_consumers_up_to_cap(outbox):
    bind(outbox, "c1", "c2")
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        assert unit.backlog(100) == 6
        assert unit.backlog(4) == 4
        unit.mark("c1", [(p1, "ok")], [(p2, "conflict")], 1.0)
        unit.resolve("c2", p3, SKIPPED, 1.0)
        assert unit.backlog(100) == 3
        unit.claim("c2", [p1], 1e9, "relay", 1.0)  # leased: still pending
        unit.set_retry("c2", p2, Retry(1, 1e9, "down"), 1.0)
        assert unit.backlog(100) == 3


def test_backlog_with_consumers_does_not_count_delivered_events(outbox):
    bind(outbox, "c1")
    p1, p2 = append(outbox, env("E1", seq=1), env("E2", seq=2))
    with outbox.write() as unit:
        unit.mark("c1", [(p1, "ok"), (p2, "ok")], [], 1.0)
    with outbox.write() as unit:
        assert unit.backlog(100) == 0


def test_backlog_with_a_consumer_and_no_events_is_zero(outbox):
    bind(outbox, "c1")
    with outbox.write() as unit:
        assert unit.backlog(100) == 0


# -- next due ---------------------------------------------------------------------------


def test_next_due_gives_oldest_positions_first_up_to_limit(outbox):
    bind(outbox, "c1")
    envs = [env(f"E{i}", "F" if i % 2 else "G", (i + 1) // 2) for i in range(1, 7)]
    positions = append(outbox, *envs)
    reads = outbox.latest
    assert due(reads, "c1", 0, 100) == positions
    assert due(reads, "c1", 0, 3) == positions[:3]
    assert due(reads, "c1", 0, 1) == positions[:1]


def test_next_due_respects_the_horizon(outbox):
    bind(outbox, "c1")
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        unit.claim("c1", [p1], 100.0, "relay-a", 10.0)
        unit.set_retry("c1", p2, Retry(1, 50.0, "timeout"), 10.0)
    reads = outbox.latest
    assert due(reads, "c1", 10.0, 10) == [p3]
    assert due(reads, "c1", 49.9, 10) == [p3]
    assert due(reads, "c1", 50.0, 10) == [p2, p3]
    assert due(reads, "c1", 100.0, 10) == [p1, p2, p3]
    assert due(reads, "c1", 100.0, 2) == [p1, p2]


def test_next_due_skips_deliveries_that_are_not_pending(outbox):
    bind(outbox, "c1", "c2")
    p1, p2, p3, p4 = append(outbox, *[env(f"E{i}", seq=i) for i in range(1, 5)])
    with outbox.write() as unit:
        unit.mark("c1", [(p1, "ok")], [(p2, "conflict")], 1.0)
        unit.resolve("c1", p3, SKIPPED, 1.0)
    assert due(outbox.latest, "c1", 1e12, 10) == [p4]
    assert due(outbox.latest, "c1", 1e12, 1) == [p4]
    # The other consumer's deliveries are its own.
    assert due(outbox.latest, "c2", 1e12, 10) == [p1, p2, p3, p4]


def test_next_due_gives_the_oldest_due_position_with_its_body(outbox):
    bind(outbox, "c1")
    e1, e2, e3 = env("E1", seq=1), env("E2", seq=2), env("E3", seq=3)
    p1, p2, p3 = append(outbox, e1, e2, e3)
    assert outbox.latest.next_due("c1", 0, 1) == [(p1, e1.body)]
    with outbox.write() as unit:
        unit.mark("c1", [(p1, "ok")], [], 1.0)
        unit.claim("c1", [p2], 100.0, "relay", 1.0)
        # In a unit too (a relay's claim reads what it leases).
        assert unit.next_due("c1", 1e12, 10) == [(p2, e2.body), (p3, e3.body)]
    assert outbox.latest.next_due("c1", 99.0, 1) == [(p3, e3.body)]
    assert outbox.latest.next_due("c1", 100.0, 1) == [(p2, e2.body)]
    with outbox.write() as unit:
        unit.mark("c1", [(p3, "ok")], [(p2, "conflict")], 2.0)
    assert due(outbox.latest, "c1", 1e12, 1) == []


# -- claims, retries, answers ---------------------------------------------------------------


def test_claim_pushes_the_due_time_and_records_the_owner(outbox):
    bind(outbox, "c1", "c2")
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        unit.claim("c1", [p1, p3], 130.0, "relay-7", 100.0)
    for event_id in ("E1", "E3"):
        claimed = record(outbox, event_id, "c1")
        assert claimed.due_at == 130.0
        assert claimed.lease_owner == "relay-7"
        assert claimed.state == PENDING
        assert claimed.attempts == 0
    assert record(outbox, "E2", "c1").lease_owner is None
    assert record(outbox, "E1", "c2").lease_owner is None
    assert due(outbox.latest, "c1", 129.0, 10) == [p2]
    assert due(outbox.latest, "c2", 0, 10) == [p1, p2, p3]


def test_a_new_claim_replaces_the_old_one(outbox):
    bind(outbox, "c1")
    [p1] = append(outbox, env("E1"))
    with outbox.write(durable=False) as unit:
        unit.claim("c1", [p1], 130.0, "relay-a", 100.0)
    with outbox.write(durable=False) as unit:
        unit.claim("c1", [p1], 260.0, "relay-b", 230.0)
    claimed = record(outbox, "E1", "c1")
    assert (claimed.due_at, claimed.lease_owner) == (260.0, "relay-b")


def test_pending_failures_counts_failures_of_a_pending_delivery_only(outbox):
    bind(outbox, "c1")
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        assert unit.pending_failures("c1", p1) == 0
        unit.set_retry("c1", p1, Retry(1, 5.0, "down"), 1.0)
        unit.set_retry("c1", p2, Retry(4, 5.0, "down"), 1.0)
        unit.set_retry("c1", p3, Retry(2, 5.0, "down"), 1.0)
        assert unit.pending_failures("c1", p1) == 1
        assert unit.pending_failures("c1", p2) == 4
        unit.mark("c1", [(p1, "ok")], [(p2, "conflict")], 2.0)
        unit.resolve("c1", p3, SKIPPED, 2.0)
        assert unit.pending_failures("c1", p1) is None
        assert unit.pending_failures("c1", p2) is None
        assert unit.pending_failures("c1", p3) is None
        assert unit.pending_failures("c1", p3 + 1000) is None


def test_set_retry_records_attempt_failures_due_time_and_error_and_drops_the_lease(outbox):
    bind(outbox, "c1", "c2")
    [p1] = append(outbox, env("E1"))
    with outbox.write() as unit:
        unit.claim("c1", [p1], 130.0, "relay-a", 100.0)
        unit.set_retry("c1", p1, Retry(1, 102.5, "ConnectionError: refused"), 101.0)
    after = record(outbox, "E1", "c1")
    assert after == DeliveryRecord(PENDING, None, 1, "ConnectionError: refused", 102.5, None)
    with outbox.write(durable=False) as unit:
        unit.set_retry("c1", p1, Retry(2, 110.0, "TimeoutError: slow"), 103.0)
        assert unit.pending_failures("c1", p1) == 2
    after = record(outbox, "E1", "c1")
    assert after == DeliveryRecord(PENDING, None, 2, "TimeoutError: slow", 110.0, None)
    untouched = record(outbox, "E1", "c2")
    assert untouched == DeliveryRecord(PENDING, None, 0, None, untouched.due_at, None)
    assert due(outbox.latest, "c1", 109.0, 10) == []
    assert due(outbox.latest, "c1", 110.0, 10) == [p1]


def test_mark_delivered_accepts_and_clears_lease_and_error(outbox):
    bind(outbox, "c1", "c2")
    [p1, _] = append(outbox, env("E1", seq=1), env("E2", seq=2))
    with outbox.write() as unit:
        unit.set_retry("c1", p1, Retry(3, 50.0, "boom"), 10.0)
        unit.claim("c1", [p1], 80.0, "relay-a", 50.0)
        unit.mark("c1", [(p1, "accepted")], [], 51.0)
        assert unit.delivery_state("E1", "c1") == (p1, ACCEPTED)
    done = record(outbox, "E1", "c1")
    assert done.state == ACCEPTED
    assert done.last_status == "accepted"
    assert done.attempts == 2  # the failed send and this one
    assert done.lease_owner is None
    assert done.last_error is None
    assert record(outbox, "E2", "c1").state == PENDING
    assert record(outbox, "E1", "c2").state == PENDING
    entry = entry_of(outbox, "E1", consumer="c1")
    assert (entry.accepted, entry.state, entry.last_status) == (True, ACCEPTED, "accepted")


def test_mark_conflicts_sets_aside_and_clears_the_lease(outbox):
    bind(outbox, "c1")
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        unit.claim("c1", [p1, p2, p3], 80.0, "relay-a", 50.0)
        unit.mark("c1", [(p3, "duplicate")], [(p1, "id_conflict"), (p2, "sequence_conflict")], 51.0)
    first, second, third = (record(outbox, e, "c1") for e in ("E1", "E2", "E3"))
    assert (first.state, first.last_status, first.attempts, first.lease_owner) == (
        SET_ASIDE, "id_conflict", 1, None)
    assert (second.state, second.last_status, second.attempts, second.lease_owner) == (
        SET_ASIDE, "sequence_conflict", 1, None)
    assert (third.state, third.last_status, third.lease_owner) == (ACCEPTED, "duplicate", None)
    with outbox.write() as unit:
        assert unit.delivery_state("E2", "c1") == (p2, SET_ASIDE)


def test_a_conflict_never_undoes_an_accepted_delivery(outbox):
    bind(outbox, "c1")
    [p1] = append(outbox, env("E1"))
    with outbox.write() as unit:
        unit.mark("c1", [(p1, "accepted")], [], 1.0)
    with outbox.write() as unit:
        unit.mark("c1", [], [(p1, "id_conflict")], 2.0)
        assert unit.delivery_state("E1", "c1") == (p1, ACCEPTED)
    assert record(outbox, "E1", "c1").state == ACCEPTED
    assert entry_of(outbox, "E1").accepted is True
    assert due(outbox.latest, "c1", 1e12, 10) == []


def test_resolve_sets_the_state_due_at_once_without_failures_or_lease(outbox):
    bind(outbox, "c1")
    p1, p2, p3 = append(outbox, env("E1", seq=1), env("E2", seq=2), env("E3", seq=3))
    with outbox.write() as unit:
        unit.set_retry("c1", p1, Retry(5, 1e9, "down"), 10.0)
        unit.claim("c1", [p1], 2e9, "relay-a", 10.0)
        unit.mark("c1", [], [(p2, "id_conflict")], 10.0)
        unit.mark("c1", [(p3, "accepted")], [], 10.0)
    with outbox.write() as unit:
        unit.resolve("c1", p1, PENDING, 20.0)
        unit.resolve("c1", p2, PENDING, 20.0)
        unit.resolve("c1", p3, SKIPPED, 20.0)
        assert unit.pending_failures("c1", p1) == 0
        assert unit.delivery_state("E2", "c1") == (p2, PENDING)
        assert unit.delivery_state("E3", "c1") == (p3, SKIPPED)
    first = record(outbox, "E1", "c1")
    assert first.state == PENDING and first.lease_owner is None and first.due_at <= 20.0
    assert due(outbox.latest, "c1", 20.0, 10) == [p1, p2]
    with outbox.write() as unit:
        unit.resolve("c1", p2, SKIPPED, 30.0)
        unit.resolve("c1", p1, ACCEPTED, 30.0)
        assert unit.delivery_state("E1", "c1") == (p1, ACCEPTED)
    assert due(outbox.latest, "c1", 1e12, 10) == []


# -- operator actions -------------------------------------------------------------------


def delivery_action(at: float, consumer: str, event_id: str, action: str, actor: str, reason: str,
                    previous_state: DeliveryState | None = None) -> OperatorAction:
    return OperatorAction(at=at, target=ActionTarget.DELIVERY, consumer=consumer, event_id=event_id, action=action,
                          actor=actor, reason=reason, previous_state=previous_state)


def test_record_action_and_operator_actions_oldest_first(outbox):
    actions = [
        delivery_action(10.0, "c1", "E1", "skip", "ann", "poison"),
        delivery_action(20.0, "c2", "E2", "redeliver", "bob", "fixed"),
        delivery_action(30.0, "c1", "E1", "redeliver", "cid", "retry it"),
    ]
    with outbox.write() as unit:
        unit.record_action(actions[0])
    with outbox.write() as unit:
        unit.record_action(actions[1])
        unit.record_action(actions[2])
    assert outbox.latest.operator_actions() == actions
    assert outbox.latest.operator_actions("E1") == [actions[0], actions[2]]
    assert outbox.latest.operator_actions("E2") == [actions[1]]
    assert outbox.latest.operator_actions("E9") == []


def test_operator_actions_do_not_store_the_previous_state(outbox):
    with outbox.write() as unit:
        unit.record_action(delivery_action(1.0, "c1", "E1", "skip", "ann", "why", SET_ASIDE))
    [listed] = outbox.latest.operator_actions()
    assert listed == delivery_action(1.0, "c1", "E1", "skip", "ann", "why", None)


# -- outbox() listing -------------------------------------------------------------------


def test_outbox_lists_events_in_commit_order_with_the_flow_filter(outbox):
    append(outbox, env("B1", "B", 1), env("A1", "A", 1))
    append(outbox, env("B2", "B", 2))
    listed = outbox.latest.outbox()
    assert [(e.event_id, e.flow_id, e.seq) for e in listed] == [
        ("B1", "B", 1), ("A1", "A", 1), ("B2", "B", 2)]
    assert [e.event_id for e in outbox.latest.outbox("B")] == ["B1", "B2"]
    assert [e.event_id for e in outbox.latest.outbox(flow_id="A")] == ["A1"]
    assert outbox.latest.outbox("C") == []


def test_outbox_before_any_consumer_is_pending_with_no_deliveries(outbox):
    append(outbox, env("E1"))
    assert outbox.latest.outbox() == [OutboxEntry("E1", "F", 1, False, PENDING, None, {})]


# Each case: per consumer, what happens to the one event -> the summary state.
SUMMARY_CASES = {
    "all pending": ({"c1": None, "c2": None, "c3": None}, PENDING),
    "some accepted": ({"c1": ACCEPTED, "c2": None, "c3": ACCEPTED}, PENDING),
    "all accepted": ({"c1": ACCEPTED, "c2": ACCEPTED, "c3": ACCEPTED}, ACCEPTED),
    "one set aside": ({"c1": ACCEPTED, "c2": SET_ASIDE, "c3": ACCEPTED}, SET_ASIDE),
    "set aside beats the rest": ({"c1": SKIPPED, "c2": SET_ASIDE, "c3": None}, SET_ASIDE),
    "accepted and skipped": ({"c1": ACCEPTED, "c2": SKIPPED, "c3": ACCEPTED}, SKIPPED),
    "all skipped": ({"c1": SKIPPED, "c2": SKIPPED, "c3": SKIPPED}, SKIPPED),
    "skipped and pending": ({"c1": SKIPPED, "c2": None, "c3": ACCEPTED}, PENDING),
}


@pytest.mark.parametrize("case", sorted(SUMMARY_CASES))
def test_outbox_summary_state_over_consumers(outbox, case):
    outcome, expected = SUMMARY_CASES[case]
    bind(outbox, *outcome)
    [pos] = append(outbox, env("E1"))
    with outbox.write() as unit:
        for consumer, result in outcome.items():
            if result == ACCEPTED:
                unit.mark(consumer, [(pos, "accepted")], [], 1.0)
            elif result == SET_ASIDE:
                unit.mark(consumer, [], [(pos, "id_conflict")], 1.0)
            elif result == SKIPPED:
                unit.resolve(consumer, pos, SKIPPED, 1.0)
    entry = entry_of(outbox, "E1")
    assert entry.state == expected
    assert entry.accepted is (expected == ACCEPTED)
    assert {name: d.state for name, d in entry.deliveries.items()} == {
        name: result or PENDING for name, result in outcome.items()}
    # The consumer filter summarises that one consumer.
    for consumer, result in outcome.items():
        mine = entry_of(outbox, "E1", consumer=consumer)
        assert mine.state == (result or PENDING)
        assert mine.accepted is (result == ACCEPTED)


def test_outbox_last_status_follows_the_chosen_consumer(outbox):
    bind(outbox, "c1", "c2")
    [pos] = append(outbox, env("E1"))
    with outbox.write() as unit:
        unit.mark("c2", [], [(pos, "id_conflict")], 1.0)
    assert entry_of(outbox, "E1").last_status == "id_conflict"
    assert entry_of(outbox, "E1", consumer="c2").last_status == "id_conflict"
    assert entry_of(outbox, "E1", consumer="c1").last_status is None


def test_outbox_deliveries_carry_the_full_record(outbox):
    bind(outbox, "c1")
    [pos] = append(outbox, env("E1"))
    with outbox.write() as unit:
        unit.set_retry("c1", pos, Retry(1, 12.0, "refused"), 2.0)
        unit.claim("c1", [pos], 40.0, "relay-9", 12.0)
    [entry] = outbox.latest.outbox(consumer="c1")
    assert entry.deliveries["c1"] == DeliveryRecord(PENDING, None, 1, "refused", 40.0, "relay-9")
    assert isinstance(entry.state, DeliveryState)
    assert isinstance(entry.deliveries["c1"].state, DeliveryState)


# -- units of work ------------------------------------------------------------------------


def test_a_unit_that_raises_leaves_nothing(outbox):
    bind(outbox, "c0")
    [p0] = append(outbox, env("E0", "Z", 1))
    with pytest.raises(Boom), outbox.write() as unit:
        unit.put_flow("F", 1, "open", '{"n": 1}')
        unit.append_event(env("E1", "F", 1))
        add_consumer(unit, "c1", "uid-1")
        unit.claim("c0", [p0], 500.0, "relay", 1.0)
        unit.mark("c0", [(p0, "accepted")], [], 1.0)
        unit.record_action(delivery_action(1.0, "c0", "E0", "skip", "ann", "x"))
        assert unit.find_event("E1") is not None  # visible inside the unit
        raise Boom
    reads = outbox.latest
    assert reads.flows() == []
    assert flow(reads, "F") is None
    assert reads.find_event("E1") is None
    assert [e.event_id for e in reads.outbox()] == ["E0"]
    kept = record(outbox, "E0", "c0")
    assert kept == DeliveryRecord(PENDING, None, 0, None, kept.due_at, None)
    assert kept.due_at < 500.0
    assert reads.operator_actions() == []
    with outbox.write() as unit:
        assert unit.bound_uid("c1") is None
        assert unit.backlog(100) == 1


def test_an_undurable_unit_commits_and_rolls_back_like_any_other(outbox):
    with outbox.write(durable=False) as unit:
        unit.append_event(env("E1", seq=1))
    with pytest.raises(Boom), outbox.write(durable=False) as unit:
        unit.append_event(env("E2", seq=2))
        raise Boom
    assert [e.event_id for e in outbox.latest.outbox()] == ["E1"]
    with outbox.write() as unit:
        unit.append_event(env("E3", seq=3))
    assert [e.event_id for e in outbox.latest.outbox()] == ["E1", "E3"]


def test_a_failed_step_drops_only_its_own_writes(outbox):
    with outbox.write() as unit:
        unit.put_flow("F", 1, "open", "{}")
        unit.append_event(env("E1", "F", 1))
        with pytest.raises(Boom), unit.step():
            unit.put_flow("F", 2, "broken", "{}")
            unit.append_event(env("E2", "F", 2))
            add_consumer(unit, "c1", "uid-1")
            raise Boom
        assert unit.lost is None
        assert unit.find_event("E2") is None
        assert unit.flow_state("F") == FlowState("open", 1, {})
        with unit.step():
            unit.append_event(env("E3", "F", 2))
        unit.put_flow("F", 2, "open", "{}")
    reads = outbox.latest
    assert [e.event_id for e in reads.outbox()] == ["E1", "E3"]
    assert flow(reads, "F") == {"state": "open", "seq": 2}
    with outbox.write() as unit:
        assert unit.bound_uid("c1") is None


def test_a_taken_key_inside_a_step_leaves_the_unit_usable(outbox, integrity_error):
    append(outbox, env("E1", "F", 1))
    with outbox.write() as unit:
        unit.append_event(env("G1", "G", 1))
        with pytest.raises(integrity_error), unit.step():
            unit.append_event(env("E1", "H", 1))
        assert unit.lost is None
        unit.append_event(env("G2", "G", 2))
    assert [(e.event_id, e.flow_id) for e in outbox.latest.outbox()] == [
        ("E1", "F"), ("G1", "G"), ("G2", "G")]


def test_in_transaction_only_inside_a_unit(outbox):
    assert outbox.in_transaction() is False
    with outbox.write() as unit:
        assert outbox.in_transaction() is True
        unit.append_event(env("E1"))
    assert outbox.in_transaction() is False
    with pytest.raises(Boom), outbox.write():
        assert outbox.in_transaction() is True
        raise Boom
    assert outbox.in_transaction() is False


def test_latest_sees_every_commit_at_once(outbox_store):
    store = outbox_store()
    other = outbox_store(same_as=store)
    reads = store.latest
    assert reads.find_event("E1") is None
    append(other, env("E1"))
    assert reads.find_event("E1") is not None
    assert event_body(store.latest, "E1") == env("E1").body


def test_a_snapshot_does_not_see_later_commits(outbox_store):
    store = outbox_store()
    other = outbox_store(same_as=store)
    append(store, env("E1", seq=1))
    with store.read() as snap:
        assert [e.event_id for e in snap.outbox()] == ["E1"]
        with other.write() as unit:
            unit.put_flow("F", 2, "open", "{}")
            unit.append_event(env("E2", seq=2))
        assert [e.event_id for e in snap.outbox()] == ["E1"]
        assert snap.find_event("E2") is None
        assert flow(snap, "F") is None
        assert snap.flows() == []
    assert [e.event_id for e in store.latest.outbox()] == ["E1", "E2"]
    with store.read() as snap:
        assert snap.find_event("E2") is not None


def test_a_unit_holds_what_it_read_until_it_commits(outbox_store):
    """A second unit's read-check-write on the same location waits for the first to commit."""
    store = outbox_store()
    with store.write() as unit:
        unit.put_flow("F", 1, "open", "{}")
    seen: list[object] = []
    errors: list[BaseException] = []
    ready, done = threading.Event(), threading.Event()

    def second_writer() -> None:
        other = outbox_store(same_as=store)
        try:
            ready.set()
            with other.write() as unit2:
                found = unit2.flow_state("F")
                seen.append(found)
                unit2.put_flow("F", found.seq + 1, "open", "{}")
        except BaseException as exc:  # noqa: BLE001 - reported in the test's thread below
            errors.append(exc)
        finally:
            outbox_store.release(other)
            done.set()

    with store.write() as unit:
        assert unit.flow_state("F").seq == 1
        thread = threading.Thread(target=second_writer)
        thread.start()
        assert ready.wait(10)
        time.sleep(0.2)
        assert not done.is_set(), "the second unit ran while the first held the store"
        unit.put_flow("F", 2, "open", "{}")
    thread.join(30)
    assert not errors, errors
    assert seen == [FlowState("open", 2, {})]
    assert flow(store.latest, "F") == {"state": "open", "seq": 3}


# -- close, reopen, binding memo ------------------------------------------------------


def test_committed_data_outlives_close_and_reopen(outbox_store):
    store = outbox_store()
    bind(store, "c1")
    [pos] = append(store, env("E1"))
    with store.write(durable=False) as unit:
        unit.claim("c1", [pos], 99.0, "relay", 1.0)
    store.close()
    store.reopen()
    assert store.latest.find_event("E1") == StoredEvent(pos, 1, env("E1").body)
    assert record(store, "E1", "c1").lease_owner == "relay"
    with store.write() as unit:
        assert unit.bound_uid("c1") == "uid-c1"
        unit.append_event(env("E2", seq=2))
    store.close()
    fresh = outbox_store(same_as=store)
    assert [e.event_id for e in fresh.latest.outbox()] == ["E1", "E2"]
    store.reopen()
    assert store.in_transaction() is False


def test_reopen_without_close_gives_a_working_store(outbox):
    append(outbox, env("E1"))
    outbox.reopen()
    append(outbox, env("E2", seq=2))
    assert [e.event_id for e in outbox.latest.outbox()] == ["E1", "E2"]


def test_binding_memo_remembers_name_and_uid_per_object(outbox_store):
    store = outbox_store()
    assert store.known_binding("c1", "uid-1") is False
    store.remember_binding("c1", "uid-1")
    assert store.known_binding("c1", "uid-1") is True
    assert store.known_binding("c1", "uid-2") is False
    assert store.known_binding("c2", "uid-1") is False
    store.remember_binding("c2", "uid-2")
    assert store.known_binding("c1", "uid-1") is True
    assert store.known_binding("c2", "uid-2") is True
    other = outbox_store(same_as=store)
    assert other.known_binding("c1", "uid-1") is False
    store.close()
    store.reopen()
    assert store.known_binding("c1", "uid-1") is True


def test_the_binding_memo_is_not_stored(outbox):
    outbox.remember_binding("c1", "uid-1")
    with outbox.write() as unit:
        assert unit.bound_uid("c1") is None


def test_every_read_in_a_unit_sees_the_deliveries_of_events_its_steps_appended(outbox):
    """An engine may write a batch's deliveries late; no read of the same
    unit may tell (each read here is the first after an append)."""
    bind(outbox, "c")
    with outbox.write() as unit:
        with unit.step():
            unit.append_event(env("E1", "F", 1))
        assert unit.backlog(10) == 1
        with unit.step():
            unit.append_event(env("E2", "F", 2))
        assert [pos for pos, _ in unit.next_due("c", float("inf"), 10)] == [
            unit.find_event("E1").pos, unit.find_event("E2").pos]
        with unit.step():
            unit.append_event(env("E3", "F", 3))
        assert unit.delivery_state("E3", "c") == (unit.find_event("E3").pos, PENDING)
        with unit.step():
            unit.append_event(env("E4", "F", 4))
        assert unit.pending_failures("c", unit.find_event("E4").pos) == 0
        with unit.step():
            unit.append_event(env("E5", "F", 5))
        assert [d.state for e in unit.outbox() for d in e.deliveries.values()] == [PENDING] * 5
        with unit.step():
            unit.append_event(env("E6", "F", 6))
        assert unit.next_due_at("c") is not None
        assert [c.backlog for c in unit.consumers()] == [6]
    assert outbox.latest.backlog(10) == 6
