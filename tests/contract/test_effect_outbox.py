"""The effect outbox's contract (:mod:`reliable_flow._store.effects`), for every engine.

Checked through the consumer store's units and reads only.
"""

from __future__ import annotations

import pytest

from reliable_flow._store.effects import EFFECT_COLUMNS, NewEffect
from reliable_flow.records import OperatorAction
from reliable_flow.statuses import ActionTarget, EffectState

S = EffectState


class Boom(Exception):
    """Raised by a test to abandon a unit of work."""


def new(key: str, *, flow: str = "F", seq: int = 1, name: str = "notify", payload: str = '{"n":1}',
        ordered: bool = False, fed: bool | None = None, created: float = 100.0) -> NewEffect:
    return NewEffect(key, name, payload, f"{flow}{seq}", flow, seq, '{"trace":"t-1"}', ordered,
                     None, None, fed, created)


def add(store, *effects: NewEffect) -> None:
    with store.write() as unit:
        for effect in effects:
            assert unit.add_effect(effect) is None


def keys(effects) -> list[str]:
    return [e.key for e in effects]


def test_a_scheduled_effect_is_stored_pending_and_due_at_once(inbox) -> None:
    add(inbox, new("k1", created=123.5))
    effect = inbox.latest.effect("k1")
    assert effect is not None
    assert (effect.name, effect.payload, effect.meta, effect.event_id, effect.flow_id, effect.seq) == (
        "notify", {"n": 1}, {"trace": "t-1"}, "F1", "F", 1)
    assert (effect.state, effect.attempts, effect.failures, effect.due_at, effect.lease_owner) == (
        S.PENDING, 0, 0, 0.0, None)
    assert (effect.result, effect.reason, effect.fed, effect.ordered) == (None, None, None, False)
    assert effect.created_at == effect.updated_at == 123.5
    assert inbox.latest.effect("nope") is None


def test_a_taken_key_stores_nothing_and_returns_the_holder(inbox) -> None:
    add(inbox, new("k1"))
    with inbox.write() as unit:
        held = unit.add_effect(new("k1", payload='{"n":2}', name="other"))
    assert held is not None and (held.name, held.payload) == ("notify", {"n": 1})
    assert keys(inbox.latest.effect_list()) == ["k1"]


def test_a_rolled_back_unit_leaves_no_effect(inbox) -> None:
    with pytest.raises(Boom), inbox.write() as unit:
        unit.add_effect(new("k1"))
        raise Boom
    assert inbox.latest.effect_list() == []


def test_effect_list_is_in_scheduling_order_and_filters(inbox) -> None:
    add(inbox, new("b", flow="G"), new("a"), new("c", flow="G", seq=2))
    with inbox.write() as unit:
        unit.update_effect("a", {"state": S.DEAD}, 200.0)
    assert keys(inbox.latest.effect_list()) == ["b", "a", "c"]
    assert keys(inbox.latest.effect_list(flow_id="G")) == ["b", "c"]
    assert keys(inbox.latest.effect_list(S.PENDING)) == ["b", "c"]
    assert keys(inbox.latest.effect_list(S.DEAD, "F")) == ["a"]
    assert keys(inbox.latest.effect_list(limit=2)) == ["b", "a"]
    assert inbox.latest.effect_counts() == {"dead": 1, "pending": 2}


def test_update_effect_sets_only_the_named_columns_and_updated_at(inbox) -> None:
    add(inbox, new("k1"))
    with inbox.write() as unit:
        unit.update_effect("k1", {"state": S.SUCCEEDED, "result": '{"id":7}', "attempts": 2, "fed": False}, 300.0)
    effect = inbox.latest.effect("k1")
    assert effect is not None
    assert (effect.state, effect.result, effect.attempts, effect.fed, effect.updated_at) == (
        S.SUCCEEDED, {"id": 7}, 2, False, 300.0)
    assert (effect.failures, effect.created_at) == (0, 100.0)


def test_update_effect_refuses_other_columns(inbox) -> None:
    add(inbox, new("k1"))
    assert "key" not in EFFECT_COLUMNS and "payload" not in EFFECT_COLUMNS
    with pytest.raises(ValueError, match="payload"), inbox.write() as unit:
        unit.update_effect("k1", {"payload": "{}"}, 1.0)
    effect = inbox.latest.effect("k1")
    assert effect is not None and effect.payload == {"n": 1}


def test_due_effects_takes_claimable_states_due_now_oldest_due_first(inbox) -> None:
    add(inbox, *(new(k, flow=k) for k in ("p1", "p2", "run_over", "run_on", "doubt", "later", "done", "dead")))
    with inbox.write() as unit:
        unit.update_effect("p1", {"due_at": 50.0}, 1.0)
        unit.update_effect("p2", {"due_at": 10.0}, 1.0)
        unit.update_effect("run_over", {"state": S.RUNNING, "due_at": 90.0}, 1.0)   # lease ended
        unit.update_effect("run_on", {"state": S.RUNNING, "due_at": 500.0}, 1.0)    # lease held
        unit.update_effect("doubt", {"state": S.IN_DOUBT, "due_at": 99.0}, 1.0)
        unit.update_effect("later", {"due_at": 101.0}, 1.0)
        unit.update_effect("done", {"state": S.SUCCEEDED}, 1.0)
        unit.update_effect("dead", {"state": S.DEAD}, 1.0)
        assert keys(unit.due_effects(100.0, {"notify"}, 10)) == ["p2", "p1", "run_over", "doubt"]
        assert keys(unit.due_effects(100.0, {"notify"}, 2)) == ["p2", "p1"]
        assert unit.due_effects(100.0, {"other"}, 10) == []
        assert unit.due_effects(100.0, set(), 10) == []


