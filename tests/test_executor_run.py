"""The effect executor, issue 18: ``EffectExecutor.run`` (the loop, until_idle,
stop), a raising ``Feedback.payload`` / ``Feedback.flow`` recorded as refused
feedback, ``run_until_idle(max_passes=)`` checked, ``Feedback(kind=)``
checked at construction, and a claim owner of its own per executor.

On both engines (the ``engine`` fixture), with an injected clock; signals in
real processes are in ``test_execute_command.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import new_location
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    Happened,
    Producer,
    RetryLater,
    relay,
)
from reliable_flow._effects import feedback
from reliable_flow.errors import InvalidEnvelope
from reliable_flow.protocol import Protocol, by_kind, exact, text
from reliable_flow.records import PassResult
from support import Clock

T0 = 1000.0
ASK = Protocol(
    name="ask", initial="new",
    transitions={"new": ["asked"], "asked": ["answered"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "answered": exact({"a": text()})})},
)


class Setup:
    """A producer and a consumer of the ``ask`` protocol on one engine; the
    consumer's handler schedules ``look_up`` (and ``note``) for every asked flow."""

    def __init__(self, engine: str, tmp_path: Path, effects: EffectRegistry) -> None:
        self.clock = Clock(T0)
        self.producer_location = new_location(engine, tmp_path, "producer")
        self.producer = Producer(self.producer_location, ASK)
        self.location = new_location(engine, tmp_path, "consumer")
        self.effects = effects

        def handler(ctx: ApplyContext) -> None:
            if ctx.event.kind == "asked":
                for name in effects:
                    ctx.schedule(name, {"q": ctx.event.payload["q"]})

        self.consumer = Consumer(self.location, ASK, name="tools", handlers=[handler], effects=effects,
                                 clock=self.clock)

    def ask(self, *flows: str) -> None:
        for flow in flows:
            assert self.producer.advance(f"{flow}1", flow, expected_seq=0, kind="asked",
                                         payload={"q": flow.lower()}).status == "committed"
            assert relay(self.producer, self.consumer, register=True).status == "accepted"
            assert self.consumer.apply_next(flow).status == "applied"

    def policy(self, **kw: Any) -> DeliveryPolicy:
        return DeliveryPolicy(lease_seconds=30, clock=self.clock, random=lambda: 0.5, **kw)

    def executor(self, policy: DeliveryPolicy | None = None, **kw: Any) -> EffectExecutor:
        return EffectExecutor(self.consumer, policy=policy or self.policy(), producer=self.producer, **kw)

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()


@pytest.fixture
def make(engine: str, tmp_path: Path) -> Iterator[Callable[[EffectRegistry], Setup]]:
    made: list[Setup] = []

    def build(effects: EffectRegistry) -> Setup:
        made.append(Setup(engine, tmp_path, effects))
        return made[-1]

    yield build
    for s in made:
        s.close()


def look_up(call: EffectCall) -> dict[str, str]:
    return {"answer": call.payload["q"].upper()}


def answers(s: Setup) -> dict[str, Any]:
    return {f: (s.producer.flow(f) or {}).get("a") for f in ("A", "B")}


# -- 7a. a Feedback function that raises is refused feedback, not a stop -------------------


class Flaky:
    """A Feedback function that raises until ``fixed``, then answers ``then(value)``."""

    def __init__(self, then: Callable[[Any], Any]) -> None:
        self.fixed = False
        self.then = then
        self.calls = 0

    def __call__(self, value: Any) -> Any:
        self.calls += 1
        if not self.fixed:
            raise KeyError("answer_text")
        return self.then(value)


@pytest.mark.parametrize("which", ["payload", "flow"])
def test_a_raising_feedback_function_is_recorded_as_refused_and_other_effects_go_on(
    make: Callable[[EffectRegistry], Setup], which: str,
) -> None:
    flaky = Flaky((lambda r: {"a": r["answer"]}) if which == "payload" else (lambda flow_id: flow_id))
    kw: dict[str, Any] = {"payload": flaky} if which == "payload" else {
        "payload": lambda r: {"a": r["answer"]}, "flow": flaky}
    effects = EffectRegistry()
    effects.register("look_up", look_up, idempotent=True, feedback=Feedback(kind="answered", **kw))
    s = make(effects)
    s.ask("A")
    ex = s.executor()
    assert ex.run_once().work == 1  # before the fix: raised KeyError out of run_once, after recording the call
    a = s.consumer.scheduled_effect("tools:A1:look_up")
    assert (a.state, a.fed) == ("succeeded", False)
    assert a.last_error == f"feedback refused: Feedback.{which} raised KeyError: 'answer_text'"
    assert (ex.stats.feedback_errors, ex.stats.fed) == (1, 0)
    # Every later pass tries it again, and still claims and runs the other effects.
    s.ask("B")
    assert ex.run_once().work == 1  # before the fix: raised from the owed feed, B never claimed
    b = s.consumer.scheduled_effect("tools:B1:look_up")
    assert (b.state, b.fed) == ("succeeded", False)
    assert ex.stats.feedback_errors == 3  # A again, then B
    assert answers(s) == {"A": None, "B": None}
    flaky.fixed = True  # the application's bug fixed: the owed feedback goes through
    assert ex.run_once().work == 0
    assert answers(s) == {"A": "A", "B": "B"}
    assert [s.consumer.scheduled_effect(f"tools:{f}1:look_up").fed for f in "AB"] == [True, True]
    assert ex.stats.fed == 2


