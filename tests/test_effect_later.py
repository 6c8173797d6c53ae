"""Delayed effects and rate limits that spread (issue 33, items 1 and 5).

``ctx.schedule(name, payload, after=seconds)`` / ``at=epoch_seconds``: never
started before its time, durable, cancelled or superseded like any effect,
shown by ``inspect`` and the metrics; bad input refused with nothing stored.
A ``rate_limit=(count, period)``: starts at least ``period / count`` apart and
at most ``count`` in any window of ``period`` (by start time, across
executors), and one ``rate_limited`` history row per wait.

Both engines (the ``engine`` fixture); an injected clock where it is about
time, real threads and a fake service where it is about what a provider sees.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
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
    Producer,
    relay,
)
from reliable_flow.protocol import Protocol, by_kind, exact, text
from support import Clock

T0 = 1_000.0
DAY = 86_400.0
TICKET = Protocol(
    name="ticket", initial="new",
    transitions={"new": ["asked"], "asked": ["answered"], "answered": ["asked"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "answered": exact({"a": text()})})},
)


class World:
    """A producer and a consumer of ``ticket`` on one engine; ``on_apply`` is
    the consumer's handler."""

    def __init__(self, engine: str, tmp_path: Path, effects: EffectRegistry,
                 on_apply: Callable[[ApplyContext], None]) -> None:
        self.clock = Clock(T0)
        self.producer = Producer(new_location(engine, tmp_path, "producer"), TICKET)
        self.location = new_location(engine, tmp_path, "consumer")
        self.effects, self.on_apply = effects, on_apply
        self.consumer = self.open_consumer()
        self.seqs: dict[str, int] = {}

    def open_consumer(self) -> Consumer:
        return Consumer(self.location, TICKET, name="support", handlers=[self.on_apply], effects=self.effects,
                        clock=self.clock)

    def step(self, flow: str, kind: str, payload: dict[str, str]) -> str:
        """Advance, relay and apply one step of ``flow``; the apply's status."""
        seq = self.seqs.get(flow, 0)
        assert self.producer.advance(f"{flow}-{seq + 1}", flow, expected_seq=seq, kind=kind,
                                     payload=payload).status == "committed"
        self.seqs[flow] = seq + 1
        assert relay(self.producer, self.consumer, register=True).status == "accepted"
        return str(self.consumer.apply_next(flow).status)

    def executor(self, consumer: Consumer | None = None, owner: str = "ex", clock: Any = None,
                 **kw: Any) -> EffectExecutor:
        policy = DeliveryPolicy(lease_seconds=30, clock=clock or self.clock, random=lambda: 0.5, owner=owner)
        return EffectExecutor(consumer or self.consumer, policy=policy, **kw)


@pytest.fixture
def make(engine: str, tmp_path: Path) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def build(on_apply: Callable[[ApplyContext], None], run: Callable[[EffectCall], Any] = lambda c: None,
              **options: Any) -> World:
        effects = EffectRegistry()
        effects.register("follow_up", run, **options)
        made.append(World(engine, tmp_path, effects, on_apply))
        return made[-1]

    yield build
    for world in made:
        world.consumer.close()
        world.producer.close()


def follow_up_in_a_day(ctx: ApplyContext) -> None:
    """The agent example: follow up in 24 hours unless the customer answered."""
    key = f"follow-{ctx.event.flow_id}"
    if ctx.event.kind == "asked":
        ctx.schedule("follow_up", {"q": ctx.event.payload["q"]}, key=key, after=DAY)
    elif ctx.event.kind == "answered":
        ctx.cancel(key, "the customer answered")


# -- delayed effects --------------------------------------------------------------------------


def test_a_delayed_effect_never_starts_before_its_time(make: Callable[..., World]) -> None:
    calls: list[float] = []
    world = make(follow_up_in_a_day, lambda c: calls.append(world.clock.t))
    assert world.step("T1", "asked", {"q": "where is my order?"}) == "applied"
    effect = world.consumer.scheduled_effect("follow-T1")
    assert effect is not None and (effect.state, effect.due_at) == ("pending", T0 + DAY)
    [scheduled] = world.consumer.effect_history("follow-T1")
    assert (str(scheduled.transition), scheduled.at, scheduled.due_at) == ("scheduled", T0, T0 + DAY)
    executor = world.executor(concurrency=4)
    for t in (T0, T0 + 3600, T0 + DAY - 0.001):
        world.clock.t = t
        assert executor.run_once().work == 0 and calls == []
    world.clock.t = T0 + DAY
    assert executor.run_once().work == 1 and calls == [T0 + DAY]
    assert str(world.consumer.scheduled_effect("follow-T1").state) == "succeeded"  # type: ignore[union-attr]


