"""What ``inspect``, ``stuck()``, ``compare`` and ``snapshot()`` say about effects
that wait for a person and about flows a consumer pruned (issue 18, items 2
and 7f), on both engines.

* A dead or unknown effect, an effect in doubt and refused feedback are
  attention items: in the text, in ``--json``'s ``attention``, exit 1.
* An ordered effect waiting behind an earlier unresolved ordered effect of
  its flow says so (``Effect.waiting_behind``), in ``inspect`` (summary and
  ``--flow`` / ``--event``) and in ``stuck()``; no ``due=`` on a dead one.
* A flow whose rows were all applied and then pruned is still the
  consumer's flow: listed from the projections.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
    OutcomeUnknown,
    PermanentFailure,
    Producer,
    relay,
    snapshot,
)
from reliable_flow._core.effects import with_waits
from reliable_flow._tools.compare import compare_files
from reliable_flow._tools.drilldown import event_report, flow_report, format_flow_report
from reliable_flow._tools.inspection import format_report, inspect_files
from reliable_flow.reservation import RESERVATION
from support import Clock, commit, run_cli


class World:
    """A producer and a consumer (``engine``), one clock, flows of reservation steps."""

    def __init__(self, engine: str, tmp_path: Path) -> None:
        self.p_loc = new_location(engine, tmp_path, "producer")
        self.c_loc = new_location(engine, tmp_path, "consumer")
        self.clock = Clock()
        self.producer = Producer(self.p_loc, RESERVATION)
        self._open: list[Any] = [self.producer]

    def consumer(self, handler: Any = None, effects: EffectRegistry | None = None) -> Consumer:
        c = Consumer(self.c_loc, RESERVATION, handlers=() if handler is None else (handler,), effects=effects,
                     clock=self.clock)
        self._open.append(c)
        return c

    def executor(self, c: Consumer, **kw: Any) -> EffectExecutor:
        policy = DeliveryPolicy(lease_seconds=30, clock=self.clock, random=lambda: 0.5, owner="exec")
        return EffectExecutor(c, policy=policy, **kw)

    def deliver(self, c: Consumer, *flows: str, upto: int = 2) -> None:
        for flow in flows:
            commit(self.producer, flow, upto)
        while relay(self.producer, c).status != "idle":
            pass
        c.process_all()

    def inspect(self, *args: str) -> tuple[int, dict[str, Any]]:
        done = run_cli("inspect", self.p_loc, self.c_loc, *args, "--json")
        assert done.returncode in (0, 1), done.stderr
        return done.returncode, json.loads(done.stdout)

    def close(self) -> None:
        for thing in reversed(self._open):
            thing.close()


@pytest.fixture
def world(engine: str, tmp_path: Path) -> Iterator[World]:
    w = World(engine, tmp_path)
    yield w
    w.close()


def ordered(w: World, first: Exception | None, **register: Any) -> Consumer:
    """Flows A and B: ``<flow>-1`` (ordered, on reserved) fails with ``first``
    (A only), ``<flow>-2`` (ordered) and ``<flow>-free`` on confirmed; the
    executor has run everything it could."""
    def step(call: EffectCall) -> Any:
        if call.key == "A-1" and first is not None:
            raise first
        return {"done": call.key}

    effects = EffectRegistry()
    effects.register("step", step, **register)

    def handler(ctx: ApplyContext) -> None:
        flow = ctx.event.flow_id
        if ctx.event.kind == "reserved":
            ctx.schedule("step", {}, key=f"{flow}-1", ordered=True)
        else:
            ctx.schedule("step", {}, key=f"{flow}-2", ordered=True)
            ctx.schedule("step", {}, key=f"{flow}-free")

    c = w.consumer(handler, effects)
    w.deliver(c, "A", "B")
    executor = w.executor(c)
    for _ in range(2):  # the second pass after every backoff: an attempt in doubt is settled or parked
        executor.run_until_idle()
        w.clock.t += 600
    return c


# -- waiting behind an earlier ordered effect ---------------------------------------------------------


def test_an_effect_waiting_behind_a_dead_one_says_so_everywhere(world: World) -> None:
    c = ordered(world, PermanentFailure("card declined"))
    dead, waiting = c.scheduled_effect("A-1"), c.scheduled_effect("A-2")
    assert (dead.state, dead.waiting_behind, dead.waiting_behind_state) == ("dead", None, None)
    assert (waiting.state, waiting.waiting_behind, waiting.waiting_behind_state) == ("pending", "A-1", "dead")
    listed = {e.key: (e.waiting_behind, e.waiting_behind_state) for e in c.scheduled_effects()}
    assert listed == {"A-1": (None, None), "A-2": ("A-1", "dead"), "A-free": (None, None),
                      "B-1": (None, None), "B-2": (None, None), "B-free": (None, None)}
    assert c.scheduled_effects(state="pending")[0].waiting_behind == "A-1"  # its blocker filtered out: still known

    flow = c.stuck("A")  # the inbox is done: the flow waits for its effect, not idle
    assert (flow.wait, flow.since) == ("effect", dead.updated_at)
    assert flow.detail == "effect 'A-2' waits behind 'A-1' (dead)"
    assert c.stuck("B").wait == "idle"

    code, report = world.inspect()
    assert code == 1
    [item] = report["attention"]
    assert (item["kind"], item["flow_id"], item["seq"], item["event_id"], item["effect_key"]) == (
        "effect_dead", "A", 1, "A1", "A-1")
    assert item["reason"] == "permanent failure" and "PermanentFailure: card declined" in item["detail"]
    assert {w["flow_id"]: w["wait"] for w in report["consumer"]["waiting"]} == {"A": "effect"}
    rows = {e["key"]: e for e in report["consumer"]["effects"]["attention"]}
    assert set(rows) == {"A-1", "A-2"}
    assert (rows["A-2"]["waiting_behind"], rows["A-2"]["waiting_behind_state"]) == ("A-1", "dead")

    text = format_report(inspect_files(world.p_loc, world.c_loc))
    [dead_line] = [line for line in text.splitlines() if "key=A-1 " in line]
    [waiting_line] = [line for line in text.splitlines() if "key=A-2 " in line]
    assert "state=dead" in dead_line and "due=" not in dead_line
    assert "state=waiting behind A-1 (dead)" in waiting_line and "due=" not in waiting_line
    assert "effect_dead: flow 'A' seq 1 event A1 effect A-1" in text
    assert "nothing needs attention" not in text

    code, drill = world.inspect("--flow", "A")
    assert code == 1 and [a["effect_key"] for a in drill["attention"]] == ["A-1"]
    assert drill["consumer"]["flow"]["wait"] == "effect"
    assert [(e["key"], e["waiting_behind"]) for e in drill["consumer"]["effects"]] == [
        ("A-1", None), ("A-2", "A-1"), ("A-free", None)]
    flow_text = format_flow_report(flow_report(world.p_loc, world.c_loc, "A"))
    assert "effect A-2 (step): waiting behind A-1 (dead), attempts 0" in flow_text
    assert "due" not in next(line for line in flow_text.splitlines() if "effect A-1 (step)" in line)
    code, by_event = world.inspect("--event", "A1")
    assert code == 1 and [a["kind"] for a in by_event["attention"]] == ["effect_dead"]
    assert event_report(world.p_loc, world.c_loc, "A2")["attention"] == []  # A-2 is not itself an item
    assert world.inspect("--flow", "B")[0] == 0

    c.admin.cancel_effect("A-1", actor="ops", reason="card replaced, charged by hand")
    assert c.scheduled_effect("A-2").waiting_behind is None
    world.executor(c).run_until_idle()
    assert c.scheduled_effect("A-2").state == "succeeded" and c.stuck("A").wait == "idle"
    code, report = world.inspect()
    assert (code, report["attention"], report["consumer"]["waiting"]) == (0, [], [])


def test_waiting_behind_is_the_executors_own_rule(world: World) -> None:
    """For every mix of states, the effects an executor may take up are exactly
    those ``with_waits`` says wait behind nothing."""
    c = ordered(world, None)
    names = {"step"}
    keys = ["A-1", "A-2", "A-free", "B-1", "B-2", "B-free"]
    states = ["pending", "running", "in_doubt", "dead", "unknown", "succeeded", "cancelled"]
    for i, (a1, b1, b2) in enumerate([(s, states[(j + 2) % 7], states[(j + 4) % 7]) for j, s in enumerate(states)]):
        with c.store.write() as unit:
            for key, state in zip(keys, [a1, "pending", "running", b1, b2, "pending"]):
                unit.update_effect(key, {"state": state, "due_at": 0.0}, world.clock())
            due = {e.key for e in unit.due_effects(1e12, names, 100)}
            read = with_waits(unit, unit.effect_list())
        free = {e.key for e in read if e.state in ("pending", "running", "in_doubt") and e.waiting_behind is None}
        assert due == free, (i, a1, b1, b2)
        assert all(e.waiting_behind is None for e in read if not e.ordered)


# -- what needs attention -------------------------------------------------------------------------


class _Unsure:
    def __call__(self, call: EffectCall) -> Any:
        raise OutcomeUnknown("connection reset")


@pytest.mark.parametrize(("register", "state", "kind"), [
    ({}, "unknown", "effect_unknown"),  # neither reconcile nor idempotent: parked
    ({"reconcile": _Unsure()}, "in_doubt", "effect_in_doubt"),  # reconcile cannot tell yet
])
def test_unknown_and_in_doubt_effects_need_attention(world: World, register: dict[str, Any], state: str,
                                                     kind: str) -> None:
    c = ordered(world, OutcomeUnknown("timed out"), **register)
    assert (c.scheduled_effect("A-1").state, c.scheduled_effect("A-2").waiting_behind_state) == (state, state)
    code, report = world.inspect()
    assert code == 1 and [(a["kind"], a["effect_key"]) for a in report["attention"]] == [(kind, "A-1")]
    assert "timed out" in report["attention"][0]["detail"] or state == "in_doubt"
    assert c.stuck("A").detail == f"effect 'A-2' waits behind 'A-1' ({state})"
    text = format_report(inspect_files(world.p_loc, world.c_loc))
    assert f"state=waiting behind A-1 ({state})" in text
    assert f"{kind}: flow 'A' seq 1 event A1 effect A-1" in text


def test_a_running_effect_whose_lease_ended_is_in_doubt(world: World) -> None:
    c = ordered(world, None)
    with c.store.write() as unit:
        unit.update_effect("B-free", {"state": "running", "due_at": world.clock() + 30, "lease_owner": "gone"},
                           world.clock())
    now = world.clock() + 10
    assert inspect_files(world.p_loc, world.c_loc, now=now)["attention"] == []  # the lease still holds
    [item] = inspect_files(world.p_loc, world.c_loc, now=now + 30)["attention"]
    assert (item["kind"], item["effect_key"]) == ("effect_in_doubt", "B-free")


def test_refused_feedback_needs_attention(world: World) -> None:
    effects = EffectRegistry()
    effects.register("look", lambda call: {"ok": True}, feedback=Feedback(kind="cancelled"))  # not a transition

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("look", {})

    c = world.consumer(handler, effects)
    world.deliver(c, "A", upto=1)
    world.executor(c, producer=world.producer).run_until_idle()
    e = c.scheduled_effect("default:A1:look")
    assert (e.state, e.fed) == ("succeeded", False) and e.last_error.startswith("feedback ")
    code, report = world.inspect()
    assert code == 1
    [item] = report["attention"]
    assert (item["kind"], item["effect_key"], item["flow_id"]) == ("feedback_refused", "default:A1:look", "A")
    assert [r["key"] for r in report["consumer"]["effects"]["attention"]] == ["default:A1:look"]
    assert world.inspect("--event", "A1")[1]["attention"][0]["kind"] == "feedback_refused"


def test_a_succeeded_effect_owing_feedback_without_a_refusal_needs_nothing_until_stuck_after(world: World) -> None:
    """Owed and not refused: nothing, until it is owed ``stuck_after`` (then
    no executor with a producer feeds it: ``result_not_fed``, issue 30 item 5)."""
    effects = EffectRegistry()
    effects.register("look", lambda call: {"ok": True}, feedback=Feedback(kind="confirmed"))

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("look", {})

    c = world.consumer(handler, effects)
    world.deliver(c, "A", upto=1)
    world.executor(c).run_until_idle()  # no producer given: the result is owed, nothing was refused
    assert (c.scheduled_effect("default:A1:look").state, c.scheduled_effect("default:A1:look").fed) == ("succeeded", False)
    report = inspect_files(world.p_loc, world.c_loc, stuck_after=300, now=world.clock.t + 299)
    assert (report["attention"], report["consumer"]["effects"]["attention"]) == ([], [])
    report = inspect_files(world.p_loc, world.c_loc, stuck_after=300, now=world.clock.t + 300)
    [item] = report["attention"]
    assert (item["kind"], item["effect_key"], item["flow_id"], item["since"]) == (
        "result_not_fed", "default:A1:look", "A", world.clock.t)
    assert "is an executor with producer= running" in format_report(report)
    assert report["consumer"]["effects"]["attention"] == []  # the effect itself is fine


# -- a pruned flow is still the consumer's flow ----------------------------------------------------------


def test_a_flow_pruned_on_the_consumer_is_still_listed(world: World) -> None:
    c = world.consumer()
    world.deliver(c, "A", upto=3)
    world.deliver(c, "B", upto=1)
    world.clock.t += 100
    pruned = c.admin.prune(10, actor="ops", reason="retention")
    assert pruned.events == 4 and c.flows() == []
    assert c.store.latest.projected_flows() == ["A", "B"]

    done = run_cli("compare", world.p_loc, world.c_loc, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["consumers"][0]["differences"] == []
    assert compare_files(world.p_loc, [world.c_loc])["differences"] == 0

    snap = snapshot(world.p_loc, world.c_loc)["consumer"]
    assert snap["projections"]["A"] == {"state": "released", "last_seq": 3, "held": 0}
    assert set(snap["projections"]) == {"A", "B"} and snap["inbox"] == {"A": [], "B": []}

    code, report = world.inspect()
    assert code == 0 and report["consumer"]["flows"] == 2
    assert "consumer 'default' (reservation): 2 flows" in format_report(inspect_files(world.p_loc, world.c_loc))
