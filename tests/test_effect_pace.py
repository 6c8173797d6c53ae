"""Effects at an agent's pace (issue 20): calls in flight at once on threads
and on the executor's event loop, heartbeats and the executor's own lease
renewals, timeouts, ``RetryLater(after=)``, and the checks of every new
option.

On both engines (the ``engine`` fixture), with an injected clock where it is
about time, and real threads and a real event loop where it is about
concurrency.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import engine_reads
from engine_reads import new_location
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Happened,
    Producer,
    RetryLater,
    relay,
)
from reliable_flow.errors import LeaseLost
from reliable_flow.protocol import Protocol, by_kind, exact, text
from support import Clock

T0 = 1000.0
LEASE = 30.0
ASK = Protocol(
    name="ask", initial="new",
    transitions={"new": ["asked"]},
    schemas={1: by_kind({"asked": exact({"q": text()})})},
)


class World:
    """A producer and a consumer of ``ask`` on one engine; applying an asked
    flow schedules one ``call`` effect for it."""

    def __init__(self, engine: str, tmp_path: Path, effects: EffectRegistry) -> None:
        self.clock = Clock(T0)
        self.producer_location = new_location(engine, tmp_path, "producer")
        self.producer = Producer(self.producer_location, ASK)
        self.location = new_location(engine, tmp_path, "consumer")
        self.effects = effects
        self.consumer = self.open_consumer()

    def open_consumer(self) -> Consumer:
        def handler(ctx: ApplyContext) -> None:
            ctx.schedule("call", {"q": ctx.event.payload["q"]}, key=f"k-{ctx.event.flow_id}")

        return Consumer(self.location, ASK, name="tools", handlers=[handler], effects=self.effects,
                        clock=self.clock)

    def ask(self, count: int) -> list[str]:
        flows = [f"F{i}" for i in range(count)]
        for flow in flows:
            assert self.producer.advance(f"{flow}-1", flow, expected_seq=0, kind="asked",
                                         payload={"q": flow}).status == "committed"
            assert relay(self.producer, self.consumer, register=True).status == "accepted"
            assert self.consumer.apply_next(flow).status == "applied"
        return [f"k-{flow}" for flow in flows]

    def executor(self, consumer: Consumer | None = None, owner: str = "ex", **kw: Any) -> EffectExecutor:
        policy = DeliveryPolicy(lease_seconds=LEASE, clock=self.clock, random=lambda: 0.5, owner=owner)
        return EffectExecutor(consumer or self.consumer, policy=policy, **kw)

    def states(self, keys: list[str]) -> list[str]:
        return [str(self.consumer.scheduled_effect(k).state) for k in keys]  # type: ignore[union-attr]


@pytest.fixture
def make(engine: str, tmp_path: Path) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def build(run: Callable[[EffectCall], Any], **options: Any) -> World:
        effects = EffectRegistry()
        effects.register("call", run, **options)
        made.append(World(engine, tmp_path, effects))
        return made[-1]

    yield build
    for world in made:
        world.consumer.close()
        world.producer.close()


class Gauge:
    """How many calls are in flight at once, at most (thread-safe)."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


# -- concurrency ------------------------------------------------------------------------------


def test_eight_plain_calls_are_in_flight_at_once(make: Callable[..., World]) -> None:
    gauge, barrier = Gauge(), threading.Barrier(8, timeout=20)

    def call(c: EffectCall) -> dict[str, str]:
        gauge.enter()
        barrier.wait()  # passes only when all eight are in flight together
        gauge.leave()
        return {"q": c.payload["q"]}

    world = make(call)
    keys = world.ask(8)
    executor = world.executor(concurrency=8)
    assert executor.run_once().work == 8
    assert world.states(keys) == ["succeeded"] * 8
    assert gauge.most == 8 and threading.current_thread().name not in gauge.threads
    assert executor.stats.started == 8 and executor.stats.outcomes == {"succeeded": 8}
    assert executor.in_flight == 0


