"""The effect executor and the effect outbox: every state and transition, the
operator's actions and reads, ``inspect``, the worker and feedback into a
producer (a v1 consumer file upgraded to the effect outbox is in
``tests/sqlite/test_effects_upgrade_sqlite.py``).

On both engines (a SQLite file in ``tmp_path`` or a PostgreSQL schema); one injected clock shared by the consumer and the
executor's policy (``random`` fixed at 0.5, so every backoff is exact); no
sleeping.  Handlers and scheduling are in ``test_effect_handlers.py``, crashes
in real child processes in ``test_effect_crash_points.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    Happened,
    NotHappened,
    OutcomeUnknown,
    PermanentFailure,
    Producer,
    RetryLater,
    Worker,
)
from reliable_flow._effects import feedback
from reliable_flow.errors import CommitOutcomeUnknown, InvalidEnvelope, NotResolvable, UnknownEffect
from reliable_flow.protocol import Protocol, by_kind, exact, text
from support import EffectWorld

T0 = 1000.0


# -- local helpers ----------------------------------------------------------------------------




class Died(BaseException):
    """Raised inside an effect function: the executor's process "dies" mid-call
    (nothing catches it, nothing is recorded, the claim stays)."""


class Script:
    """An effect (or reconcile) function answering from a script, one step per
    call, the last step repeating.  A step is an exception (raised), a function
    of the call, or a value (returned).  ``calls`` records every call."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps) or [{"ok": True}]
        self.calls: list[EffectCall] = []

    def __call__(self, call: EffectCall) -> Any:
        self.calls.append(call)
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, BaseException):
            raise step
        if callable(step) and not isinstance(step, type):
            return step(call)
        return step

    @property
    def attempts(self) -> list[int]:
        return [c.attempt for c in self.calls]


World = EffectWorld


@pytest.fixture
def world(engine: str, tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path, engine=engine)
    yield w
    w.close()


def one_effect(w: World, run: Callable[[EffectCall], Any], *, flows: tuple[str, ...] = ("A",), upto: int = 1,
               meta: dict[str, str] | None = None, **register: Any) -> Consumer:
    """A consumer whose handler schedules ``notify`` on each flow's reserved step
    (key ``default:<flow>1:notify``), with every flow delivered and applied."""
    schedule_kw = register.pop("schedule_kw", None) or {}
    effects = EffectRegistry()
    effects.register("notify", run, **register)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("notify", {"flow": ctx.event.flow_id}, **schedule_kw)

    c = w.consumer((handler,), effects)
    for flow in flows:
        w.push(flow, upto, meta=meta)
    w.deliver(c)
    c.process_all()
    return c


KEY = "default:A1:notify"


def run_dying(ex: EffectExecutor) -> None:
    with pytest.raises(Died):
        ex.run_once()


# -- 3. executor: each state and transition ------------------------------------------------------


def test_success_stores_json_result_and_the_call_sees_everything(world: World) -> None:
    run = Script({"sent": [1, "two", None], "n": 1.5})
    c = one_effect(world, run, meta={"trace": "t-9"})
    ex = world.executor(c)
    assert ex.run_once().work == 1
    (call,) = run.calls
    assert call == EffectCall(KEY, "notify", {"flow": "A"}, {"trace": "t-9"}, 1, "A", "A1")
    e = c.scheduled_effect(KEY)
    assert (e.state, e.result, e.attempts, e.failures, e.lease_owner, e.last_error, e.fed) == (
        "succeeded", {"sent": [1, "two", None], "n": 1.5}, 1, 0, None, None, None)
    assert e.updated_at == T0
    assert ex.run_once().work == 0
    assert len(run.calls) == 1
    assert ex.stats.outcomes == {"succeeded": 1}


@pytest.mark.parametrize("result", [42, "text", None, [1, 2], True])
def test_any_json_value_is_a_result(world: World, result: Any) -> None:
    c = one_effect(world, Script(lambda call: result))
    world.executor(c).run_once()
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).result) == ("succeeded", result)


def test_retry_later_backs_off_exactly_then_goes_dead_at_max_attempts(world: World) -> None:
    def busy(call: EffectCall) -> None:
        world.clock.t += 1  # the call takes a second: backoff counts from its end
        raise RetryLater("busy")

    run = Script(busy)
    c = one_effect(world, run, max_attempts=4)
    ex = EffectExecutor(c, policy=DeliveryPolicy(lease_seconds=30, clock=world.clock, random=lambda: 0.5,
                                                 backoff_base=2, backoff_cap=5, owner="exec-1"))
    # due = end of call + random() * min(cap, base * 2**(failures-1))
    for failures, (start, due) in enumerate([(1000, 1002.0), (1002, 1005.0), (1005, 1008.5)], start=1):
        world.clock.t = start
        assert ex.run_once().work == 1
        e = c.scheduled_effect(KEY)
        assert (e.state, e.attempts, e.failures, e.due_at, e.last_error, e.lease_owner) == (
            "pending", failures, failures, due, "RetryLater: busy", None)
        world.clock.t = due - 0.01
        assert ex.run_once().work == 0  # not due yet
    world.clock.t = 1008.5
    assert ex.run_once().work == 1
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.failures, e.reason, e.last_error) == (
        "dead", 4, 4, "failed 4 of max_attempts=4 times", "RetryLater: busy")
    for _ in range(5):
        world.clock.t += 3600
        assert ex.run_once().work == 0
    assert run.attempts == [1, 2, 3, 4]
    assert {call.key for call in run.calls} == {KEY}  # the same key on every attempt
    assert ex.stats.outcomes == {"pending": 3, "dead": 1}


def test_permanent_failure_goes_dead_at_once(world: World) -> None:
    run = Script(PermanentFailure("card declined"))
    c = one_effect(world, run)
    ex = world.executor(c)
    ex.run_once()
    world.clock.t += 3600
    ex.run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.reason, e.last_error) == (
        "dead", 1, "permanent failure", "PermanentFailure: card declined")
    assert len(run.calls) == 1