def test_an_ordered_effect_waits_for_earlier_unresolved_ordered_ones_of_its_flow(inbox) -> None:
    add(inbox, new("f1", ordered=True), new("f2", seq=2, ordered=True), new("g1", flow="G", ordered=True),
        new("f3", seq=3))
    with inbox.write() as unit:
        assert keys(unit.due_effects(0.0, {"notify"}, 10)) == ["f1", "g1", "f3"]
    for state in (S.RUNNING, S.IN_DOUBT, S.DEAD, S.UNKNOWN):
        with inbox.write() as unit:
            unit.update_effect("f1", {"state": state, "due_at": 1e9}, 1.0)
            assert "f2" not in keys(unit.due_effects(0.0, {"notify"}, 10)), state
    for state in (S.SUCCEEDED, S.CANCELLED, S.EXPIRED, S.SUPERSEDED):
        with inbox.write() as unit:
            unit.update_effect("f1", {"state": state}, 1.0)
            assert "f2" in keys(unit.due_effects(0.0, {"notify"}, 10)), state


def test_unfed_effects_are_succeeded_ones_owing_feedback(inbox) -> None:
    add(inbox, new("a"), new("b"), new("c"))
    with inbox.write() as unit:
        unit.update_effect("a", {"state": S.SUCCEEDED, "fed": False}, 1.0)
        unit.update_effect("b", {"state": S.SUCCEEDED, "fed": True}, 1.0)
        unit.update_effect("c", {"state": S.SUCCEEDED}, 1.0)
    assert keys(inbox.latest.unfed_effects(10, 1.0)) == ["a"]


def test_unfed_effects_are_failed_ones_owing_their_failure_step(inbox) -> None:
    """Failed for good and ``fed`` 0: owed at once; ``unknown`` only once due;
    one still open (a retried effect keeps its ``fed``) never."""
    names = ["dead", "cancelled", "expired", "superseded", "unknown", "late", "pending", "done"]
    add(inbox, *(new(n) for n in names))
    with inbox.write() as unit:
        for state in (S.DEAD, S.CANCELLED, S.EXPIRED, S.SUPERSEDED):
            unit.update_effect(state.value, {"state": state, "fed": False}, 1.0)
        unit.update_effect("unknown", {"state": S.UNKNOWN, "fed": False, "due_at": 5.0}, 1.0)
        unit.update_effect("late", {"state": S.UNKNOWN, "fed": False, "due_at": 50.0}, 1.0)
        unit.update_effect("pending", {"state": S.PENDING, "fed": False}, 1.0)
        unit.update_effect("done", {"state": S.DEAD, "fed": True}, 1.0)
    assert keys(inbox.latest.unfed_effects(10, 5.0)) == ["dead", "cancelled", "expired", "superseded", "unknown"]
    assert keys(inbox.latest.unfed_effects(2, 5.0)) == ["dead", "cancelled"]
    assert keys(inbox.latest.unfed_effects(10, 4.0)) == ["dead", "cancelled", "expired", "superseded"]


def effect_action(at: float, key: str, action: str, actor: str, reason: str) -> OperatorAction:
    return OperatorAction(at=at, target=ActionTarget.EFFECT, key=key, action=action, actor=actor, reason=reason)


def test_effect_actions_are_recorded_in_order(inbox) -> None:
    with inbox.write() as unit:
        unit.record_action(effect_action(2.0, "k2", "cancel", "ops", "not needed"))
        unit.record_action(effect_action(1.0, "k1", "retry", "ops", "provider fixed"))
    assert [a.key for a in inbox.latest.effect_actions()] == ["k2", "k1"]
    assert inbox.latest.effect_actions("k1") == [effect_action(1.0, "k1", "retry", "ops", "provider fixed")]


def test_app_tables_live_in_the_unit_and_roll_back_with_it(inbox, placeholder) -> None:
    with inbox.write() as unit:
        assert unit.app_version("app") == 0
        unit.user_execute("CREATE TABLE note(text TEXT)")
        unit.set_app_version("app", 1)
    with pytest.raises(Boom), inbox.write() as unit:
        unit.user_execute(f"INSERT INTO note(text) VALUES ({placeholder})", ("lost",))
        raise Boom
    with inbox.write() as unit:
        unit.user_execute(f"INSERT INTO note(text) VALUES ({placeholder})", ("kept",))
        assert unit.user_execute("SELECT text FROM note") == [("kept",)]
        assert unit.app_version("app") == 1
        unit.set_app_version("app", 2)
        assert unit.app_version("app") == 2


def test_step_undoes_only_its_own_writes(inbox) -> None:
    with inbox.write() as unit:
        unit.add_effect(new("kept"))
        with pytest.raises(Boom), unit.step():
            unit.add_effect(new("undone"))
            raise Boom
        unit.add_effect(new("after"))
    assert keys(inbox.latest.effect_list()) == ["kept", "after"]
