"""The decisions moved into ``_core/`` (issue 19, item 4), checked on their own:
the operator transition tables against every state of their enum, which
effects a handler may cancel, whether an executor still holds its lease,
when fed-back results count as fed, and feedback as one producer
transaction at the flow's current seq (both engines)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from reliable_flow import (
    ApplyContext,
    Consumer,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    Producer,
    relay,
)
from reliable_flow._core.admin import (
    DELIVERY_ACTIONS,
    EFFECT_ACTIONS,
    delivery_action_in,
    effect_action_in,
    effect_changes,
)
from reliable_flow._core.effects import (
    HANDLER_CANCELS_FROM,
    Plan,
    cancel_in,
    feedback_refusal,
    lease_held,
    record_outcome_in,
)
from reliable_flow._producer import advance_at_current
from reliable_flow.errors import InvalidEnvelope, NotResolvable, UnknownEffect, UnknownEvent
from reliable_flow.protocol import Protocol, by_kind, exact, text
from reliable_flow.records import AdvanceResult, ScheduledEffect
from reliable_flow.statuses import AdvanceStatus, DeliveryState, EffectState

_D, _S = DeliveryState, EffectState

# -- the tables, every state --------------------------------------------------------------

DELIVERY_EXPECTED = {  # state -> (redeliver allowed, skip allowed)
    _D.PENDING: (True, True), _D.SET_ASIDE: (True, True), _D.ACCEPTED: (False, False), _D.SKIPPED: (False, False),
}
EFFECT_EXPECTED = {  # state -> the operator actions allowed from it
    _S.PENDING: {"resolve", "cancel"},
    _S.RUNNING: set(),
    _S.IN_DOUBT: {"resolve", "cancel"},
    _S.UNKNOWN: {"retry", "resolve", "cancel"},
    _S.DEAD: {"retry", "resolve", "cancel"},
    _S.SUCCEEDED: set(), _S.EXPIRED: set(), _S.SUPERSEDED: set(), _S.CANCELLED: set(),
}


def test_every_delivery_and_effect_state_has_an_expected_row() -> None:
    assert set(DELIVERY_EXPECTED) == set(DeliveryState)
    assert set(EFFECT_EXPECTED) == set(EffectState)
    assert set(DELIVERY_ACTIONS) == {"redeliver", "skip"}
    assert set(EFFECT_ACTIONS) == {"retry", "resolve", "cancel"}


@dataclass
class FakeOutboxUnit:
    state: DeliveryState | None
    resolved: list[tuple[str, int, DeliveryState, float]] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)

    def delivery_state(self, event_id: str, consumer: str) -> tuple[int, DeliveryState] | None:
        return None if self.state is None else (7, self.state)

    def resolve(self, consumer: str, pos: int, state: DeliveryState, now: float) -> None:
        self.resolved.append((consumer, pos, state, now))

    def record_action(self, action: Any) -> None:
        self.actions.append(action)


@pytest.mark.parametrize("state", list(DeliveryState))
@pytest.mark.parametrize("action", ["redeliver", "skip"])
def test_delivery_actions_from_every_state(state: DeliveryState, action: str) -> None:
    unit = FakeOutboxUnit(state)
    allowed = DELIVERY_EXPECTED[state][0 if action == "redeliver" else 1]
    if not allowed:
        with pytest.raises(NotResolvable, match=f"is {state} for consumer 'c'; cannot {action} it"):
            delivery_action_in(unit, action, "E1", "c", "alice", "why", 5.0, "here")  # type: ignore[arg-type]
        assert (unit.resolved, unit.actions) == ([], [])
        return
    record = delivery_action_in(unit, action, "E1", "c", "alice", "why", 5.0, "here")  # type: ignore[arg-type]
    target = _D.PENDING if action == "redeliver" else _D.SKIPPED
    assert unit.resolved == [("c", 7, target, 5.0)]
    assert [(a.event_id, a.action, a.previous_state) for a in unit.actions] == [("E1", action, None)]
    assert (record.previous_state, record.actor, record.reason, record.at) == (state, "alice", "why", 5.0)


def test_a_delivery_action_on_an_unknown_event_raises() -> None:
    with pytest.raises(UnknownEvent, match="no delivery of event 'E1' to consumer 'c' in here"):
        delivery_action_in(FakeOutboxUnit(None), "skip", "E1", "c", "a", "r", 1.0, "here")  # type: ignore[arg-type]


def _effect(state: EffectState, owner: str | None = None) -> ScheduledEffect:
    return ScheduledEffect(key="k", name="send", payload={}, event_id="E1", flow_id="F", seq=1, meta={}, state=state,
                  ordered=False, deadline=None, version=None, attempts=0, failures=0, due_at=0.0, lease_owner=owner,
                  last_error=None, result=None, reason=None, fed=None, created_at=0.0, updated_at=0.0)


@dataclass
class FakeEffectUnit:
    held: ScheduledEffect | None
    updates: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    history: list[Any] = field(default_factory=list)

    def effect(self, key: str) -> ScheduledEffect | None:
        return self.held

    def add_transitions(self, rows: list[Any]) -> None:
        self.history.extend(rows)

    def update_effect(self, key: str, changes: dict[str, Any], now: float) -> None:
        self.updates.append((key, changes, now))

    def record_action(self, action: Any) -> None:
        self.actions.append(action)


@pytest.mark.parametrize("state", list(EffectState))
@pytest.mark.parametrize("action", ["retry", "resolve", "cancel"])
def test_effect_actions_from_every_state(state: EffectState, action: str) -> None:
    unit = FakeEffectUnit(_effect(state))
    if action not in EFFECT_EXPECTED[state]:
        with pytest.raises(NotResolvable, match=f"effect 'k' is {state}; {action} needs one of: "):
            effect_action_in(unit, action, "k", "alice", "why", 5.0, "here")  # type: ignore[arg-type]
        assert (unit.updates, unit.actions) == ([], [])
        return
    record, before = effect_action_in(unit, action, "k", "alice", "why", 5.0, "here", '{"ok":1}')  # type: ignore[arg-type]
    assert before.state is state
    # An operator has no registry: a cancel owes the failure step, which an
    # executor whose registry asks for none clears.
    owed = {"fed": False} if action == "cancel" else {}
    assert unit.updates == [("k", {**effect_changes(action, "why", '{"ok":1}'), **owed}, 5.0)]
    assert [(a.key, a.action, a.actor, a.reason, a.at) for a in unit.actions] == [("k", action, "alice", "why", 5.0)]
    assert record is unit.actions[0]


def test_what_each_effect_action_writes() -> None:
    assert effect_changes("retry", "r") == {"state": _S.PENDING, "due_at": 0.0, "failures": 0, "attempts": 0,
                                            "lease_owner": None, "reason": None}
    assert effect_changes("resolve", "r", "[1]") == {"state": _S.SUCCEEDED, "result": "[1]", "fed": False,
                                                     "lease_owner": None, "reason": None}
    assert effect_changes("cancel", "r") == {"state": _S.CANCELLED, "lease_owner": None, "reason": "r"}


def test_an_effect_action_on_an_unknown_key_raises() -> None:
    with pytest.raises(UnknownEffect, match="no effect with key 'k' in here"):
        effect_action_in(FakeEffectUnit(None), "cancel", "k", "a", "r", 1.0, "here")  # type: ignore[arg-type]


@pytest.mark.parametrize("state", list(EffectState))
def test_a_handler_cancels_only_a_pending_effect(state: EffectState) -> None:
    unit = FakeEffectUnit(_effect(state))
    if state is _S.PENDING:
        cancel_in(unit, "k", "not needed", 3.0)  # type: ignore[arg-type]
        assert unit.updates == [("k", {"state": _S.CANCELLED, "reason": "not needed"}, 3.0)]
    else:
        with pytest.raises(NotResolvable, match=f"effect 'k' is {state}; only a pending effect can be cancelled"):
            cancel_in(unit, "k", "not needed", 3.0)  # type: ignore[arg-type]
        assert unit.updates == []
    assert HANDLER_CANCELS_FROM == (_S.PENDING,)
    with pytest.raises(UnknownEffect, match="no effect with key 'k'"):
        cancel_in(FakeEffectUnit(None), "k", "r", 3.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", list(EffectState))
def test_an_outcome_is_recorded_only_while_the_claim_is_still_ours(state: EffectState) -> None:
    for owner, ours in (("exec-1", True), ("exec-2", False), (None, False)):
        effect = _effect(state, owner)
        unit = FakeEffectUnit(effect)
        held = state is _S.RUNNING and ours
        assert lease_held(unit.held, "exec-1") is held
        assert record_outcome_in(unit, effect, Plan.RUN, "exec-1", {"state": _S.SUCCEEDED}, 2.0,  # type: ignore[arg-type]
                                 "returned") is held
        assert unit.updates == ([(effect.key, {"state": _S.SUCCEEDED}, 2.0)] if held else [])
        # the history says what happened either way: the outcome, or that it was discarded
        assert [str(t.transition) for t in unit.history] == (["called", "succeeded"] if held else ["lease_lost"])
    assert lease_held(None, "exec-1") is False
    assert record_outcome_in(FakeEffectUnit(None), effect, Plan.RUN, "exec-1", {}, 2.0,  # type: ignore[arg-type]
                             "returned") is False


@pytest.mark.parametrize("status", list(AdvanceStatus))
def test_fed_back_results_count_as_fed_when_committed_or_existing(status: AdvanceStatus) -> None:
    refusal = feedback_refusal(AdvanceResult(status, "E", "F", None, "because"))
    if status in (AdvanceStatus.COMMITTED, AdvanceStatus.EXISTING):
        assert refusal is None
    else:
        assert refusal == f"feedback {status}: because"  # test_attention recognises "feedback "


# -- feedback: one producer transaction at the flow's current seq (both engines) ------------

NOTES = Protocol(name="notes", initial="new", transitions={"new": ["note"], "note": ["note"]},
                 schemas={1: by_kind({"note": exact({"text": text()})})})


def _note(p: Producer, event_id: str, flow: str, text_: str) -> AdvanceResult:
    """An app's advance at its guess of the seq, guessing again while stale."""
    for _ in range(1000):
        at = p.flow(flow)
        r = p.advance(event_id, flow, expected_seq=0 if at is None else int(at["seq"]), kind="note",
                      payload={"text": text_})
        if r.status != AdvanceStatus.STALE:
            return r
    raise AssertionError("stale for ever")