def test_a_delayed_effect_is_durable_across_a_reopen_and_at_takes_epoch_seconds(
        make: Callable[..., World]) -> None:
    calls: list[str] = []

    def at_noon(ctx: ApplyContext) -> None:
        ctx.schedule("follow_up", {"q": "x"}, key=f"at-{ctx.event.flow_id}", at=T0 + 500)

    world = make(at_noon, lambda c: calls.append(c.key))
    world.step("T1", "asked", {"q": "?"})
    world.consumer.close()
    world.consumer = world.open_consumer()  # nothing of the wait is in memory
    world.clock.t = T0 + 499
    assert world.executor().run_once().work == 0
    world.clock.t = T0 + 500
    assert world.executor().run_once().work == 1 and calls == ["at-T1"]


def test_unless_the_customer_answered_cancel_or_supersede(make: Callable[..., World]) -> None:
    calls: list[str] = []
    world = make(follow_up_in_a_day, lambda c: calls.append(c.key))
    world.step("T1", "asked", {"q": "?"})
    world.clock.t = T0 + 3600
    world.step("T1", "answered", {"a": "found it"})  # the next step cancels the follow-up
    world.clock.t = T0 + DAY + 1
    assert world.executor().run_once().work == 0 and calls == []
    assert str(world.consumer.scheduled_effect("follow-T1").state) == "cancelled"  # type: ignore[union-attr]

    def superseded(ctx: ApplyContext) -> None:  # the same, as a version: only if nothing newer happened
        if ctx.event.kind == "asked":
            ctx.schedule("follow_up", {"q": "?"}, key=f"v-{ctx.event.flow_id}", after=DAY, version=ctx.event.seq)

    other = make(superseded, lambda c: calls.append(c.key))
    other.step("T2", "asked", {"q": "?"})
    other.step("T2", "answered", {"a": "ok"})
    other.clock.t = T0 + DAY
    executor = other.executor()
    executor.run_once()
    assert calls == [] and str(other.consumer.scheduled_effect("v-T2").state) == "superseded"  # type: ignore


@pytest.mark.parametrize(("options", "message"), [
    ({"after": float("nan")}, "after must be a finite number >= 0"),
    ({"after": float("inf")}, "after must be a finite number >= 0"),
    ({"after": -1}, "after must be a finite number >= 0"),
    ({"after": True}, "after must be a finite number >= 0"),
    ({"after": "60"}, "after must be a finite number >= 0"),
    ({"at": float("-inf")}, "at must be a finite number >= 0"),
    ({"at": float("nan")}, "at must be a finite number >= 0"),
    ({"at": False}, "at must be a finite number >= 0"),
    ({"at": "tomorrow"}, "at must be a finite number >= 0"),
    ({"after": 60, "at": T0 + 60}, "give after or at, not both"),
])
def test_a_bad_delay_is_refused_naming_it_and_nothing_is_stored(
        make: Callable[..., World], options: dict[str, Any], message: str) -> None:
    world = make(lambda ctx: ctx.schedule("follow_up", {"q": "?"}, **options))
    world.producer.advance("T1-1", "T1", expected_seq=0, kind="asked", payload={"q": "?"})
    relay(world.producer, world.consumer, register=True)
    with pytest.raises(ValueError, match=message):
        world.consumer.apply_next("T1")
    assert world.consumer.scheduled_effects() == []
    assert world.consumer.projection("T1") is None  # the apply rolled back with it


