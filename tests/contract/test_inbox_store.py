"""The inbox store's contract (:mod:`reliable_flow._store.inbox`), for every engine.

Each test states one promise of a method's docstring and checks it only
through the store interface: ``write()`` units, ``read()`` snapshots,
``latest`` reads, ``location`` and ``close``/``reopen``.
"""

from __future__ import annotations

import threading
import time

import pytest
from contract_support import (
    body_of,
    contract_problems,
    entries,
    env,
    offers,
    protocol_members,
    protocol_properties,
)

from reliable_flow._envelope import Envelope
from reliable_flow._store import FlowState, InboxReads, InboxStore, InboxUnit
from reliable_flow.records import AppliedEvent, InboxEntry
from reliable_flow.statuses import BlockReason, InboxState

PENDING = InboxState.PENDING
BLOCKED = InboxState.BLOCKED
APPLIED = InboxState.APPLIED


class Boom(Exception):
    """Raised by a test to abandon a unit of work."""



def insert(store, *envs: Envelope) -> None:
    with store.write() as unit:
        for e in envs:
            unit.insert(e)


def apply(store, e: Envelope, view: str = "{}") -> None:
    """What applying ``e`` writes: its effect, its row applied, the projection."""
    with store.write() as unit:
        unit.record_applied(e.event_id, e.flow_id, e.seq, e.kind)
        unit.put_projection(e.flow_id, e.kind, e.seq, "{}", view)


def rows(store, flow_id: str) -> list[tuple[str, int, InboxState, BlockReason | None]]:
    return [(r.event_id, r.seq, r.state, r.reason) for r in entries(store.latest, flow_id)]



# -- the store object -------------------------------------------------------------------


def test_units_and_snapshots_offer_every_protocol_method(inbox):
    with inbox.write() as unit:
        for name in protocol_members(InboxUnit):
            assert offers(unit, name, protocol_properties(InboxUnit, InboxReads)), name
    with inbox.read() as reads:
        for name in protocol_members(InboxReads):
            assert offers(reads, name, protocol_properties(InboxUnit, InboxReads)), name
    for name in protocol_members(InboxReads):
        assert offers(inbox.latest, name, protocol_properties(InboxUnit, InboxReads)), name


# Public members an engine's consumer side offers beyond the contract, each
# documented.  Views: ``lost`` (set when the engine dropped the transaction
# under a ``step``; the producer's contract declares it, the consumer's
# does not need it).  Stores: ``in_transaction`` (what both sides' store
# classes share; only the relay, on the producer side, asks) and ``schema``
# (the PostgreSQL schema the store's tables live in).
INBOX_VIEW_EXTRAS = {"lost"}
INBOX_STORE_EXTRAS = {"in_transaction", "schema"}


def test_the_engine_classes_offer_exactly_the_contract(inbox):
    """Strict: every member of InboxUnit (views: a unit, a snapshot and
    ``latest`` are one class) and of InboxStore, with the contract's
    parameter names, kinds and defaults; and nothing public beyond it but
    the documented extras."""
    with inbox.write() as unit:
        assert contract_problems(unit, (InboxUnit,), INBOX_VIEW_EXTRAS) == []
    assert contract_problems(inbox, (InboxStore,), INBOX_STORE_EXTRAS) == []


def test_meta_names_protocol_consumer_and_a_uid(inbox_store):
    store = inbox_store(protocol="orders-v1", name="billing")
    meta = store.latest.meta()
    assert meta["protocol"] == "orders-v1"
    assert meta["name"] == "billing"
    assert isinstance(meta["uid"], str) and meta["uid"]
    with store.read() as reads:
        assert reads.meta() == meta
    with store.write() as unit:
        assert unit.meta() == meta


def test_add_meta_records_a_key_once_and_the_first_value_stays(inbox_store):
    store = inbox_store()
    assert store.latest.meta_value("protocol_path") is None
    with store.write() as unit:
        assert unit.add_meta("protocol_path", "app:FIRST") == "app:FIRST"
    with store.write() as unit:
        assert unit.add_meta("protocol_path", "app:SECOND") == "app:FIRST"
        assert unit.meta()["protocol_path"] == "app:FIRST"
    with store.read() as reads:
        assert reads.meta_value("protocol_path") == "app:FIRST"
        assert reads.meta_value("name") == "consumer-a"