@pytest.mark.parametrize(("raised", "error"), [
    (OutcomeUnknown("no answer"), "OutcomeUnknown: no answer"),
    (TimeoutError("read timed out"), "TimeoutError: read timed out"),
    (ValueError("odd"), "RuntimeError: unclassified failure, treated as unknown: ValueError: odd"),
])
def test_failures_that_may_have_happened_go_in_doubt(world: World, raised: Exception, error: str) -> None:
    run = Script(raised)
    c = one_effect(world, run, reconcile=Script(Happened()))
    ex = world.executor(c)
    assert ex.run_once().work == 1
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.failures, e.due_at, e.last_error, e.lease_owner) == (
        "in_doubt", 1, 1, T0 + 0.25, error, None)  # 0.5 * min(300, 0.5 * 2**0)
    world.clock.t = T0 + 0.2
    assert ex.run_once().work == 0


def test_in_doubt_reconciled_as_happened_succeeds_without_calling_again(world: World) -> None:
    run = Script(OutcomeUnknown("no answer"))
    check = Script(Happened({"receipt": "r-1"}))
    c = one_effect(world, run, reconcile=check)
    ex = world.executor(c)
    ex.run_once()
    assert check.calls == []  # not before it is due
    world.clock.t = T0 + 0.25
    assert ex.run_once().work == 1
    e = c.scheduled_effect(KEY)
    assert (e.state, e.result, e.attempts, e.lease_owner) == ("succeeded", {"receipt": "r-1"}, 1, None)
    assert [(call.key, call.attempt) for call in check.calls] == [(KEY, 1)]
    assert len(run.calls) == 1
    assert ex.stats.outcomes == {"in_doubt": 1, "reconciled_succeeded": 1}


def test_in_doubt_reconciled_as_not_happened_runs_again_with_the_same_key(world: World) -> None:
    run = Script(OutcomeUnknown("no answer"), {"ok": 2})
    check = Script(NotHappened())
    c = one_effect(world, run, reconcile=check)
    ex = world.executor(c)
    ex.run_once()
    world.clock.t = T0 + 1
    assert ex.run_once(limit=1).work == 1  # only the reconcile
    e = c.scheduled_effect(KEY)
    assert (e.state, e.due_at, e.attempts, e.last_error) == ("pending", T0 + 1, 1, None)
    assert ex.run_once().work == 1
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).result, c.scheduled_effect(KEY).attempts) == ("succeeded", {"ok": 2}, 2)
    assert [(call.key, call.attempt) for call in run.calls] == [(KEY, 1), (KEY, 2)]
    assert len(check.calls) == 1


def test_not_happened_with_attempts_used_up_goes_dead(world: World) -> None:
    run = Script(OutcomeUnknown("no answer"))
    check = Script(NotHappened())
    c = one_effect(world, run, reconcile=check, max_attempts=2)
    ex = world.executor(c)
    for _ in range(10):
        ex.run_until_idle()
        world.clock.t += 3600
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts) == ("dead", 2)
    assert "max_attempts=2" in e.reason
    assert run.attempts == [1, 2] and [call.attempt for call in check.calls] == [1, 2]


def test_reconcile_that_cannot_tell_backs_off_then_parks_unknown(world: World) -> None:
    run = Script(OutcomeUnknown("no answer"))
    check = Script(OSError("ledger down"), "not an answer")
    c = one_effect(world, run, reconcile=check, max_attempts=3)
    ex = world.executor(c)
    ex.run_once()  # the doubt is failure 1: due + 0.5 * min(300, 0.5 * 2**0)
    assert (c.scheduled_effect(KEY).failures, c.scheduled_effect(KEY).due_at) == (1, T0 + 0.25)
    world.clock.t = T0 + 1
    assert ex.run_once().work == 1  # reconcile raises: failure 2, due + 0.5 * min(300, 0.5 * 2**1)
    e = c.scheduled_effect(KEY)
    assert (e.state, e.failures, e.due_at, e.last_error) == ("in_doubt", 2, T0 + 1.5, "OSError: ledger down")
    world.clock.t = T0 + 2
    assert ex.run_once().work == 1  # a non-answer also counts as "could not tell": failure 3
    e = c.scheduled_effect(KEY)
    assert (e.state, e.failures, e.due_at) == ("in_doubt", 3, T0 + 3)
    assert e.last_error.startswith("TypeError: reconcile must return Happened or NotHappened")
    world.clock.t = T0 + 3
    assert ex.run_once().work == 1  # max_attempts=3 reconciles could not tell: parked
    e = c.scheduled_effect(KEY)
    assert (e.state, e.failures, e.lease_owner) == ("unknown", 4, None)
    assert e.reason == "reconcile could not tell in 3 tries (max_attempts)"
    for _ in range(5):
        world.clock.t += 3600
        assert ex.run_once().work == 0
    assert len(run.calls) == 1 and len(check.calls) == 3
    assert ex.stats.outcomes == {"in_doubt": 1, "reconciled_in_doubt": 2, "reconciled_unknown": 1}


def test_each_doubt_starts_its_own_backoff_and_reconcile_budget(world: World) -> None:
    run = Script(RetryLater("busy"), RetryLater("busy"), OutcomeUnknown("no answer"))
    check = Script(OSError("ledger down"))
    c = one_effect(world, run, reconcile=check, max_attempts=3)
    ex = world.executor(c)
    for t in (T0, T0 + 0.25, T0 + 0.75):  # retries due after 0.25, then 0.5
        world.clock.t = t
        assert ex.run_once().work == 1
    e = c.scheduled_effect(KEY)  # the two retries before do not count: the doubt is failure 1
    assert (e.state, e.attempts, e.failures, e.due_at) == ("in_doubt", 3, 1, T0 + 1.0)
    for _ in range(10):
        world.clock.t = c.scheduled_effect(KEY).due_at
        ex.run_once()
    assert c.scheduled_effect(KEY).state == "unknown"
    assert len(check.calls) == 3  # max_attempts reconciles of its own


