"""Each side sees what it waits for (issue 30, item 5), on both engines and a
real ``redis-server``.

* A bridge publishes, with its announcement, the effects of its consumer
  that owe a producer a step; ``reliable-flow inspect PRODUCER
  redis://...`` (or ``inspect PRODUCER`` alone, once the producer
  was served with ``serve_as``; with ``#CONSUMER``, the consumer's full
  report, read through its bridge) lists the flows waiting for a result for
  ``--stuck-after`` or more, with the effect's key: exit 1; nothing waiting
  that long: exit 0.  A result that came home is not listed.
* The summary is a view: stale when its bridge stopped publishing (said so),
  unreadable when malformed (said so, never trusted).
* ``inspect`` refuses a producer and a consumer that share no registration
  (a consumer name the producer never registered, or another store under a
  registered name): exit 2, one sentence naming both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_hosts import ASK, TOOLS, ToolsHost, until
from redis_server import import_redis
from reliable_flow import (
    ApplyContext,
    Consumer,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    PermanentFailure,
    Producer,
    Worker,
    relay,
)
from reliable_flow._core.owed import parse_summary
from reliable_flow.errors import ConsumerMismatch
from reliable_flow.reservation import RESERVATION
from support import commit, run_cli

redis = import_redis()

from reliable_flow._tools.remote_inspect import format_remote_report, remote_report
from reliable_flow.transport.redis import RedisReceiver
from reliable_flow.transport.redis import _bridge as bridge_module

OWED_KEY = "rf:{tools}:owed"



def _effects() -> EffectRegistry:
    effects = EffectRegistry()
    effects.register("look_up", _look_up, feedback=Feedback(kind="answered"))
    return effects


def _look_up(call: EffectCall) -> dict[str, str]:
    if call.payload["q"] == "fail":
        raise PermanentFailure("the tool always fails")  # dead, no on_failure: the flow waits for ever
    return {"a": call.payload["q"].upper()}


def _inspect(*args: str) -> tuple[int, Any, str]:
    done = run_cli("inspect", *args)
    out: Any = json.loads(done.stdout) if "--json" in args and done.returncode in (0, 1) else done.stdout
    return done.returncode, out, done.stderr


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def quick_announcements(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bridges announce (and publish what is owed) every 0.1 s, not every 5 s."""
    monkeypatch.setattr(bridge_module, "ANNOUNCE_EVERY", 0.1)


def _owed(client: Any) -> dict[str, Any] | None:
    raw = client.hget(OWED_KEY, "summary")
    return None if raw is None else parse_summary(raw)


def test_the_producer_sees_the_flow_waiting_on_another_host(new_store: Any, redis_url: str, client: Any) -> None:
    agent_at, tools_at = new_store("agent"), new_store(TOOLS)
    with Producer(agent_at, ASK) as producer, RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
        worker = Worker(producer, [tools], register=True, idle_sleep=0, serve_as="agent")
        producer.advance("A1", "A", expected_seq=0, kind="asked", payload={"q": "a"})
        producer.advance("B1", "B", expected_seq=0, kind="asked", payload={"q": "fail"})
        with ToolsHost(tools_at, redis_url, _effects()):
            until(lambda: (producer.flow("A") or {}).get("state") == "answered", worker)
            # B's tool ended dead: its key is listed once the bridge published after that
            summary = until(lambda: (s := _owed(client)) and [e["state"] for e in s["effects"]] == ["dead"] and s,
                            worker)
            [owed] = summary["effects"]
            assert (owed["key"], owed["flow_id"], owed["producer"], summary["count"]) == (
                "tools:B1:look_up", "B", "agent", 1)
            # the server alone: what every registered consumer's bridge publishes
            code, report, err = _inspect(agent_at, redis_url, "--stuck-after", "0", "--json")
            assert code == 1, err
            [item] = report["attention"]
            assert (item["kind"], item["flow_id"], item["effect_key"], item["consumer"], item["state"]) == (
                "waiting_for_result", "B", "tools:B1:look_up", TOOLS, "dead")
            assert "an operator" in item["detail"]
            # the consumer named: its full report, read through its bridge (tests/test_remote_console.py)
            code, report, err = _inspect(agent_at, f"{redis_url}#{TOOLS}", "--stuck-after", "0", "--json")
            assert code == 1, err
            assert report["consumer"]["name"] == TOOLS
            assert ("effect_dead", "tools:B1:look_up") in [(a["kind"], a["effect_key"]) for a in report["attention"]]
            # given only the producer: where it is served was recorded by the worker
            code, out, err = _inspect(agent_at, "--stuck-after", "0")
            assert code == 1, err
            assert "waiting_for_result: flow id 'B' effect key 'tools:B1:look_up' (dead)  consumer=tools" in out
            assert "flow 'A'" not in out  # its result came home: nothing owed
            code, out, err = _inspect(agent_at, "--stuck-after", "3600")
            assert (code, err) == (0, ""), out
            assert "nothing needs attention (stuck after 3600 s)" in out
            assert "flow 'B' effect tools:B1:look_up (look_up): dead since" in out  # listed, not stuck yet
        # another store announced under the name the producer binds to host B's store: no pair
        client.hset("rf:{tools}:consumer", mapping={"uid": "someone-else", "at": repr(time.time())})
    with pytest.raises(ConsumerMismatch, match="share no registration.*another store under that name"):
        remote_report(agent_at, f"{redis_url}#{TOOLS}")
    report = remote_report(agent_at, redis_url, stuck_after=3600)  # every registered consumer: said, not refused
    assert [a["kind"] for a in report["attention"]] == ["other_store"]