def test_each_store_has_its_own_uid_and_keeps_it(inbox_store):
    first = inbox_store(name="same")
    second = inbox_store(name="same")
    assert first.latest.meta()["uid"] != second.latest.meta()["uid"]
    uid = first.latest.meta()["uid"]
    again = inbox_store(same_as=first, name="same")
    assert again.latest.meta()["uid"] == uid
    first.close()
    first.reopen()
    assert first.latest.meta()["uid"] == uid


def test_location_names_where_the_data_lives(inbox_store):
    first = inbox_store()
    second = inbox_store()
    assert isinstance(first.location, str) and first.location
    assert first.location != second.location
    insert(first, env("E1"))
    again = inbox_store(same_as=first)
    assert again.location == first.location
    assert rows(again, "F") == [("E1", 1, PENDING, None)]
    assert rows(second, "F") == []


def test_a_fresh_store_is_empty(inbox):
    reads = inbox.latest
    assert reads.flows() == []
    assert reads.open_flows() == []
    assert entries(reads, "F") == []
    assert reads.effects("F") == []
    assert reads.projection("F") is None
    with inbox.write() as unit:
        assert unit.unapplied(100) == 0
        assert unit.last_seq("F") == 0
        assert unit.flow_state("F") is None
        assert unit.next_row("F", 1) is None
        assert body_of(unit, "E1") is None
        assert unit.holder("F", 1) is None


# -- receiving --------------------------------------------------------------------------


def test_insert_new_stores_a_pending_row(inbox):
    e = env("E1", "F", 1)
    with inbox.write() as unit:
        assert unit.insert_new(e) is True
        assert body_of(unit, "E1") == e.body
        assert unit.holder("F", 1) == "E1"
    assert entries(inbox.latest, "F") == [InboxEntry("E1", 1, PENDING, None)]


def test_insert_new_refuses_a_taken_id_and_keeps_the_first(inbox):
    first = env("E1", "F", 1)
    with inbox.write() as unit:
        assert unit.insert_new(first) is True
    with inbox.write() as unit:
        assert unit.insert_new(first) is False
        assert unit.insert_new(env("E1", "G", 4, kind="other")) is False
        assert body_of(unit, "E1") == first.body
        assert unit.holder("G", 4) is None
    assert inbox.latest.flows() == ["F"]
    assert rows(inbox, "F") == [("E1", 1, PENDING, None)]


def test_insert_new_refuses_a_taken_flow_and_seq(inbox):
    with inbox.write() as unit:
        assert unit.insert_new(env("E1", "F", 1)) is True
        assert unit.insert_new(env("E2", "F", 1)) is False
        assert body_of(unit, "E2") is None
        assert unit.holder("F", 1) == "E1"
        assert unit.insert_new(env("E3", "F", 2)) is True
    assert rows(inbox, "F") == [("E1", 1, PENDING, None), ("E3", 2, PENDING, None)]


def test_insert_new_many_answers_insert_new_of_each_in_turn(inbox):
    """A set with distinct ids and (flow, seq): each refused for the reason
    insert_new would refuse it, the others stored pending, in that order."""
    a1 = env("A1", "F", 1)
    insert(inbox, a1, env("B1", "G", 1))
    apply(inbox, a1)  # F's last applied seq is 1
    batch = [
        env("X1", "F", 1),  # at or before F's last applied seq
        env("B1", "K", 5, kind="other"),  # a taken id
        env("Y1", "G", 1),  # a taken (flow, seq)
        env("Z2", "G", 2),
        env("W1", "H", 1),
        env("V2", "F", 2),
    ]
    with inbox.write() as unit:
        assert unit.insert_new_many(batch) == [False, False, False, True, True, True]
        assert unit.holder("G", 2) == "Z2" and unit.holder("K", 5) is None
        assert unit.next_row("F", 2) == (2, "V2", batch[5].body)
    assert rows(inbox, "G") == [("B1", 1, PENDING, None), ("Z2", 2, PENDING, None)]
    assert rows(inbox, "H") == [("W1", 1, PENDING, None)]
    assert body_of(inbox.latest, "X1") is None and body_of(inbox.latest, "Y1") is None
    with inbox.write() as unit:
        assert unit.insert_new_many([env("Z2", "G", 2), env("U3", "G", 3)]) == [False, True]
        assert unit.insert_new_many([]) == []


