"""Recurring effects (issue 33, item 2): ``EffectRegistry.every``.

A schedule is declared on the registry and recorded in the consumer's store
when an executor opens; each due tick becomes an ordinary effect keyed
``schedule:<name>:<tick>`` in the claim transaction that moves the schedule
on, so two executors never make one tick twice, and a killed executor's
tick is performed exactly once in effect by the effect machinery.  Missed
ticks (one / all / skip), the operator's pause / resume / remove (recorded,
and from the command line), the cron parser against croniter's answers and
a hand-checked daylight-saving table, bad input, and a reopen.

Both engines (the ``engine`` fixture); an injected clock except in the kill
test, which runs real executor processes on the real clock.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from children.every_child import registry as child_registry
from engine_reads import new_location
from reliable_flow import Consumer, DeliveryPolicy, EffectCall, EffectExecutor, EffectRegistry
from reliable_flow._core.cron import CronError, parse_cron
from reliable_flow._tools.cli import main as cli_main
from reliable_flow.errors import (
    InvalidEnvelope,
    NotResolvable,
    ScheduleConflict,
    UnknownEffect,
    UnknownSchedule,
)
from reliable_flow.metrics import prometheus_text
from reliable_flow.reservation import RESERVATION
from support import Clock

CHILDREN = Path(__file__).parent / "children"
T0 = 1_000_000.0  # the ticks below are worked out from it (it is no multiple of 60)
MINUTE = 60.0


class Ticks:
    """A consumer on one engine with a registry whose effect ``digest``
    records the keys it was called with."""

    def __init__(self, location: str, clock: Clock) -> None:
        self.location, self.clock = location, clock
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.consumers: list[Consumer] = []

    def registry(self, **every: Any) -> EffectRegistry:
        effects = EffectRegistry()

        def digest(call: EffectCall) -> None:
            with self.lock:
                self.calls.append(call.key)

        effects.register("digest", digest)
        if every:
            effects.every("digest", {"to": "team"}, **every)
        return effects

    def consumer(self, effects: EffectRegistry) -> Consumer:
        self.consumers.append(Consumer(self.location, RESERVATION, name="ticks", effects=effects, clock=self.clock))
        return self.consumers[-1]

    def executor(self, owner: str = "ex", **every: Any) -> EffectExecutor:
        consumer = self.consumer(self.registry(**every))
        policy = DeliveryPolicy(lease_seconds=30, clock=self.clock, random=lambda: 0.5, owner=owner)
        return EffectExecutor(consumer, policy=policy)


@pytest.fixture
def ticks(engine: str, tmp_path: Path) -> Iterator[Ticks]:
    world = Ticks(new_location(engine, tmp_path, "consumer"), Clock(T0))
    yield world
    for consumer in world.consumers:
        consumer.close()


def key(tick: float, name: str = "digest") -> str:
    return f"schedule:{name}:" + f"{tick:.3f}".rstrip("0").rstrip(".")


# -- declaring and recording ------------------------------------------------------------------


def test_an_interval_schedule_ticks_on_its_multiples_once_each(ticks: Ticks) -> None:
    executor = ticks.executor(interval=MINUTE)
    [stored] = executor.consumer.admin.schedules()
    first = (T0 // MINUTE + 1) * MINUTE
    assert (stored.schedule, stored.name, stored.payload, stored.next_at, stored.last_tick, stored.paused) == (
        "digest", "digest", {"to": "team"}, first, None, False)
    assert executor.run_once().work == 0 and ticks.calls == []  # not before its time
    for n in range(3):
        ticks.clock.t = first + n * MINUTE + 0.5
        assert executor.run_once().work == 1
        assert executor.run_once().work == 0  # the same tick is never made twice
    assert ticks.calls == [key(first), key(first + MINUTE), key(first + 2 * MINUTE)]
    effect = executor.consumer.scheduled_effect(key(first))
    assert effect is not None and (str(effect.state), effect.flow_id, effect.payload) == (
        "succeeded", "schedule:digest", {"to": "team"})
    assert effect.meta == {"schedule": "digest", "tick": key(first).rsplit(":", 1)[1]}
    [scheduled, *_] = executor.consumer.effect_history(key(first))
    assert (str(scheduled.transition), scheduled.due_at) == ("scheduled", first)
    [stored] = executor.consumer.admin.schedules()
    assert (stored.last_tick, stored.next_at, stored.skipped) == (first + 2 * MINUTE, first + 3 * MINUTE, 0)


def test_the_same_name_with_another_definition_is_refused_until_an_operator_removes_it(ticks: Ticks) -> None:
    ticks.executor(interval=MINUTE)
    ticks.executor(interval=MINUTE)  # the same definition: fine, nothing changes
    with pytest.raises(ScheduleConflict, match=r"interval 60\.0 -> 120\.0"):
        ticks.executor(interval=2 * MINUTE)
    consumer = ticks.consumers[0]
    [stored] = consumer.admin.schedules()
    assert stored.interval == MINUTE  # nothing recorded
    record = consumer.admin.remove_schedule("digest", actor="ops", reason="every two minutes now")
    assert (record.action, record.schedule, str(record.target)) == ("remove", "digest", "schedule")
    assert consumer.admin.schedules() == []
    ticks.executor(interval=2 * MINUTE)
    [stored] = consumer.admin.schedules()
    assert stored.interval == 2 * MINUTE
    assert [a.action for a in consumer.admin.schedule_actions("digest")] == ["remove"]


def test_a_schedule_survives_a_reopen_and_a_new_executor_goes_on_from_the_stored_tick(ticks: Ticks) -> None:
    executor = ticks.executor(interval=MINUTE)
    first = executor.consumer.admin.schedules()[0].next_at
    ticks.clock.t = first
    assert executor.run_once().work == 1
    executor.consumer.close()
    ticks.clock.t = first + MINUTE
    again = ticks.executor(interval=MINUTE)  # a new process: nothing of the schedule is in memory
    assert again.run_once().work == 1
    assert ticks.calls == [key(first), key(first + MINUTE)]


def test_an_executor_without_the_declaration_still_ticks_a_stored_schedule_of_its_effect(ticks: Ticks) -> None:
    declared = ticks.executor(interval=MINUTE)
    first = declared.consumer.admin.schedules()[0].next_at
    plain = ticks.executor()  # registers "digest" but declares nothing: the store is the truth
    ticks.clock.t = first
    assert plain.run_once().work == 1 and declared.run_once().work == 0
    assert ticks.calls == [key(first)]


# -- exactly once across executors ------------------------------------------------------------


def test_racing_executors_make_each_tick_once(ticks: Ticks) -> None:
    first = ticks.executor(interval=MINUTE).consumer.admin.schedules()[0].next_at
    racers, rounds = 3, 12
    barrier = threading.Barrier(racers + 1)
    errors: list[BaseException] = []

    def race(owner: str) -> None:
        try:
            executor = ticks.executor(owner=owner, interval=MINUTE)  # its own consumer, on this thread
            for _ in range(rounds):
                barrier.wait()  # the clock was moved on to the next tick
                executor.run_once()
                barrier.wait()
            with ticks.lock:
                ticks.consumers.remove(executor.consumer)
            executor.consumer.close()  # on the thread that opened it
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=race, args=(f"ex{i}",)) for i in range(racers)]
    for t in threads:
        t.start()
    for n in range(rounds):
        ticks.clock.t = first + n * MINUTE
        barrier.wait()
        barrier.wait()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(ticks.calls) == sorted(key(first + n * MINUTE) for n in range(rounds))
    made = ticks.consumers[0].scheduled_effects()
    assert len(made) == rounds
    for effect in made:  # one "scheduled" row per tick: no executor made it a second time
        history = ticks.consumers[0].effect_history(effect.key)
        assert [str(t.transition) for t in history].count("scheduled") == 1


def test_a_schedule_moves_on_only_from_the_next_tick_it_was_read_with(ticks: Ticks) -> None:
    consumer = ticks.executor(interval=MINUTE).consumer
    [stored] = consumer.admin.schedules()
    with consumer.store.write() as unit:
        assert unit.advance_schedule("digest", stored.next_at - 1, stored.next_at + MINUTE, None, 0, T0) is False
        assert unit.advance_schedule("digest", stored.next_at, stored.next_at + MINUTE, None, 0, T0) is True
        assert unit.advance_schedule("digest", stored.next_at, stored.next_at + 2 * MINUTE, None, 0, T0) is False
    assert consumer.admin.schedules()[0].next_at == stored.next_at + MINUTE


@pytest.mark.parametrize("kills", [12])
def test_a_killed_executor_leaves_every_tick_performed_exactly_once(engine: str, tmp_path: Path,
                                                                     kills: int) -> None:
    location = new_location(engine, tmp_path, "consumer")
    log = tmp_path / "service.log"
    interval = 0.05
    rng = random.Random(os.environ.get("RELIABLE_FLOW_SEED", "every"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    for _ in range(kills):
        child = subprocess.Popen([sys.executable, str(CHILDREN / "every_child.py"), location, str(log),
                                  str(interval)], env=env, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.02, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    effects = child_registry(str(log), None)  # the effect, not its declaration
    with Consumer(location, RESERVATION, name="ticks", effects=effects) as consumer:
        consumer.admin.pause_schedule("tick", actor="test", reason="drain what the kills left")
        [stored] = consumer.admin.schedules()
        assert stored.last_tick is not None
        # Past every lease: what a killed incarnation left running is reconciled now.
        later = time.time() + 60
        policy = DeliveryPolicy(lease_seconds=30, owner="drain", clock=lambda: later)
        EffectExecutor(consumer, policy=policy).run_until_idle()
        made = consumer.scheduled_effects()
        settled = sum(1 for e in made if "reconciling" in {str(t.transition) for t in consumer.effect_history(e.key)})
    first = min(round(float(e.key.rsplit(":", 1)[1]) / interval) for e in made)
    last = round(stored.last_tick / interval)
    expected = {key(round(k * interval, 3), "tick") for k in range(first, last + 1)}
    assert {e.key for e in made} == expected  # no tick lost (missed="all"), none made twice
    assert {str(e.state) for e in made} == {"succeeded"}
    performed = [line for line in log.read_text().splitlines() if line.startswith("schedule:")]
    assert sorted(performed) == sorted(expected)  # each performed once at the counting service
    assert len(expected) >= kills  # the campaign did run ticks
    assert settled >= 1  # and some kill landed in the middle of one, which reconcile settled


# -- missed ticks -----------------------------------------------------------------------------


@pytest.mark.parametrize(("missed", "performed", "skipped"), [
    ("one", [9], 9), ("all", list(range(10)), 0), ("skip", [], 10),
])
def test_missed_ticks(ticks: Ticks, missed: str, performed: list[int], skipped: int) -> None:
    executor = ticks.executor(interval=MINUTE, missed=missed)
    first = executor.consumer.admin.schedules()[0].next_at
    ticks.clock.t = first + 9 * MINUTE + 40  # every executor was down for ten ticks; the 10th is 40 s late
    executor.run_until_idle()
    assert ticks.calls == [key(first + n * MINUTE) for n in performed]
    [stored] = executor.consumer.admin.schedules()
    assert (stored.skipped, stored.next_at) == (skipped, first + 10 * MINUTE)
    ticks.clock.t = first + 10 * MINUTE  # the next tick, on time, whatever missed says
    executor.run_until_idle()
    assert ticks.calls[-1] == key(first + 10 * MINUTE)


def test_skip_performs_a_tick_found_on_time(ticks: Ticks) -> None:
    executor = ticks.executor(interval=3600.0, missed="skip")
    first = executor.consumer.admin.schedules()[0].next_at
    ticks.clock.t = first + 30  # 30 s after its time: on time (within a minute)
    assert executor.run_once().work == 1
    ticks.clock.t = first + 3600 + 61  # a minute and more late: missed, skipped
    assert executor.run_once().work == 0
    assert ticks.calls == [key(first)]


def test_all_catches_up_at_most_100_ticks(ticks: Ticks) -> None:
    executor = ticks.executor(interval=1.0, missed="all")
    first = executor.consumer.admin.schedules()[0].next_at
    ticks.clock.t = first + 149
    executor.run_until_idle(max_passes=10)
    assert sorted(ticks.calls) == sorted(key(first + n) for n in range(50, 150))
    assert executor.consumer.admin.schedules()[0].skipped == 50


# -- the operator -----------------------------------------------------------------------------


def test_pause_resume_and_remove_are_recorded_and_effective(ticks: Ticks) -> None:
    executor = ticks.executor(interval=MINUTE)
    admin = executor.consumer.admin
    first = admin.schedules()[0].next_at
    pause = admin.pause_schedule("digest", actor="ana", reason="provider outage")
    assert (pause.action, pause.actor, pause.reason, pause.schedule) == ("pause", "ana", "provider outage", "digest")
    with pytest.raises(NotResolvable, match="already paused"):
        admin.pause_schedule("digest", actor="ana", reason="again")
    ticks.clock.t = first + 5 * MINUTE
    assert executor.run_once().work == 0 and ticks.calls == []
    assert admin.schedules()[0].paused is True
    admin.resume_schedule("digest", actor="ana", reason="provider back")
    assert admin.schedules()[0].next_at == first + 6 * MINUTE  # the paused ticks are not performed
    assert executor.run_once().work == 0
    ticks.clock.t = first + 6 * MINUTE
    assert executor.run_once().work == 1 and ticks.calls == [key(first + 6 * MINUTE)]
    with pytest.raises(NotResolvable, match="not paused"):
        admin.resume_schedule("digest", actor="ana", reason="again")
    admin.remove_schedule("digest", actor="ana", reason="no more digests")
    ticks.clock.t = first + 7 * MINUTE
    assert executor.run_once().work == 0 and len(ticks.calls) == 1
    with pytest.raises(UnknownSchedule):
        admin.pause_schedule("digest", actor="ana", reason="gone")
    assert [(a.action, a.actor) for a in admin.schedule_actions()] == [
        ("pause", "ana"), ("resume", "ana"), ("remove", "ana")]
    with pytest.raises(ValueError, match="actor"):
        admin.pause_schedule("digest", actor=" ", reason="x")


def test_the_command_line_pauses_resumes_and_removes(ticks: Ticks, capsys: pytest.CaptureFixture[str]) -> None:
    executor = ticks.executor(interval=MINUTE)
    executor.consumer.close()
    base = ["schedule", "pause", ticks.location, "digest", "--actor", "ops", "--reason", "maintenance"]
    assert cli_main(base) == 0
    assert "schedule pause: schedule 'digest' is paused" in capsys.readouterr().out
    assert cli_main(base) == 1  # already paused: refused by the rules
    assert "refused" in capsys.readouterr().err
    assert cli_main(["schedule", "resume", ticks.location, "digest", "--actor", "ops", "--reason", "done",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["action"] == "resume"
    assert cli_main(["schedule", "remove", ticks.location, "nope", "--actor", "ops", "--reason", "x"]) == 2
    with Consumer(ticks.location, RESERVATION) as consumer:
        assert [a.action for a in consumer.admin.schedule_actions()] == ["pause", "resume"]


def test_inspect_and_the_metrics_show_the_schedules(ticks: Ticks, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, engine: str) -> None:
    executor = ticks.executor(interval=MINUTE)
    first = executor.consumer.admin.schedules()[0].next_at
    ticks.clock.t = first
    executor.run_once()
    executor.consumer.admin.pause_schedule("digest", actor="ops", reason="quiet hours")
    text = prometheus_text([executor.consumer.metrics()])
    assert f'reliable_flow_schedule_next_tick_timestamp_seconds{{consumer="ticks",schedule="digest"}} ' \
           f'{first + MINUTE:g}' in text or "schedule_next_tick" in text
    assert 'reliable_flow_schedule_paused{consumer="ticks",schedule="digest"} 1' in text
    assert 'reliable_flow_schedule_last_tick_timestamp_seconds{consumer="ticks",schedule="digest"}' in text
    from reliable_flow import Producer

    producer = Producer(new_location(engine, tmp_path, "producer"), RESERVATION)
    producer.close()
    args = ["inspect", str(producer.store.location), ticks.location]
    cli_main(args)
    out = capsys.readouterr().out
    assert "recurring schedules" in out and "schedule=digest" in out and "state=paused" in out
    cli_main([*args, "--json"])
    report = json.loads(capsys.readouterr().out)
    [shown] = report["consumer"]["schedules"]
    assert (shown["schedule"], shown["paused"], shown["last_tick"], shown["next_at"]) == (
        "digest", True, first, first + MINUTE)
    assert report["consumer"]["schedule_actions"][0]["action"] == "pause"


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"interval": float("nan")}, ValueError, "interval"),
    ({"interval": float("inf")}, ValueError, "interval"),
    ({"interval": True}, TypeError, "interval"),
    ({"interval": 0}, ValueError, "interval"),
    ({"interval": -5}, ValueError, "interval"),
    ({"interval": "60"}, TypeError, "interval"),
    ({}, ValueError, "exactly one of interval"),
    ({"interval": 60, "cron": "* * * * *"}, ValueError, "exactly one of interval"),
    ({"cron": "61 * * * *"}, CronError, "minute field"),
    ({"cron": "\u0663 * * * *"}, CronError, "minute field"),  # an Arabic-Indic 3: a digit to str.isdigit
    ({"cron": "0 \u00b2 * * *"}, CronError, "hour field"),  # a superscript 2
    ({"cron": "0 8 * * mon-xyz"}, CronError, "day-of-week field"),
    ({"cron": "0 8 * *"}, CronError, "five are needed"),
    ({"cron": "0 0 30 2 *"}, CronError, "no tick"),
    ({"cron": "*/0 * * * *"}, CronError, "minute field: step"),
    ({"cron": "0 8 * * 1-5", "tz": "Mars/Olympus"}, ValueError, "tz: unknown time zone"),
    ({"cron": "0 8 * * 1-5", "tz": 3}, ValueError, "tz must be"),
    ({"interval": 60, "missed": "some"}, ValueError, "missed"),
    ({"interval": 60, "payload": {"x": float("nan")}}, InvalidEnvelope, "payload"),
    ({"interval": 60, "schedule": ""}, InvalidEnvelope, "schedule"),
])
def test_bad_input_is_refused_naming_it_and_nothing_is_declared(kwargs: dict[str, Any], error: type,
                                                                 match: str) -> None:
    effects = EffectRegistry()
    effects.register("digest", lambda c: None)
    payload = kwargs.pop("payload", {})
    with pytest.raises(error, match=match):
        effects.every("digest", payload, **kwargs)
    assert effects.schedules == {}


def test_a_schedule_needs_a_registered_effect_and_a_name_of_its_own() -> None:
    effects = EffectRegistry()
    with pytest.raises(UnknownEffect, match="not registered"):
        effects.every("digest", interval=60)
    effects.register("digest", lambda c: None)
    effects.every("digest", interval=60)
    with pytest.raises(ValueError, match="already declared"):
        effects.every("digest", interval=120)
    effects.every("digest", {"team": "b"}, interval=120, schedule="digest-b")  # another name: fine
    assert sorted(effects.schedules) == ["digest", "digest-b"]


# -- cron -------------------------------------------------------------------------------------

EXPRESSIONS = ["0 8 * * 1-5", "*/15 * * * *", "5 4 * * sun", "0 0 1,15 * *", "0 12 * jan-mar mon", "30 2 * * *",
               "0 0 13 * 5", "1-10/3 */5 * * *", "0 0 29 2 *", "7/20 3 * * 1-5/2", "@daily", "0 0 31 * *",
               "0 9-17 * * MON-FRI", "15 14 1 * *", "0 22 * * 1-5", "23 0-20/2 * * *", "0 4 8-14 * 0"]


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
def test_the_cron_parser_agrees_with_croniter(tz: str) -> None:
    croniter = pytest.importorskip("croniter").croniter
    from zoneinfo import ZoneInfo

    rng = random.Random(tz)
    zone = ZoneInfo(tz)
    for expression in EXPRESSIONS:
        cron = parse_cron(expression, tz)
        for _ in range(25):
            t = float(rng.randrange(946_684_800, 2_000_000_000))
            start = dt.datetime.fromtimestamp(t, zone)
            assert cron.next_after(t) == croniter(expression, start).get_next(float), (expression, t)
            assert cron.last_at_or_before(t - 1) == croniter(expression, start).get_prev(float), (expression, t)


def _utc(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


@pytest.mark.parametrize(("expression", "after", "ticks"), [
    # Europe/Berlin springs forward on 2026-03-29 at 02:00 CET (01:00 UTC) to 03:00 CEST: there is no
    # 02:30 that day; its tick is at the first instant after the gap (03:00 CEST = 01:00 UTC).
    ("30 2 * * *", "2026-03-27T12:00", ["2026-03-28T01:30", "2026-03-29T01:00", "2026-03-30T00:30"]),
    # Several ticks inside one gap are one tick at its end.
    ("*/20 2 * * *", "2026-03-28T12:00", ["2026-03-29T01:00", "2026-03-30T00:00", "2026-03-30T00:20"]),
    # It falls back on 2026-10-25 at 03:00 CEST (01:00 UTC) to 02:00 CET: 02:30 happens twice, and ticks
    # once, at its first occurrence (02:30 CEST = 00:30 UTC); the next day's is 02:30 CET = 01:30 UTC.
    ("30 2 * * *", "2026-10-24T12:00", ["2026-10-25T00:30", "2026-10-26T01:30"]),
    # Hourly through the repeated hour: 02:00 and 02:30 once each, never again in the second pass.
    ("0,30 2,3 25 10 *", "2026-10-24T12:00", ["2026-10-25T00:00", "2026-10-25T00:30", "2026-10-25T02:00",
                                              "2026-10-25T02:30"]),
    # Weekdays at 08:00 Berlin: CET then CEST.
    ("0 8 * * 1-5", "2026-03-26T12:00", ["2026-03-27T07:00", "2026-03-30T06:00"]),
])
def test_daylight_saving_changes_by_hand(expression: str, after: str, ticks: list[str]) -> None:
    cron = parse_cron(expression, "Europe/Berlin")
    at, found = _utc(after), []
    for _ in ticks:
        at = cron.next_after(at)
        found.append(at)
    assert found == [_utc(t) for t in ticks]
    assert cron.last_at_or_before(found[-1]) == found[-1]
    assert cron.last_at_or_before(found[-1] - 1) == found[-2] if len(found) > 1 else True


def test_a_cron_schedule_ticks_on_the_zones_wall_clock(ticks: Ticks) -> None:
    ticks.clock.t = _utc("2026-03-27T12:00")
    executor = ticks.executor(cron="30 2 * * *", tz="Europe/Berlin", missed="all")
    [stored] = executor.consumer.admin.schedules()
    assert (stored.cron, stored.tz, stored.next_at) == ("30 2 * * *", "Europe/Berlin", _utc("2026-03-28T01:30"))
    ticks.clock.t = _utc("2026-03-30T06:00")
    executor.run_until_idle()
    assert ticks.calls == [key(_utc(t)) for t in ("2026-03-28T01:30", "2026-03-29T01:00", "2026-03-30T00:30")]


def test_the_library_never_imports_croniter() -> None:
    src = Path(__file__).parents[1] / "src"
    assert not [p for p in src.rglob("*.py") if "import croniter" in p.read_text() or "from croniter" in p.read_text()]


def test_the_console_shows_the_schedules_and_their_actions(ticks: Ticks, tmp_path: Path, engine: str) -> None:
    from reliable_flow import Producer
    from reliable_flow.console import make_app
    from test_console import Client

    executor = ticks.executor(interval=MINUTE)
    first = executor.consumer.admin.schedules()[0].next_at
    executor.consumer.admin.pause_schedule("digest", actor="ops", reason="quiet <b>hours</b>")
    producer_at = new_location(engine, tmp_path, "producer")
    Producer(producer_at, RESERVATION).close()
    client = Client(make_app(producer_at, [f"ticks={ticks.location}"]))
    [consumer] = client.json("/api/overview")["consumers"]
    [shown] = consumer["schedules"]
    assert (shown["schedule"], shown["paused"], shown["next_at"], shown["last_tick"]) == ("digest", True, first, None)
    html = client.ok("/")
    assert "Recurring schedules" in html and "every 60 s" in html and "paused" in html
    log = client.json("/api/actions")["log"]
    assert [(a["target"], a["action"], a["schedule"]) for a in log] == [("schedule", "pause", "digest")]
    assert "quiet &lt;b&gt;hours&lt;/b&gt;" in client.ok("/actions")


@pytest.mark.parametrize("expression", ["*/7 * * * *", "30 2 * * *", "0,30 1-3 * * 0", "0 8 * * 1-5"])
def test_the_latest_ticks_of_a_range_are_the_ones_counted_forward(expression: str) -> None:
    cron = parse_cron(expression, "Europe/Berlin")
    rng = random.Random(expression)
    for _ in range(10):
        first = _utc("2026-03-20T00:00") + rng.uniform(0, 40 * 86_400)
        last = first + rng.uniform(0, 1.5 * 86_400)
        forward, at = [], first - 0.001
        while (at := cron.next_after(at)) <= last:
            forward.append(at)
        most = rng.randint(1, 5)
        latest, older = cron.latest(first, last, most, 10_000)
        assert latest == forward[-most:] and older == len(forward) - len(latest)


def test_a_long_outage_of_a_minute_schedule_counts_its_skipped_ticks_up_to_a_cap(ticks: Ticks) -> None:
    executor = ticks.executor(cron="* * * * *", missed="one")
    first = executor.consumer.admin.schedules()[0].next_at
    ticks.clock.t = first + 30 * 86_400  # a month down
    assert executor.run_once().work == 1 and ticks.calls == [key(first + 30 * 86_400)]
    assert executor.consumer.admin.schedules()[0].skipped == 10_000  # at least that many