def test_idempotent_in_doubt_reruns_with_the_same_key(world: World) -> None:
    run = Script(TimeoutError("slow"), {"ok": True})
    c = one_effect(world, run, idempotent=True)
    ex = world.executor(c)
    ex.run_once()
    assert c.scheduled_effect(KEY).state == "in_doubt"
    world.clock.t = T0 + 1
    ex.run_once()
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).attempts) == ("succeeded", 2)
    assert [(call.key, call.attempt) for call in run.calls] == [(KEY, 1), (KEY, 2)]


def test_idempotent_reruns_stop_at_max_attempts(world: World) -> None:
    run = Script(TimeoutError("slow"))
    c = one_effect(world, run, idempotent=True, max_attempts=2)
    ex = world.executor(c)
    for _ in range(10):
        ex.run_once()
        world.clock.t += 3600
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts) == ("unknown", 2)
    assert "max_attempts" in e.reason
    assert run.attempts == [1, 2]


def test_in_doubt_with_neither_is_parked_unknown_and_never_called_again(world: World) -> None:
    run = Script(OutcomeUnknown("no answer"))
    c = one_effect(world, run)
    ex = world.executor(c)
    ex.run_once()
    assert c.scheduled_effect(KEY).state == "in_doubt"
    for _ in range(20):
        world.clock.t += 3600
        ex.run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.lease_owner) == ("unknown", 1, None)
    assert "neither reconcile nor idempotent=True" in e.reason
    assert len(run.calls) == 1
    assert ex.stats.outcomes == {"in_doubt": 1, "unknown": 1}


@pytest.mark.parametrize("mode", ["reconcile", "idempotent", "neither"])
def test_running_effect_whose_lease_ran_out_is_in_doubt(world: World, mode: str) -> None:
    run = Script(Died(), {"ok": "again"})
    check = Script(Happened({"ok": "checked"}))
    register = {"reconcile": {"reconcile": check}, "idempotent": {"idempotent": True}, "neither": {}}[mode]
    c = one_effect(world, run, **register)
    dead = world.executor(c, owner="dead-one")
    run_dying(dead)
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.lease_owner, e.due_at) == ("running", 1, dead.owner, T0 + 30)
    assert dead.owner.startswith("dead-one/")  # the policy's owner, made this executor's own
    other = world.executor(c, owner="survivor")
    world.clock.t = T0 + 29.9
    assert other.run_once().work == 0  # the lease still holds
    world.clock.t = T0 + 30
    assert other.run_once().work == 1
    e = c.scheduled_effect(KEY)
    if mode == "reconcile":
        assert (e.state, e.result, e.attempts) == ("succeeded", {"ok": "checked"}, 1)
        assert len(run.calls) == 1 and [call.attempt for call in check.calls] == [1]
    elif mode == "idempotent":
        assert (e.state, e.result, e.attempts) == ("succeeded", {"ok": "again"}, 2)
        assert [(call.key, call.attempt) for call in run.calls] == [(KEY, 1), (KEY, 2)]
    else:
        assert (e.state, e.attempts) == ("unknown", 1)
        for _ in range(5):
            world.clock.t += 3600
            other.run_once()
        assert len(run.calls) == 1
    assert e.lease_owner is None


def test_a_runner_dying_starts_a_new_doubt_after_earlier_retries(world: World) -> None:
    run = Script(RetryLater("busy"), RetryLater("busy"), Died())
    check = Script(OSError("ledger down"))
    c = one_effect(world, run, reconcile=check, max_attempts=5)
    ex = world.executor(c)
    ex.run_once()
    world.clock.t = T0 + 0.25
    ex.run_once()
    world.clock.t = T0 + 0.75
    run_dying(ex)
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).failures) == ("running", 2)
    world.clock.t = T0 + 0.75 + 30  # the lease ran out: reconcile, which cannot tell
    assert world.executor(c, owner="survivor").run_once().work == 1
    e = c.scheduled_effect(KEY)  # the doubt is failure 1, the failed reconcile failure 2
    assert (e.state, e.failures, e.due_at) == ("in_doubt", 2, world.clock.t + 0.5)


def test_late_outcome_after_the_lease_was_taken_over_is_discarded(world: World) -> None:
    takeover: list[EffectExecutor] = []

    def slow(call: EffectCall) -> dict[str, str]:
        world.clock.t += 31  # longer than the lease: another executor takes the effect up
        assert takeover[0].run_once().work == 1
        return {"by": "slow"}

    c = one_effect(world, Script(slow), reconcile=Script(Happened({"by": "checker"})))
    first, second = world.executor(c, owner="first"), world.executor(c, owner="second")
    takeover.append(second)
    assert first.run_once().work == 1
    e = c.scheduled_effect(KEY)
    assert (e.state, e.result) == ("succeeded", {"by": "checker"})
    assert first.stats.outcomes == {"lease_lost": 1}
    assert second.stats.outcomes == {"reconciled_succeeded": 1}


def test_deadline_passed_before_running_expires_it(world: World) -> None:
    run = Script(RetryLater("busy"))
    c = one_effect(world, run, schedule_kw={"deadline": T0 + 1})
    ex = world.executor(c)
    ex.run_once()
    assert c.scheduled_effect(KEY).state == "pending"
    world.clock.t = T0 + 1  # exactly at the deadline: still runs
    ex.run_once()
    assert c.scheduled_effect(KEY).due_at == T0 + 1.5
    world.clock.t = T0 + 1.5
    ex.run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.lease_owner) == ("expired", 2, None)
    assert e.reason == "its deadline 1001.000 passed (now 1001.500)"
    assert len(run.calls) == 2