def test_insert_new_many_is_rolled_back_with_its_unit(inbox):
    with pytest.raises(Boom), inbox.write() as unit:
        assert unit.insert_new_many([env("E1", "F", 1), env("E2", "F", 2)]) == [True, True]
        raise Boom
    assert inbox.latest.flows() == []


def test_insert_raises_on_a_taken_id_and_stores_nothing(inbox, integrity_error):
    first = env("E1", "F", 1)
    insert(inbox, first)
    with pytest.raises(integrity_error), inbox.write() as unit:
        unit.insert(env("E1", "G", 3))
    with inbox.write() as unit:
        assert body_of(unit, "E1") == first.body
        assert unit.holder("G", 3) is None
    assert inbox.latest.flows() == ["F"]


def test_insert_raises_on_a_taken_flow_and_seq_and_stores_nothing(inbox, integrity_error):
    insert(inbox, env("E1", "F", 1))
    with pytest.raises(integrity_error), inbox.write() as unit:
        unit.insert(env("E2", "F", 1))
    with inbox.write() as unit:
        assert body_of(unit, "E2") is None
        assert unit.holder("F", 1) == "E1"
    assert rows(inbox, "F") == [("E1", 1, PENDING, None)]


def test_body_of_and_holder(inbox):
    a1, a2, b1 = env("A1", "A", 1), env("A2", "A", 2), env("B1", "B", 1)
    insert(inbox, a1, a2, b1)
    with inbox.write() as unit:
        assert body_of(unit, "A2") == a2.body
        assert body_of(unit, "B1") == b1.body
        assert body_of(unit, "C1") is None
        assert unit.holder("A", 1) == "A1"
        assert unit.holder("A", 2) == "A2"
        assert unit.holder("B", 1) == "B1"
        assert unit.holder("B", 2) is None
        assert unit.holder("C", 1) is None


def test_unapplied_counts_rows_not_applied_up_to_cap(inbox):
    a1, a2, a3, b1 = env("A1", "A", 1), env("A2", "A", 2), env("A3", "A", 3), env("B1", "B", 1)
    insert(inbox, a1, a2, a3, b1)
    with inbox.write() as unit:
        assert unit.unapplied(100) == 4
        assert unit.unapplied(4) == 4
        assert unit.unapplied(3) == 3
        assert unit.unapplied(1) == 1
    apply(inbox, a1)
    with inbox.write() as unit:
        unit.block("A2", BlockReason.INVALID_PAYLOAD)
        assert unit.unapplied(100) == 3  # a blocked row is not applied
        unit.record_applied("B1", "B", 1, "created")
        assert unit.unapplied(100) == 2
        assert unit.unapplied(1) == 1


# -- projection ---------------------------------------------------------------------------


def test_last_seq_is_zero_before_any_apply(inbox):
    insert(inbox, env("E1", "F", 1))
    with inbox.write() as unit:
        assert unit.last_seq("F") == 0
        unit.put_projection("F", "open", 1, "{}", "{}")
        assert unit.last_seq("F") == 1
        assert unit.last_seq("G") == 0
    with inbox.write() as unit:
        unit.put_projection("F", "open", 7, "{}", "{}")
    with inbox.write() as unit:
        assert unit.last_seq("F") == 7


def test_put_projection_creates_then_replaces(inbox):
    with inbox.write() as unit:
        assert unit.flow_state("F") is None
        unit.put_projection("F", "open", 1, '{"amount": 3}', '{"shown": "three"}')
        assert unit.flow_state("F") == FlowState("open", 1, {"amount": 3})
    assert inbox.latest.projection("F") == {"state": "open", "last_seq": 1, "shown": "three"}
    with inbox.write() as unit:
        unit.put_projection("F", "closed", 2, '{"total": 5}', '{"label": "done", "items": 2}')
    assert inbox.latest.projection("F") == {
        "state": "closed", "last_seq": 2, "label": "done", "items": 2}
    with inbox.write() as unit:
        assert unit.flow_state("F") == FlowState("closed", 2, {"total": 5})
    assert inbox.latest.projection("G") is None