def test_a_raising_feedback_function_does_not_stop_run_until_idle(make: Callable[[EffectRegistry], Setup]) -> None:
    effects = EffectRegistry()
    effects.register("look_up", look_up, feedback=Feedback(kind="answered", payload=Flaky(lambda r: r)))
    effects.register("note", lambda call: {"noted": True})
    s = make(effects)
    s.ask("A", "B")
    ex = s.executor()
    assert ex.run_until_idle() == 4
    assert s.consumer.effect_counts()["succeeded"] == 4
    assert ex.stats.feedback_errors >= 2


# -- 7b. run_until_idle(max_passes=) is a count --------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, False, 2.5, math.nan, math.inf, "3", None])
def test_run_until_idle_refuses_a_max_passes_that_is_not_a_count(make: Callable[[EffectRegistry], Setup],
                                                                 value: Any) -> None:
    effects = EffectRegistry()
    effects.register("look_up", look_up)
    s = make(effects)
    s.ask("A")
    ex = s.executor()
    with pytest.raises(ValueError, match="max_passes must be an int >= 1"):
        ex.run_until_idle(max_passes=value)
    assert s.consumer.scheduled_effect("tools:A1:look_up").state == "pending"  # nothing claimed
    assert ex.run_until_idle(max_passes=1) == 1


# -- 7c. Feedback(kind=) is checked when built ----------------------------------------------


@pytest.mark.parametrize("kind", ["", None, 7, True, "x" * 129, "tab\there"], ids=repr)
def test_feedback_refuses_a_kind_that_cannot_be_a_step(kind: Any) -> None:
    with pytest.raises(InvalidEnvelope, match="kind"):
        Feedback(kind=kind)


@pytest.mark.parametrize("field", ["payload", "flow"])
def test_feedback_refuses_functions_that_are_not_callable(field: str) -> None:
    with pytest.raises(TypeError, match=f"{field} must be callable or None"):
        Feedback(kind="answered", **{field: "a"})
    assert Feedback(kind="answered", **{field: None}).kind == "answered"


# -- 7d. each executor claims as itself ------------------------------------------------------


class Died(BaseException):
    """Raised inside a reconcile: that executor is "still in its call" (nothing records its end)."""


def test_two_executors_given_one_policy_each_claim_as_themselves(make: Callable[[EffectRegistry], Setup]) -> None:
    def slow(call: EffectCall) -> dict[str, str]:
        s.clock.t += 31  # longer than the lease: the second executor takes the effect up meanwhile
        with pytest.raises(Died):
            second.run_once()  # its claim is live: it is "in the call" when the first one's outcome comes
        return {"answer": "late"}

    def reconcile(call: EffectCall) -> Happened:
        raise Died

    effects = EffectRegistry()
    effects.register("look_up", slow, reconcile=reconcile)
    s = make(effects)
    s.ask("A")
    shared = s.policy(owner="host:1")
    first, second = s.executor(shared), s.executor(shared)
    assert first.run_once().work == 1
    e = s.consumer.scheduled_effect("tools:A1:look_up")
    # Before the fix both claimed as "host:1": the first executor's late outcome
    # overwrote the second's live claim (succeeded, "late").
    assert (e.state, e.result, e.lease_owner) == ("running", None, second.owner)
    assert first.stats.outcomes == {"lease_lost": 1}
    assert first.owner != second.owner
    assert first.owner.startswith("host:1/") and second.owner.startswith("host:1/")


def test_an_executor_records_its_own_owner_on_the_claim(make: Callable[[EffectRegistry], Setup]) -> None:
    seen: list[str | None] = []
    effects = EffectRegistry()
    effects.register("look_up", lambda call: seen.append(s.consumer.scheduled_effect(call.key).lease_owner) or {})
    s = make(effects)
    s.ask("A")
    ex = s.executor(s.policy(owner="me"))
    ex.run_once()
    assert seen == [ex.owner] and ex.policy.owner == ex.owner


# -- 4. run(): the loop ---------------------------------------------------------------------