def test_in_doubt_past_deadline_is_reconciled_before_it_expires(world: World) -> None:
    run = Script(OutcomeUnknown("?"))
    check = Script(NotHappened())
    c = one_effect(world, run, reconcile=check, schedule_kw={"deadline": T0 + 1})
    ex = world.executor(c)
    ex.run_once()
    world.clock.t = T0 + 5
    ex.run_once()
    assert c.scheduled_effect(KEY).state == "expired"
    assert len(run.calls) == 1 and len(check.calls) == 1


def test_idempotent_in_doubt_past_deadline_is_parked_not_rerun(world: World) -> None:
    run = Script(OutcomeUnknown("?"))
    c = one_effect(world, run, idempotent=True, schedule_kw={"deadline": T0 + 1})
    ex = world.executor(c)
    ex.run_once()
    world.clock.t = T0 + 5
    ex.run_once()
    e = c.scheduled_effect(KEY)
    assert e.state == "unknown"
    assert "not re-run even by key" in e.reason
    assert len(run.calls) == 1


@pytest.mark.parametrize(("version", "state"), [(1, "superseded"), (2, "succeeded")])
def test_version_superseded_once_the_flow_moves_past_it(world: World, version: int, state: str) -> None:
    run = Script({"ok": True})
    c = one_effect(world, run, upto=2, schedule_kw={"version": version})  # the flow is at seq 2
    assert c.scheduled_effect(KEY).version == version
    world.executor(c).run_once()
    e = c.scheduled_effect(KEY)
    assert e.state == state
    assert len(run.calls) == (state == "succeeded")
    if state == "superseded":
        assert e.reason == "flow 'A' was applied up to seq 2, past version 1"


def test_effect_cancelled_by_a_handler_never_runs(world: World) -> None:
    run = Script({"ok": True})
    effects = EffectRegistry()
    effects.register("notify", run)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("notify", {})
        elif ctx.event.kind == "confirmed":
            ctx.cancel(KEY, "confirmed before it was sent")

    c = world.consumer((handler,), effects)
    world.push("A", 2)
    world.deliver(c)
    c.drain("A")
    ex = world.executor(c)
    assert ex.run_until_idle() == 0
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).reason) == ("cancelled", "confirmed before it was sent")
    assert run.calls == []


@pytest.mark.parametrize("result", [{"x": float("nan")}, {"x": {1, 2}}, object(), {1: "x"}])
def test_non_json_result_is_unknown_and_never_rerun(world: World, result: Any) -> None:
    run = Script(lambda call: result)
    c = one_effect(world, run, idempotent=True)
    ex = world.executor(c)
    ex.run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.result, e.lease_owner) == ("unknown", None, None)
    assert e.reason == "it ran, but its result is not JSON; resolve it by hand"
    assert e.last_error.startswith("result")
    for _ in range(5):
        world.clock.t += 3600
        assert ex.run_once().work == 0
    assert len(run.calls) == 1


def test_non_json_answer_of_reconcile_is_unknown(world: World) -> None:
    c = one_effect(world, Script(OutcomeUnknown("?")), reconcile=Script(Happened({"x": float("inf")})))
    ex = world.executor(c)
    ex.run_once()
    world.clock.t += 1
    ex.run_once()
    assert c.scheduled_effect(KEY).state == "unknown"


def test_result_with_a_lone_surrogate_is_unknown(world: World) -> None:
    c = one_effect(world, Script({"text": "\ud800"}))
    world.executor(c).run_once()
    e = c.scheduled_effect(KEY)
    assert (e.state, e.lease_owner) == ("unknown", None)
    assert e.last_error.startswith("result.text")


def test_only_registered_names_are_claimed(world: World) -> None:
    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("mine", {})
        ctx.schedule("theirs", {})

    c = world.consumer((handler,))  # no registry: the handler may schedule any name
    world.push("A", 1)
    world.deliver(c)
    c.apply_next("A")
    mine, theirs = EffectRegistry(), EffectRegistry()
    run_mine, run_theirs = Script(), Script()
    mine.register("mine", run_mine)
    theirs.register("theirs", run_theirs)
    with pytest.raises(TypeError):
        EffectExecutor(c)  # neither the consumer nor the call names a registry
    assert world.executor(c, effects=mine).run_until_idle() == 1
    assert c.scheduled_effect("default:A1:theirs").state == "pending"
    assert c.scheduled_effect("default:A1:theirs").attempts == 0
    assert run_theirs.calls == []
    assert world.executor(c, effects=theirs).run_until_idle() == 1
    assert [len(run_mine.calls), len(run_theirs.calls)] == [1, 1]


def test_due_effects_are_taken_oldest_due_first(world: World) -> None:
    run = Script(lambda call: (_ for _ in ()).throw(RetryLater("busy")) if call.flow_id == "A" else {"ok": 1})
    c = one_effect(world, run)  # A's effect: retried, due at T0 + 0.25
    world.executor(c).run_once()
    world.push("B")  # B's effect: scheduled later, but due at once
    world.deliver(c)
    c.process_all()
    world.clock.t = T0 + 1
    assert world.executor(c).run_once(limit=1).work == 1
    assert [call.flow_id for call in run.calls] == ["A", "B"]


