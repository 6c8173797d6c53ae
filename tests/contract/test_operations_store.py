"""The operators' part of the storage contract, for every engine: the consumer
registry of an outbox store, and the full inbox rows, skips, replacements
and their record of an inbox store (:mod:`reliable_flow._store.outbox`,
:mod:`reliable_flow._store.inbox`).

Each test states one promise of a method's docstring and checks it only
through the store interface.
"""

from __future__ import annotations

import pytest
from contract_support import append, body_of, entries, env

from reliable_flow.records import InboxRow, OperatorAction
from reliable_flow.statuses import ActionTarget, BlockReason, DeliveryState, InboxState

PENDING, BLOCKED, APPLIED = InboxState.PENDING, InboxState.BLOCKED, InboxState.APPLIED
SKIPPED, REPLACED = InboxState.SKIPPED, InboxState.REPLACED


class Boom(Exception):
    """Raised by a test to abandon a unit of work."""




def register(store, name: str, now: float = 100.0, from_now: bool = False) -> None:
    with store.write() as unit:
        unit.register_consumer(name, now, from_now)


def deliveries_to(store, name: str) -> dict[str, DeliveryState]:
    return {e.event_id: e.deliveries[name].state for e in store.latest.outbox() if name in e.deliveries}


# -- the consumer registry (outbox store) ---------------------------------------------------


def test_a_new_store_has_no_consumer(outbox):
    with outbox.write() as unit:
        assert unit.has_consumers() is False
        assert unit.is_registered("a") is False
    assert outbox.latest.consumers() == []
    assert outbox.latest.registry_actions() == []


def test_registering_makes_every_committed_event_pending_and_leaves_the_name_unbound(outbox):
    append(outbox, env("A1"), env("A2", seq=2))
    register(outbox, "audit", now=123.5)
    with outbox.write() as unit:
        assert unit.has_consumers() and unit.is_registered("audit")
        assert unit.bound_uid("audit") is None
    assert deliveries_to(outbox, "audit") == {"A1": DeliveryState.PENDING, "A2": DeliveryState.PENDING}
    [entry] = outbox.latest.consumers()
    assert (entry.name, entry.uid, entry.bound, entry.registered_at, entry.from_now) == (
        "audit", None, False, 123.5, False)
    assert (entry.backlog, entry.set_aside) == (2, 0)
    # Events appended later are pending for a registered name too, bound or not.
    append(outbox, env("B1", "G"))
    assert deliveries_to(outbox, "audit")["B1"] == DeliveryState.PENDING


def test_registering_from_now_gets_only_later_events(outbox):
    append(outbox, env("A1"), env("A2", seq=2))
    register(outbox, "late", from_now=True)
    assert deliveries_to(outbox, "late") == {}
    append(outbox, env("A3", seq=3))
    assert deliveries_to(outbox, "late") == {"A3": DeliveryState.PENDING}
    [entry] = outbox.latest.consumers()
    assert entry.from_now is True and entry.backlog == 1


def test_registering_a_taken_name_raises_the_integrity_error_and_writes_nothing(outbox, integrity_error):
    register(outbox, "a", now=1.0)
    with pytest.raises(integrity_error), outbox.write() as unit:
        unit.register_consumer("a", 2.0, False)
    assert [c.registered_at for c in outbox.latest.consumers()] == [1.0]


def test_binding_binds_a_registered_name_once(outbox):
    register(outbox, "a")
    with outbox.write() as unit:
        unit.bind_consumer("a", "uid-1")
        assert unit.bound_uid("a") == "uid-1"
        unit.bind_consumer("a", "uid-2")  # already bound: stays with its first file
        assert unit.bound_uid("a") == "uid-1"
    [entry] = outbox.latest.consumers()
    assert (entry.uid, entry.bound) == ("uid-1", True)


def test_consumers_counts_pending_and_set_aside_per_name_sorted(outbox):
    append(outbox, env("A1"), env("A2", seq=2), env("A3", seq=3))
    register(outbox, "b")
    register(outbox, "a")
    with outbox.write() as unit:
        positions = [unit.find_event(e).pos for e in ("A1", "A2", "A3")]
        unit.mark("a", [(positions[0], "accepted")], [(positions[1], "id_conflict")], 5.0)
    got = {c.name: (c.backlog, c.set_aside) for c in outbox.latest.consumers()}
    assert list(got) == ["a", "b"]
    assert got == {"a": (1, 1), "b": (3, 0)}


