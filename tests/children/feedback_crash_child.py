"""An effect executor with a producer, for ``test_effect_failure_crash.py``:
it feeds results and failure steps back, and dies at a feedback crash point
(``RELIABLE_FLOW_CRASH_AT``) or by the test's SIGKILL.

Not collected by pytest.  Run as a script::

    python tests/children/feedback_crash_child.py PRODUCER CONSUMER [slow]

PRODUCER and CONSUMER are store locations (SQLite paths or
``postgresql://...#schema`` strings) the test prepared: flows whose
``tool_called`` step was applied, each with a pending ``call_tool`` effect.
The effect fails for good (``PermanentFailure``) when its ``tool`` is
``"broken"``, else returns ``{"output": ...}`` (``idempotent=True``: a call
left in doubt is re-run by key); its ``Feedback`` feeds
``tool_result`` or, on failure, ``tool_failed``.  The executor runs until
nothing is due, then the child prints ``done`` and exits 0.  ``slow``:
each step committed in the producer is followed by 20 ms before the effect
is marked fed (:func:`widen_the_window`).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    PermanentFailure,
    Producer,
)
from reliable_flow._effects import feedback
from reliable_flow.protocol import Protocol, by_kind, exact, optional, text

TASK = Protocol(
    name="tool_task",
    initial="new",
    transitions={"new": ["tool_called"], "tool_called": ["tool_result", "tool_failed"]},
    schemas={1: by_kind({
        "tool_called": exact({"tool": text()}),
        "tool_result": exact({"output": text()}),
        "tool_failed": exact({"key": text(), "effect_state": text(), "reason": optional(text()),
                              "error": optional(text())}),
    })},
)
NAME = "call_tool"
CONSUMER = "agent"
LEASE = 2.0


def call_tool(call: EffectCall) -> dict[str, str]:
    time.sleep(0.002)  # a little work, so a kill may land during a call as well as around one
    if call.payload["tool"] == "broken":
        raise PermanentFailure("the tool always answers 500")
    return {"output": f"{call.payload['tool']} done"}


def registry() -> EffectRegistry:
    effects = EffectRegistry()
    # idempotent: a call a kill left in doubt is re-run by key (the result is
    # the same), so every effect ends succeeded or dead and owes one step.
    effects.register(NAME, call_tool, feedback=Feedback("tool_result", on_failure="tool_failed"),
                     idempotent=True, max_attempts=1000)
    return effects


#: The registry, by name, for ``reliable-flow effect resolve|amend --effects``.
EFFECTS = registry()


def handler(ctx: ApplyContext) -> None:
    if ctx.event.kind == "tool_called":
        ctx.schedule(NAME, dict(ctx.event.payload))


def widen_the_window() -> None:
    """Wait 20 ms after each step committed in the producer, before the
    effect is marked fed: most SIGKILLs then land in that window, the one
    exactly-once depends on (a real commit, a real kill; only the timing is
    stretched)."""
    real = feedback.advance_at_current

    def advance(*args: Any, **kw: Any) -> Any:
        answer = real(*args, **kw)
        time.sleep(0.02)
        return answer

    feedback.advance_at_current = advance  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    producer_at, consumer_at = argv[0], argv[1]
    if len(argv) > 2 and argv[2] == "slow":
        widen_the_window()
    policy = DeliveryPolicy(lease_seconds=LEASE, owner="child")
    with Producer(producer_at, TASK) as producer, \
            Consumer(consumer_at, TASK, handlers=[handler], effects=registry(), name=CONSUMER) as consumer:
        EffectExecutor(consumer, policy=policy, producer=producer).run(until_idle=True, idle_sleep=0.01,
                                                                        handle_signals=False)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