def _counting_writes(p: Producer, before: Any = None) -> list[int]:
    """Count ``p``'s write transactions (``before()`` runs as each one is asked for)."""
    store, calls = p.store, []
    real = store.write

    def write(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if before is not None:
            before()
        return real(*args, **kw)

    store.write = write  # type: ignore[method-assign]
    return calls


def test_feedback_at_current_answers_like_advance(engine: str, new_store: Any) -> None:
    with Producer(new_store("producer"), NOTES) as p:
        assert _note(p, "A1", "F", "one").status == "committed"
        first = advance_at_current(p, "fb", "F", kind="note", payload={"text": "x"}, meta={"t": "1"})
        assert (first.status, first.seq) == ("committed", 2)
        assert _note(p, "A3", "F", "three").seq == 3
        again = advance_at_current(p, "fb", "F", kind="note", payload={"text": "x"}, meta={"t": "1"})
        assert (again.status, again.seq) == ("existing", 2)  # at its own seq, though the flow moved on
        other = advance_at_current(p, "fb", "F", kind="note", payload={"text": "y"}, meta={"t": "1"})
        assert (other.status, other.seq) == ("conflict", 2)
        assert "payload" in (other.reason or "")
        bad = advance_at_current(p, "fb2", "F", kind="note", payload={"text": 5})
        assert bad.status == "invalid_payload"
        wrong = advance_at_current(p, "fb3", "F", kind="begun", payload={"text": "x"})
        assert wrong.status == "invalid_transition"
        with pytest.raises(InvalidEnvelope):
            advance_at_current(p, "", "F", kind="note", payload={"text": "x"})
        assert p.flow("F")["seq"] == 3
        assert [e.event_id for e in p.outbox("F")] == ["A1", "fb", "A3"]


def test_feedback_lands_at_the_current_seq_while_others_advance(engine: str, new_store: Any) -> None:
    where = new_store("producer")
    writers, steps, feeds = 2, 8, 8
    with Producer(where, NOTES) as p:
        assert _note(p, "start", "F", "s").status == "committed"
    results: dict[str, AdvanceResult] = {}
    errors: list[BaseException] = []
    go = threading.Barrier(writers + 1)  # every thread starts at once

    def writer(n: int) -> None:
        try:
            with Producer(where, NOTES) as mine:
                go.wait()
                for i in range(steps):
                    results[f"w{n}-{i}"] = _note(mine, f"w{n}-{i}", "F", "w")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def feeder() -> None:
        try:
            with Producer(where, NOTES) as mine:
                writes = _counting_writes(mine)
                go.wait()
                for i in range(feeds):
                    results[f"fb{i}"] = advance_at_current(mine, f"fb{i}", "F", kind="note", payload={"text": "r"})
                assert len(writes) == feeds  # one transaction each, never retried
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)] + [threading.Thread(target=feeder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(r.status == "committed" for r in results.values()), results
    with Producer(where, NOTES) as p:
        total = 1 + writers * steps + feeds
        assert p.flow("F")["seq"] == total
        stored = {e.event_id: e.seq for e in p.outbox("F")}
        assert sorted(stored.values()) == list(range(1, total + 1))
        for i in range(feeds):
            assert stored[f"fb{i}"] == results[f"fb{i}"].seq  # at the seq the flow was at, in its transaction


def test_the_executor_feeds_back_in_one_transaction_though_the_flow_keeps_moving(engine: str, new_store: Any) -> None:
    producer_at, consumer_at = new_store("producer"), new_store("consumer")
    effects = EffectRegistry()
    effects.register("echo", lambda call: {"text": "answer"}, feedback=Feedback(kind="note"))

    def ask(ctx: ApplyContext) -> None:
        if ctx.event.payload["text"] == "ask":
            ctx.schedule("echo", {})

    with Producer(producer_at, NOTES) as p, Producer(producer_at, NOTES) as rival, \
            Producer(producer_at, NOTES) as feeder, \
            Consumer(consumer_at, NOTES, handlers=(ask,), effects=effects, name="app") as c:
        assert _note(p, "N1", "N", "ask").status == "committed"
        while relay(p, c).status != "idle":
            pass
        assert c.drain("N").applied == 1
        # Another writer moves the flow on as each of the feeder's transactions is asked for.
        writes = _counting_writes(feeder, lambda: _note(rival, f"R{len(writes)}", "N", "rival"))
        ex = EffectExecutor(c, producer=feeder)
        assert ex.run_once().work == 1
        effect = c.scheduled_effects()[0]
        assert (effect.state, effect.fed, effect.last_error) == ("succeeded", True, None)
        assert (ex.stats.fed, ex.stats.feedback_errors) == (1, 0)
        assert len(writes) == 1  # one producer transaction, no retry loop
        assert [(e.event_id, e.seq) for e in p.outbox("N")] == [("N1", 1), ("R1", 2), (f"{effect.key}:result", 3)]