def test_projection_shows_the_view_and_flow_state_the_data(inbox):
    with inbox.write() as unit:
        unit.put_projection("F", "open", 3, '{"secret": 1}', '{"public": 2}')
        assert unit.flow_state("F").data == {"secret": 1}
        assert unit.projection("F") == {"state": "open", "last_seq": 3, "public": 2}


# -- applying -----------------------------------------------------------------------------


def test_next_row_is_the_first_row_at_or_after_seq(inbox):
    f1, f2, f4, f9 = env("F1", "F", 1), env("F2", "F", 2), env("F4", "F", 4), env("F9", "F", 9)
    insert(inbox, f9, f2, env("G3", "G", 3), f4, f1)
    with inbox.write() as unit:
        assert unit.next_row("F", 1) == (1, "F1", f1.body)
        assert unit.next_row("F", 2) == (2, "F2", f2.body)
        assert unit.next_row("F", 3) == (4, "F4", f4.body)  # past a gap
        assert unit.next_row("F", 5) == (9, "F9", f9.body)
        assert unit.next_row("F", 10) is None
        assert unit.next_row("G", 1) == (3, "G3", env("G3", "G", 3).body)
        assert unit.next_row("H", 1) is None


def test_flow_and_next_row_answers_flow_state_then_next_row(inbox):
    """One call for an apply's two first reads: the flow's state (None
    before any apply) and its first row at or after last_seq + 1."""
    f1, f2, f4, g3 = env("F1", "F", 1), env("F2", "F", 2), env("F4", "F", 4), env("G3", "G", 3)
    insert(inbox, f4, f2, g3, f1)
    with inbox.write() as unit:
        assert unit.flow_and_next_row("F") == (None, (1, "F1", f1.body))
        assert unit.flow_and_next_row("G") == (None, (3, "G3", g3.body))  # a gap: the core decides
        assert unit.flow_and_next_row("H") == (None, None)
    apply(inbox, f1)
    apply(inbox, f2)
    with inbox.write() as unit:
        state, row = unit.flow_and_next_row("F")
        assert state is not None and state.seq == 2 and row == (4, "F4", f4.body)
        # What the same unit writes next is seen by its next reads.
        unit.insert(env("F3", "F", 3))
        assert unit.next_row("F", 3) == (3, "F3", env("F3", "F", 3).body)
        unit.put_projection("F", "paid", 4, '{"n": 4}', "{}")
        assert unit.flow_and_next_row("F") == (FlowState("paid", 4, {"n": 4}), None)
    with inbox.read() as reads:
        assert reads.flow_state("F") == FlowState("paid", 4, {"n": 4})


def test_next_row_finds_rows_whatever_their_state(inbox):
    f1, f2 = env("F1", "F", 1), env("F2", "F", 2)
    insert(inbox, f1, f2)
    apply(inbox, f1)
    with inbox.write() as unit:
        unit.block("F2", BlockReason.UNSUPPORTED_SCHEMA)
        assert unit.next_row("F", 1) == (1, "F1", f1.body)
        assert unit.next_row("F", 2) == (2, "F2", f2.body)


def test_next_row_sees_what_the_same_unit_wrote_since_the_last_next_row(inbox):
    """An engine may read ahead (the row after the one it returned); writes of
    the same unit that add, free or remove rows must still be seen."""
    f1, f2, f3 = env("F1", "F", 1), env("F2", "F", 2), env("F3", "F", 3)
    insert(inbox, f1)
    with inbox.write() as unit:
        assert unit.next_row("F", 1) == (1, "F1", f1.body)
        unit.put_projection("F", "created", 1, "{}", "{}")
        unit.record_applied("F1", "F", 1, "created")
        assert unit.insert_new(f2)
        assert unit.next_row("F", 2) == (2, "F2", f2.body)
        unit.insert(f3)
        assert unit.next_row("F", 2) == (2, "F2", f2.body)
        assert unit.next_row("F", 3) == (3, "F3", f3.body)
    with inbox.write() as unit:
        assert unit.next_row("F", 2) == (2, "F2", f2.body)
        unit.set_replaced("F3")
        assert unit.next_row("F", 3) is None
        assert unit.insert_new(env("F3b", "F", 3))
        assert unit.next_row("F", 3) == (3, "F3b", env("F3b", "F", 3).body)