def test_never_more_calls_in_flight_than_concurrency(make: Callable[..., World]) -> None:
    gauge = Gauge()

    def call(c: EffectCall) -> None:
        gauge.enter()
        time.sleep(0.05)
        gauge.leave()

    world = make(call)
    keys = world.ask(9)
    assert world.executor(concurrency=3).run_once().work == 9
    assert world.states(keys) == ["succeeded"] * 9
    assert gauge.most == 3


def test_async_calls_run_together_on_the_executors_event_loop(make: Callable[..., World]) -> None:
    gauge = Gauge()
    loops: set[int] = set()

    async def call(c: EffectCall) -> dict[str, str]:
        loops.add(id(asyncio.get_running_loop()))
        gauge.enter()
        await asyncio.sleep(0.1)
        gauge.leave()
        return {"q": c.payload["q"]}

    world = make(call)
    keys = world.ask(6)
    executor = world.executor(concurrency=6)
    started = time.monotonic()
    assert executor.run_once().work == 6
    assert time.monotonic() - started < 0.1 * 6  # not one after another
    assert world.states(keys) == ["succeeded"] * 6
    assert world.consumer.scheduled_effect(keys[0]).result == {"q": "F0"}  # type: ignore[union-attr]
    assert gauge.most == 6 and len(loops) == 1 and len(gauge.threads) == 1  # one loop, one thread


def test_an_async_reconcile_settles_a_doubt(make: Callable[..., World]) -> None:
    async def reconcile(c: EffectCall) -> Happened:
        await asyncio.sleep(0)
        return Happened({"checked": c.key})

    def call(c: EffectCall) -> None:
        raise TimeoutError("no answer")

    world = make(call, reconcile=reconcile)
    [key] = world.ask(1)
    executor = world.executor(concurrency=2)
    executor.run_once()
    assert world.states([key]) == ["in_doubt"]
    world.clock.t += 60
    executor.run_once()
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.result) == ("succeeded", {"checked": key})


def test_concurrency_one_still_calls_in_the_executors_thread(make: Callable[..., World]) -> None:
    threads: list[str] = []
    world = make(lambda c: threads.append(threading.current_thread().name))
    world.ask(2)
    assert world.executor().run_once().work == 2
    assert threads == [threading.current_thread().name] * 2


def test_a_base_exception_in_a_call_ends_the_executor_and_leaves_the_claim(make: Callable[..., World]) -> None:
    class Died(BaseException):
        pass

    def call(c: EffectCall) -> None:
        raise Died

    world = make(call)
    [key] = world.ask(1)
    executor = world.executor(concurrency=4)
    with pytest.raises(Died):
        executor.run_once()
    effect = world.consumer.scheduled_effect(key)  # as a dead process leaves it: claimed, leased, unrecorded
    assert effect is not None and (effect.state, effect.lease_owner, effect.due_at) == (
        "running", executor.owner, T0 + LEASE)


# -- heartbeats and the executor's own renewals ----------------------------------------------


def test_the_executor_renews_the_lease_of_a_long_call_by_itself(make: Callable[..., World]) -> None:
    seen: list[int] = []

    def call(c: EffectCall) -> str:
        for _ in range(8):  # 8 x 6 s = 48 s of the test's clock: longer than the 30 s lease
            world.clock.t += 6
            time.sleep(0.25)  # the executor's thread looks every 0.1 s at least
        other = world.open_consumer()  # another executor, in another thread: finds nothing to take
        seen.append(world.executor(other, owner="other").run_once().work)
        other.close()
        return "done"

    world = make(call)
    [key] = world.ask(1)
    executor = world.executor(concurrency=2)
    assert executor.run_once().work == 1
    assert seen == [0]
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.result) == ("succeeded", "done")
    assert executor.stats.renewals >= 3 and "lease_lost" not in executor.stats.outcomes


