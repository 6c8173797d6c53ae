"""Results and failure steps are fed back exactly once across crashes of the
feeding process, in real child processes.

The test prepares the stores (flows ``F<i>`` whose ``tool_called`` step
was applied, each with a pending ``call_tool`` effect: ``tool`` "broken"
fails for good and feeds ``tool_failed``, any other succeeds and feeds
``tool_result``), then runs ``tests/children/feedback_crash_child.py``:

* at each feedback crash point (``os._exit`` with no COMMIT, ROLLBACK or
  ``finally``): ``feedback.after_advance`` (the step committed in the
  producer, the effect not yet marked fed) and ``feedback.after_mark``;
* with SIGKILL after random delays, again and again, while it calls,
  records and feeds many effects (the child waits 20 ms after each step
  committed in the producer, before the mark, so most kills land in that
  window: the campaign fails unless at least one did).

Then an executor in the test's own process runs what is left to the end,
and each flow must hold exactly one fed-back step, the right one (the
result or the failure step, under its derived event id), each effect
marked fed with one ``fed_back`` in its history, nothing refused.  On both
engines (SQLite files, PostgreSQL schemas of the session's server).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from children.feedback_crash_child import CONSUMER, LEASE, TASK, handler, registry
from engine_reads import new_location
from reliable_flow import Consumer, DeliveryPolicy, EffectExecutor, Producer, relay
from reliable_flow.crash import CRASH_EXIT_CODE, ENV_VAR, FEEDBACK_CRASH_POINTS

CHILD = Path(__file__).resolve().parent / "children" / "feedback_crash_child.py"
SRC = Path(reliable_flow.__file__).resolve().parent.parent


def prepare(where: Path, engine: str, tools: list[str]) -> tuple[str, str]:
    """Stores where flow F<i> called ``tools[i]``, applied: one pending effect each."""
    producer_at, consumer_at = new_location(engine, where, "producer"), new_location(engine, where, "consumer")
    with Producer(producer_at, TASK) as p, \
            Consumer(consumer_at, TASK, handlers=[handler], effects=registry(), name=CONSUMER) as c:
        for i, name in enumerate(tools):
            assert p.advance(f"F{i}-1", f"F{i}", expected_seq=0, kind="tool_called",
                             payload={"tool": name}).status == "committed"
        while relay(p, c).status != "idle":
            pass
        c.process_all()
        assert len(c.scheduled_effects()) == len(tools)
    return str(producer_at), str(consumer_at)


def child(producer_at: str, consumer_at: str, crash_at: str | None, *more: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    if crash_at is not None:
        env[ENV_VAR] = crash_at
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.Popen([sys.executable, str(CHILD), producer_at, consumer_at, *more], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_and_check(producer_at: str, consumer_at: str, tools: list[str]) -> dict[str, Any]:
    """Run what is left to the end here, then check each flow holds exactly
    its one step; returns counts for the caller's own checks."""
    with Producer(producer_at, TASK) as p, \
            Consumer(consumer_at, TASK, handlers=[handler], effects=registry(), name=CONSUMER) as c:
        ex = EffectExecutor(c, producer=p, policy=DeliveryPolicy(lease_seconds=LEASE, owner="recovery"))
        ex.run(until_idle=True, idle_sleep=0.05, handle_signals=False)
        for i, name in enumerate(tools):
            key = f"{CONSUMER}:F{i}-1:call_tool"
            effect = c.scheduled_effect(key)
            assert effect is not None
            failed = name == "broken"
            assert (effect.state, effect.fed, effect.last_error if not failed else None) == (
                "dead" if failed else "succeeded", True, None), effect
            fed = [e.event_id for e in p.outbox(f"F{i}") if e.seq > 1]
            assert fed == [f"{key}:{'failure' if failed else 'result'}"], (key, fed)
            flow = p.flow(f"F{i}")
            assert flow is not None and (flow["state"], flow["seq"]) == (
                "tool_failed" if failed else "tool_result", 2)
            history = [h.transition for h in c.effect_history(key)]
            assert history.count("fed_back") == 1 and "feedback_refused" not in history, history
        return {"fed_by_recovery": ex.stats.fed}


def in_the_window(producer_at: str, consumer_at: str) -> int:
    """How many effects a kill left with their step in the producer but not marked fed."""
    with Producer(producer_at, TASK) as p, Consumer(consumer_at, TASK) as c:
        owed = [e for e in c.scheduled_effects() if e.fed is False]
        return sum(1 for e in owed if any(o.seq > 1 for o in p.outbox(e.flow_id)))


@pytest.mark.parametrize("tool", ["broken", "calc"])
@pytest.mark.parametrize("point", FEEDBACK_CRASH_POINTS)
def test_feedback_crash_point_then_recovery_feeds_exactly_once(tmp_path: Path, engine: str, point: str,
                                                               tool: str) -> None:
    producer_at, consumer_at = prepare(tmp_path, engine, [tool])
    crashed = child(producer_at, consumer_at, point)
    out, err = crashed.communicate(timeout=60)
    assert crashed.returncode == CRASH_EXIT_CODE, err
    assert out == ""
    key = f"{CONSUMER}:F0-1:call_tool"
    step = f"{key}:{'failure' if tool == 'broken' else 'result'}"
    with Producer(producer_at, TASK) as p, Consumer(consumer_at, TASK) as c:
        assert [e.event_id for e in p.outbox("F0") if e.seq > 1] == [step]  # committed before the crash
        # after_advance: not marked yet (the recovery re-advances: ``existing``); after_mark: marked.
        assert c.scheduled_effect(key).fed is (point == "feedback.after_mark")
    counts = finish_and_check(producer_at, consumer_at, [tool])
    assert counts["fed_by_recovery"] == (1 if point == "feedback.after_advance" else 0)


def test_child_without_a_crash_point_feeds_every_step(tmp_path: Path, engine: str) -> None:
    tools = ["broken", "calc", "calc", "broken"]
    producer_at, consumer_at = prepare(tmp_path, engine, tools)
    done = child(producer_at, consumer_at, None)
    out, err = done.communicate(timeout=60)
    assert (done.returncode, out.strip()) == (0, "done"), err
    assert finish_and_check(producer_at, consumer_at, tools)["fed_by_recovery"] == 0


def test_sigkilled_feeder_feeds_each_result_and_failure_exactly_once(tmp_path: Path, engine: str) -> None:
    """Kill the feeding executor at random moments until its work is done."""
    seed = int(os.environ.get("RELIABLE_FLOW_SEED") or random.randrange(2 ** 32))
    print(f"seed {seed}")
    rng = random.Random(seed)
    flows = 200 if engine == "sqlite" else 100
    tools = [rng.choice(["broken", "calc"]) for _ in range(flows)]
    producer_at, consumer_at = prepare(tmp_path, engine, tools)
    kills = windows = 0
    for _ in range(40 if engine == "sqlite" else 15):
        proc = child(producer_at, consumer_at, None, "slow")
        time.sleep(rng.uniform(0.3, 1.0))  # past the start-up, somewhere in the work
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        out, err = proc.communicate(timeout=60)
        if proc.returncode == 0:
            assert out.strip() == "done", err
            break
        assert proc.returncode == -signal.SIGKILL, err
        windows += in_the_window(producer_at, consumer_at)
    print(f"{kills} kills, {windows} in the window between the advance and the mark")
    assert kills >= 3 and windows >= 1, "the kills did not land where it matters: nothing was proved"
    finish_and_check(producer_at, consumer_at, tools)