def test_removing_forgets_the_name_and_its_deliveries_only(outbox):
    append(outbox, env("A1"))
    register(outbox, "a")
    register(outbox, "b")
    with outbox.write() as unit:
        unit.remove_consumer("a")
        assert unit.is_registered("a") is False and unit.is_registered("b") is True
    assert [c.name for c in outbox.latest.consumers()] == ["b"]
    assert [set(e.deliveries) for e in outbox.latest.outbox()] == [{"b"}]
    append(outbox, env("A2", seq=2))
    assert [set(e.deliveries) for e in outbox.latest.outbox()] == [{"b"}, {"b"}]
    # Its deliveries are gone, not hidden: registered again from now, it has none.
    register(outbox, "a", from_now=True)
    assert deliveries_to(outbox, "a") == {}
    assert {c.name: c.backlog for c in outbox.latest.consumers()} == {"a": 0, "b": 2}


def test_a_unit_that_fails_keeps_the_registry_as_it_was(outbox):
    register(outbox, "a")
    with pytest.raises(Boom), outbox.write() as unit:
        unit.remove_consumer("a")
        unit.register_consumer("b", 1.0, False)
        unit.record_registry_action(registry_action(1.0, "b", "register", "ops", "x"))
        raise Boom
    assert [c.name for c in outbox.latest.consumers()] == ["a"]
    assert outbox.latest.registry_actions() == []


def registry_action(at: float, consumer: str, action: str, actor: str, reason: str) -> OperatorAction:
    return OperatorAction(at=at, target=ActionTarget.REGISTRY, consumer=consumer, action=action, actor=actor,
                          reason=reason)


def test_registry_actions_are_recorded_in_order_and_filtered_by_name(outbox):
    actions = [registry_action(1.0, "a", "register", "alice", "new service"),
               registry_action(2.0, "b", "register", "relay", "first"),
               registry_action(3.0, "a", "remove", "bob", "typo")]
    with outbox.write() as unit:
        for a in actions:
            unit.record_registry_action(a)
    assert outbox.latest.registry_actions() == actions
    with outbox.read() as reads:
        assert reads.registry_actions("a") == [actions[0], actions[2]]


def test_forget_binding_forgets_one_name(outbox):
    outbox.remember_binding("a", "u1")
    outbox.remember_binding("b", "u2")
    outbox.forget_binding("a")
    assert outbox.known_binding("a", "u1") is False
    assert outbox.known_binding("b", "u2") is True


# -- full rows, skips and replacements (inbox store) -----------------------------------------


def test_inserts_stamp_when_a_row_was_received(inbox):
    with inbox.write() as unit:
        assert unit.insert_new(env("A1"), 10.5) is True
        unit.insert(env("A2", seq=2), 11.0)
        unit.insert(env("A3", seq=3))  # no time given: unknown
    assert inbox.latest.inbox_row("A1").row() == InboxRow("A1", "F", 1, PENDING, None, None, 10.5, None)
    assert [r.received_at for r in inbox.latest.inbox_rows("F")] == [10.5, 11.0, None]
    assert inbox.latest.inbox_row("nope") is None


def test_inbox_rows_start_at_the_seq_asked_for(inbox):
    with inbox.write() as unit:
        for seq in (1, 2, 4):
            unit.insert(env(f"A{seq}", seq=seq), float(seq))
        unit.insert(env("B1", "G"), 1.0)
    assert [r.event_id for r in inbox.latest.inbox_rows("F", 2)] == ["A2", "A4"]
    with inbox.read() as reads:
        assert [r.seq for r in reads.inbox_rows("F")] == [1, 2, 4]


def test_a_block_keeps_its_detail_and_the_time_it_first_became_blocked(inbox):
    with inbox.write() as unit:
        unit.insert(env("A1"), 1.0)
        unit.block("A1", BlockReason.UNSUPPORTED_SCHEMA, "schema 2 unknown", 5.0)
    row = inbox.latest.inbox_row("A1")
    assert (row.state, row.reason, row.detail, row.blocked_at) == (BLOCKED, "unsupported_schema", "schema 2 unknown", 5.0)
    with inbox.write() as unit:
        unit.block("A1", BlockReason.UNSUPPORTED_SCHEMA, "schema 2 unknown", 9.0)  # unchanged
        unit.block("A1", BlockReason.INVALID_PAYLOAD, "amount: too big", 12.0)  # another reason
    row = inbox.latest.inbox_row("A1")
    assert (row.reason, row.detail, row.blocked_at) == ("invalid_payload", "amount: too big", 5.0)
    with inbox.write() as unit:
        unit.record_applied("A1", "F", 1, "created")
    row = inbox.latest.inbox_row("A1")
    assert (row.state, row.reason, row.detail, row.blocked_at) == (APPLIED, None, None, 5.0)