def test_a_heartbeat_extends_the_lease_before_it_returns(make: Callable[..., World]) -> None:
    due: list[float] = []

    def call(c: EffectCall) -> None:
        world.clock.t += 20
        c.heartbeat()
        reader = world.open_consumer()
        due.append(reader.scheduled_effect(c.key).due_at)  # type: ignore[union-attr]
        reader.close()

    world = make(call)
    world.ask(1)
    executor = world.executor(concurrency=2)
    executor.run_once()
    assert due == [T0 + 20 + LEASE]


def test_a_heartbeat_in_the_executors_thread_renews_at_once(make: Callable[..., World]) -> None:
    due: list[float] = []

    def call(c: EffectCall) -> None:
        world.clock.t += 20
        c.heartbeat()
        due.append(world.consumer.scheduled_effect(c.key).due_at)  # type: ignore[union-attr]

    world = make(call)
    world.ask(1)
    executor = world.executor()  # concurrency 1: the call runs in this thread
    executor.run_once()
    assert due == [T0 + 20 + LEASE] and executor.stats.renewals == 1


def test_after_the_lease_was_lost_heartbeat_raises_and_the_outcome_is_discarded(
    make: Callable[..., World],
) -> None:
    said: list[object] = []

    def call(c: EffectCall) -> str:
        world.clock.t += LEASE + 1  # the lease ran out: another executor takes the effect up
        assert world.executor(owner="second").run_once().work == 1
        try:
            c.heartbeat()
        except LeaseLost as exc:
            said.append(exc)
        said.append(c.lease_lost)
        return "late"

    def reconcile(c: EffectCall) -> Happened:
        return Happened("checked")

    world = make(call, reconcile=reconcile)
    [key] = world.ask(1)
    first = world.executor(owner="first")
    first.run_once()
    assert isinstance(said[0], LeaseLost) and said[1] is True
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.result) == ("succeeded", "checked")
    assert first.stats.outcomes == {"lease_lost": 1}


def test_heartbeat_outside_an_executor_does_nothing() -> None:
    call = EffectCall("k", "call", {}, {}, 1, "F", "E")
    call.heartbeat()
    assert call.lease_lost is False


# -- timeouts ---------------------------------------------------------------------------------


def test_a_call_past_its_timeout_is_in_doubt_and_held_until_it_returns(make: Callable[..., World]) -> None:
    release, returned = threading.Event(), threading.Event()

    def call(c: EffectCall) -> str:
        world.clock.t += 6  # past the 5 s timeout
        release.wait(20)
        returned.set()
        return "late"

    def reconcile(c: EffectCall) -> Happened:
        return Happened("reconciled")

    world = make(call, reconcile=reconcile, timeout=5)
    [key] = world.ask(1)
    executor = world.executor(concurrency=2)
    assert executor.run_once().work == 1  # returns: the call is past its timeout, still running
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.lease_owner) == ("in_doubt", executor.owner)
    assert effect.last_error is not None and "timed out after 5 s" in effect.last_error
    assert executor.stats.outcomes == {"timed_out": 1} and executor.in_flight == 1
    world.clock.t += LEASE + 1
    executor.run_once()  # renews the held doubt's lease; takes nothing
    assert world.executor(owner="other").run_once().work == 0  # held: nothing runs it meanwhile
    release.set()
    assert returned.wait(20)
    executor.finish()
    while executor.in_flight:  # the late answer comes; it is discarded and the doubt let go
        executor.run_once()
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.lease_owner) == ("in_doubt", None)
    assert executor.stats.outcomes["late_outcome_discarded"] == 1
    assert world.executor(owner="other").run_once().work == 1
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.result) == ("succeeded", "reconciled")


