"""The agent and its tools for ``test_agent_round_trip.py`` (issue 30): an
asyncio agent on host A, its tools on host B, results and failures coming
home through the transport with no code of the application's on the way
back.

Not collected by pytest.  Three ways in:

* ``AGENT``: the protocol of a task flow, ``new -> called -> result |
  failed``, ``result -> called`` (a task makes one or two tool calls in
  turn); the stores record it as ``children.agent_app:AGENT``;
* ``HANDLERS`` and ``EFFECTS``: what ``reliable-flow bridge`` / ``execute``
  load on host B.  A ``called`` step schedules its tool; every tool is
  registered with ``Feedback("result", on_failure="failed")``, so the
  library feeds its result (or its failure step) into the agent's producer,
  served on host A by ``run --serve-as agent``.  The tools call the fake
  provider (``fake_service.py``, on the Unix socket named by
  ``$RF_AGENT_PROVIDER``) with the effect's key: ``search`` (a plain
  function) and ``fetch`` (``async def``) answer 503 (``RetryLater``), 429
  with a Retry-After (``RetryLater(after=)``), late (a timeout: in doubt,
  settled by ``reconcile`` asking the provider) or a receipt; ``broken``
  always answers 500, raised as ``RetryLater`` until its
  :data:`BROKEN_ATTEMPTS` are used up: ``dead``, and its failure step comes
  home;
* ``python -m children.agent_app agent LOCATION SEED TASKS BEGAN PACE LOG``:
  the agent (an :class:`~reliable_flow.aio.AsyncProducer`).  Task ``i``
  (flow ``T0000`` ...) starts ``i * PACE`` seconds after the wall-clock time
  ``BEGAN`` (so an agent started again after a SIGKILL keeps to the
  schedule); at most :data:`IN_FLIGHT` tasks run at once.  A task advances a
  ``called`` step (event id ``<flow>:call<n>``), then awaits
  ``producer.wait(flow, after_seq=seq)`` until its result or failure step
  is in, and goes on with its next call or ends.  It keeps no state of its
  own: a task is carried on from the producer's view of its flow.  Every
  advance, every answer of ``wait`` and every end is appended to LOG (one
  JSON line each, flushed); the agent prints ``agent: all final N`` and
  exits 0 once every task is final.

Only ``reliable_flow`` and the other children are imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any, TextIO

from reliable_flow import EffectCall, EffectRegistry, Feedback, Happened, NotHappened, RetryLater
from reliable_flow._handlers import ApplyContext
from reliable_flow.protocol import Protocol, by_kind, exact, integer, optional, text

try:  # as the bridge imports it (tests/ on PYTHONPATH) and as a sibling script
    from children import effect_kill_worker as _provider
except ImportError:  # pragma: no cover
    import effect_kill_worker as _provider  # type: ignore[no-redef]

AGENT = Protocol(
    name="agent_task", initial="new",
    transitions={"new": ["called"], "called": ["result", "failed"], "result": ["called"]},
    schemas={1: by_kind({
        "called": exact({"tool": text(choices=("search", "fetch", "broken")), "q": text(), "round": integer(1, 9)}),
        "result": exact({"receipt": text()}),
        "failed": exact({"key": text(), "effect_state": text(), "reason": optional(text(max_len=20_000)),
                         "error": optional(text(max_len=20_000))}),
    })},
)
TOOLS = ("search", "fetch", "broken")
CONSUMER = "tools"  # the consumer's name: effect keys are tools:<event id>:<tool>
PROVIDER_ENV = "RF_AGENT_PROVIDER"
CALL_TIMEOUT = 0.4  # a perform's deadline at the provider
STATUS_TIMEOUT = 0.4  # a reconcile's
#: The executors' effect lease: longer than a call's and a reconcile's timeout.
EFFECT_LEASE = 3.0
MAX_ATTEMPTS = 1_000_000  # 503s, 429s and kills must never exhaust a working tool
BROKEN_ATTEMPTS = 3  # a tool that always answers 500 is dead after this many
IN_FLIGHT = 40  # tasks of the agent at once (each awaiting one wait); above the tools' concurrency 32
WAIT_TIMEOUT = 20.0  # one producer.wait; on None the task reads its flow and waits again


def plan(seed: int, tasks: int) -> dict[str, list[str]]:
    """Flow id -> its tool calls in order (one or two; none after ``broken``),
    the same for every caller."""
    rng = random.Random(f"{seed}:agent-plan")
    out: dict[str, list[str]] = {}
    for i in range(tasks):
        calls: list[str] = []
        for _ in range(rng.choice((1, 2))):
            calls.append(rng.choices(TOOLS, weights=(45, 45, 10))[0])
            if calls[-1] == "broken":
                break
        out[f"T{i:04d}"] = calls
    return out


def final_of(calls: list[str]) -> tuple[str, int]:
    """The state and seq a task's flow ends at."""
    return ("failed" if calls[-1] == "broken" else "result"), 2 * len(calls)


# -- host B: the tools ---------------------------------------------------------------------


def schedule_tool(ctx: ApplyContext) -> None:
    """The tools' apply handler: a ``called`` step schedules its tool (key
    ``tools:<event id>:<tool>``); the steps that came home schedule nothing."""
    if ctx.event.kind == "called":
        payload = ctx.event.payload
        ctx.schedule(payload["tool"], {"q": payload["q"], "round": payload["round"]})


