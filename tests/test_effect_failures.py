"""Failures come home (``Feedback(on_failure=..., unknown_after=...)``) and
the way out for refused feedback (``consumer.admin.amend_effect``, a checked
``resolve_effect``).

An agent's flow ``T`` calls a tool (``tool_called``); the consumer's
handler schedules ``call_tool``, whose ``Feedback`` advances the result as
``tool_result`` or the failure as ``tool_failed``.  On both engines, one
injected clock, no sleeping; crashes in real child processes are in
``test_effect_failure_crash.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from children.feedback_crash_child import CONSUMER as AGENT
from children.feedback_crash_child import TASK as CHILD_TASK
from children.feedback_crash_child import handler as child_handler
from children.feedback_crash_child import registry as child_registry
from engine_reads import new_location
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    OutcomeUnknown,
    PermanentFailure,
    Producer,
    RetryLater,
    relay,
)
from reliable_flow._tools.cli import main
from reliable_flow.aio import AsyncConsumer, AsyncEffectExecutor, AsyncProducer
from reliable_flow.errors import InvalidEnvelope, NotResolvable
from reliable_flow.protocol import Protocol, by_kind, exact, optional, text
from support import EffectWorld

TASK = Protocol(
    name="tool_task",
    initial="new",
    transitions={"new": ["tool_called"], "tool_called": ["tool_called", "tool_result", "tool_failed"],
                 "tool_result": ["tool_called"], "tool_failed": ["tool_called"]},
    schemas={1: by_kind({
        "tool_called": exact({"tool": text()}),
        "tool_result": exact({"output": text()}),
        "tool_failed": exact({"key": text(), "effect_state": text(), "reason": optional(text()),
                              "error": optional(text())}),
    })},
)
KEY = "agent:T1:call_tool"
FAILED = f"{KEY}:failure"
RESULT = f"{KEY}:result"


@pytest.fixture
def agent(engine: str, tmp_path: Path) -> Iterator[EffectWorld]:
    w = EffectWorld(tmp_path, TASK, engine=engine)
    yield w
    w.close()


def tool(w: EffectWorld, run: Callable[[EffectCall], Any], feedback: Feedback | None = None,
         schedule: dict[str, Any] | None = None, calls: int = 1, **register: Any) -> Consumer:
    """T1 (and up to T<calls>) ``tool_called``, applied; the handler scheduled ``call_tool`` for each."""
    effects = EffectRegistry()
    effects.register("call_tool", run, feedback=feedback or Feedback("tool_result", on_failure="tool_failed"),
                     **register)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "tool_called":
            ctx.schedule("call_tool", dict(ctx.event.payload), **(schedule or {}))

    c = w.consumer((handler,), effects, name="agent")
    for seq in range(1, calls + 1):
        assert w.producer.advance(f"T{seq}", "T", expected_seq=seq - 1, kind="tool_called",
                                  payload={"tool": "calc"}).status == "committed"
    w.deliver(c)
    assert c.drain("T").applied == calls
    return c


def fed_back(w: EffectWorld) -> list[tuple[str, str, dict[str, Any]]]:
    """The steps fed back into flow T: (event id, kind, payload)."""
    events = [w.producer.event(e.event_id) for e in w.producer.outbox("T") if ":" in e.event_id]
    return [(e["event_id"], e["kind"], e["payload"]) for e in events if e is not None]


def declined(call: EffectCall) -> Any:
    raise PermanentFailure("HTTP 500 from the tool")


# -- Feedback's arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "error", "match"), [
    ({"on_failure": 3}, TypeError, "on_failure must be a kind, a Feedback or None"),
    ({"on_failure": ""}, InvalidEnvelope, "on_failure"),
    ({"on_failure": Feedback("x", on_failure="y")}, ValueError, "no failure step of its own"),
    ({"on_failure": Feedback("x", on_failure="y", unknown_after=1)}, ValueError, "no failure step of its own"),
    ({"unknown_after": 5}, ValueError, "unknown_after needs on_failure"),
    ({"on_failure": "f", "unknown_after": float("nan")}, ValueError, "unknown_after must be a finite number"),
    ({"on_failure": "f", "unknown_after": float("inf")}, ValueError, "unknown_after must be a finite number"),
    ({"on_failure": "f", "unknown_after": -1}, ValueError, "unknown_after must be a finite number"),
    ({"on_failure": "f", "unknown_after": True}, ValueError, "unknown_after must be a finite number"),
    ({"on_failure": "f", "unknown_after": "5"}, ValueError, "unknown_after must be a finite number"),
])
def test_feedback_refuses_bad_failure_arguments(kw: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Feedback("tool_result", **kw)


def test_failure_step_is_built_from_on_failure() -> None:
    def route(flow: str) -> str:
        return f"{flow}-x"

    assert Feedback("r").failure_step is None
    assert Feedback("r", on_failure="f").failure_step == Feedback("f")
    assert Feedback("r", flow=route, on_failure="f").failure_step == Feedback("f", flow=route)
    own = Feedback("f", payload=dict)
    assert Feedback("r", on_failure=own, unknown_after=0).failure_step == own
    assert Feedback("r", on_failure="f", unknown_after=2).unknown_after == 2.0


# -- failures come home ----------------------------------------------------------------------------


def test_dead_effect_feeds_its_failure_step_exactly_once(agent: EffectWorld) -> None:
    c = tool(agent, declined)
    ex = agent.executor(c, producer=agent.producer)
    assert ex.run_once().work == 1
    e = c.scheduled_effect(KEY)
    assert (e.state, e.fed) == ("dead", True)
    assert fed_back(agent) == [(FAILED, "tool_failed", {
        "key": KEY, "effect_state": "dead", "reason": "permanent failure",
        "error": "PermanentFailure: HTTP 500 from the tool"})]
    assert agent.producer.flow("T")["state"] == "tool_failed"
    assert ex.stats.fed == 1
    assert [h.detail for h in c.effect_history(KEY) if h.transition == "fed_back"] == [f"advanced as {FAILED}"]
    for _ in range(3):  # and never again
        agent.clock.t += 3600
        ex.run_once()
    assert len(fed_back(agent)) == 1
    agent.deliver(c)  # the failure step comes back to the consumer as the flow's next step
    assert c.drain("T").applied == 1
    assert c.projection("T")["state"] == "tool_failed"


def test_dead_after_max_attempts_feeds_its_failure_step(agent: EffectWorld) -> None:
    c = tool(agent, lambda call: (_ for _ in ()).throw(RetryLater("busy")), max_attempts=2)
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    assert fed_back(agent) == []  # pending again: not a failure yet
    agent.clock.t += 3600
    ex.run_once()
    assert [(s, p["effect_state"], p["reason"]) for _, s, p in fed_back(agent)] == [
        ("tool_failed", "dead", "failed 2 of max_attempts=2 times")]


def test_without_on_failure_a_failure_feeds_nothing(agent: EffectWorld) -> None:
    c = tool(agent, declined, feedback=Feedback("tool_result"))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_until_idle()
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).fed) == ("dead", None)
    assert fed_back(agent) == []
    assert ex.stats.fed == 0


def test_expired_effect_feeds_its_failure_step(agent: EffectWorld) -> None:
    c = tool(agent, lambda call: {"output": "late"}, schedule={"deadline": agent.clock.t + 10})
    agent.clock.t += 11
    ex = agent.executor(c, producer=agent.producer)
    ex.run_until_idle()
    assert [(k, p["effect_state"]) for _, k, p in fed_back(agent)] == [("tool_failed", "expired")]
    assert c.scheduled_effect(KEY).fed is True


def test_superseded_effect_feeds_its_failure_step(agent: EffectWorld) -> None:
    """T1's call was for version 1; T2 moved the flow on before it ran (T2's
    own call ends dead, and feeds its own failure step after T1's)."""
    c = tool(agent, declined, schedule={"version": 1}, calls=1)
    assert agent.producer.advance("T2", "T", expected_seq=1, kind="tool_called",
                                  payload={"tool": "calc"}).status == "committed"
    agent.deliver(c)
    assert c.drain("T").applied == 1
    ex = agent.executor(c, producer=agent.producer)
    ex.run_until_idle()
    assert c.scheduled_effect(KEY).state == "superseded"
    steps = fed_back(agent)
    assert steps[0][0] == FAILED and steps[0][2]["effect_state"] == "superseded"
    assert "past version 1" in steps[0][2]["reason"]


