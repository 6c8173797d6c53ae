"""The asyncio face of the executor and the worker (issue 21, items 4-5):
``AsyncEffectExecutor`` awaits ``async def`` effect functions on the
application's own loop and runs plain ones on threads, with the sync
executor's concurrency, heartbeats, timeouts, rate limits and feedback;
``AsyncWorker`` relays, applies and executes at once on one loop, keeps it
responsive, stops on ``stop()`` or a signal after recording the calls in
flight; ``reliable-flow run --async`` is that worker; and a SIGKILLed async
worker process loses nothing and applies nothing twice (the invariants of
``test_worker.py``'s kill test).

Behaviour runs on both engines (the ``engine`` / ``at`` fixtures).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
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
from reliable_flow.aio import AsyncConsumer, AsyncEffectExecutor, AsyncProducer, AsyncWorker
from reliable_flow.protocol import Protocol, by_kind, exact, text
from reliable_flow.records import PassResult
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, Clock, child_process, chosen_seed, commit, run_script
from test_worker import (
    PLANTED,
    RELEASED,
    At,
    Invariants,
    check_files_agree,
    cli,
    stopped_stats,
    stores,
    wait_for_line,
    worker_env,
)

AIO_CHILD = CHILDREN / "aio_worker_child.py"
CHILD_TIMEOUT = 60
T0 = 1000.0
LEASE = 30.0
ASK = Protocol(
    name="ask", initial="new",
    transitions={"new": ["asked"], "asked": ["answered"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "answered": exact({"a": text()})})},
)


def handler(ctx: ApplyContext) -> None:
    if ctx.event.kind == "asked":
        ctx.schedule("call", {"q": ctx.event.payload["q"]}, key=f"k-{ctx.event.flow_id}")


class World:
    """A producer and a consumer of ``ask`` on one engine; applying an asked
    flow schedules one ``call`` effect.  Set up with the sync face; the
    test then opens the async objects inside its loop."""

    def __init__(self, engine: str, tmp_path: Path, effects: EffectRegistry) -> None:
        self.clock = Clock(T0)
        self.producer_location = new_location(engine, tmp_path, "producer")
        self.location = new_location(engine, tmp_path, "consumer")
        self.effects = effects

    def ask(self, count: int) -> list[str]:
        flows = [f"F{i}" for i in range(count)]
        with Producer(self.producer_location, ASK) as producer, self.sync_consumer() as consumer:
            for flow in flows:
                assert producer.advance(f"{flow}-1", flow, expected_seq=0, kind="asked",
                                        payload={"q": flow}).status == "committed"
                assert relay(producer, consumer, register=True).status == "accepted"
                assert consumer.apply_next(flow).status == "applied"
        return [f"k-{flow}" for flow in flows]

    def sync_consumer(self) -> Consumer:
        return Consumer(self.location, ASK, name="tools", handlers=[handler], effects=self.effects, clock=self.clock)

    def consumer(self) -> AsyncConsumer:
        return AsyncConsumer(self.location, ASK, name="tools", handlers=[handler], effects=self.effects,
                             clock=self.clock)

    def producer(self) -> AsyncProducer:
        return AsyncProducer(self.producer_location, ASK)

    def policy(self, owner: str = "ex") -> DeliveryPolicy:
        return DeliveryPolicy(lease_seconds=LEASE, clock=self.clock, random=lambda: 0.5, owner=owner)

    def states(self, keys: list[str]) -> list[str]:
        with self.sync_consumer() as c:
            return [str(c.scheduled_effect(k).state) for k in keys]  # type: ignore[union-attr]

    def effect(self, key: str) -> Any:
        with self.sync_consumer() as c:
            return c.scheduled_effect(key)


@pytest.fixture
def make(engine: str, tmp_path: Path) -> Callable[..., World]:
    def build(run: Callable[[EffectCall], Any], **options: Any) -> World:
        effects = EffectRegistry()
        effects.register("call", run, **options)
        return World(engine, tmp_path, effects)

    return build


# -- AsyncEffectExecutor ----------------------------------------------------------------------


def test_async_calls_run_on_the_applications_loop_together(make: Callable[..., World]) -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    together = {"now": 0, "most": 0}

    async def call(c: EffectCall) -> str:
        loops.append(asyncio.get_running_loop())
        together["now"] += 1
        together["most"] = max(together["most"], together["now"])
        await asyncio.sleep(0.2)
        together["now"] -= 1
        return c.payload["q"]

    world = make(call)
    keys = world.ask(6)

    async def main() -> None:
        consumer = world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=4)
        assert (await executor.run_once(limit=4)).work == 4
        assert set(loops) == {asyncio.get_running_loop()}  # the test's own loop
        assert together["most"] == 4
        assert (await executor.run_once()).work == 2
        assert executor.stats.outcomes == {"succeeded": 6} and executor.in_flight == 0
        await executor.close()
        await consumer.close()

    asyncio.run(main())
    assert world.states(keys) == ["succeeded"] * 6


def test_plain_calls_run_on_threads_and_never_block_the_loop(make: Callable[..., World]) -> None:
    threads: set[str] = set()
    gate = threading.Barrier(3, timeout=20)

    def call(c: EffectCall) -> str:
        threads.add(threading.current_thread().name)
        gate.wait()  # three calls at once, or this times out
        time.sleep(0.1)
        return "ok"

    world = make(call)
    keys = world.ask(3)

    async def main() -> None:
        consumer = world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=3)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick = asyncio.create_task(ticker())
        assert (await executor.run_once()).work == 3
        tick.cancel()
        assert ticks >= 20  # the loop ran on while three plain calls slept on threads
        assert threading.main_thread().name not in threads and len(threads) == 3
        await consumer.close()

    asyncio.run(main())
    assert world.states(keys) == ["succeeded"] * 3


def test_a_heartbeat_from_an_async_call_renews_the_lease(make: Callable[..., World]) -> None:
    due: list[float] = []

    async def call(c: EffectCall) -> None:
        world.clock.t += 20
        await c.aheartbeat()  # waits until the executor wrote the renewal
        with world.sync_consumer() as reader:
            due.append(reader.scheduled_effect(c.key).due_at)  # type: ignore[union-attr]
        world.clock.t += 5
        c.heartbeat()  # on the loop: only asks; never blocks it

    world = make(call)
    world.ask(1)

    async def main() -> None:
        consumer = world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=2)
        began = time.monotonic()
        await executor.run(until_idle=True, handle_signals=False)
        assert time.monotonic() - began < 3  # the sync heartbeat did not hold the loop for HEARTBEAT_WAIT
        assert executor.stats.heartbeats >= 1 and executor.stats.outcomes == {"succeeded": 1}
        await consumer.close()

    asyncio.run(main())
    assert due == [T0 + 20 + LEASE]


def test_a_call_past_its_timeout_is_recorded_in_doubt_then_reconciled(make: Callable[..., World]) -> None:
    gates: list[asyncio.Event] = []

    async def call(c: EffectCall) -> str:
        world.clock.t += 6  # past the 5 s timeout
        await gates[0].wait()
        return "late"

    async def reconcile(c: EffectCall) -> Happened:
        return Happened("reconciled")

    world = make(call, reconcile=reconcile, timeout=5)
    [key] = world.ask(1)

    async def main() -> None:
        gates.append(asyncio.Event())
        consumer = world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=2)
        assert (await executor.run_once()).work == 1  # returns: past its timeout, still running
        effect = await consumer.scheduled_effect(key)
        assert effect is not None and effect.state == "in_doubt" and "timed out after 5 s" in effect.last_error
        assert executor.stats.outcomes == {"timed_out": 1} and executor.in_flight == 1
        gates[0].set()
        while executor.in_flight:  # the late answer is discarded and the doubt let go
            await executor.pump()
            await asyncio.sleep(0.01)
        assert executor.stats.outcomes["late_outcome_discarded"] == 1
        await executor.run_once()
        await executor.finish()  # the async reconcile settled it (the pumps above may have started it)
        assert executor.stats.outcomes["reconciled_succeeded"] == 1
        effect = await consumer.scheduled_effect(key)
        assert effect is not None and (effect.state, effect.result) == ("succeeded", "reconciled")
        await consumer.close()

    asyncio.run(main())


def test_a_rate_limit_puts_effects_off(make: Callable[..., World]) -> None:
    calls: list[float] = []

    async def call(c: EffectCall) -> None:
        calls.append(world.clock.t)

    world = make(call, rate_limit=(2, 10))  # starts 5 s apart
    keys = world.ask(5)

    async def main() -> None:
        consumer = world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=4)
        assert (await executor.run_once()).work == 1 and calls == [T0]
        assert executor.stats.rate_limited == 4  # one wait each, one row each
        for t in (T0 + 5, T0 + 12.5, T0 + 17.5, T0 + 25):  # never a third in 12.5 s
            world.clock.t = t
            assert (await executor.run_once()).work == 1
        assert calls == [T0, T0 + 5, T0 + 12.5, T0 + 17.5, T0 + 25]
        assert executor.stats.rate_limited == 4
        metrics = await executor.metrics()
        assert metrics.started == {"call": 5} and metrics.in_flight == {}
        await consumer.close()

    asyncio.run(main())
    assert world.states(keys) == ["succeeded"] * 5


def test_run_until_idle_takes_up_what_is_due_and_never_waits(make: Callable[..., World]) -> None:
    """As ``EffectExecutor.run_until_idle``: run_once until nothing is due now;
    an effect backing off is left for later, not waited for."""
    async def call(c: EffectCall) -> str:
        if c.payload["q"] == "F0":
            raise RetryLater("not yet")
        return c.payload["q"]

    world = make(call)
    keys = world.ask(5)

    async def main() -> None:
        consumer = world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=2)
        assert await executor.run_until_idle() == 5
        assert executor.stats.outcomes == {"succeeded": 4, "pending": 1}
        assert await executor.run_until_idle() == 0  # F0 backs off: nothing due now
        world.clock.t += 3600
        assert await executor.run_until_idle(max_passes=1) == 1
        with pytest.raises(ValueError, match="max_passes"):
            await executor.run_until_idle(max_passes=0)
        await consumer.close()

    asyncio.run(main())
    assert world.states(keys)[1:] == ["succeeded"] * 4


def test_feedback_advances_into_an_async_producer(make: Callable[..., World]) -> None:
    async def call(c: EffectCall) -> dict[str, str]:
        return {"a": c.payload["q"].lower()}

    world = make(call, feedback=Feedback(kind="answered"))
    keys = world.ask(3)

    async def main() -> None:
        producer, consumer = world.producer(), world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), producer=producer, concurrency=3)
        assert executor.producer is producer and executor.sync.producer is None  # fed in awaited steps
        await executor.run(until_idle=True, handle_signals=False)
        assert executor.stats.fed == 3 and executor.stats.feedback_errors == 0
        for i in range(3):
            flow = await producer.flow(f"F{i}")
            assert flow is not None and (flow["seq"], flow["state"]) == (2, "answered")
        assert [e.event_id for e in await producer.outbox("F0")] == ["F0-1", "k-F0:result"]
        assert (await executor.run_once()).work == 0 and executor.stats.fed == 3  # fed once
        await consumer.close()
        await producer.close()

    asyncio.run(main())
    assert world.states(keys) == ["succeeded"] * 3


def test_the_executor_checks_its_arguments(make: Callable[..., World], tmp_path: Path) -> None:
    world = make(lambda c: None)
    with world.sync_consumer() as sync_consumer, \
            pytest.raises(TypeError, match="loop"):
        EffectExecutor(sync_consumer, loop="not a loop")  # type: ignore[arg-type]

    async def main() -> None:
        consumer = world.consumer()
        with pytest.raises(TypeError, match="AsyncConsumer"):
            AsyncEffectExecutor(object())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="AsyncProducer"):
            AsyncEffectExecutor(consumer, producer=object())  # type: ignore[arg-type]
        await consumer.close()

    asyncio.run(main())
    consumer = world.consumer()
    with pytest.raises(RuntimeError, match="running event loop"):
        AsyncEffectExecutor(consumer)
    asyncio.run(consumer.close())


def test_a_sync_executor_given_a_loop_awaits_there_and_leaves_it_running(make: Callable[..., World]) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def call(c: EffectCall) -> None:
        seen.append(asyncio.get_running_loop())

    world = make(call)
    world.ask(1)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        with world.sync_consumer() as consumer:
            executor = EffectExecutor(consumer, policy=world.policy(), loop=loop)
            assert executor.run_once().work == 1
            executor.close()
        assert seen == [loop] and loop.is_running()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


# -- AsyncWorker ------------------------------------------------------------------------------


def test_the_worker_delivers_applies_and_executes_with_a_responsive_loop(make: Callable[..., World]) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def call(c: EffectCall) -> dict[str, str]:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0.05)
        return {"a": "yes"}

    world = make(call, feedback=Feedback(kind="answered"))
    with Producer(world.producer_location, ASK) as p:
        for i in range(10):
            assert p.advance(f"F{i}-1", f"F{i}", expected_seq=0, kind="asked",
                             payload={"q": f"F{i}"}).status == "committed"
    world.sync_consumer().close()

    async def main() -> None:
        producer, consumer = world.producer(), world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), producer=producer, concurrency=5)
        worker = AsyncWorker(producer, [consumer], executors=[executor], register=True, idle_sleep=0.01)
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.001)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        stats = await worker.run(until_idle=True, handle_signals=False)
        tick.cancel()
        assert await worker.run_once() == PassResult(0, None)  # as Worker.run_once: nothing waits now
        assert set(loops) == {asyncio.get_running_loop()} and len(loops) == 10
        # the 10 asked events and the 10 answers fed back, relayed and applied
        assert stats.relayed["accepted"] == 20 and stats.applied == 20 and stats.errors == 0
        assert stats.effects == {"succeeded": 10} and executor.stats.fed == 10
        assert len(gaps) > 50 and max(gaps) < 0.25  # the loop never stalled
        for i in range(10):
            assert await consumer.projection(f"F{i}") is not None
            flow = await producer.flow(f"F{i}")
            assert flow is not None and flow["state"] == "answered"
        await consumer.close()
        await producer.close()

    asyncio.run(main())


def test_stop_from_another_task_ends_the_run_after_recording_the_calls(make: Callable[..., World]) -> None:
    started = 0

    async def call(c: EffectCall) -> str:
        nonlocal started
        started += 1
        await asyncio.sleep(0.3)
        return "done"

    world = make(call)
    keys = world.ask(3)

    async def main() -> None:
        producer, consumer = world.producer(), world.consumer()
        executor = AsyncEffectExecutor(consumer, policy=world.policy(), concurrency=3)
        worker = AsyncWorker(producer, [consumer], executors=[executor], register=True, idle_sleep=0.01)

        async def stopper() -> None:
            while started < 3:
                await asyncio.sleep(0.005)
            worker.stop()

        stop_task = asyncio.create_task(stopper())
        stats = await asyncio.wait_for(worker.run(handle_signals=False), 20)
        await stop_task
        assert executor.in_flight == 0  # the calls in flight were awaited and recorded
        assert stats.effects == {"succeeded": 3}
        await consumer.close()
        await producer.close()

    asyncio.run(main())
    assert world.states(keys) == ["succeeded"] * 3


def test_a_sigterm_stops_the_worker_and_puts_the_handlers_back(make: Callable[..., World]) -> None:
    world = make(lambda c: None)
    world.ask(1)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    async def main() -> None:
        producer, consumer = world.producer(), world.consumer()
        worker = AsyncWorker(producer, [consumer], register=True, idle_sleep=0.01,
                             on_pass=lambda s: os.kill(os.getpid(), signal.SIGTERM) if s.passes == 2 else None)
        stats = await asyncio.wait_for(worker.run(), 20)
        assert worker.stopping and stats.passes == 2
        await consumer.close()
        await producer.close()

    asyncio.run(main())
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_the_worker_refuses_an_unknown_consumer_and_wrong_objects(at: At) -> None:
    Producer(at("producer"), RESERVATION).close()

    async def main() -> None:
        producer = AsyncProducer(at("producer"), RESERVATION)
        consumer = AsyncConsumer(at("c"), RESERVATION, name="c")
        other = AsyncConsumer(at("d"), RESERVATION, name="d")
        await producer.admin.register_consumer("c", actor="test", reason="known")
        with pytest.raises(Exception, match="'d'"):
            AsyncWorker(producer, [consumer, other])
        with pytest.raises(TypeError, match="AsyncConsumer"):
            AsyncWorker(producer, [consumer.sync])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="AsyncEffectExecutor"):
            AsyncWorker(producer, [consumer], executors=[object()])  # type: ignore[list-item]
        for thing in (consumer, other, producer):
            await thing.close()

    asyncio.run(main())


# -- the command line -------------------------------------------------------------------------


@pytest.fixture
def cli_files(at: At) -> list[str]:
    with Producer(at("producer"), RESERVATION) as producer:
        commit(producer, "A", sep="-")
        commit(producer, "B", sep="-")
    for name in ("projection", "audit"):
        Consumer(at(name), RESERVATION, name=name).close()
    return ["--producer", str(at("producer")),
            "--consumer", f"projection={at('projection')}", "--consumer", f"audit={at('audit')}",
            "--register"]


def test_cli_run_async_until_idle_delivers_everything(tmp_path: Path, at: At, cli_files: list[str]) -> None:
    proc = cli("run", "--async", *cli_files, "--until-idle", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    stats = stopped_stats(proc.stderr)
    assert (stats["applied"], stats["relayed"]["accepted"], stats["errors"]) == (12, 12, 0)
    with Producer(at("producer"), RESERVATION) as producer:
        assert all(e.accepted for e in producer.outbox())
    for name in ("projection", "audit"):
        with Consumer(at(name), RESERVATION) as c:
            assert c.projection("A") == c.projection("B") == RELEASED


def test_cli_run_async_stops_cleanly_on_sigterm(tmp_path: Path, at: At, cli_files: list[str]) -> None:
    with child_process(
        [sys.executable, "-m", "reliable_flow", "run", "--async", *cli_files, "--idle-sleep", "0.05",
         "--report-every", "0.01"], env=worker_env(), cwd=tmp_path,
    ) as proc:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("run: {"), first
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
    stats = stopped_stats(first + rest)
    assert stats["passes"] >= 1 and stats["errors"] == 0
    assert check_files_agree(at)["effects"] == stats["applied"]


# -- SIGKILL ----------------------------------------------------------------------------------


def test_an_async_worker_survives_sigkill_at_any_moment(tmp_path: Path, engine: str, at: At) -> None:
    kills = int(os.environ.get("RELIABLE_FLOW_AIO_KILLS", "20" if engine == "sqlite" else "8"))
    seed = chosen_seed()
    print(f"aio worker kill test: seed={seed} kills={kills} (replay with RELIABLE_FLOW_SEED={seed})")
    rng = random.Random(seed)
    Producer(at("producer"), RESERVATION).close()
    with Consumer(at("projection"), RESERVATION, name="projection") as projection:
        assert projection.receive(PLANTED).status == "accepted"
    Consumer(at("audit"), RESERVATION, name="audit").close()
    invariants = Invariants(at)
    invariants.check("start")
    killed_after_ready = 0
    for k in range(kills):
        where = f"seed={seed} kill {k}"
        with child_process([sys.executable, str(AIO_CHILD), "kill", stores(at), str(rng.randrange(2**32))],
                           env=worker_env(), cwd=tmp_path) as proc:
            if rng.random() < 0.15:  # now and then while it starts and opens the stores
                time.sleep(rng.uniform(0.0, 0.3))
            else:
                wait_for_line(proc, "ready")
                killed_after_ready += 1
                time.sleep(rng.uniform(0.0, 0.25))
            proc.kill()
            _, err = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == -signal.SIGKILL, (where, proc.returncode, err)
        invariants.check(where)
    assert killed_after_ready >= kills // 2

    finish = run_script(AIO_CHILD, "finish", stores(at), str(rng.randrange(2**32)),
                        env=worker_env(), cwd=tmp_path, timeout=CHILD_TIMEOUT + 30)
    assert finish.returncode == 0, (seed, finish.returncode, finish.stderr)
    assert "done" in finish.stdout
    final = invariants.check(f"seed={seed} final")
    assert len(final["outbox"]) == 60
    not_accepted = {key: state for key, state in final["delivery"].items() if state != "accepted"}
    assert not_accepted == {("projection", "F07-1"): "set_aside"}, seed
    audit, projection = final["audit"], final["projection"]
    assert len(audit["effects"]) == 60 and set(audit["projection"].values()) == {("released", 3)}
    assert len(projection["effects"]) == 58
    print(f"aio worker kill test: {kills} kills, {killed_after_ready} after ready")