def test_block_marks_the_row_blocked_with_its_reason(inbox):
    insert(inbox, env("F1", "F", 1), env("F2", "F", 2))
    with inbox.write() as unit:
        unit.block("F1", BlockReason.INVALID_TRANSITION)
    assert entries(inbox.latest, "F") == [
        InboxEntry("F1", 1, BLOCKED, BlockReason.INVALID_TRANSITION),
        InboxEntry("F2", 2, PENDING, None),
    ]


def test_block_is_idempotent(inbox):
    insert(inbox, env("F1", "F", 1))
    for _ in range(3):
        with inbox.write() as unit:
            unit.block("F1", BlockReason.INVALID_PAYLOAD)
            assert entries(unit, "F") == [InboxEntry("F1", 1, BLOCKED, BlockReason.INVALID_PAYLOAD)]
    assert entries(inbox.latest, "F") == [InboxEntry("F1", 1, BLOCKED, BlockReason.INVALID_PAYLOAD)]


def test_block_for_another_reason_records_the_new_reason(inbox):
    insert(inbox, env("F1", "F", 1))
    with inbox.write() as unit:
        unit.block("F1", BlockReason.UNSUPPORTED_SCHEMA)
    with inbox.write() as unit:
        unit.block("F1", BlockReason.INVALID_PAYLOAD)
    assert entries(inbox.latest, "F") == [InboxEntry("F1", 1, BLOCKED, BlockReason.INVALID_PAYLOAD)]


def test_record_applied_writes_one_effect_and_marks_the_row_applied(inbox):
    f1, f2 = env("F1", "F", 1, kind="reserved"), env("F2", "F", 2, kind="paid")
    insert(inbox, f1, f2)
    with inbox.write() as unit:
        unit.record_applied("F1", "F", 1, "reserved")
        assert unit.effects("F") == [AppliedEvent("F1", "F", 1, "reserved")]
    assert inbox.latest.effects("F") == [AppliedEvent("F1", "F", 1, "reserved")]
    assert rows(inbox, "F") == [("F1", 1, APPLIED, None), ("F2", 2, PENDING, None)]


def test_record_applied_on_a_blocked_row_clears_the_reason(inbox):
    insert(inbox, env("F1", "F", 1))
    with inbox.write() as unit:
        unit.block("F1", BlockReason.UNSUPPORTED_SCHEMA)
    with inbox.write() as unit:
        unit.record_applied("F1", "F", 1, "created")
    assert entries(inbox.latest, "F") == [InboxEntry("F1", 1, APPLIED, None)]


def test_effects_come_in_apply_order(inbox):
    f1, f2, g1 = env("F1", "F", 1), env("F2", "F", 2), env("G1", "G", 1)
    insert(inbox, f1, f2, g1)
    with inbox.write() as unit:
        unit.record_applied("F2", "F", 2, "second")
        unit.record_applied("G1", "G", 1, "other")
    with inbox.write() as unit:
        unit.record_applied("F1", "F", 1, "first")
    assert inbox.latest.effects("F") == [
        AppliedEvent("F2", "F", 2, "second"), AppliedEvent("F1", "F", 1, "first")]
    assert inbox.latest.effects("G") == [AppliedEvent("G1", "G", 1, "other")]
    assert inbox.latest.effects("H") == []