def test_cancelled_by_its_handler_feeds_its_failure_step(agent: EffectWorld) -> None:
    effects = EffectRegistry()
    effects.register("call_tool", declined, feedback=Feedback("tool_result", on_failure="tool_failed"))

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.seq == 1:
            ctx.schedule("call_tool", {"tool": "calc"})
        else:
            ctx.cancel(KEY, "the user gave up")

    c = agent.consumer((handler,), effects, name="agent")
    for seq in (1, 2):
        agent.producer.advance(f"T{seq}", "T", expected_seq=seq - 1, kind="tool_called", payload={"tool": "c"})
    agent.deliver(c)
    assert c.drain("T").applied == 2
    ex = agent.executor(c, producer=agent.producer)
    ex.run_until_idle()
    assert [(k, p["effect_state"], p["reason"]) for _, k, p in fed_back(agent)] == [
        ("tool_failed", "cancelled", "the user gave up")]


def test_unknown_feeds_its_failure_step_only_after_unknown_after(agent: EffectWorld) -> None:
    c = tool(agent, lambda call: (_ for _ in ()).throw(OutcomeUnknown("no answer")),
             feedback=Feedback("tool_result", on_failure="tool_failed", unknown_after=60))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()  # in doubt
    agent.clock.t += 1
    ex.run_once()  # parked: neither reconcile nor idempotent
    assert c.scheduled_effect(KEY).state == "unknown"
    agent.clock.t += 59.5
    ex.run_until_idle()
    assert fed_back(agent) == []
    agent.clock.t += 1
    ex.run_until_idle()
    assert [(k, p["effect_state"]) for _, k, p in fed_back(agent)] == [("tool_failed", "unknown")]
    assert c.scheduled_effect(KEY).fed is True


