"""reliable_flow.aio (issue 21): the async face gives the sync face's answers
and rows, never blocks the event loop, and a cancelled task loses nothing
and applies nothing twice."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from reliable_flow import Consumer, PayloadError, Producer, aio, relay, relay_batch
from reliable_flow.aio import AsyncConsumer, AsyncProducer
from reliable_flow.errors import InvalidEnvelope, StorageError
from reliable_flow.reservation import RESERVATION
from support import KINDS, envelope

FLOWS = ("A", "B", "C", "D", "E", "F", "G", "H", "K", "L")
VOLATILE = {"at", "due_at", "uid", "registered_at", "created_at", "updated_at", "since", "received_at", "blocked_at"}


def _refuse_some(ctx: Any) -> None:
    """A handler that blocks D1 and E1 (the operator's scenarios)."""
    if ctx.event.event_id in ("D1", "E1"):
        raise PayloadError("amount", "refused by the test's handler")


def plain(value: Any) -> Any:
    """Results and records as plain data, without times and uids (they differ by store)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in VOLATILE}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# -- the sync face, seen through awaits (so one scenario drives both faces) ---------------


class Awaited:
    """A sync Producer / Consumer / admin whose methods are awaited."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.obj, name)
        if name == "admin":
            return Awaited(value)
        if name == "applying":
            return value
        if name == "batch":
            return lambda: _SyncBatch(value())
        if callable(value):
            async def call(*args: Any, **kwargs: Any) -> Any:
                return value(*args, **kwargs)
            return call
        return value


class _SyncBatch:
    def __init__(self, cm: Any) -> None:
        self.cm = cm

    async def __aenter__(self) -> Awaited:
        self.batch = self.cm.__enter__()
        return Awaited(self.batch)

    async def __aexit__(self, *exc: object) -> bool:
        return bool(self.cm.__exit__(*exc))


def _unwrap(x: Any) -> Any:
    return x.obj if isinstance(x, Awaited) else x


async def sync_relay(p: Any, c: Any, *args: Any, **kwargs: Any) -> Any:
    return relay(_unwrap(p), _unwrap(c), *args, **kwargs)


async def sync_relay_batch(p: Any, c: Any, *args: Any, **kwargs: Any) -> Any:
    return relay_batch(_unwrap(p), _unwrap(c), *args, **kwargs)


SYNC_FACE = (lambda loc: Awaited(Producer(loc, RESERVATION)),
             lambda loc: Awaited(Consumer(loc, RESERVATION, handlers=[_refuse_some])),
             sync_relay, sync_relay_batch)
ASYNC_FACE = (lambda loc: AsyncProducer(loc, RESERVATION),
              lambda loc: AsyncConsumer(loc, RESERVATION, handlers=[_refuse_some]),
              aio.relay, aio.relay_batch)


async def scenario(face: tuple[Any, ...], producer_at: str, consumer_at: str) -> list[Any]:
    """The behaviour suite's core scenarios; every answer, then every row."""
    open_producer, open_consumer, relay_one, relay_many = face
    p, c = open_producer(producer_at), open_consumer(consumer_at)
    seen: list[Any] = []
    note = seen.append
    who = {"actor": "ops", "reason": "test"}
    try:
        # advance: committed, existing, conflict, stale, invalid_transition, invalid_payload
        note(await p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}))
        note(await p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}))
        note(await p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 4}))
        note(await p.advance("A9", "A", expected_seq=0, kind="reserved", payload={"amount": 3}))
        note(await p.advance("B0", "B", expected_seq=0, kind="released", payload={"amount": 3}))
        note(await p.advance("B0", "B", expected_seq=0, kind="reserved", payload={"amount": 0}))
        for n in (2, 3):
            note(await p.advance(f"A{n}", "A", expected_seq=n - 1, kind=KINDS[n - 1], payload={"amount": 3}))
        async with p.batch() as b:  # several flows, one commit; later advances see earlier ones
            for flow in "BCDEFG":
                note(await b.advance(f"{flow}1", flow, expected_seq=0, kind="reserved", payload={"amount": 3}))
            note(await b.advance("B2", "B", expected_seq=1, kind="confirmed", payload={"amount": 3}))
            note(await b.advance("B2", "B", expected_seq=1, kind="confirmed", payload={"amount": 3}))
            note(await b.advance("B3", "B", expected_seq=1, kind="confirmed", payload={"amount": 3}))
        note((b.committed, b.results))
        note(await c.receive(envelope("G1", "G", 1, amount=5)))  # G1 arrives with another body first
        note(await relay_one(p, c, "A1"))
        note(await relay_one(p, c, "A1"))  # again: the consumer answers duplicate
        note(await relay_many(p, c, 100))  # the rest; G1 is set aside (id_conflict)
        note(await relay_one(p, c))  # idle
        # receive: duplicate, id_conflict, sequence_conflict
        note(await c.receive(await p.event("A2")))
        note(await c.receive(envelope("A2", "A", 2, amount=4)))
        note(await c.receive(envelope("X1", "A", 1)))
        # a gap, then the missing step
        note(await c.receive(envelope("H2", "H", 2)))
        note(await c.apply_next("H"))
        note(await c.receive_many([envelope("H1", "H", 1), envelope("K1", "K", 1), envelope("H1", "H", 1)]))
        # order: A applies 1, 2, 3, then idle
        for _ in range(4):
            note(await c.apply_next("A"))
        note(await c.drain("H"))
        # blocked by a handler's PayloadError; the operator skips D1 and replaces E1
        note(await c.apply_next("D"))
        note(await c.stuck("D"))
        note(await c.admin.skip_event("D1", **who))
        note(await c.apply_next("E"))
        note(await c.admin.replace_event("E1", envelope("E1b", "E", 1), **who))
        note(await c.apply_next("E"))
        note(await c.process_all())
        # the producer's operator: redeliver the set-aside G1 (still conflicts), then skip it
        note(await p.admin.redeliver("G1", consumer="default", **who))
        note(await relay_one(p, c))
        note(await p.admin.skip("G1", consumer="default", **who))
        note(await p.admin.register_consumer("other", True, **who))
        # the receive-and-apply mode
        note(await p.advance("L1", "L", expected_seq=0, kind="reserved", payload={"amount": 3}))
        note(await relay_one(p, c.applying(), "L1"))
        note(await relay_many(p, c.applying(), 10))
        # the rows
        note(await p.outbox())
        note(await p.outbox("A", consumer="default"))
        note(await p.flows())
        for flow in FLOWS:
            note((await p.flow(flow), await c.inbox(flow), await c.projection(flow), await c.applied(flow)))
        note((await c.flows(), await c.open_flows()))
        note((await p.admin.operator_actions(), await p.admin.consumers(), await p.admin.registry_actions()))
        note((await c.admin.operator_actions(), await c.effect_counts(), await c.event("E1b")))
    finally:
        await p.close()
        await c.close()
    return plain(seen)