def test_a_stale_or_malformed_summary_is_said_so(new_store: Any, redis_url: str, client: Any) -> None:
    agent_at = new_store("agent")
    with Producer(agent_at, ASK) as producer, RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
        producer.admin.register_consumer(TOOLS, actor="ops", reason="host B")
        Worker(producer, [tools], idle_sleep=0, serve_as="agent")  # records where it is served
        at = 1000.0
        effect = {"key": "k", "name": "look_up", "flow_id": "A", "state": "running", "since": at,
                  "updated_at": at, "fed": None, "refused": False, "producer": "agent"}
        other = {**effect, "key": "k2", "flow_id": "Z", "producer": "another-agent"}
        client.hset(OWED_KEY, "summary", json.dumps({"v": 1, "consumer": TOOLS, "uid": "u", "at": at, "count": 2,
                                         "truncated": False, "effects": [effect, other]}))
        report = remote_report(agent_at, stuck_after=60, now=at + 59)
        [summary] = [c["summary"] for c in report["consumers"]]
        assert summary["stale"] and summary["other_producers"] == 1 and [e["key"] for e in summary["effects"]] == ["k"]
        assert [a["kind"] for a in report["attention"]] == ["summary_stale"]
        assert "(stale)" in format_remote_report(report)
        report = remote_report(agent_at, stuck_after=60, now=at + 60)
        assert [(a["kind"], a.get("effect_key")) for a in report["attention"]] == [
            ("waiting_for_result", "k"), ("summary_stale", None)]
        for bad in ("[1]", json.dumps({"v": 1, "consumer": TOOLS, "uid": "u", "at": "soon", "count": 1,
                                       "truncated": False, "effects": []})):
            client.hset(OWED_KEY, "summary", bad)
            report = remote_report(agent_at, stuck_after=60, now=at)
            assert report["attention"] == [] and report["consumers"][0]["unreadable"], bad
            assert "cannot be read" in format_remote_report(report)


@pytest.mark.parametrize(("bad", "field"), [
    ({"at": float("nan")}, "at"), ({"at": True}, "at"), ({"count": "1"}, "count"),
    ({"effects": [{"state": "asleep"}]}, "effects\\[0\\].state"), ({"effects": [3]}, "effects\\[0\\]"),
    ({"v": 2}, "version"), ({"truncated": None}, "truncated"),
])
def test_a_summary_is_checked_field_by_field(bad: dict[str, Any], field: str) -> None:
    good = {"v": 1, "consumer": TOOLS, "uid": "u", "at": 1.0, "count": 0, "truncated": False, "effects": []}
    parse_summary(json.dumps(good))
    with pytest.raises(ValueError, match=f"^summary: .*{field}"):
        parse_summary(json.dumps({**good, **bad}))


def test_a_consumer_on_redis_the_producer_never_registered_is_refused(new_store: Any, redis_url: str,
                                                                       client: Any) -> None:
    agent_at = new_store("agent")
    with Producer(agent_at, ASK) as producer, RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
        producer.admin.register_consumer(TOOLS, actor="ops", reason="host B")
        Worker(producer, [tools], idle_sleep=0, serve_as="agent")
    code, out, err = _inspect(agent_at, f"{redis_url}#stranger")
    assert (code, out) == (2, "")
    assert "share no registration" in err and "'stranger'" in err and "agent" in err and err.count("\n") == 1
    with pytest.raises(ConsumerMismatch, match="holds \\['tools'\\], not 'stranger'"):
        remote_report(agent_at, f"{redis_url}#stranger")