def test_unknown_without_unknown_after_waits_for_an_operator_whose_cancel_feeds_it(agent: EffectWorld) -> None:
    c = tool(agent, lambda call: (_ for _ in ()).throw(OutcomeUnknown("no answer")))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    agent.clock.t += 1
    ex.run_once()
    agent.clock.t += 10 ** 6
    ex.run_until_idle()
    assert (c.scheduled_effect(KEY).state, fed_back(agent)) == ("unknown", [])
    c.admin.cancel_effect(KEY, actor="ops", reason="the provider has no record")
    ex.run_until_idle()
    assert [(k, p["effect_state"], p["reason"]) for _, k, p in fed_back(agent)] == [
        ("tool_failed", "cancelled", "the provider has no record")]


def test_failure_step_with_its_own_payload_and_a_retry_that_fails_again(agent: EffectWorld) -> None:
    """``on_failure=Feedback(...)`` builds the payload; an operator's retry
    that fails again does not feed a second failure step."""
    failure = Feedback("tool_failed", payload=lambda f: {"key": f["key"], "effect_state": f["effect_state"],
                                                          "error": f"tool said: {f.get('error')}"})
    c = tool(agent, declined, feedback=Feedback("tool_result", on_failure=failure))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_until_idle()
    assert fed_back(agent) == [(FAILED, "tool_failed", {
        "key": KEY, "effect_state": "dead", "error": "tool said: PermanentFailure: HTTP 500 from the tool"})]
    c.admin.retry_effect(KEY, actor="ops", reason="the tool is fixed")
    ex.run_until_idle()
    c.admin.cancel_effect(KEY, actor="ops", reason="still broken")
    ex.run_until_idle()
    assert len(fed_back(agent)) == 1
    assert c.scheduled_effect(KEY).state == "cancelled"