def test_the_async_face_gives_the_sync_faces_answers_and_rows(new_store: Callable[[str], str]) -> None:
    sync_seen = asyncio.run(scenario(SYNC_FACE, new_store("sync_producer"), new_store("sync_consumer")))
    async_seen = asyncio.run(scenario(ASYNC_FACE, new_store("async_producer"), new_store("async_consumer")))
    statuses = [s["status"] for s in sync_seen[:6]]
    assert statuses == ["committed", "existing", "conflict", "stale", "invalid_transition", "invalid_payload"]
    assert "id_conflict" in str(sync_seen) and "sequence_conflict" in str(sync_seen) and "gap" in str(sync_seen)
    assert "blocked" in str(sync_seen) and "'applied': True" in str(sync_seen)
    assert len(async_seen) == len(sync_seen)
    for n, (mine, theirs) in enumerate(zip(async_seen, sync_seen)):
        assert mine == theirs, n


def test_bad_input_raises_the_sync_error_and_stores_nothing(new_store: Callable[[str], str]) -> None:
    async def main() -> None:
        async with AsyncProducer(new_store("producer"), RESERVATION) as p:
            with pytest.raises(InvalidEnvelope):
                await p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": math.nan})
            with pytest.raises(InvalidEnvelope):
                await p.advance("", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            assert await p.flows() == [] and await p.outbox() == []
        async with AsyncConsumer(new_store("consumer"), RESERVATION) as c:
            with pytest.raises(InvalidEnvelope):
                await c.receive_many([envelope("A1", "A", 1), {"event_id": "A2"}])
            assert await c.flows() == []
            with pytest.raises(TypeError):
                await aio.relay(p, c.sync)  # type: ignore[arg-type]

    asyncio.run(main())
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(TypeError):
        AsyncProducer(new_store("bad"), "reservation")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_inbox"):
        AsyncConsumer(new_store("bad2"), RESERVATION, max_inbox=-1)
    with pytest.raises(ValueError, match="max_inbox"):
        asyncio.run(AsyncConsumer.open(new_store("bad3"), RESERVATION, max_inbox=-1))
    time.sleep(0.05)
    assert {t.name for t in threading.enumerate()} - before == set()  # their threads ended


def test_open_without_blocking_and_close_twice(new_store: Callable[[str], str]) -> None:
    async def main() -> None:
        p = await AsyncProducer.open(new_store("producer"), RESERVATION, max_backlog=5)
        c = await AsyncConsumer.open(new_store("consumer"), RESERVATION, name="billing")
        assert (p.max_backlog, c.name, c.protocol) == (5, "billing", RESERVATION)
        await p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert (await aio.relay(p, c)).status == "accepted"
        await p.close()
        await p.close()
        await c.close()
        with pytest.raises(StorageError, match="closed"):
            await c.flows()

    asyncio.run(main())


def test_the_event_loop_keeps_running_while_the_store_works(new_store: Callable[[str], str]) -> None:
    def slow(ctx: Any) -> None:
        time.sleep(0.2)  # on the consumer's thread, inside the apply transaction

    async def main() -> tuple[int, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        async with AsyncProducer(new_store("producer"), RESERVATION) as p, \
                AsyncConsumer(new_store("consumer"), RESERVATION, handlers=[slow]) as c:
            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            for n in range(20):
                await p.advance(f"F{n}", f"F{n}", expected_seq=0, kind="reserved", payload={"amount": 3})
            during_advances = ticks
            await aio.relay(p, c)
            before = ticks
            assert (await c.apply_next("F0")).status == "applied"
            during_apply = ticks - before
            tick.cancel()
        return during_advances, during_apply

    during_advances, during_apply = asyncio.run(main())
    assert during_advances >= 3
    assert during_apply >= 20  # 200 ms of handler: the 1 ms ticker went on


def _gated_protocol(started: threading.Event, gate: threading.Event) -> Any:
    """RESERVATION whose step waits at ``gate`` (inside the advance's transaction)."""
    def step(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        started.set()
        assert gate.wait(10)
        return RESERVATION.step(state, kind, value, data)

    return dataclasses.replace(RESERVATION, step=step)


def test_a_cancelled_advance_either_never_ran_or_committed(new_store: Callable[[str], str]) -> None:
    started, gate = threading.Event(), threading.Event()
    args: dict[str, Any] = {"expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}}

    async def main() -> None:
        async with AsyncProducer(new_store("producer"), _gated_protocol(started, gate)) as p:
            # Cancelled before the thread started it: it never runs.
            held = threading.Event()
            p.thread.submit(held.wait, 10)
            task = asyncio.create_task(p.advance("A1", "A", **args))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task  # the thread's call is cancelled by now (a loop turn after the task)
            held.set()
            assert await p.flow("A") is None and await p.outbox() == []
            # Cancelled while it runs: it commits; a retry answers existing.
            task = asyncio.create_task(p.advance("A1", "A", **args))
            while not started.is_set():
                await asyncio.sleep(0.001)
            task.cancel()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await p.flow("A")) == {"state": "reserved", "seq": 1, "amount": 3}
            assert (await p.advance("A1", "A", **args)).status == "existing"

    asyncio.run(main())


def test_a_batch_holds_the_others_and_a_cancelled_batch_rolls_back(new_store: Callable[[str], str]) -> None:
    async def main() -> None:
        async with AsyncProducer(new_store("producer"), RESERVATION) as p:
            args: dict[str, Any] = {"expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}}
            async with p.batch() as b:
                await b.advance("A1", "A", **args)
                other = asyncio.create_task(p.advance("B1", "B", **args))
                reader = asyncio.create_task(p.outbox())
                await asyncio.sleep(0.05)
                assert not other.done() and not reader.done()  # they wait for the batch's end
                with pytest.raises(RuntimeError, match="already open"):
                    async with p.batch():
                        pass
            assert [e.event_id for e in await reader] == ["A1", "B1"]  # in turn, after the batch
            assert (await other).status == "committed"

            async def cancelled_in_the_middle() -> None:
                async with p.batch() as b:
                    await b.advance("C1", "C", **args)
                    await asyncio.sleep(10)

            task = asyncio.create_task(cancelled_in_the_middle())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await p.flow("C") is None  # rolled back, and the producer is free again
            assert (await p.advance("C1", "C", **args)).status == "committed"

    asyncio.run(main())


# -- the soak: random cancellations at random awaits ----------------------------------------

CANCELLED = object()

#: The default soak's events (the target: the test asserts every one went
#: through) and its time bound (a safety net for a slow machine: hit first,
#: the test asserts what got through, and says so).  RELIABLE_FLOW_SOAK=1
#: (the opt-in soak runs) makes it ten times the events, with a longer bound.
#: (One test, not a second one skipped by default: a skipped PostgreSQL test
#: fails a run with RELIABLE_FLOW_REQUIRE_POSTGRES.)
SOAK_EVENTS = 2400
SOAK_BOUND = 30.0
LONG_SOAK_EVENTS = 24_000
LONG_SOAK_BOUND = 600.0
SOAK_LANES = 4  # producer/consumer pairs, each with its own stores and threads


async def chaotic(rng: random.Random, call: Coroutine[Any, Any, Any], odds: float) -> Any:
    """Run ``call`` as a task; with ``odds``, cancel it at a random moment:
    before it starts, after a few loop turns, or after a pause drawn from
    0.1 ms to 50 ms, log-uniform (as likely within a hop to a store thread
    as during a commit, or while the call waits for its object's lock)."""
    task = asyncio.ensure_future(call)
    if rng.random() < odds:
        pause = rng.choice(("now", "turns", "sleep"))
        if pause == "turns":
            for _ in range(rng.randint(1, 4)):
                await asyncio.sleep(0)
        elif pause == "sleep":
            await asyncio.wait((task,), timeout=0.0001 * 500 ** rng.random())
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return CANCELLED


def cancellation_soak(new_store: Callable[[str], str], events: int, bound: float, seed: int = 21) -> dict[str, Any]:
    """``events`` events (the reservation protocol's three steps per flow)
    over ``SOAK_LANES`` producer/consumer pairs, every awaited call cancelled
    at a random moment three times in ten, and retried with the same ids:

    * advances one at a time, or in ``producer.batch()`` blocks of 2 to 8
      (a retried batch answers all ``committed`` -- it had rolled back -- or
      all ``existing`` -- its commit had finished);
    * delivered by ``relay``, by ``relay_batch`` to ``consumer.applying()``
      (applied on arrival) or by ``relay_batch`` to the consumer (applied
      later);
    * applied by ``apply_next`` or by ``process_all`` (one event or ten per
      transaction).

    Production stops at ``bound`` seconds if it is not done by then; then
    everything is settled without cancellations and checked: every event
    advanced is in the outbox once, accepted, and applied exactly once, in
    seq order, with its flow's projection at the last seq; nothing else."""

    async def lane(n: int, flows: list[str], deadline: float, counts: dict[str, int]) -> int:
        rng = random.Random(seed * 1000 + n)
        advanced: dict[str, int] = {}
        async with AsyncProducer(new_store(f"producer{n}"), RESERVATION) as p, \
                AsyncConsumer(new_store(f"consumer{n}"), RESERVATION) as c:
            producing = True

            def args(flow: str, step: int) -> dict[str, Any]:
                return {"event_id": f"{flow}-{step}", "flow_id": flow, "expected_seq": step - 1,
                        "kind": KINDS[step - 1], "payload": {"amount": 3}}

            async def one(flow: str, step: int) -> None:
                cancelled = False
                while (result := await chaotic(rng, p.advance(**args(flow, step)), 0.3)) is CANCELLED:
                    counts["cancelled"] += 1
                    cancelled = True
                assert result.status in (("committed", "existing") if cancelled else ("committed",)), result
                if cancelled:
                    counts["existing" if result.status == "existing" else "committed_after_cancel"] += 1
                advanced[flow] = step

            async def block(chunk: list[str], step: int) -> list[Any]:
                async with p.batch() as b:
                    for flow in chunk:
                        await b.advance(**args(flow, step))
                return b.results

            async def batch(chunk: list[str], step: int) -> None:
                cancelled = False
                while (results := await chaotic(rng, block(chunk, step), 0.3)) is CANCELLED:
                    counts["cancelled"] += 1
                    counts["batches_cancelled"] += 1
                    cancelled = True
                statuses = {r.status for r in results}
                assert len(results) == len(chunk) and len(statuses) == 1, results  # all or none
                assert statuses <= ({"committed", "existing"} if cancelled else {"committed"}), results
                if cancelled:
                    counts["batch_existing" if statuses == {"existing"} else "batch_committed_after_cancel"] += 1
                for flow in chunk:
                    advanced[flow] = step

            async def produce() -> None:
                nonlocal producing
                try:
                    for step in range(1, 4):
                        at = 0
                        while at < len(flows):
                            if time.monotonic() > deadline:
                                counts["timed_out"] = 1
                                return
                            if rng.random() < 0.4:
                                size = rng.randint(2, 8)
                                await batch(flows[at:at + size], step)
                                at += size
                            else:
                                await one(flows[at], step)
                                at += 1
                finally:
                    producing = False

            async def deliver() -> None:
                while producing:
                    pick = rng.random()
                    if pick < 0.35:
                        result = await chaotic(rng, aio.relay(p, c), 0.3)
                        answers = [] if result is CANCELLED else [result]
                    else:  # in batches: applied on arrival, or applied later
                        to = c.applying() if pick < 0.7 else c
                        result = await chaotic(rng, aio.relay_batch(p, to, rng.randint(5, 50)), 0.3)
                        answers = [] if result is CANCELLED else list(result.results) or [None]
                    assert all(a is None or a.status in ("accepted", "duplicate", "idle") for a in answers), answers
                    if answers and (answers[0] is None or answers[0].status == "idle"):
                        await asyncio.sleep(0.001)

            async def apply() -> None:
                while producing:
                    if rng.random() < 0.5:
                        for flow in (await c.open_flows())[:20]:
                            result = await chaotic(rng, c.apply_next(flow), 0.3)
                            assert result is CANCELLED or result.status in ("applied", "idle", "gap"), result
                    else:
                        drained = await chaotic(
                            rng, c.process_all(rng.randint(1, 3), batch_size=rng.choice((1, 10))), 0.3)
                        assert drained is CANCELLED or all(
                            d.stop in ("idle", "gap", "limit") for d in drained.values()), drained
                    await asyncio.sleep(0.001)

            await asyncio.gather(produce(), deliver(), apply())
            # settle, without cancellations
            while (await aio.relay_batch(p, c, 500)).results:
                pass
            await c.process_all()
            assert await c.open_flows() == []
            for flow, last in advanced.items():
                applied = await c.applied(flow)
                assert [(e.event_id, e.seq) for e in applied] == [(f"{flow}-{n}", n) for n in range(1, last + 1)]
                assert (await c.projection(flow) or {})["last_seq"] == last
            outbox = await p.outbox()
            assert sorted(e.event_id for e in outbox) == sorted(
                f"{flow}-{n}" for flow, last in advanced.items() for n in range(1, last + 1))
            assert all(e.accepted for e in outbox)
            assert sorted(await c.flows()) == sorted(advanced)
        return sum(advanced.values())

    async def main() -> dict[str, Any]:
        counts: dict[str, Any] = dict.fromkeys(
            ("cancelled", "existing", "committed_after_cancel", "batches_cancelled", "batch_existing",
             "batch_committed_after_cancel", "timed_out"), 0)
        per_lane = math.ceil(events / 3 / SOAK_LANES)
        started = time.monotonic()
        done = await asyncio.gather(*(
            lane(n, [f"S{n}-{i:05d}" for i in range(per_lane)], started + bound, counts)
            for n in range(SOAK_LANES)))
        counts["events"] = sum(done)
        counts["planned"] = 3 * per_lane * SOAK_LANES
        counts["seconds"] = round(time.monotonic() - started, 1)
        return counts

    return asyncio.run(main())


def test_cancellation_at_random_awaits_loses_nothing_and_applies_nothing_twice(
    new_store: Callable[[str], str],
) -> None:
    long = bool(os.environ.get("RELIABLE_FLOW_SOAK"))
    counts = cancellation_soak(new_store, LONG_SOAK_EVENTS if long else SOAK_EVENTS,
                               LONG_SOAK_BOUND if long else SOAK_BOUND)
    print(f"cancellation soak: {counts}")
    # The count is the target; the bound only guards a slow machine (then
    # fewer events went through, each of them checked all the same).
    assert counts["events"] == counts["planned"] >= 2000 or (counts["timed_out"] and counts["events"] >= 300), counts
    # Both kinds of cancelled advance are shown deterministically by
    # test_a_cancelled_advance_either_never_ran_or_committed; here: that
    # cancellations happened, of single advances and of batches, over a real
    # number of events.
    assert counts["cancelled"] >= 100 and counts["batches_cancelled"] >= 10, counts
