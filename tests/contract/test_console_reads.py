"""The console's bounded reads of the store contract (issue 31, item 5), for
every engine: ``OutboxReads.set_aside`` / ``pending_summary`` / ``sizes``,
``InboxReads.waiting_flows`` / ``waiting_summary`` / ``applies_recorded``,
``EffectReads.effect_counts(cap=)`` / ``attention_effects`` (``effect_list``'s
keyset and ``flows_by_correlation``: tests/test_console_scale.py, through the
console).  Each test states one promise of a docstring, through the store
interface only."""

from __future__ import annotations

from contract_support import add_consumer, append, env
from test_effect_outbox import add, keys, new

from reliable_flow._store.records import PendingSummary, SetAside, WaitingSummary
from reliable_flow.statuses import BlockReason
from reliable_flow.statuses import EffectState as S

# -- the producer side -----------------------------------------------------------------------


def test_set_aside_lists_by_consumer_then_commit_order_up_to_the_limit(outbox) -> None:
    p1, p2, p3 = append(outbox, env("E1", "A"), env("E2", "B"), env("E3", "C"))
    with outbox.write() as unit:
        add_consumer(unit, "c2", "uid-2")
        add_consumer(unit, "c1", "uid-1")
        unit.mark("c1", [(p1, "accepted")], [(p3, "id_conflict"), (p2, "sequence_conflict")], 10.0)
        unit.mark("c2", [], [(p1, "id_conflict")], 10.0)
    assert outbox.latest.set_aside(10) == [
        SetAside("c1", "E2", "B", 1, "sequence_conflict"), SetAside("c1", "E3", "C", 1, "id_conflict"),
        SetAside("c2", "E1", "A", 1, "id_conflict")]
    assert [s.event_id for s in outbox.latest.set_aside(2)] == ["E2", "E3"]


def test_pending_summary_counts_up_to_the_cap_with_the_leased_and_the_oldest(outbox) -> None:
    with outbox.write() as unit:
        unit.append_event(env("E1", "A"), committed_at=5.0)
        unit.append_event(env("E2", "B"), committed_at=6.0)
        unit.append_event(env("E3", "C"), committed_at=7.0)
        add_consumer(unit, "c1", "uid-1")
        p1, p2, _ = (unit.find_event(e).pos for e in ("E1", "E2", "E3"))
        unit.mark("c1", [(p1, "accepted")], [], 10.0)
        unit.claim("c1", [p2], 100.0, "relay-1", 20.0)  # leased until 100
    assert outbox.latest.pending_summary("c1", 50.0, 10) == PendingSummary(2, 1, 6.0)
    assert outbox.latest.pending_summary("c1", 150.0, 10) == PendingSummary(2, 0, 6.0)  # the lease ended
    assert outbox.latest.pending_summary("c1", 50.0, 1).pending == 1  # the cap: at least one
    assert outbox.latest.pending_summary("other", 50.0, 10) == PendingSummary(0, 0, None)


def test_sizes_count_events_and_flows_up_to_the_cap(outbox) -> None:
    append(outbox, env("E1", "A"), env("E2", "A", seq=2), env("E3", "B"))
    with outbox.write() as unit:
        unit.put_flow("A", 2, "s", "{}")
        unit.put_flow("B", 1, "s", "{}")
    assert outbox.latest.sizes(10) == (3, 2)
    assert outbox.latest.sizes(2) == (2, 2)


# -- the consumer side -------------------------------------------------------------------------


def test_waiting_flows_are_those_blocked_or_waiting_since_before_in_flow_order(inbox) -> None:
    with inbox.write() as unit:
        unit.insert(env("A1", "A"), received_at=100.0)  # pending since 100
        unit.insert(env("B1", "B"), received_at=900.0)  # pending, recent
        unit.insert(env("C1", "C"), received_at=900.0)
        unit.block("C1", BlockReason.UNSUPPORTED_SCHEMA, "schema 2", now=900.0)  # blocked: whenever
        unit.insert(env("D1", "D"))  # arrival unknown
        unit.insert(env("E1", "E"), received_at=100.0)
        unit.record_applied("E1", "E", 1, "created")  # applied: waits for nothing
    assert inbox.latest.waiting_flows(500.0, "", 10) == ["A", "C", "D"]
    assert inbox.latest.waiting_flows(500.0, "A", 1) == ["C"]
    assert inbox.latest.waiting_flows(1000.0, "", 10) == ["A", "B", "C", "D"]


def test_waiting_summary_counts_pending_and_blocked_with_the_earliest_arrival(inbox) -> None:
    assert inbox.latest.waiting_summary(10) == WaitingSummary(0, 0, None)
    with inbox.write() as unit:
        unit.insert(env("A1", "A"), received_at=300.0)
        unit.insert(env("B1", "B"), received_at=200.0)
        unit.insert(env("C1", "C"), received_at=100.0)
        unit.block("B1", BlockReason.UNSUPPORTED_SCHEMA, None, now=250.0)
        unit.record_applied("C1", "C", 1, "created")
    assert inbox.latest.waiting_summary(10) == WaitingSummary(1, 1, 200.0)
    capped = inbox.latest.waiting_summary(1)
    assert capped.pending + capped.blocked == 1


def test_applies_recorded_grows_with_each_apply(inbox) -> None:
    assert inbox.latest.applies_recorded() == 0
    with inbox.write() as unit:
        for i, flow in enumerate("ABC"):
            unit.insert(env(f"{flow}1", flow))
            unit.record_applied(f"{flow}1", flow, 1, "created")
            assert unit.applies_recorded() == i + 1


def test_effect_counts_with_a_cap_stop_at_it(inbox) -> None:
    add(inbox, *(new(f"k{i}") for i in range(3)), new("d1"))
    with inbox.write() as unit:
        unit.update_effect("d1", {"state": S.DEAD}, 200.0)
    assert inbox.latest.effect_counts() == {"pending": 3, "dead": 1}
    assert inbox.latest.effect_counts(cap=2) == {"pending": 2, "dead": 1}


def test_attention_effects_are_those_a_person_may_need_in_scheduling_order(inbox) -> None:
    add(inbox, *(new(k) for k in ("ok", "dead", "held", "lapsed", "doubt", "owed", "owed-new", "refused", "unknown")))
    with inbox.write() as unit:
        unit.update_effect("ok", {"state": S.SUCCEEDED}, 100.0)
        unit.update_effect("dead", {"state": S.DEAD}, 100.0)
        unit.update_effect("held", {"state": S.RUNNING, "due_at": 500.0, "lease_owner": "x"}, 100.0)
        unit.update_effect("lapsed", {"state": S.RUNNING, "due_at": 150.0, "lease_owner": "x"}, 100.0)
        unit.update_effect("doubt", {"state": S.IN_DOUBT}, 100.0)
        unit.update_effect("owed", {"state": S.SUCCEEDED, "fed": False}, 100.0)
        unit.update_effect("owed-new", {"state": S.SUCCEEDED, "fed": False}, 390.0)
        unit.update_effect("refused", {"state": S.SUCCEEDED, "fed": False, "last_error": "feedback refused: x"},
                           390.0)
        unit.update_effect("unknown", {"state": S.UNKNOWN}, 100.0)
    # at 400, unfed since before 300: "owed" (and "refused", whatever its time); "held"'s lease runs to 500
    found = inbox.latest.attention_effects(400.0, 300.0, 10)
    assert keys(found) == ["dead", "lapsed", "doubt", "owed", "refused", "unknown"]
    assert keys(inbox.latest.attention_effects(400.0, 300.0, 1)) == ["dead"]