def test_a_failure_payload_function_that_raises_is_refused_feedback(agent: EffectWorld) -> None:
    def broken(failure: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("nope")

    c = tool(agent, declined, feedback=Feedback("tool_result", on_failure=Feedback("tool_failed", payload=broken)))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.fed) == ("dead", False)
    assert e.last_error.startswith("feedback refused: Feedback.on_failure.payload raised KeyError")
    assert ex.stats.feedback_errors == 1 and fed_back(agent) == []


def test_an_async_executor_feeds_failure_steps_too(agent: EffectWorld) -> None:
    c = tool(agent, declined)

    async def main() -> None:
        producer = AsyncProducer(agent.producer.location, TASK)
        consumer = AsyncConsumer(agent.consumer_path, TASK, name="agent", effects=c.effect_registry,
                                 clock=agent.clock)
        ex = AsyncEffectExecutor(consumer, producer=producer, policy=DeliveryPolicy(
            lease_seconds=30, clock=agent.clock, random=lambda: 0.5, owner="aio"))
        await ex.run(until_idle=True, handle_signals=False)
        assert (ex.stats.fed, (await ex.run_once()).work, ex.stats.fed) == (1, 0, 1)
        await consumer.close()
        await producer.close()

    asyncio.run(main())
    assert [(e, k, p["effect_state"]) for e, k, p in fed_back(agent)] == [(FAILED, "tool_failed", "dead")]


# -- a way out for refused feedback ----------------------------------------------------------------


def refused_result(agent: EffectWorld) -> Consumer:
    """call_tool succeeded with a result the producer refuses (an extra field)."""
    c = tool(agent, lambda call: {"output": "42", "extra": 1})
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.fed) == ("succeeded", False) and e.last_error.startswith("feedback invalid_payload")
    return c


def test_amend_replaces_a_refused_result_which_is_then_fed_once(agent: EffectWorld) -> None:
    c = refused_result(agent)
    for action in (c.admin.resolve_effect, c.admin.retry_effect, c.admin.cancel_effect):
        with pytest.raises(NotResolvable):
            action(KEY, actor="ops", reason="try")  # type: ignore[operator]
    record = c.admin.amend_effect(KEY, result={"output": "42"}, actor="ops", reason="dropped the extra field",
                                  producer=agent.producer)
    assert (record.action, record.reason) == ("resolve", "amend: dropped the extra field")
    assert fed_back(agent) == []  # checked against the producer, nothing committed there
    assert [(a.action, a.reason) for a in c.admin.effect_actions(KEY)] == [("resolve", "amend: dropped the extra field")]
    e = c.scheduled_effect(KEY)
    assert (e.state, e.result, e.fed, e.last_error) == ("succeeded", {"output": "42"}, False, None)
    ex = agent.executor(c, owner="exec-2", producer=agent.producer)
    for _ in range(3):
        ex.run_once()
    assert fed_back(agent) == [(RESULT, "tool_result", {"output": "42"})]
    assert c.scheduled_effect(KEY).fed is True
    assert "amend by ops" in next(h.detail or "" for h in c.effect_history(KEY) if h.transition == "operator")
    with pytest.raises(NotResolvable, match="its feedback was fed; amend is only for an effect whose feedback"):
        c.admin.amend_effect(KEY, result={"output": "43"}, actor="ops", reason="again")


@pytest.mark.parametrize("bad", [{"output": 42}, {"output": "x", "more": 1}, "not an object", None])
def test_amend_with_a_result_the_producer_would_refuse_records_nothing(agent: EffectWorld, bad: Any) -> None:
    c = refused_result(agent)
    before = c.scheduled_effect(KEY)
    with pytest.raises(NotResolvable, match="would be refused as feedback"):
        c.admin.amend_effect(KEY, result=bad, actor="ops", reason="r", producer=agent.producer)
    assert c.scheduled_effect(KEY) == before
    assert c.admin.effect_actions() == [] and fed_back(agent) == []