def test_a_timed_out_call_with_no_way_to_settle_it_is_parked(make: Callable[..., World]) -> None:
    release = threading.Event()

    def call(c: EffectCall) -> None:
        world.clock.t += 2
        release.wait(20)

    world = make(call, timeout=1)
    [key] = world.ask(1)
    executor = world.executor()  # concurrency 1: a timeout still runs the call off this thread
    executor.run_once()
    assert world.states([key]) == ["in_doubt"]
    release.set()
    while executor.in_flight:
        executor.run_once()
    world.clock.t += 60
    executor.run_once()
    assert world.states([key]) == ["unknown"]


# -- RetryLater(after=) -----------------------------------------------------------------------


def test_retry_later_after_sets_the_next_due_time_and_counts_the_attempt(make: Callable[..., World]) -> None:
    def call(c: EffectCall) -> None:
        raise RetryLater("429 Too Many Requests", after=7.5)

    world = make(call, max_attempts=2)
    [key] = world.ask(1)
    executor = world.executor()
    executor.run_once()
    effect = world.consumer.scheduled_effect(key)
    assert effect is not None and (effect.state, effect.attempts, effect.due_at) == ("pending", 1, T0 + 7.5)
    world.clock.t += 7.4
    assert executor.run_once().work == 0
    world.clock.t += 0.1
    assert executor.run_once().work == 1
    assert world.states([key]) == ["dead"]  # max_attempts still bounds it


@pytest.mark.parametrize("after", [float("nan"), float("inf"), -1, True, "5"])
def test_retry_later_refuses_a_bad_after(after: object) -> None:
    with pytest.raises(ValueError, match="after must be a finite number >= 0"):
        RetryLater("busy", after=after)  # type: ignore[arg-type]


# -- bad options, nothing stored --------------------------------------------------------------


@pytest.mark.parametrize(("option", "value", "message"), [
    ("concurrency", 0, "concurrency must be None or an int >= 1"),
    ("concurrency", True, "concurrency must be None or an int >= 1"),
    ("concurrency", 2.0, "concurrency must be None or an int >= 1"),
    ("timeout", 0, "timeout must be a finite number > 0"),
    ("timeout", float("nan"), "timeout must be a finite number > 0"),
    ("timeout", float("inf"), "timeout must be a finite number > 0"),
    ("timeout", False, "timeout must be a finite number > 0"),
    ("rate_limit", 5, "rate_limit must be a pair"),
    ("rate_limit", (1, 2, 3), "rate_limit must be a pair"),
    ("rate_limit", (0, 1), "rate_limit count must be an int >= 1"),
    ("rate_limit", (True, 1), "rate_limit count must be an int >= 1"),
    ("rate_limit", (1, 0), "rate_limit period_seconds must be a finite number > 0"),
    ("rate_limit", (1, float("nan")), "rate_limit period_seconds must be a finite number > 0"),
    ("rate_limit", (1, -2), "rate_limit period_seconds must be a finite number > 0"),
])
def test_register_refuses_a_bad_option_and_registers_nothing(option: str, value: object, message: str) -> None:
    effects = EffectRegistry()
    with pytest.raises(ValueError, match=message):
        effects.register("call", print, **{option: value})
    assert "call" not in effects


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "4", None])
def test_the_executor_refuses_a_bad_concurrency(make: Callable[..., World], value: object) -> None:
    world = make(print)
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        world.executor(concurrency=value)


# -- the worker is never stalled by a call ----------------------------------------------------


def test_a_slow_call_delays_no_delivery_of_the_worker(make: Callable[..., World]) -> None:
    from reliable_flow import Worker

    release, began = threading.Event(), threading.Event()

    def call(c: EffectCall) -> str:
        if c.flow_id == "F0":
            began.set()
            release.wait(5)  # a slow model call
        return "done"

    world = make(call)
    world.ask(1)  # F0 applied: its slow effect is due
    executor = world.executor(concurrency=2)
    worker = Worker(world.producer, [world.consumer], executors=[executor], idle_sleep=0)
    worker.run_once()
    assert began.wait(5) and executor.in_flight == 1
    for flow in ("G1", "G2", "G3"):
        world.producer.advance(f"{flow}-1", flow, expected_seq=0, kind="asked", payload={"q": flow})
    started = time.monotonic()
    worker.run_once()  # relays and applies the three while F0's call is in flight
    took = time.monotonic() - started
    assert not release.is_set() and executor.in_flight >= 1
    assert took < 2.0 and all(world.consumer.projection(f) is not None for f in ("G1", "G2", "G3"))
    release.set()
    worker.run(until_idle=True, handle_signals=False)
    assert world.states([f"k-{f}" for f in ("F0", "G1", "G2", "G3")]) == ["succeeded"] * 4
    assert executor.in_flight == 0