def ordered_world(w: World, todo: dict[str, list[Any]]) -> tuple[Consumer, list[tuple[str, int]]]:
    """Flows A and B: ``<flow>-1`` (ordered, on reserved), ``<flow>-2`` (ordered) and
    ``<flow>-free`` (not ordered) on confirmed.  ``todo[key]`` scripts a key's calls."""
    calls: list[tuple[str, int]] = []

    def step(call: EffectCall) -> Any:
        calls.append((call.key, call.attempt))
        steps = todo.get(call.key)
        if steps:
            outcome = steps.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return {"done": call.key}

    effects = EffectRegistry()
    effects.register("step", step)

    def handler(ctx: ApplyContext) -> None:
        flow = ctx.event.flow_id
        if ctx.event.kind == "reserved":
            ctx.schedule("step", {}, key=f"{flow}-1", ordered=True)
        else:
            ctx.schedule("step", {}, key=f"{flow}-2", ordered=True)
            ctx.schedule("step", {}, key=f"{flow}-free")

    c = w.consumer((handler,), effects)
    for flow in ("A", "B"):
        w.push(flow, 2)
    w.deliver(c)
    c.process_all()
    return c, calls


def test_ordered_effect_waits_for_the_earlier_one_of_its_flow_only(world: World) -> None:
    c, calls = ordered_world(world, {"A-1": [RetryLater("busy")]})
    ex = world.executor(c)
    ex.run_until_idle()
    assert calls == [("A-1", 1), ("A-free", 1), ("B-1", 1), ("B-2", 1), ("B-free", 1)]
    assert (c.scheduled_effect("A-1").state, c.scheduled_effect("A-2").state) == ("pending", "pending")
    world.clock.t += 1
    ex.run_until_idle()
    assert calls[5:] == [("A-1", 2), ("A-2", 1)]
    assert {e.state for e in c.scheduled_effects()} == {"succeeded"}


@pytest.mark.parametrize(("first", "state", "action"), [
    (PermanentFailure("no"), "dead", "cancel"),
    (PermanentFailure("no"), "dead", "resolve"),
    (OutcomeUnknown("?"), "unknown", "resolve"),
    (OutcomeUnknown("?"), "unknown", "cancel"),
])
def test_ordered_effect_waits_behind_a_dead_or_unknown_one_until_an_operator_acts(
        world: World, first: Exception, state: str, action: str) -> None:
    c, calls = ordered_world(world, {"A-1": [first]})
    ex = world.executor(c)
    for _ in range(10):
        ex.run_until_idle()
        world.clock.t += 3600
    assert c.scheduled_effect("A-1").state == state
    assert c.scheduled_effect("A-2").state == "pending"
    assert ("A-2", 1) not in calls and ("A-free", 1) in calls and ("B-2", 1) in calls
    getattr(c.admin, f"{action}_effect")("A-1", actor="ops", reason="checked by hand")
    ex.run_until_idle()
    assert c.scheduled_effect("A-2").state == "succeeded"
    assert calls.count(("A-1", 1)) == 1 and ("A-1", 2) not in calls


# -- 4. operator actions and reads --------------------------------------------------------------

# Each flow's effect, and the state it is left in by build_zoo().
ZOO = {
    "P": ("retry", "pending"), "R": ("die", "running"), "D": ("doubt", "in_doubt"), "S": ("ok", "succeeded"),
    "X": ("perm", "dead"), "U": ("weird", "unknown"), "E": ("ok", "expired"), "V": ("ok", "superseded"),
    "C": ("ok", "cancelled"),
}
ALLOWED = {  # spelled out here, not read from src
    "retry": {"dead", "unknown"},  # in_doubt settles itself (reconcile / re-run by key / park)
    "resolve": {"dead", "unknown", "in_doubt", "pending"},
    "cancel": {"pending", "dead", "unknown", "in_doubt"},
}
AFTER = {"retry": "pending", "resolve": "succeeded", "cancel": "cancelled"}


def zoo_key(flow: str) -> str:
    return f"default:{flow}1:{ZOO[flow][0]}"


def build_zoo(w: World) -> Consumer:
    """One effect in each of the nine states, the clock still at T0."""
    effects = EffectRegistry()
    effects.register("retry", Script(RetryLater("busy")))
    effects.register("die", Script(Died()))
    effects.register("doubt", Script(OutcomeUnknown("timed out")), reconcile=Script(Happened()))
    effects.register("ok", Script({"ok": True}))
    effects.register("perm", Script(PermanentFailure("card declined")))
    effects.register("weird", Script({1, 2}))

    def handler(ctx: ApplyContext) -> None:
        flow = ctx.event.flow_id
        if ctx.event.kind == "reserved":
            kw = {"E": {"deadline": T0 - 1}, "V": {"version": 1}}.get(flow, {})
            ctx.schedule(ZOO[flow][0], {"flow": flow}, **kw)

    c = w.consumer((handler,), effects)
    for flow in ZOO:
        w.push(flow, 2 if flow == "V" else 1)
    w.deliver(c)
    c.process_all()
    c.admin.cancel_effect(zoo_key("C"), actor="setup", reason="not wanted")
    ex = w.executor(c, owner="exec-1")
    for _ in range(20):
        try:
            if ex.run_once().work == 0:
                break
        except Died:
            continue
    assert {flow: c.scheduled_effect(zoo_key(flow)).state for flow in ZOO} == {f: s for f, (_, s) in ZOO.items()}
    return c


def test_effect_counts_list_every_state(world: World) -> None:
    c = world.consumer()
    assert c.effect_counts() == {s: 0 for s in (
        "pending", "running", "in_doubt", "succeeded", "dead", "unknown", "expired", "superseded", "cancelled")}
    c = build_zoo(world)
    assert c.effect_counts() == {s: 1 for _, s in ZOO.values()}


def test_effect_outbox_filters_by_state_flow_and_limit(world: World) -> None:
    c = build_zoo(world)
    assert [e.flow_id for e in c.scheduled_effects()] == sorted(ZOO)  # scheduling order (process_all: by flow)
    assert [e.key for e in c.scheduled_effects(state="unknown")] == [zoo_key("U")]
    assert [e.key for e in c.scheduled_effects(state=c.scheduled_effect(zoo_key("X")).state)] == [zoo_key("X")]
    assert [e.key for e in c.scheduled_effects(flow_id="D")] == [zoo_key("D")]
    assert c.scheduled_effects(flow_id="D", state="dead") == []
    assert [e.flow_id for e in c.scheduled_effects(limit=2)] == ["C", "D"]
    with pytest.raises(ValueError):
        c.scheduled_effects(state="sleeping")


