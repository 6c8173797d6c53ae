"""An asyncio agent whose tool calls go through the effect outbox, with ``reliable_flow.aio``.

A conversation is a flow of the protocol ``CONVERSATION``::

    new -> asked -> answered
             |
             +--> tool_called -> tool_result -> answered

The agent is asyncio code.  For each conversation it commits the user's
question (``await producer.advance``) into its producer file (``agent.db``),
then asks a model -- here ``fake_model``, an ``async def`` that answers the
same way every time -- what to do next.  The model either answers at once
or decides a tool call, which the agent commits as the step
``tool_called``.  The agent does not call the tool itself: the consumer
``tools`` (``tools.db``) applies the step, and its apply handler schedules
the tool call as an effect (``ctx.schedule``) in the apply transaction.  An
``AsyncEffectExecutor`` awaits the tool -- ``get_weather``, an ``async
def`` -- on the agent's own event loop, and ``Feedback`` advances its
result into the conversation's flow as the step ``tool_result``.  The
agent reads that step from its flow, asks the model again, and commits the
answer.

An ``AsyncWorker`` relays, applies and runs the effects in the background
of the same loop; the three conversations run as concurrent tasks.  Each
conversation's story is printed once it is done, so the output is the same
on every run.

The agent keeps no memory of its own, only the flows: run it again on the
same directory (``python examples/async_agent.py DIR``) and every question
is answered ``existing``, every conversation is found answered, and no tool
is called again.

Run ``python examples/async_agent.py [DIR]`` (a temporary directory by default).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from reliable_flow import ApplyContext, EffectCall, EffectRegistry, Feedback
from reliable_flow.aio import AsyncConsumer, AsyncEffectExecutor, AsyncProducer, AsyncWorker
from reliable_flow.protocol import Protocol, by_kind, exact, integer, text

__all__ = ["CONVERSATION", "EFFECTS", "HANDLERS", "main"]

# -- the protocol: a conversation's steps ------------------------------------------------------

TOOLS = ("get_weather",)

CONVERSATION = Protocol(
    name="conversation",
    initial="new",
    transitions={
        "new": ["asked"],
        "asked": ["tool_called", "answered"],
        "tool_called": ["tool_result"],
        "tool_result": ["answered"],
    },
    schemas={1: by_kind({
        "asked": exact({"question": text(1, 2000)}),
        "tool_called": exact({"tool": text(choices=TOOLS), "city": text(1, 100)}),
        "tool_result": exact({"tool": text(choices=TOOLS), "city": text(1, 100), "temp_c": integer(-90, 60),
                              "sky": text(1, 40)}),
        "answered": exact({"answer": text(1, 4000)}),
    })},
    project=lambda state, data: {"tool": data.get("tool"), "answered": state == "answered"},
)

# -- the model: an async call that decides the next step -----------------------------------------


async def fake_model(flow: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What a model would decide from the conversation so far: ``(kind, payload)``.

    Deterministic: a question about the weather needs the tool, once; its
    result is turned into an answer; anything else is answered at once."""
    await asyncio.sleep(0.01)  # the model "thinks"; the loop serves the other conversations meanwhile
    if flow["state"] == "tool_result":
        return "answered", {"answer": f"It is {flow['temp_c']} C and {flow['sky']} in {flow['city']}."}
    question = flow["question"]
    if "weather in " in question:
        city = question.split("weather in ", 1)[1].rstrip("?!. ")
        return "tool_called", {"tool": "get_weather", "city": city}
    return "answered", {"answer": "Hello! Ask me about the weather somewhere."}


# -- the tool: an async call to the outside world, through the effect outbox ---------------------


class WeatherService:
    """A fake weather API that deduplicates by idempotency key (so the tool is
    registered ``idempotent=True``) and counts what it received."""

    def __init__(self) -> None:
        self.forecast = {"Paris": (18, "cloudy"), "Oslo": (4, "snowing")}
        self.requests: Counter[str] = Counter()  # key -> requests received

    async def current(self, key: str, city: str) -> dict[str, Any]:
        self.requests[key] += 1
        await asyncio.sleep(0.05)  # network time: the executor awaits it on the agent's loop
        temp_c, sky = self.forecast.get(city, (20, "clear"))
        return {"city": city, "temp_c": temp_c, "sky": sky}


WEATHER = WeatherService()


async def get_weather(call: EffectCall) -> dict[str, Any]:
    """The effect function: an ``async def``, awaited on the application's loop."""
    return await WEATHER.current(call.key, call.payload["city"])


EFFECTS = EffectRegistry()
EFFECTS.register(
    "get_weather", get_weather, idempotent=True, timeout=30,
    feedback=Feedback(kind="tool_result", payload=lambda result: {"tool": "get_weather", **result}),
)