def test_a_second_effect_for_the_same_event_raises(inbox, integrity_error):
    insert(inbox, env("F1", "F", 1))
    apply(inbox, env("F1", "F", 1), view='{"n": 1}')
    with pytest.raises(integrity_error), inbox.write() as unit:
        unit.record_applied("F1", "F", 1, "created")
    with pytest.raises(integrity_error), inbox.write() as unit:
        unit.record_applied("F1", "F", 2, "again")
    assert inbox.latest.effects("F") == [AppliedEvent("F1", "F", 1, "created")]
    assert inbox.latest.projection("F") == {"state": "created", "last_seq": 1, "n": 1}


def test_a_second_effect_for_the_same_flow_and_seq_raises(inbox, integrity_error):
    insert(inbox, env("F1", "F", 1))
    apply(inbox, env("F1", "F", 1))
    with pytest.raises(integrity_error), inbox.write() as unit:
        unit.record_applied("X1", "F", 1, "created")
    assert inbox.latest.effects("F") == [AppliedEvent("F1", "F", 1, "created")]


# -- listings -----------------------------------------------------------------------------


def test_inbox_lists_the_flow_rows_by_seq_with_enum_states(inbox):
    insert(inbox, env("F3", "F", 3), env("G1", "G", 1), env("F1", "F", 1), env("F2", "F", 2))
    apply(inbox, env("F1", "F", 1))
    with inbox.write() as unit:
        unit.block("F2", BlockReason.INVALID_TRANSITION)
    listed = entries(inbox.latest, "F")
    assert listed == [
        InboxEntry("F1", 1, APPLIED, None),
        InboxEntry("F2", 2, BLOCKED, BlockReason.INVALID_TRANSITION),
        InboxEntry("F3", 3, PENDING, None),
    ]
    assert all(type(e.state) is InboxState for e in listed)
    assert type(listed[1].reason) is BlockReason
    assert entries(inbox.latest, "G") == [InboxEntry("G1", 1, PENDING, None)]
    assert entries(inbox.latest, "H") == []


def test_flows_lists_every_flow_with_an_inbox_row_sorted(inbox):
    insert(inbox, env("c1", "c", 1), env("a1", "a", 1), env("c2", "c", 2), env("b1", "b", 1))
    apply(inbox, env("a1", "a", 1))
    with inbox.write() as unit:
        unit.put_projection("z", "open", 1, "{}", "{}")  # a projection is not a row
    assert inbox.latest.flows() == ["a", "b", "c"]


def test_open_flows_lists_flows_with_unapplied_rows_sorted(inbox):
    insert(inbox, env("c1", "c", 1), env("a1", "a", 1), env("a2", "a", 2), env("b1", "b", 1),
           env("d1", "d", 1))
    assert inbox.latest.open_flows() == ["a", "b", "c", "d"]
    apply(inbox, env("a1", "a", 1))
    apply(inbox, env("b1", "b", 1))
    with inbox.write() as unit:
        unit.block("d1", BlockReason.UNSUPPORTED_SCHEMA)
    assert inbox.latest.open_flows() == ["a", "c", "d"]
    apply(inbox, env("a2", "a", 2))
    apply(inbox, env("c1", "c", 1))
    assert inbox.latest.open_flows() == ["d"]
    apply(inbox, env("d1", "d", 1))
    assert inbox.latest.open_flows() == []
    assert inbox.latest.flows() == ["a", "b", "c", "d"]


# -- units of work ------------------------------------------------------------------------


def test_a_unit_that_raises_leaves_nothing(inbox):
    f1 = env("F1", "F", 1)
    insert(inbox, f1)
    with pytest.raises(Boom), inbox.write() as unit:
        assert unit.insert_new(env("G1", "G", 1)) is True
        unit.insert(env("F2", "F", 2))
        unit.record_applied("F1", "F", 1, "created")
        unit.put_projection("F", "created", 1, '{"a": 1}', '{"b": 2}')
        unit.block("F2", BlockReason.INVALID_PAYLOAD)
        assert unit.holder("G", 1) == "G1"  # visible inside the unit
        raise Boom
    reads = inbox.latest
    assert reads.flows() == ["F"]
    assert entries(reads, "F") == [InboxEntry("F1", 1, PENDING, None)]
    assert entries(reads, "G") == []
    assert reads.effects("F") == []
    assert reads.projection("F") is None
    assert reads.open_flows() == ["F"]
    with inbox.write() as unit:
        assert body_of(unit, "G1") is None
        assert unit.last_seq("F") == 0
        assert unit.unapplied(100) == 1