@pytest.mark.parametrize("action", ["retry", "resolve", "cancel"])
def test_operator_action_from_every_state(world: World, action: str) -> None:
    c = build_zoo(world)
    act = getattr(c.admin, f"{action}_effect")
    extra = {"result": {"by": "hand"}} if action == "resolve" else {}
    done = []
    for flow, (_, state) in ZOO.items():
        key = zoo_key(flow)
        before = c.scheduled_effect(key)
        if state in ALLOWED[action]:
            world.clock.t += 1.0
            record = act(key, actor="alice", reason=f"{action} {flow}", **extra)
            assert (record.key, record.action, record.actor, record.reason) == (key, action, "alice", f"{action} {flow}")
            assert record.at == world.clock.t  # the consumer's clock
            assert c.scheduled_effect(key).updated_at == world.clock.t
            after = c.scheduled_effect(key)
            assert (after.state, after.lease_owner) == (AFTER[action], None)
            if action == "retry":
                assert (after.due_at, after.failures, after.attempts) == (0.0, 0, 0)  # a fresh budget
            if action == "resolve":
                assert after.result == {"by": "hand"}
            if action == "cancel":
                assert after.reason == f"cancel {flow}"
            done.append(key)
        else:
            with pytest.raises(NotResolvable, match=state):
                act(key, actor="alice", reason="try it", **extra)
            assert c.scheduled_effect(key) == before
    assert len(done) == len(ALLOWED[action])
    mine = [a for a in c.admin.effect_actions() if a.actor == "alice"]
    assert [(a.key, a.action) for a in mine] == [(k, action) for k in done]
    assert [a.key for a in c.admin.effect_actions(done[0])] == [done[0]]


def test_retried_dead_and_unknown_effects_run_again_with_the_same_key(world: World) -> None:
    c = build_zoo(world)
    ex = world.executor(c)
    for flow in ("X", "U"):
        c.admin.retry_effect(zoo_key(flow), actor="bob", reason="fixed upstream")
    ex.run_until_idle()
    dead, unknown = c.scheduled_effect(zoo_key("X")), c.scheduled_effect(zoo_key("U"))
    assert (dead.state, dead.attempts) == ("dead", 1)  # still declined; attempts counted afresh
    assert (unknown.state, unknown.attempts) == ("unknown", 1)
    perm = world_specs(c)["perm"]
    assert [(call.key, call.attempt) for call in perm.calls] == [(zoo_key("X"), 1), (zoo_key("X"), 1)]
    assert [a.action for a in c.admin.effect_actions(zoo_key("X"))] == ["retry"]


def test_retry_of_an_exhausted_effect_starts_a_fresh_budget(world: World) -> None:
    run = Script(RetryLater("busy"))
    c = one_effect(world, run, max_attempts=2)
    ex = world.executor(c)
    for _ in range(3):
        ex.run_until_idle()
        world.clock.t += 10
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).attempts, c.scheduled_effect(KEY).failures) == ("dead", 2, 2)
    c.admin.retry_effect(KEY, actor="bob", reason="the service is back")
    e = c.scheduled_effect(KEY)
    assert (e.state, e.attempts, e.failures, e.due_at, e.reason) == ("pending", 0, 0, 0.0, None)
    ex.run_once()
    e = c.scheduled_effect(KEY)  # backoff starts again from the first failure
    assert (e.state, e.attempts, e.failures, e.due_at) == ("pending", 1, 1, world.clock.t + 0.25)
    world.clock.t += 10
    ex.run_once()
    assert (c.scheduled_effect(KEY).state, c.scheduled_effect(KEY).attempts) == ("dead", 2)
    assert run.attempts == [1, 2, 1, 2]


def world_specs(c: Consumer) -> dict[str, Script]:
    registry = c.effect_registry
    assert registry is not None
    return {name: registry.get(name).run for name in registry}  # type: ignore[union-attr,misc]


def test_resolved_pending_effect_never_runs(world: World) -> None:
    c = build_zoo(world)
    c.admin.resolve_effect(zoo_key("P"), result=None, actor="bob", reason="sent by hand")
    world.clock.t += 3600
    world.executor(c).run_until_idle()
    assert (c.scheduled_effect(zoo_key("P")).state, c.scheduled_effect(zoo_key("P")).result) == ("succeeded", None)
    assert len(world_specs(c)["retry"].calls) == 1


def test_operator_actions_check_their_arguments(world: World) -> None:
    c = build_zoo(world)
    before = c.admin.effect_actions()
    with pytest.raises(UnknownEffect):
        c.admin.retry_effect("no-such-key", actor="bob", reason="why")
    for kw in ({"actor": "", "reason": "why"}, {"actor": "bob", "reason": "  "}, {"actor": None, "reason": "x"}):
        for action in ("retry", "resolve", "cancel"):
            with pytest.raises(ValueError):
                getattr(c.admin, f"{action}_effect")(zoo_key("X"), **kw)
    with pytest.raises(InvalidEnvelope):
        c.admin.resolve_effect(zoo_key("X"), result={"x": float("nan")}, actor="bob", reason="why")
    assert c.admin.effect_actions() == before
    assert c.scheduled_effect(zoo_key("X")).state == "dead"