# -- the durable history ----------------------------------------------------------------------


def history(world: World, key: str) -> list[tuple[str, int, str | None]]:
    return [(str(t.transition), t.attempt, t.owner) for t in world.consumer.effect_history(key)]


def test_every_transition_is_a_history_row_in_order(make: Callable[..., World]) -> None:
    from reliable_flow import OutcomeUnknown

    answers: list[Any] = [RetryLater("busy", after=2), OutcomeUnknown("no reply")]

    def call(c: EffectCall) -> None:
        raise answers.pop(0)

    world = make(call, reconcile=lambda c: Happened({"id": 7}))
    [key] = world.ask(1)
    executor = world.executor(owner="ex")
    executor.run_once()
    world.clock.t += 2
    executor.run_once()  # unknown: in doubt
    world.clock.t += 60
    executor.run_once()  # reconciled: it happened
    owner = executor.owner
    assert history(world, key) == [
        ("scheduled", 0, None),
        ("claimed", 1, owner), ("called", 1, owner), ("retry_planned", 1, owner),
        ("claimed", 2, owner), ("called", 2, owner), ("in_doubt", 2, owner),
        ("reconciling", 2, owner), ("reconciled", 2, owner), ("succeeded", 2, owner),
    ]
    rows = world.consumer.effect_history(key)
    assert [t.at for t in rows] == sorted(t.at for t in rows) and rows[0].at == T0
    assert rows[2].detail == "retry: RetryLater: busy"
    assert rows[3].detail.startswith(f"due at {T0 + 2:.3f}")  # type: ignore[union-attr]
    assert rows[8].detail == "reconcile: it happened"
    assert world.consumer.effect_history("no-such-key") == []
    # The due time is a field where the transition left the effect due again;
    # the in-doubt backoff is the policy's, as its detail says.
    doubt = rows[6].due_at
    assert doubt is not None and doubt > rows[6].at and rows[6].detail == f"due at {doubt:.3f}: OutcomeUnknown: no reply"
    assert [t.due_at for t in rows] == [T0, None, None, T0 + 2, None, None, doubt, None, None, None]


def test_a_timeout_a_lease_takeover_and_an_operator_are_in_the_history(make: Callable[..., World]) -> None:
    release = threading.Event()

    def call(c: EffectCall) -> None:
        world.clock.t += 3
        release.wait(20)

    world = make(call, timeout=2)
    [key] = world.ask(1)
    executor = world.executor(owner="ex")
    executor.run_once()
    release.set()
    while executor.in_flight:
        executor.run_once()
    world.clock.t += 60
    executor.run_once()  # neither reconcile nor idempotent: parked
    world.consumer.admin.resolve_effect(key, result={"by": "hand"}, actor="ada", reason="checked the ledger")
    kinds = [str(t.transition) for t in world.consumer.effect_history(key)]
    assert kinds == ["scheduled", "claimed", "timed_out", "released", "parked", "operator"]
    released = world.consumer.effect_history(key)[3]
    assert released.due_at == released.at  # the doubt is due at once; a held timeout and a resolve are not due
    assert [t.due_at is None for t in world.consumer.effect_history(key)] == [False, True, True, False, True, True]
    operator = world.consumer.effect_history(key)[-1]
    assert operator.owner is None and operator.detail == "resolve by ada (unknown -> succeeded): checked the ledger"