def test_a_skipped_row_is_done(inbox):
    with inbox.write() as unit:
        unit.insert(env("A1"), 1.0)
        unit.block("A1", BlockReason.INVALID_TRANSITION, "no", 2.0)
        unit.set_skipped("A1")
        assert unit.unapplied(10) == 0
    assert inbox.latest.inbox_row("A1").state == SKIPPED
    assert inbox.latest.open_flows() == []
    assert [e.state for e in entries(inbox.latest, "F")] == [SKIPPED]


def test_a_replaced_row_is_kept_and_gives_its_slot_to_the_replacement(inbox):
    old, new = env("A2", seq=2, n=1), env("A2-fix", seq=2, n=2)
    with inbox.write() as unit:
        unit.insert(env("A1"), 1.0)
        unit.insert(old, 2.0)
        unit.set_replaced("A2")
        assert unit.holder("F", 2) is None
        assert unit.next_row("F", 2) is None
        unit.insert(new, 3.0)
        assert unit.holder("F", 2) == "A2-fix"
        assert unit.next_row("F", 2) == (2, "A2-fix", new.body)
        assert unit.insert_new(env("A2-other", seq=2, n=3), 4.0) is False  # the slot is taken again
        assert unit.unapplied(10) == 2  # A1 and the replacement
        assert body_of(unit, "A2") == old.body  # kept, with its body
    assert [(e.event_id, e.state) for e in entries(inbox.latest, "F")] == [
        ("A1", PENDING), ("A2", REPLACED), ("A2-fix", PENDING)]
    assert [r.event_id for r in inbox.latest.inbox_rows("F", 2)] == ["A2", "A2-fix"]
    assert body_of(inbox.latest, "A2-fix") == new.body


def test_a_second_live_row_in_a_slot_raises_the_integrity_error(inbox, integrity_error):
    with inbox.write() as unit:
        unit.insert(env("A1"), 1.0)
    with pytest.raises(integrity_error), inbox.write() as unit:
        unit.insert(env("A1-other", n=5), 2.0)


def test_a_replacement_that_fails_leaves_the_old_row_as_it_was(inbox):
    with inbox.write() as unit:
        unit.insert(env("A1"), 1.0)
    with pytest.raises(Boom), inbox.write() as unit:
        unit.set_replaced("A1")
        unit.insert(env("A1-fix", n=9), 2.0)
        unit.record_inbox_action(inbox_action(2.0, "A1", "F", 1, "replace", PENDING, "ops", "fix", "A1-fix"))
        raise Boom
    assert [(e.event_id, e.state) for e in entries(inbox.latest, "F")] == [("A1", PENDING)]
    assert inbox.latest.inbox_actions() == []
    with inbox.write() as unit:
        assert unit.holder("F", 1) == "A1"


def inbox_action(at: float, event_id: str, flow_id: str, seq: int, action: str, previous_state: InboxState,
                 actor: str, reason: str, replacement_event_id: str | None = None) -> OperatorAction:
    return OperatorAction(at=at, target=ActionTarget.INBOX, event_id=event_id, flow_id=flow_id, seq=seq,
                          action=action, previous_state=previous_state, actor=actor, reason=reason,
                          replacement_event_id=replacement_event_id)


def test_inbox_actions_are_recorded_in_order_and_found_by_either_event_id(inbox):
    actions = [inbox_action(1.0, "A2", "F", 2, "replace", BLOCKED, "alice", "bad amount", "A2-fix"),
               inbox_action(2.0, "B1", "G", 1, "skip", PENDING, "bob", "cancelled by hand")]
    with inbox.write() as unit:
        for a in actions:
            unit.record_inbox_action(a)
    assert inbox.latest.inbox_actions() == actions
    with inbox.read() as reads:
        assert reads.inbox_actions("A2-fix") == [actions[0]]
        assert reads.inbox_actions("A2") == [actions[0]]
        assert reads.inbox_actions("B1") == [actions[1]]
        assert reads.inbox_actions("Z9") == []