def test_inspect_shows_effect_counts_and_the_effects_needing_attention(world: World) -> None:
    c = build_zoo(world)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    out = subprocess.run(
        [sys.executable, "-m", "reliable_flow", "inspect", world.producer.location, str(world.consumer_path),
         "--json"], capture_output=True, text=True, env=env, cwd=world.dir, timeout=60, check=False)
    assert out.returncode == 1, out.stderr  # dead, unknown and in doubt effects need attention
    effects = json.loads(out.stdout)["consumer"]["effects"]
    assert effects["counts"] == c.effect_counts() == {s: 1 for _, s in ZOO.values()}
    attention = {a["key"]: a for a in effects["attention"]}
    assert set(attention) == {zoo_key(f) for f in ("P", "R", "D", "X", "U")}
    owner = c.scheduled_effect(zoo_key("R")).lease_owner
    assert owner is not None and owner.startswith("exec-1/")  # the executor's own owner
    assert attention[zoo_key("R")] == {
        "key": zoo_key("R"), "name": "die", "flow_id": "R", "state": "running", "attempts": 1, "due_at": T0 + 30,
        "lease_owner": owner, "last_error": None, "reason": None, "waiting_behind": None,
        "waiting_behind_state": None}
    assert attention[zoo_key("P")] == {
        "key": zoo_key("P"), "name": "retry", "flow_id": "P", "state": "pending", "attempts": 1,
        "due_at": T0 + 0.25, "lease_owner": None, "last_error": "RetryLater: busy", "reason": None,
        "waiting_behind": None, "waiting_behind_state": None}
    assert attention[zoo_key("D")]["last_error"] == "OutcomeUnknown: timed out"
    assert attention[zoo_key("X")]["reason"] == "permanent failure"
    assert [(a["key"], a["action"], a["actor"]) for a in effects["actions"]] == [(zoo_key("C"), "cancel", "setup")]
    plain = subprocess.run(
        [sys.executable, "-m", "reliable_flow", "inspect", world.producer.location, str(world.consumer_path)],
        capture_output=True, text=True, env=env, cwd=world.dir, timeout=60, check=False)
    assert plain.returncode == 1, plain.stderr
    assert "effects needing attention" in plain.stdout
    assert "lease_owner=exec-1" in plain.stdout


def test_worker_runs_effects(world: World) -> None:
    run = Script({"ok": True})
    effects = EffectRegistry()
    effects.register("notify", run)
    c = world.consumer((lambda ctx: ctx.schedule("notify", {"seq": ctx.event.seq}),), effects)
    world.push("A", 3)
    world.push("B", 1)
    ex = world.executor(c)
    worker = Worker(world.producer, [c], executors=[ex], idle_sleep=0)
    stats = worker.run(until_idle=True, handle_signals=False)  # calls end on a later pass than they start
    assert stats.applied == 4
    assert stats.effects == {"succeeded": 4}
    assert c.effect_counts()["succeeded"] == 4
    assert sorted((call.flow_id, call.payload["seq"]) for call in run.calls) == [
        ("A", 1), ("A", 2), ("A", 3), ("B", 1)]
    with pytest.raises(TypeError):
        Worker(world.producer, [c], executors=[object()])  # type: ignore[list-item]


def test_worker_runs_effects_of_healthy_flows_while_one_flow_fails(world: World) -> None:
    run = Script({"ok": True})
    effects = EffectRegistry()
    effects.register("notify", run)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.flow_id == "BAD":
            raise RuntimeError("handler bug")
        ctx.schedule("notify", {})

    c = world.consumer((handler,), effects)
    world.push("A", 1)
    world.push("BAD", 1)
    stats = Worker(world.producer, [c], executors=[world.executor(c)], idle_sleep=0).run(
        max_passes=2, handle_signals=False)
    assert stats.effects == {"succeeded": 1}
    assert stats.errors >= 1 and "handler bug" in stats.last_error
    assert [call.flow_id for call in run.calls] == ["A"]
    assert c.projection("BAD") is None


# -- 5. feedback into a producer ----------------------------------------------------------------

TOOL_TASK = Protocol(
    name="tool_task",
    initial="new",
    transitions={"new": ["requested"], "requested": ["tool_called"], "tool_called": ["tool_result"],
                 "tool_result": ["tool_called", "answered"]},
    schemas={1: by_kind({
        "requested": exact({"question": text()}),
        "tool_called": exact({"tool": text(), "input": text()}),
        "tool_result": exact({"output": text()}),
        "answered": exact({"answer": text()}),
    })},
)
TOOL_KEY = "agent:T2:call_tool"


@pytest.fixture
def agent(engine: str, tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path, TOOL_TASK, engine=engine)
    yield w
    w.close()


def tool_flow(w: World, run: Callable[[EffectCall], Any] | None = None, **register: Any) -> tuple[Consumer, Script]:
    """T: requested -> tool_called, applied; the handler scheduled ``call_tool``."""
    tool = Script(run or (lambda call: {"output": f"{call.payload['tool']}({call.payload['input']}) = 42"}))
    effects = EffectRegistry()
    effects.register("call_tool", tool, feedback=Feedback(kind="tool_result"), **register)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "tool_called":
            ctx.schedule("call_tool", dict(ctx.event.payload))

    c = w.consumer((handler,), effects, name="agent")
    assert w.producer.advance("T1", "T", expected_seq=0, kind="requested",
                              payload={"question": "6 x 7?"}).status == "committed"
    assert w.producer.advance("T2", "T", expected_seq=1, kind="tool_called",
                              payload={"tool": "calc", "input": "6*7"}, meta={"trace": "t-1"}).status == "committed"
    w.deliver(c)
    assert c.drain("T").applied == 2
    return c, tool


def result_events(w: World) -> list[str]:
    return [e.event_id for e in w.producer.outbox("T") if e.event_id.endswith(":result")]