HANDLERS = [schedule_tool]


def _answered(answer: dict[str, Any]) -> Any:
    error = answer.get("error")
    if error == "throttled":  # 429 Too Many Requests, Retry-After: S
        raise RetryLater(f"429 Too Many Requests (Retry-After {answer['after']})", after=float(answer["after"]))
    if error == "broken":
        raise RetryLater("500 Internal Server Error")
    if error is not None:  # "retry" (503) or "deadline" (read after the caller gave up): nothing done
        raise RetryLater(f"503 Service Unavailable ({error})")
    return answer["result"]


def _effects() -> EffectRegistry:
    socket_path = os.environ.get(PROVIDER_ENV)
    if not socket_path:
        raise RuntimeError(f"${PROVIDER_ENV} must name the fake provider's socket")
    owner = f"tools-{os.getpid()}"

    def perform(call: EffectCall, **more: Any) -> dict[str, Any]:
        return {"op": "perform", "key": call.key, "payload": call.payload, "attempt": call.attempt,
                "owner": owner, "deadline": time.monotonic() + CALL_TIMEOUT, **more}

    def status(call: EffectCall) -> dict[str, Any]:
        return {"op": "status", "key": call.key, "attempt": call.attempt, "owner": owner}

    def search(call: EffectCall) -> Any:
        return _answered(_provider._exchange(socket_path, perform(call), CALL_TIMEOUT))

    async def fetch(call: EffectCall) -> Any:
        return _answered(await _provider._aexchange(socket_path, perform(call), CALL_TIMEOUT))

    def broken(call: EffectCall) -> Any:
        return _answered(_provider._exchange(socket_path, perform(call, broken=True), CALL_TIMEOUT))

    def was_performed(call: EffectCall) -> Happened | NotHappened:
        answer = _provider._exchange(socket_path, status(call), STATUS_TIMEOUT)
        return Happened(answer["result"]) if answer["performed"] else NotHappened()

    async def was_performed_async(call: EffectCall) -> Happened | NotHappened:
        answer = await _provider._aexchange(socket_path, status(call), STATUS_TIMEOUT)
        return Happened(answer["result"]) if answer["performed"] else NotHappened()

    home = Feedback("result", on_failure="failed")
    effects = EffectRegistry()
    effects.register("search", search, reconcile=was_performed, max_attempts=MAX_ATTEMPTS, feedback=home)
    effects.register("fetch", fetch, reconcile=was_performed_async, max_attempts=MAX_ATTEMPTS, feedback=home)
    effects.register("broken", broken, reconcile=was_performed, max_attempts=BROKEN_ATTEMPTS, feedback=home)
    return effects


def __getattr__(name: str) -> Any:
    """``EFFECTS``, built on first use (the test imports this module for its plan)."""
    if name == "EFFECTS":
        effects = globals()["EFFECTS"] = _effects()
        return effects
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- host A: the agent ---------------------------------------------------------------------


async def agent(location: str, seed: int, tasks: int, began: float, pace: float, log: TextIO) -> int:
    from reliable_flow.aio import AsyncProducer

    wanted = plan(seed, tasks)
    gate = asyncio.Semaphore(IN_FLIGHT)

    def record(**entry: Any) -> None:
        log.write(json.dumps({"pid": os.getpid(), "at": round(time.time() - began, 3), **entry}) + "\n")
        log.flush()

    async def task(index: int, flow: str, calls: list[str], producer: AsyncProducer) -> None:
        await asyncio.sleep(max(0.0, began + index * pace - time.time()))
        async with gate:
            while True:
                state = await producer.flow(flow)
                seq, kind = (int(state["seq"]), state["state"]) if state else (0, "new")
                done = int(state.get("round", 0)) if state else 0
                if kind == "failed" or (kind == "result" and done == len(calls)):
                    record(flow=flow, final=kind, seq=seq)
                    return
                if kind in ("new", "result"):
                    n = done + 1
                    result = await producer.advance(
                        f"{flow}:call{n}", flow, expected_seq=seq, kind="called",
                        payload={"tool": calls[n - 1], "q": f"{flow}/{n}", "round": n})
                    if result.status.value not in ("committed", "existing"):
                        raise AssertionError(f"advance {flow}:call{n} at {seq}: {result}")
                    record(flow=flow, advanced=f"{flow}:call{n}", status=result.status.value, seq=result.seq)
                    continue
                began_wait = time.monotonic()
                got = await producer.wait(flow, after_seq=seq, timeout=WAIT_TIMEOUT)
                record(flow=flow, waited=round(time.monotonic() - began_wait, 3), after_seq=seq,
                       saw=None if got is None else got["state"], seq=None if got is None else got["seq"])

    async with AsyncProducer(location, AGENT) as producer:
        await asyncio.gather(*(task(i, flow, calls, producer) for i, (flow, calls) in enumerate(wanted.items())))
    print(f"agent: all final {len(wanted)}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "agent":
        with open(argv[6], "a", encoding="utf-8") as log:  # what the agent saw, one JSON line each
            return asyncio.run(agent(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), float(argv[5]), log))
    raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