def test_a_lease_that_ran_out_is_in_the_history_of_both_executors(make: Callable[..., World]) -> None:
    def call(c: EffectCall) -> str:
        world.clock.t += LEASE + 1
        assert world.executor(owner="second").run_once().work == 1
        return "late"

    world = make(call, reconcile=lambda c: Happened("checked"))
    [key] = world.ask(1)
    first = world.executor(owner="first")
    first.run_once()
    second_owner = next(t.owner for t in world.consumer.effect_history(key) if str(t.transition) == "reconciling")
    assert history(world, key) == [
        ("scheduled", 0, None), ("claimed", 1, first.owner),
        ("lease_expired", 1, first.owner), ("reconciling", 1, second_owner), ("reconciled", 1, second_owner),
        ("succeeded", 1, second_owner), ("lease_lost", 1, first.owner),
    ]


def test_an_operators_retry_is_due_at_once_in_the_history(make: Callable[..., World]) -> None:
    from reliable_flow import PermanentFailure

    def call(c: EffectCall) -> None:
        raise PermanentFailure("no such account")

    world = make(call)
    [key] = world.ask(1)
    world.executor().run_once()
    world.clock.t += 5
    world.consumer.admin.retry_effect(key, actor="ada", reason="account fixed")
    *_, dead, operator = world.consumer.effect_history(key)
    assert (str(dead.transition), dead.due_at) == ("dead", None)
    assert (str(operator.transition), operator.due_at) == ("operator", T0 + 5)


def _consumer_store_one_version_back(engine: str, location: str) -> int:
    """Create a consumer store of ``ask`` named ``tools`` at ``location`` as
    the release before ``effect_history.due_at`` made it (every migration
    but the last), the way that release's own code did; its version."""
    meta = "INSERT INTO meta(key, value) VALUES ('protocol', 'ask'), ('name', 'tools'), ('uid', 'u-old')"
    if engine == "sqlite":
        from reliable_flow._store.sqlite import connection as lite
        from reliable_flow._store.sqlite.schema import CONSUMER, FileKind

        old = FileKind(CONSUMER.name, CONSUMER.application_id, CONSUMER.migrations[:-1])
        lite.Database(location, old, on_create=lambda conn: conn.execute(meta)).close()
        return old.version
    from reliable_flow._store.postgres import connection as pg
    from reliable_flow._store.postgres import location as where
    from reliable_flow._store.postgres.schema import CONSUMER as PG_CONSUMER
    from reliable_flow._store.postgres.schema import StoreKind

    old_pg = StoreKind(PG_CONSUMER.name, PG_CONSUMER.migrations[:-1])
    pg.Database(where.parse(location, old_pg.name), old_pg, on_create=lambda conn: conn.execute(meta)).close()
    return old_pg.version


def _schema_version(engine: str, location: str) -> int:
    query = "PRAGMA user_version" if engine == "sqlite" else "SELECT version FROM rf_identity"
    return int(engine_reads.rows(location, query)[0][0])


def test_an_older_store_gains_the_due_time_and_its_old_rows_have_none(engine: str, tmp_path: Path) -> None:
    location = new_location(engine, tmp_path, "consumer")
    old = _consumer_store_one_version_back(engine, location)
    engine_reads.execute(location, (
        "INSERT INTO effect_history(key, name, at, transition, attempt, owner, detail) "
        "VALUES ('k-old', 'call', 900.0, 'retry_planned', 1, 'ex', 'due at 950.000: busy')"))
    assert _schema_version(engine, location) == old
    effects = EffectRegistry()
    effects.register("call", lambda c: "ok")
    with Producer(new_location(engine, tmp_path, "producer"), ASK) as producer, \
            Consumer(location, ASK, name="tools", effects=effects, clock=Clock(T0), handlers=[
                lambda ctx: ctx.schedule("call", {"q": "x"}, key="k-new")]) as consumer:
        assert _schema_version(engine, location) == old + 1
        [row] = consumer.effect_history("k-old")
        assert (row.detail, row.due_at) == ("due at 950.000: busy", None)  # kept as written; no due time then
        producer.advance("F-1", "F", expected_seq=0, kind="asked", payload={"q": "x"})
        assert relay(producer, consumer, register=True).status == "accepted"
        assert consumer.apply_next("F").status == "applied"
        assert [(str(t.transition), t.due_at) for t in consumer.effect_history("k-new")] == [("scheduled", T0)]