def test_feedback_advances_the_result_as_the_next_step_exactly_once(agent: World) -> None:
    c, tool = tool_flow(agent)
    ex = agent.executor(c, producer=agent.producer)
    assert ex.run_once().work == 1
    assert agent.producer.flow("T") == {"state": "tool_result", "seq": 3, "question": "6 x 7?", "tool": "calc",
                                        "input": "6*7", "output": "calc(6*7) = 42"}
    assert result_events(agent) == [f"{TOOL_KEY}:result"]
    assert agent.producer.event(f"{TOOL_KEY}:result")["meta"] == {"trace": "t-1"}
    assert (c.scheduled_effect(TOOL_KEY).state, c.scheduled_effect(TOOL_KEY).fed) == ("succeeded", True)
    assert ex.stats.fed == 1
    # Re-run: this executor and a new one, with a new producer object on the same file.
    assert ex.run_until_idle() == 0
    again = Producer(agent.producer.location, TOOL_TASK)
    try:
        assert agent.executor(c, owner="exec-2", producer=again).run_until_idle() == 0
    finally:
        again.close()
    assert result_events(agent) == [f"{TOOL_KEY}:result"]
    assert len(tool.calls) == 1
    agent.deliver(c)
    assert c.drain("T").applied == 1
    assert c.projection("T")["state"] == "tool_result"


def test_feedback_owed_is_advanced_by_a_later_executor_with_a_producer(agent: World) -> None:
    c, tool = tool_flow(agent)
    agent.executor(c).run_once()  # no producer: the result waits
    assert (c.scheduled_effect(TOOL_KEY).state, c.scheduled_effect(TOOL_KEY).fed) == ("succeeded", False)
    assert result_events(agent) == []
    feeder = agent.executor(c, owner="feeder", producer=agent.producer)
    assert feeder.run_once().work == 0
    assert c.scheduled_effect(TOOL_KEY).fed is True
    assert result_events(agent) == [f"{TOOL_KEY}:result"]
    assert feeder.stats.fed == 1
    assert len(tool.calls) == 1


def test_feedback_after_reconcile_happened(agent: World) -> None:
    c, _tool = tool_flow(agent, run=Script(OutcomeUnknown("?")), reconcile=Script(Happened({"output": "found"})))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    agent.clock.t += 1
    ex.run_once()
    assert agent.producer.flow("T")["output"] == "found"
    assert result_events(agent) == [f"{TOOL_KEY}:result"]


class LosingProducer(Producer):
    """Commits a fed-back advance, then reports that the commit outcome is unknown (once)."""

    lose = True


@pytest.fixture
def losing_feedback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Feedback into a ``LosingProducer`` loses the answer of its first advance."""
    real = feedback.advance_at_current

    def advance(producer: Producer, *args: Any, **kw: Any) -> Any:
        result = real(producer, *args, **kw)
        if isinstance(producer, LosingProducer) and producer.lose:
            producer.lose = False
            raise CommitOutcomeUnknown("the answer was lost")
        return result

    monkeypatch.setattr(feedback, "advance_at_current", advance)


def test_feedback_interrupted_after_the_advance_is_not_advanced_twice(agent: World, losing_feedback: None) -> None:
    c, tool = tool_flow(agent)
    losing = LosingProducer(agent.producer.location, TOOL_TASK)
    try:
        ex = agent.executor(c, producer=losing)
        with pytest.raises(CommitOutcomeUnknown):
            ex.run_once()
        assert (c.scheduled_effect(TOOL_KEY).state, c.scheduled_effect(TOOL_KEY).fed) == ("succeeded", False)
        assert result_events(agent) == [f"{TOOL_KEY}:result"]
        for _ in range(3):  # the result is owed: every pass tries to feed it again
            assert ex.run_once().work == 0
        assert result_events(agent) == [f"{TOOL_KEY}:result"]
        assert agent.producer.flow("T")["seq"] == 3
        assert len(tool.calls) == 1
    finally:
        losing.close()


@pytest.mark.parametrize("moved_on", [False, True])
def test_owed_feedback_whose_advance_committed_is_settled(agent: World, moved_on: bool,
                                                          losing_feedback: None) -> None:
    c, _ = tool_flow(agent)
    losing = LosingProducer(agent.producer.location, TOOL_TASK)
    try:
        ex = agent.executor(c, producer=losing)
        with pytest.raises(CommitOutcomeUnknown):
            ex.run_once()
        if moved_on:  # the app took the flow further before the executor came back
            assert agent.producer.advance("T4", "T", expected_seq=3, kind="answered",
                                          payload={"answer": "42"}).status == "committed"
        ex.run_once()
        assert result_events(agent) == [f"{TOOL_KEY}:result"]
        assert (c.scheduled_effect(TOOL_KEY).fed, c.scheduled_effect(TOOL_KEY).last_error) == (True, None)
        assert (ex.stats.fed, ex.stats.feedback_errors) == (1, 0)
    finally:
        losing.close()


def test_refused_feedback_is_recorded_and_nothing_advanced(agent: World) -> None:
    c, _ = tool_flow(agent, run=lambda call: {"output": "x", "extra": 1})  # not a valid tool_result payload
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    e = c.scheduled_effect(TOOL_KEY)
    assert (e.state, e.fed) == ("succeeded", False)
    assert e.last_error.startswith("feedback invalid_payload")
    assert ex.stats.feedback_errors == 1
    assert result_events(agent) == []
    assert agent.producer.flow("T")["state"] == "tool_called"


def test_result_resolved_by_an_operator_is_fed_back(agent: World) -> None:
    c, _ = tool_flow(agent, run=Script(OutcomeUnknown("?")))
    ex = agent.executor(c, producer=agent.producer)
    ex.run_once()
    agent.clock.t += 1
    ex.run_once()
    assert c.scheduled_effect(TOOL_KEY).state == "unknown"
    c.admin.resolve_effect(TOOL_KEY, result={"output": "checked by hand"}, actor="ops", reason="looked in the tool log")
    ex.run_once()
    assert result_events(agent) == [f"{TOOL_KEY}:result"]
    assert agent.producer.flow("T")["output"] == "checked by hand"
    assert c.scheduled_effect(TOOL_KEY).fed is True