# -- the consumer: what it does for each applied step --------------------------------------------


def run_tools(ctx: ApplyContext) -> None:
    """Runs on the consumer's thread, inside the apply transaction: the tool
    call is scheduled exactly when the step is applied, once."""
    if ctx.event.kind == "tool_called":
        ctx.schedule(ctx.event.payload["tool"], {"city": ctx.event.payload["city"]})


HANDLERS = [run_tools]

# -- the agent -------------------------------------------------------------------------------------

QUESTIONS = {
    "C1": "What is the weather in Paris?",
    "C2": "Hello there!",
    "C3": "And the weather in Oslo?",
}


async def wait_for_step(producer: AsyncProducer, flow_id: str, seq: int, timeout: float = 30.0) -> dict[str, Any]:
    """The flow once it is past ``seq``: the tool's result is fed back into it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        flow = await producer.flow(flow_id)
        if flow is not None and flow["seq"] > seq:
            return flow
        if loop.time() > deadline:
            raise TimeoutError(f"no step after seq {seq} in flow {flow_id}")
        await asyncio.sleep(0.01)


async def converse(producer: AsyncProducer, flow_id: str, question: str) -> list[str]:
    """One conversation, from the question to the answer; its story, as lines."""
    story = [f"conversation {flow_id}: {question!r}"]

    def say(who: str, line: str) -> None:
        story.append(f"  {who:<6} {line}")

    asked = await producer.advance(f"{flow_id}-1", flow_id, expected_seq=0, kind="asked",
                                   payload={"question": question})
    say("agent", f"advance {flow_id}-1 asked       -> {asked.status}")
    while True:
        flow = await producer.flow(flow_id)
        assert flow is not None
        if flow["state"] == "answered":
            answer = (await producer.outbox(flow_id))[-1].event_id
            say("agent", f"already answered at seq {flow['seq']} ({answer}): nothing to do")
            return story
        if flow["state"] == "tool_called":  # a run before this one stopped while the tool ran
            say("agent", f"waiting for the result of the tool call at seq {flow['seq']}")
            flow = await wait_for_step(producer, flow_id, flow["seq"])
            continue
        kind, payload = await fake_model(flow)
        if kind == "tool_called":
            say("model", f"decides: call {payload['tool']}(city={payload['city']!r})")
        else:
            say("model", f"answers: {payload['answer']!r}")
        event_id = f"{flow_id}-{flow['seq'] + 1}"
        result = await producer.advance(event_id, flow_id, expected_seq=flow["seq"], kind=kind, payload=payload)
        say("agent", f"advance {event_id} {kind:<11} -> {result.status}")
        if kind == "answered":
            return story
        # The tool runs elsewhere: the consumer schedules it, the executor calls it, and its
        # result comes back into this flow as the next step.
        flow = await wait_for_step(producer, flow_id, result.seq)
        fed = (await producer.outbox(flow_id))[-1]
        say("tool", f"result fed back as {fed.event_id} (seq {fed.seq}): "
                    f"{flow['temp_c']} C, {flow['sky']}")


async def run(where: Path) -> None:
    async with (
        AsyncProducer(where / "agent.db", CONVERSATION) as producer,
        AsyncConsumer(where / "tools.db", CONVERSATION, name="tools", handlers=HANDLERS,
                      effects=EFFECTS) as consumer,
    ):
        executor = AsyncEffectExecutor(consumer, EFFECTS, producer=producer, concurrency=4)
        worker = AsyncWorker(producer, [consumer], executors=[executor], idle_sleep=0.01)
        delivering = asyncio.create_task(worker.run())
        try:
            stories = await asyncio.gather(*(converse(producer, cid, q) for cid, q in QUESTIONS.items()))
        finally:
            worker.stop()  # the steps in progress finish, then run() returns
            await delivering
        # Deliver the answers too, so the consumer's file holds every step.
        await AsyncWorker(producer, [consumer], executors=[executor]).run(until_idle=True)
        for story in stories:
            print("\n".join(story))
        print("what the weather service saw:")
        for key, n in sorted(WEATHER.requests.items()):
            print(f"  {key}: {n} request")
        if not WEATHER.requests:
            print("  nothing: no tool was called in this run")
        print("what the files say:")
        for cid in QUESTIONS:
            flow = await producer.flow(cid) or {}
            print(f"  agent.db {cid}: state {flow.get('state')}, seq {flow.get('seq')}; "
                  f"tools.db projection: {await consumer.projection(cid)}")
        counts = {state: n for state, n in (await consumer.effect_counts()).items() if n}
        print(f"  tools.db effects: {counts}; results fed back by this run: {executor.stats.fed}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="async_agent_") as tmp:
        where = Path(args[0] if args else tmp)
        where.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