def test_pruning_removes_an_effects_history_with_it(make: Callable[..., World]) -> None:
    world = make(lambda c: "ok")
    [key] = world.ask(1)
    world.executor().run_once()
    assert len(world.consumer.effect_history(key)) == 4
    world.clock.t += 10_000
    world.consumer.admin.prune(older_than=60, actor="ops", reason="retention")
    assert world.consumer.scheduled_effect(key) is None and world.consumer.effect_history(key) == []


def test_inspect_effect_shows_the_history(make: Callable[..., World], capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from reliable_flow._tools.cli import main

    world = make(lambda c: {"sent": True})
    [key] = world.ask(1)
    world.executor(owner="ex").run_once()
    producer, consumer = world.producer_location, world.location  # as given (a location unmasked)
    assert main(["inspect", producer, consumer, "--effect", key]) == 0
    out = capsys.readouterr().out
    assert f"effect '{key}' (call) of consumer 'tools': succeeded, attempts 1" in out
    steps = [line.split()[1] for line in out.splitlines() if " attempt " in line]
    assert steps == ["scheduled", "claimed", "called", "succeeded"], out
    assert "called           attempt 1 [" in out and out.rstrip().endswith("nothing needs attention (stuck after 300 s)")
    assert "scheduled        attempt 0 due 1970-01-01T00:16:40+00:00\n" in out  # T0: due from its scheduling
    assert main(["inspect", producer, consumer, "--effect", key, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["transition"] for t in report["consumer"]["history"]] == ["scheduled", "claimed", "called", "succeeded"]
    assert [t["due_at"] for t in report["consumer"]["history"]] == [T0, None, None, None]


# -- caps and rate limits, across executors ---------------------------------------------------


def test_a_names_concurrency_cap_holds_across_executors(make: Callable[..., World]) -> None:
    gauge = Gauge()

    def call(c: EffectCall) -> None:
        gauge.enter()
        time.sleep(0.15)
        gauge.leave()

    world = make(call, concurrency=2)
    keys = world.ask(8)
    done: list[int] = []

    def run_one(owner: str) -> None:
        consumer = world.open_consumer()  # each executor its own store object, in its own thread
        try:
            executor = world.executor(consumer, owner=owner, concurrency=4)
            while True:
                taken = executor.run_once().work
                done.append(taken)
                if taken == 0 and consumer.effect_counts()["succeeded"] == 8:
                    return
                time.sleep(0.02)
        finally:
            consumer.close()

    threads = [threading.Thread(target=run_one, args=(f"ex{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert world.states(keys) == ["succeeded"] * 8 and sum(done) == 8
    assert gauge.most == 2  # 2 executors x concurrency 4, yet never more than the cap of 2


def test_a_rate_limit_holds_across_executors_and_spreads_the_starts(make: Callable[..., World]) -> None:
    calls: list[float] = []
    world = make(lambda c: calls.append(world.clock.t), rate_limit=(2, 10))  # 2 per 10 s: 5 s apart
    keys = world.ask(5)
    first, second = world.executor(owner="a", concurrency=4), world.executor(owner="b", concurrency=4)
    assert first.run_once().work == 1
    assert second.run_once().work == 0  # the same name's starts, counted from the store
    assert calls == [T0]
    waiting = [world.consumer.scheduled_effect(k) for k in keys[1:]]
    # put off to the next free start times, one spacing apart: they wake one at a time
    assert [(e.state, e.due_at) for e in waiting] == [  # type: ignore[union-attr]
        ("pending", T0 + 5), ("pending", T0 + 10), ("pending", T0 + 15), ("pending", T0 + 20)]
    limited = [t for t in world.consumer.effect_history(keys[2]) if str(t.transition) == "rate_limited"]
    assert [t.due_at for t in limited] == [T0 + 10]
    world.clock.t = T0 + 5
    assert second.run_once().work == 1 and calls == [T0, T0 + 5]
    # 5 s apart, and never a third in 12.5 s (the period and half the spacing: room for jitter)
    world.clock.t = T0 + 10
    assert second.run_once().work == 0  # the second start was at T0 + 5: a third waits for T0 + 12.5
    for t in (T0 + 12.5, T0 + 17.5, T0 + 25):
        world.clock.t = t - 0.001
        assert second.run_once().work == 0
        world.clock.t = t
        assert second.run_once().work == 1 and calls[-1] == t
    assert calls == [T0, T0 + 5, T0 + 12.5, T0 + 17.5, T0 + 25]
    assert [str(t.transition) for t in world.consumer.effect_history(keys[2])].count("rate_limited") == 1
    assert world.states(keys) == ["succeeded"] * 5


# -- metrics ----------------------------------------------------------------------------------


def test_the_executors_metrics_count_starts_waits_heartbeats_and_timeouts(make: Callable[..., World]) -> None:
    from reliable_flow.metrics import ExecutorMetrics, prometheus_text

    release = threading.Event()

    def call(c: EffectCall) -> None:
        c.heartbeat()
        if c.flow_id == "F0":  # outlives its timeout (the clock is shared)
            world.clock.t += 3
            release.wait(20)

    world = make(call, timeout=2, rate_limit=(2, 10))  # F0 starts; F1 and F2 wait for a start
    world.ask(3)
    executor = world.executor(owner="ex", concurrency=4)
    executor.run_once()
    m = executor.metrics()
    assert isinstance(m, ExecutorMetrics)
    assert (m.concurrency, m.in_flight, m.started, m.rate_limited) == (4, {"call": 1}, {"call": 1}, 2)
    assert (m.heartbeats, m.timeouts, m.lease_lost) == (1, 1, 0) and m.renewals >= 1
    text = prometheus_text([m])
    assert 'reliable_flow_effect_starts_total{consumer="tools",owner="' in text
    assert "reliable_flow_effect_timeouts_total{" in text and text.count("# TYPE reliable_flow_effect_") == 9
    release.set()
    while executor.in_flight:
        executor.run_once()
    assert executor.metrics().in_flight == {}


def test_an_async_heartbeat_does_not_block_the_loop(make: Callable[..., World]) -> None:
    ticks: list[float] = []

    async def ticker(c: EffectCall) -> str:
        if c.flow_id == "F0":
            world.clock.t += 20
            await c.aheartbeat()
            reader = world.open_consumer()
            due = reader.scheduled_effect(c.key).due_at  # type: ignore[union-attr]
            reader.close()
            return f"{due}"
        for _ in range(5):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)
        return "ticked"

    world = make(ticker)
    keys = world.ask(2)
    executor = world.executor(concurrency=2)
    executor.run_once()
    executor.close()
    assert world.consumer.scheduled_effect(keys[0]).result == f"{T0 + 20 + LEASE}"  # type: ignore[union-attr]
    assert len(ticks) == 5 and world.states(keys) == ["succeeded", "succeeded"]


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "many"])
def test_the_commands_refuse_a_bad_concurrency(value: str, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    from reliable_flow._tools.cli import main

    consumer = tmp_path / "c.db"
    for argv in (["execute", str(consumer), "--effects", "m:EFFECTS", "--concurrency", value],
                 ["run", "--producer", str(tmp_path / "p.db"), "--consumer", f"c={consumer}", "--concurrency", value]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and "--concurrency: must be an int >= 1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing created