def test_an_undurable_unit_commits_and_rolls_back_like_any_other(inbox):
    with inbox.write(durable=False) as unit:
        unit.insert(env("F1", "F", 1))
    with pytest.raises(Boom), inbox.write(durable=False) as unit:
        unit.insert(env("F2", "F", 2))
        raise Boom
    assert rows(inbox, "F") == [("F1", 1, PENDING, None)]


def test_latest_sees_every_commit_at_once(inbox_store):
    store = inbox_store()
    other = inbox_store(same_as=store)
    reads = store.latest
    assert reads.flows() == []
    insert(other, env("F1", "F", 1))
    assert reads.flows() == ["F"]
    assert rows(store, "F") == [("F1", 1, PENDING, None)]


def test_a_snapshot_does_not_see_later_commits(inbox_store):
    store = inbox_store()
    other = inbox_store(same_as=store)
    insert(store, env("F1", "F", 1))
    with store.read() as snap:
        assert snap.flows() == ["F"]
        with other.write() as unit:
            unit.insert(env("G1", "G", 1))
            unit.record_applied("F1", "F", 1, "created")
            unit.put_projection("F", "created", 1, "{}", "{}")
        assert snap.flows() == ["F"]
        assert snap.open_flows() == ["F"]
        assert entries(snap, "F") == [InboxEntry("F1", 1, PENDING, None)]
        assert snap.effects("F") == []
        assert snap.projection("F") is None
    assert store.latest.flows() == ["F", "G"]
    assert store.latest.open_flows() == ["G"]


# -- close and reopen ---------------------------------------------------------------------


def test_committed_data_outlives_close_and_reopen(inbox_store):
    store = inbox_store()
    f1 = env("F1", "F", 1)
    insert(store, f1, env("F2", "F", 2))
    apply(store, f1, view='{"v": 1}')
    store.close()
    store.reopen()
    assert rows(store, "F") == [("F1", 1, APPLIED, None), ("F2", 2, PENDING, None)]
    assert store.latest.projection("F") == {"state": "created", "last_seq": 1, "v": 1}
    with store.write() as unit:
        unit.insert(env("F3", "F", 3))
    store.close()
    fresh = inbox_store(same_as=store)
    assert [r.event_id for r in entries(fresh.latest, "F")] == ["F1", "F2", "F3"]
    assert fresh.latest.effects("F") == [AppliedEvent("F1", "F", 1, "created")]
    store.reopen()


def test_reopen_without_close_gives_a_working_store(inbox):
    insert(inbox, env("F1", "F", 1))
    inbox.reopen()
    insert(inbox, env("F2", "F", 2))
    assert [r.event_id for r in entries(inbox.latest, "F")] == ["F1", "F2"]


def test_a_unit_holds_what_it_read_until_it_commits(inbox_store):
    """A second unit's read-check-write on the same location waits for the first to commit."""
    store = inbox_store()
    seen: list[object] = []
    errors: list[BaseException] = []
    ready, done = threading.Event(), threading.Event()

    def second_writer() -> None:
        other = inbox_store(same_as=store)
        try:
            ready.set()
            with other.write() as unit2:
                seen.append(unit2.holder("F", 1))
                seen.append(unit2.insert_new(env("B1", "F", 1)))
        except BaseException as exc:  # noqa: BLE001 - reported in the test's thread below
            errors.append(exc)
        finally:
            inbox_store.release(other)
            done.set()

    with store.write() as unit:
        assert unit.holder("F", 1) is None
        thread = threading.Thread(target=second_writer)
        thread.start()
        assert ready.wait(10)
        time.sleep(0.2)
        assert not done.is_set(), "the second unit ran while the first held the store"
        assert unit.insert_new(env("A1", "F", 1)) is True
    thread.join(30)
    assert not errors, errors
    assert seen == ["A1", False]
    assert rows(store, "F") == [("A1", 1, PENDING, None)]