def test_inspect_and_the_metrics_show_the_next_due_times(make: Callable[..., World]) -> None:
    from reliable_flow._tools.inspection import format_report, inspect_files
    from reliable_flow.metrics import prometheus_text

    world = make(follow_up_in_a_day)
    world.step("T1", "asked", {"q": "?"})
    world.clock.t = T0 + 60
    world.step("T2", "asked", {"q": "?"})
    m = world.consumer.metrics()
    assert (m.timers, m.next_due) == ({"follow_up": 2}, {"follow_up": T0 + DAY})
    text = prometheus_text([m])
    assert 'reliable_flow_effects_waiting_for_time{consumer="support",effect="follow_up"} 2' in text
    assert f'reliable_flow_effect_next_due_timestamp_seconds{{consumer="support",effect="follow_up"}} {int(T0 + DAY)}' \
        in text
    report = inspect_files(world.producer.location, world.location, now=T0 + 60)
    assert report["consumer"]["effects"]["timers"] == [
        {"name": "follow_up", "waiting": 2, "next_due": T0 + DAY, "next_key": "follow-T1"}]
    shown = format_report(report)
    assert "effects waiting for a time" in shown and "follow-T1" in shown
    # the console's overview: the same timers, per consumer
    from reliable_flow.console._data import Console
    from reliable_flow.console._pages import overview_page

    overview = Console(world.producer.location, [world.location], redact=None, stuck_after=300).overview(T0 + 60)
    assert overview["consumers"][0]["timers"] == [{"name": "follow_up", "waiting": 2, "next_due": T0 + DAY}]
    page = str(overview_page("", overview))
    assert "Effects waiting for a time" in page and "follow_up" in page
    world.clock.t = T0 + DAY + 60  # both due: no timer left
    assert world.consumer.metrics().timers == {}


# -- rate limits that spread ------------------------------------------------------------------


def _most_in_a_window(times: list[float], period: float) -> int:
    """The most of ``times`` in any half-open window ``[t, t + period)``: a
    provider's own sliding window of the same size."""
    ordered = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(ordered):
        while t - ordered[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_starts_are_spread_and_a_wait_writes_one_history_row(make: Callable[..., World]) -> None:
    calls: list[float] = []
    world = make(lambda ctx: ctx.schedule("follow_up", {"q": "?"}, key=f"r-{ctx.event.flow_id}"),
                 lambda c: calls.append(world.clock.t), rate_limit=(20, 1))
    flows = [f"T{i}" for i in range(60)]
    for flow in flows:
        world.step(flow, "asked", {"q": "?"})
    executor = world.executor(concurrency=64)
    while executor.stats.started < len(flows) and world.clock.t < T0 + 10:
        executor.run_once(limit=64)
        world.clock.t = round(world.clock.t + 0.01, 6)  # a pass every 10 ms
    assert len(calls) == 60 and _most_in_a_window(calls, 1.0) == 20
    assert _most_in_a_window(calls, 1.025) == 20  # the window with its margin: 1 s + 1 s / 20 / 2
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert min(gaps) >= 0.05 - 1e-9  # 1 s / 20, never a burst
    rows = [t for f in flows for t in world.consumer.effect_history(f"r-{f}") if str(t.transition) == "rate_limited"]
    assert len(rows) == 59  # each effect that waited: one row for its wait (the first started at once)
    assert executor.stats.rate_limited == 59 and executor.metrics().rate_limited == 59


def test_a_provider_sliding_window_is_never_exceeded_with_real_threads(make: Callable[..., World]) -> None:
    """Two executors on threads of their own, concurrency 16 each, the real
    clock: a fake service stamps each call as it arrives."""
    arrived: list[float] = []
    lock = threading.Lock()

    def service(c: EffectCall) -> None:
        with lock:
            arrived.append(time.time())
        time.sleep(0.02)  # the provider's latency

    count, period = 5, 0.5
    world = make(lambda ctx: ctx.schedule("follow_up", {"q": "?"}, key=f"r-{ctx.event.flow_id}"),
                 service, rate_limit=(count, period))
    for i in range(24):
        world.step(f"T{i}", "asked", {"q": "?"})
    errors: list[BaseException] = []

    def run(owner: str) -> None:
        consumer = world.open_consumer()
        try:
            executor = world.executor(consumer, owner=owner, clock=time.time, concurrency=16)
            executor.run(until_idle=True, handle_signals=False, idle_sleep=0.01)
            executor.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            consumer.close()

    threads = [threading.Thread(target=run, args=(owner,)) for owner in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(arrived) == 24
    assert _most_in_a_window(arrived, period) <= count
    starts = [t.at for i in range(24) for t in world.consumer.effect_history(f"r-T{i}")
              if str(t.transition) == "claimed"]
    assert len(starts) == 24 and _most_in_a_window(starts, period) <= count  # by start time: guaranteed