def test_amend_checks_against_the_flow_where_it_is_now(agent: EffectWorld) -> None:
    """The step would be refused at the flow's current state: nothing recorded."""
    c = refused_result(agent)
    assert agent.producer.advance("T2", "T", expected_seq=1, kind="tool_called",
                                  payload={"tool": "calc"}).status == "committed"
    agent.producer.advance("T3", "T", expected_seq=2, kind="tool_result", payload={"output": "other"})
    with pytest.raises(NotResolvable, match="invalid_transition"):
        c.admin.amend_effect(KEY, result={"output": "42"}, actor="ops", reason="r", producer=agent.producer)
    assert c.admin.effect_actions() == []


def test_amend_to_the_failure_step(agent: EffectWorld) -> None:
    c = refused_result(agent)
    record = c.admin.amend_effect(KEY, failure=True, actor="ops", reason="the output is garbage",
                                  producer=agent.producer)
    assert (record.action, record.reason) == ("cancel", "amend: the output is garbage")
    assert c.scheduled_effect(KEY).state == "cancelled"
    agent.executor(c, producer=agent.producer).run_until_idle()
    assert fed_back(agent) == [(FAILED, "tool_failed", {
        "key": KEY, "effect_state": "cancelled", "reason": "amended to its failure step by ops: the output is garbage"})]


def test_amend_is_refused_where_it_does_not_apply(agent: EffectWorld) -> None:
    c = tool(agent, lambda call: {"output": "fine"})
    with pytest.raises(NotResolvable, match="is pending and its feedback owes nothing"):
        c.admin.amend_effect(KEY, result={"output": "x"}, actor="ops", reason="r")
    agent.executor(c).run_once()  # no producer: owed, never refused
    with pytest.raises(NotResolvable, match="is owed and was not refused"):
        c.admin.amend_effect(KEY, result={"output": "x"}, actor="ops", reason="r")
    with pytest.raises(ValueError, match="actor"):
        c.admin.amend_effect(KEY, result={"output": "x"}, actor=" ", reason="r")
    with pytest.raises(TypeError, match="failure must be a bool"):
        c.admin.amend_effect(KEY, failure=1, actor="ops", reason="r")  # type: ignore[arg-type]
    with pytest.raises(InvalidEnvelope, match="result"):
        c.admin.amend_effect(KEY, result=float("nan"), actor="ops", reason="r")
    assert c.admin.effect_actions() == []


def test_amend_to_the_failure_step_of_a_refused_failure_is_refused(agent: EffectWorld) -> None:
    c = tool(agent, declined, feedback=Feedback("tool_result", on_failure="tool_result"))  # wrong payload
    agent.executor(c, producer=agent.producer).run_once()
    assert c.scheduled_effect(KEY).last_error.startswith("feedback invalid_payload")
    with pytest.raises(NotResolvable, match="its failure step is what was refused"):
        c.admin.amend_effect(KEY, failure=True, actor="ops", reason="r")
    c.admin.amend_effect(KEY, result={"output": "done by hand"}, actor="ops", reason="did it myself")
    agent.executor(c, producer=agent.producer).run_until_idle()
    assert fed_back(agent) == [(RESULT, "tool_result", {"output": "done by hand"})]


def test_resolve_checks_the_result_against_the_feedback_builder(agent: EffectWorld) -> None:
    def payload(result: Any) -> dict[str, Any]:
        return {"output": str(result["text"])}

    c = tool(agent, lambda call: (_ for _ in ()).throw(OutcomeUnknown("?")),
             feedback=Feedback("tool_result", payload=payload))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    agent.clock.t += 1
    ex.run_once()
    with pytest.raises(NotResolvable, match=r"Feedback.payload raised KeyError"):
        c.admin.resolve_effect(KEY, result={"output": "x"}, actor="ops", reason="r")
    with pytest.raises(NotResolvable, match="would be refused"):
        c.admin.resolve_effect(KEY, result=["a list"], actor="ops", reason="r")
    assert (c.scheduled_effect(KEY).state, c.admin.effect_actions()) == ("unknown", [])
    c.admin.resolve_effect(KEY, result={"text": 42}, actor="ops", reason="r")
    ex.run_once()
    assert fed_back(agent) == [(RESULT, "tool_result", {"output": "42"})]


# -- on the command line ---------------------------------------------------------------------------