def test_run_until_idle_waits_out_backoff_and_returns_when_nothing_waits(
    make: Callable[[EffectRegistry], Setup],
) -> None:
    tries: list[int] = []

    def busy_once(call: EffectCall) -> dict[str, str]:
        tries.append(call.attempt)
        if len(tries) == 1:
            raise RetryLater("busy")
        return {"answer": "ok"}

    effects = EffectRegistry()
    effects.register("look_up", busy_once, feedback=Feedback(kind="answered", payload=lambda r: {"a": r["answer"]}))
    s = make(effects)
    s.ask("A")
    ex = EffectExecutor(s.consumer, producer=s.producer, policy=DeliveryPolicy(
        lease_seconds=30, backoff_base=0.05, backoff_cap=0.05, random=lambda: 1.0))
    stats = ex.run(until_idle=True, idle_sleep=30, handle_signals=False)  # an idle sleep would show as a hang
    assert stats is ex.stats
    assert tries == [1, 2]
    assert stats.outcomes == {"pending": 1, "succeeded": 1} and stats.fed == 1
    assert s.producer.flow("A")["a"] == "ok"


def test_a_pass_says_when_the_executor_next_has_work(make: Callable[[EffectRegistry], Setup]) -> None:
    def busy(call: EffectCall) -> dict[str, str]:
        raise RetryLater("busy")

    effects = EffectRegistry()
    effects.register("look_up", busy)
    s = make(effects)
    ex = s.executor(s.policy(backoff_base=2.0, backoff_cap=2.0))
    assert ex.run_once() == PassResult(0, None)  # no effect at all: nothing waits
    s.ask("A")
    assert ex.run_once() == PassResult(1, 0.0)  # taken up; it backs off 0.5 * 2 s
    after = ex.run_once()
    assert after.work == 0 and after.wake_in == pytest.approx(1.0)
    s.clock.t += 0.75
    assert ex.run_once().wake_in == pytest.approx(0.25)


def test_run_stops_after_the_call_in_progress_and_claims_nothing_more(make: Callable[[EffectRegistry], Setup]) -> None:
    calls: list[str] = []

    def stopping(call: EffectCall) -> dict[str, bool]:
        calls.append(call.flow_id)
        ex.stop()  # as SIGTERM's handler would, during the call
        return {"done": True}

    effects = EffectRegistry()
    effects.register("look_up", stopping)
    s = make(effects)
    s.ask("A", "B")
    ex = s.executor()
    ex.run(handle_signals=False)
    assert calls == ["A"]
    assert [s.consumer.scheduled_effect(f"tools:{f}1:look_up").state for f in "AB"] == ["succeeded", "pending"]
    assert ex.run_until_idle() == 1  # run_once outside run() is not stopped


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"until_idle": 1}, "until_idle must be True or False"), ({"handle_signals": "no"}, "handle_signals"),
     ({"max_passes": 0}, "max_passes must be None or an int >= 1"), ({"max_passes": True}, "max_passes"),
     ({"idle_sleep": math.nan}, "idle_sleep must be a finite number"), ({"idle_sleep": -1}, "idle_sleep"),
     ({"limit": 0}, "limit must be an int >= 1"), ({"limit": 2.5}, "limit")],
)
def test_run_refuses_bad_arguments_before_claiming(make: Callable[[EffectRegistry], Setup], kwargs: dict[str, Any],
                                                   match: str) -> None:
    effects = EffectRegistry()
    effects.register("look_up", look_up)
    s = make(effects)
    s.ask("A")
    with pytest.raises((ValueError, TypeError), match=match):
        s.executor().run(handle_signals=False, **{"max_passes": 1, **kwargs})
    assert s.consumer.scheduled_effect("tools:A1:look_up").state == "pending"


def test_run_records_a_failed_pass_and_goes_on(make: Callable[[EffectRegistry], Setup],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fail = [1]
    real = feedback.advance_at_current

    def broken(producer: Producer, *args: Any, **kw: Any) -> Any:  # how the executor feeds back
        if fail[0]:
            fail[0] -= 1
            raise OSError("producer unreachable")
        return real(producer, *args, **kw)

    monkeypatch.setattr(feedback, "advance_at_current", broken)
    effects = EffectRegistry()
    effects.register("look_up", look_up, feedback=Feedback(kind="answered", payload=lambda r: {"a": r["answer"]}))
    s = make(effects)
    s.ask("A")
    other = Producer(s.producer_location, ASK)
    try:
        ex = EffectExecutor(s.consumer, policy=s.policy(), producer=other)
        stats = ex.run(max_passes=2, idle_sleep=0, handle_signals=False)
        assert stats.errors == 1 and stats.last_error == "OSError: producer unreachable"
        assert s.producer.flow("A")["a"] == "A"  # fed on the next pass
    finally:
        other.close()