def test_a_producer_never_served_needs_a_location(new_store: Any) -> None:
    agent_at = new_store("agent")
    Producer(agent_at, ASK).close()
    code, out, err = _inspect(agent_at)
    assert (code, out) == (2, "")
    assert "never served to other hosts" in err and "redis://host:6379/0#NAME" in err


def test_inspect_refuses_a_consumer_store_the_producer_never_registered(new_store: Any, tmp_path: Path) -> None:
    p_at, c_at, other_at, twin_at = (new_store(x) for x in ("producer", "consumer", "other", "twin"))
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION) as consumer, \
            Consumer(other_at, RESERVATION, name="other"), Consumer(twin_at, RESERVATION):
        commit(producer, "A", 1)
        relay(producer, consumer)  # registers and binds 'default' to the consumer's uid
    code, out, err = _inspect(p_at, c_at)
    assert code == 0, err + out
    code, out, err = _inspect(p_at, other_at)  # a consumer of another producer, beside this one
    assert (code, out) == (2, "")
    assert "share no registration" in err and "'other'" in err and "not 'other'" in err
    for flag in ("--flow", "--event", "--effect"):
        assert _inspect(p_at, other_at, flag, "A")[0] == 2
    code, out, err = _inspect(p_at, twin_at)  # the same name, another store
    assert (code, out) == (2, "")
    assert "share no registration" in err and "another store under that name" in err and err.count("\n") == 1


def test_what_a_consumer_owes_is_its_feedback_effects_not_yet_fed(new_store: Any) -> None:
    """Pending, dead (no failure step) and finished-not-fed effects with
    ``feedback=`` are owed, oldest first, a refused one marked; one without
    ``feedback=`` is not (a fed one is not: the first test)."""
    from reliable_flow._core.owed import owed_effects, owed_summary
    from reliable_flow.transport.redis._owed import feeding

    effects = EffectRegistry()
    effects.register("look_up", _look_up, feedback=Feedback(kind="answered", flow=lambda f: f"agent-{f}"))
    effects.register("mail", lambda call: None)

    def schedule(ctx: ApplyContext) -> None:
        ctx.schedule("look_up", {"q": ctx.event.payload["q"]})
        ctx.schedule("mail", {})

    with Producer(new_store("agent"), ASK) as producer, \
            Consumer(new_store(TOOLS), ASK, name=TOOLS, handlers=[schedule], effects=effects) as consumer:
        for flow, q in (("A", "a"), ("B", "fail"), ("C", "c")):
            producer.advance(f"{flow}1", flow, expected_seq=0, kind="asked", payload={"q": q})
        while relay(producer, consumer).status != "idle":
            pass
        consumer.process_all()
        with consumer.store.read() as reads:
            pending, truncated = owed_effects(reads, {"look_up"}, time.time())
        assert [e.key for e in pending] == ["tools:A1:look_up", "tools:B1:look_up", "tools:C1:look_up"]
        assert not truncated
        fed = EffectExecutor(consumer, producer=producer)
        unfed = EffectExecutor(consumer)  # no producer: A's and C's results stay owed
        unfed.run_until_idle()
        with consumer.store.read() as reads:
            owed, _ = owed_effects(reads, {"look_up"}, time.time())
        assert [(e.key, e.state.value, e.fed) for e in owed] == [
            ("tools:A1:look_up", "succeeded", False), ("tools:B1:look_up", "dead", None),
            ("tools:C1:look_up", "succeeded", False)]
        targets = feeding(consumer, [fed])
        assert set(targets) == {"look_up"} and targets["look_up"][0] == producer.uid
        summary = owed_summary(TOOLS, consumer.uid, owed, False, targets, 5.0)
        assert [(e["flow_id"], e["producer"]) for e in summary["effects"]] == [
            ("agent-A", producer.uid), ("agent-B", producer.uid), ("agent-C", producer.uid)]
        assert parse_summary(json.dumps(summary))["effects"] == summary["effects"]
        # fed into flows the mapping names, which the producer does not hold: refused, still owed, said so
        fed.run_until_idle()
        with consumer.store.read() as reads:
            owed, _ = owed_effects(reads, {"look_up"}, time.time())
        summary = owed_summary(TOOLS, consumer.uid, owed, False, targets, 5.0)
        assert [(e["key"], e["refused"]) for e in summary["effects"]] == [
            ("tools:A1:look_up", True), ("tools:B1:look_up", False), ("tools:C1:look_up", True)]
        assert feeding(consumer, [])["look_up"][0] is None  # no executor here: the target is not known
        fed.close()
        unfed.close()