CHILD = "children.feedback_crash_child"
CHECKED = ["--protocol", f"{CHILD}:TASK", "--effects", f"{CHILD}:EFFECTS", "--actor", "ops", "--reason", "INC-9"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_effect_resolve_and_amend_on_the_command_line(capsys: pytest.CaptureFixture[str], engine: str,
                                                      tmp_path: Path) -> None:
    """F0's tool failed and its failure step is owed (no producer yet); F1's
    tool answered a result the producer refused.  ``resolve`` and ``amend``
    check the result against the Feedback and the producer before recording."""
    producer_at, consumer_at = str(new_location(engine, tmp_path, "producer")), str(new_location(engine, tmp_path,
                                                                                                  "consumer"))
    bad = EffectRegistry()
    bad.register("call_tool", lambda call: (_ for _ in ()).throw(PermanentFailure("500"))
                 if call.payload["tool"] == "broken" else {"output": "x", "extra": 1},
                 feedback=Feedback("tool_result", on_failure="tool_failed"))
    with Producer(producer_at, CHILD_TASK) as p, \
            Consumer(consumer_at, CHILD_TASK, handlers=[child_handler], effects=bad, name=AGENT) as c:
        for i, name in enumerate(["broken", "calc"]):
            p.advance(f"F{i}-1", f"F{i}", expected_seq=0, kind="tool_called", payload={"tool": name})
        while relay(p, c).status != "idle":
            pass
        c.process_all()
        EffectExecutor(c).run_until_idle()  # F0 dead, its failure step owed
        c.admin.retry_effect(f"{AGENT}:F0-1:call_tool", actor="t", reason="again")  # and in doubt no more
        EffectExecutor(c, producer=p).run_once()  # F1's result refused; F0 dead again (fed its failure step)
    dead, refused = f"{AGENT}:F0-1:call_tool", f"{AGENT}:F1-1:call_tool"
    with Consumer(consumer_at, CHILD_TASK) as c:
        assert c.scheduled_effect(refused).last_error.startswith("feedback invalid_payload")

    code, out, err = cli(capsys, "effect", "amend", consumer_at, refused, "--result", '{"output": 7}',
                         "--producer", producer_at, *CHECKED)
    assert (code, out) == (1, "") and "would be refused as feedback (invalid_payload" in err
    code, out, err = cli(capsys, "effect", "amend", consumer_at, dead, "--result", '{"output": "7"}', *CHECKED)
    assert (code, out) == (1, "") and "amend is only for an effect whose feedback was refused" in err
    with pytest.raises(SystemExit):  # --effects is required: the step cannot be built without it
        main(["effect", "amend", consumer_at, refused, "--failure", "--actor", "a", "--reason", "r"])
    capsys.readouterr()
    code, out, err = cli(capsys, "effect", "amend", consumer_at, refused, "--result", '{"output": "7"}',
                         "--producer", producer_at, *CHECKED)
    assert (code, err) == (0, "") and "fed on the next executor pass" in out

    with Producer(producer_at, CHILD_TASK) as p, \
            Consumer(consumer_at, CHILD_TASK, handlers=[child_handler], effects=child_registry(), name=AGENT) as c:
        assert [(a.key, a.action, a.reason) for a in c.admin.effect_actions(refused)] == [
            (refused, "resolve", "amend: INC-9")]
        for _ in range(3):
            EffectExecutor(c, producer=p).run_once()
        assert [(e.event_id, p.event(e.event_id)["kind"]) for e in p.outbox("F1") if e.seq > 1] == [
            (f"{refused}:result", "tool_result")]
        assert p.flow("F1")["output"] == "7"
        # F0: resolved by hand, checked the same way (its failure step came home already).
    code, out, err = cli(capsys, "effect", "resolve", consumer_at, dead, "--result", '{"output": 7}',
                         "--producer", producer_at, *CHECKED)
    assert (code, out) == (1, "") and "would be refused as feedback" in err
    with Consumer(consumer_at, CHILD_TASK) as c:
        assert c.scheduled_effect(dead).state == "dead"
        assert [a.action for a in c.admin.effect_actions(dead)] == ["retry"]
