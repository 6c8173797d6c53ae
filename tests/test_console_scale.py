"""The console at scale (issue 31, item 5), on both engines: keyset pages of
effects that stay put while effects are added, filtered by state and name;
flows found by correlation id through the store's index; a bounded
attention list that is ``inspect``'s list cut short, saying so; stores
written before the console's migrations upgraded in place.  (That the reads
use indexes: tests/sqlite/test_query_plans.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from engine_reads import execute, is_pg, rows
from reliable_flow import (
    ApplyContext,
    Consumer,
    EffectExecutor,
    EffectRegistry,
    PermanentFailure,
    Producer,
    Protocol,
    relay,
)
from reliable_flow._store.repository.statements import FEED_REFUSED
from reliable_flow._tools.attention import attention_items
from reliable_flow._tools.drilldown import opened
from reliable_flow._tools.inspection import inspect_files
from reliable_flow.console import _data, make_app
from test_console import Client

At = Callable[[str], str]
NOTES = Protocol(name="notes", initial="new", transitions={"new": ["noted"], "noted": ["noted"]},
                 schemas={1: lambda kind, payload: dict(payload), 2: lambda kind, payload: dict(payload)},
                 consumer_schemas={1})  # a schema-2 event blocks


def _registry() -> EffectRegistry:
    def bill(call: Any) -> None:
        if call.payload["fail"]:
            raise PermanentFailure("card declined")

    effects = EffectRegistry()
    effects.register("notify", lambda call: None)
    effects.register("bill", bill, max_attempts=1)
    return effects


def _handler(ctx: ApplyContext) -> None:
    ctx.schedule(ctx.event.payload["effect"], {"fail": ctx.event.payload.get("fail", False)})


def _advance(p_at: str, c_at: str, flows: list[tuple[str, dict[str, Any]]], *, schema: int = 1,
             meta: dict[str, str] | None = None, run: bool = True) -> None:
    """Each (flow, payload) as a new flow's first event, relayed, applied and its effect run."""
    effects = _registry()
    with Producer(p_at, NOTES) as producer, \
            Consumer(c_at, NOTES, handlers=(_handler,), effects=effects) as consumer:
        for flow, payload in flows:
            producer.advance(f"{flow}-1", flow, expected_seq=0, kind="noted", payload=payload, schema=schema,
                             meta=meta)
        while relay(producer, consumer).status != "idle":
            pass
        consumer.process_all()
        if run:
            EffectExecutor(consumer).run_until_idle()


def _keys(page: dict[str, Any]) -> list[str]:
    return [e["key"] for e in page["effects"]]


def test_effect_pages_stay_put_while_effects_are_added_and_filter_by_state_and_name(at: At) -> None:
    p_at, c_at = at("producer"), at("consumer")
    _advance(p_at, c_at, [(f"a{n}", {"effect": "bill" if n % 2 else "notify", "fail": n % 4 == 1})
                          for n in range(8)])
    client = Client(make_app(p_at, [c_at]))
    dead = client.json("/api/effects", "state=dead&name=bill&limit=1")
    assert _keys(dead) == ["default:a1-1:bill"] and dead["next"] == "default:a1-1:bill"
    first = client.json("/api/effects", "name=bill&limit=2")
    assert _keys(first) == ["default:a1-1:bill", "default:a3-1:bill"]
    # Effects scheduled now come after every one listed: the next page starts where the first ended.
    _advance(p_at, c_at, [(f"b{n}", {"effect": "bill", "fail": True}) for n in range(3)])
    second = client.json("/api/effects", f"name=bill&limit=2&after={first['next']}")
    assert _keys(second) == ["default:a5-1:bill", "default:a7-1:bill"]
    third = client.json("/api/effects", f"name=bill&limit=2&after={second['next']}")
    assert _keys(third) == ["default:b0-1:bill", "default:b1-1:bill"]
    last = client.json("/api/effects", f"name=bill&limit=2&after={third['next']}")
    assert _keys(last) == ["default:b2-1:bill"] and last["next"] is None
    assert _keys(client.json("/api/effects", "state=dead&name=bill")) == [
        "default:a1-1:bill", "default:a5-1:bill", "default:b0-1:bill", "default:b1-1:bill", "default:b2-1:bill"]
    assert _keys(client.json("/api/effects", "state=succeeded&name=bill")) == [
        "default:a3-1:bill", "default:a7-1:bill"]
    assert _keys(client.json("/api/effects", "state=succeeded&limit=2&after=default:a2-1:notify")) == [
        "default:a3-1:bill", "default:a4-1:notify"]
    # A page whose last effect changed state since still leads on: the key, not the filter, is the cursor.
    assert _keys(client.json("/api/effects", "state=dead&after=default:a3-1:bill")) == [
        "default:a5-1:bill", "default:b0-1:bill", "default:b1-1:bill", "default:b2-1:bill"]


def test_a_correlation_id_finds_its_flows_through_the_store(at: At, monkeypatch: pytest.MonkeyPatch) -> None:
    p_at, c_at = at("producer"), at("consumer")
    _advance(p_at, c_at, [(f"c{n}", {"effect": "notify"}) for n in (3, 1, 2)], meta={"correlation_id": "order-7"})
    _advance(p_at, c_at, [("d1", {"effect": "notify"})], meta={"correlation_id": "order-8"})
    _advance(p_at, c_at, [("e1", {"effect": "notify"})])
    with opened(p_at, c_at) as (_, c):
        assert c.flows_by_correlation("order-7", 10) == ["c1", "c2", "c3"]
        assert c.flows_by_correlation("order-7", 2) == ["c1", "c2"]
        assert c.flows_by_correlation("order-9", 10) == []
    client = Client(make_app(p_at, [c_at]))
    found = client.json("/api/flows", "q=order-8")
    assert found == {"q": "order-8", "flows": [{"flow_id": "d1", "matched": ["correlation_id"]}], "more": False}
    monkeypatch.setattr(_data, "FOUND_LIMIT", 2)
    found = client.json("/api/flows", "q=order-7")
    assert [f["flow_id"] for f in found["flows"]] == ["c1", "c2"] and found["more"] is True
    assert "narrow the search" in client.ok("/flows", "q=order-7")


def test_a_correlation_id_is_found_whatever_its_characters_and_the_bodies_hold(at: At) -> None:
    """Quotes, non-ASCII and control characters in the id; a NUL in a payload
    (which PostgreSQL's jsonb refuses: the index must not make the insert fail)."""
    p_at, c_at = at("producer"), at("consumer")
    odd = 'ord"\\é\t\u2028/1'
    _advance(p_at, c_at, [("n1", {"effect": "notify", "s": "a\x00b"})], meta={"correlation_id": odd})
    _advance(p_at, c_at, [("n2", {"effect": "notify"})], meta={"correlation_id": odd + "x"})
    with opened(p_at, c_at) as (_, c):
        assert c.flows_by_correlation(odd, 10) == ["n1"]
        assert c.flows_by_correlation(odd + "x", 10) == ["n2"]


def _troubles(p_at: str, c_at: str) -> None:
    """Blocked flows (schema 2), dead effects, a flow at a gap and an event set aside."""
    _advance(p_at, c_at, [(f"x{n}", {"effect": "notify"}) for n in range(3)], schema=2)
    _advance(p_at, c_at, [(f"e{n}", {"effect": "bill", "fail": True}) for n in range(3)])
    with Producer(p_at, NOTES) as producer, Consumer(c_at, NOTES) as consumer:
        producer.advance("s1", "s", expected_seq=0, kind="noted", payload={"effect": "notify"})
        consumer.receive({"event_id": "s1", "flow_id": "s", "seq": 1, "kind": "noted", "schema": 1,
                          "payload": {"other": 1}})
        relay(producer, consumer, event_id="s1")
        consumer.receive({"event_id": "g2", "flow_id": "g", "seq": 2, "kind": "noted", "schema": 1,
                          "payload": {"effect": "notify"}})
        consumer.process_all()  # s1 (the consumer's own body) applies; g waits at its gap
    time.sleep(0.6)  # every wait older than the tests' stuck_after (0.5 s)


def test_the_attention_list_is_inspects_cut_short_and_says_so(at: At) -> None:
    p_at, c_at = at("producer"), at("consumer")
    _troubles(p_at, c_at)
    now = time.time()
    full = inspect_files(p_at, c_at, stuck_after=0.5, now=now)["attention"]
    assert [a["kind"] for a in full] == ["gap"] + ["blocked"] * 3 + ["set_aside"] + ["effect_dead"] * 3
    with opened(p_at, c_at) as (p, c):
        for limit in range(len(full) + 2):
            items, more = attention_items(p, c, now, 0.5, limit)
            assert (items, more) == (full[:limit], limit < len(full)), limit
    app = make_app(p_at, [c_at], stuck_after=0.5)
    client = Client(app)
    overview = client.json("/api/overview")
    assert overview["attention"] == inspect_files(p_at, c_at, stuck_after=0.5)["attention"]
    assert overview["attention_more"] is False
    app.console.attention_limit = 3
    overview = client.json("/api/overview")
    assert [a["kind"] for a in overview["attention"]] == ["gap", "blocked", "blocked"]
    assert overview["attention_more"] is True
    status, _, text = client.get("/healthz")
    assert status == 503 and json.loads(text)["more"] is True and len(json.loads(text)["attention"]) == 3
    html = client.ok("/")
    assert "Needs attention (3+)" in html and "inspect lists every one" in html


def test_the_overview_counts_stop_at_the_cap(at: At, monkeypatch: pytest.MonkeyPatch) -> None:
    p_at, c_at = at("producer"), at("consumer")
    _advance(p_at, c_at, [(f"a{n}", {"effect": "notify"}) for n in range(4)], run=False)
    client = Client(make_app(p_at, [c_at]))
    overview = client.json("/api/overview")
    (default,) = overview["consumers"]
    assert overview["produced"] == {"events": 4, "flows": 4} and default["effects"] == {"pending": 4}
    assert default["applied"] == 4
    monkeypatch.setattr(_data, "COUNT_CAP", 3)
    overview = client.json("/api/overview")
    assert overview["produced"] == {"events": 3, "flows": 3} and overview["count_cap"] == 3
    assert overview["consumers"][0]["effects"] == {"pending": 3}
    assert "3+ events in 3+ flows" in client.ok("/")


def test_the_store_and_the_executor_agree_on_how_a_refused_feeding_is_written() -> None:
    from reliable_flow._core.effects import FEEDBACK_REFUSED

    assert FEED_REFUSED == FEEDBACK_REFUSED


# -- stores written before the console's migrations -------------------------------------------------

_NEW_INDEXES = {"producer": ["delivery_set_aside"],
                "consumer": ["effect_by_name", "effect_by_state_name", "effect_by_flow", "inbox_correlation"]}


def _indexes(location: str) -> set[str]:
    if is_pg(location):
        schema = location.rsplit("#", 1)[1]
        return {str(r[0]) for r in rows(location, "SELECT indexname FROM pg_indexes WHERE schemaname = %s",
                                         (schema,))}
    return {str(r[0]) for r in rows(location, "SELECT name FROM sqlite_master WHERE type = 'index'")}


def _back_to_previous_version(location: str, side: str) -> None:
    """The store as the version before the console's migration left it: without its indexes (and, on
    the consumer side, without the later migrations' tables: the recurring schedules')."""
    drops = [f"DROP INDEX {name}" for name in _NEW_INDEXES[side]]
    later = 1
    if side == "consumer":  # the consumer's console migration is followed by the schedules' (v9 / v6)
        drops += ["DROP TABLE effect_schedule", "DROP TABLE schedule_action"]  # and superseded's (v10 / v7),
        later = 3  # which can run again as it is
    if is_pg(location):
        execute(location, *drops, f"UPDATE rf_identity SET version = version - {later}")
    else:
        version = rows(location, "PRAGMA user_version")[0][0]
        execute(location, *drops, f"PRAGMA user_version = {version - later}")


def test_stores_written_before_the_console_migrations_upgrade_in_place(at: At) -> None:
    p_at, c_at = at("producer"), at("consumer")
    _advance(p_at, c_at, [("c1", {"effect": "bill", "fail": True})], meta={"correlation_id": "order-1"})
    _troubles(p_at, c_at)
    before = inspect_files(p_at, c_at)["attention"]
    for location, side in ((p_at, "producer"), (c_at, "consumer")):
        _back_to_previous_version(location, side)
        assert not set(_NEW_INDEXES[side]) & _indexes(location)
    # Opening them (read-write) migrates; the rows stored before are in the new indexes.
    with Producer(p_at, NOTES), Consumer(c_at, NOTES):
        pass
    for location, side in ((p_at, "producer"), (c_at, "consumer")):
        assert set(_NEW_INDEXES[side]) <= _indexes(location)
    with opened(p_at, c_at) as (p, c):
        assert c.flows_by_correlation("order-1", 10) == ["c1"]
        assert [(s.consumer, s.event_id, s.last_status) for s in p.set_aside(10)] == [
            ("default", "s1", "id_conflict")]
        assert [e.key for e in c.effect_list(name="bill", state=None, limit=10)] == [
            "default:c1-1:bill", "default:e0-1:bill", "default:e1-1:bill", "default:e2-1:bill"]
    assert inspect_files(p_at, c_at)["attention"] == before


def test_a_reader_keeps_its_stores_open_between_reads_and_lets_them_go(
        at: At, monkeypatch: pytest.MonkeyPatch) -> None:
    from reliable_flow.console import _reads

    p_at, c_at = at("producer"), at("consumer")
    _advance(p_at, c_at, [("a1", {"effect": "notify"})])
    monkeypatch.setattr(_reads, "IDLE", 0.3)
    opens: list[str] = []
    real_open = _reads.open_producer

    def counted(location: Any) -> Any:
        opens.append(location)
        return real_open(location)

    monkeypatch.setattr(_reads, "open_producer", counted)
    reader = _reads.Reader(p_at, c_at)
    assert [reader.run(lambda p, c: c.flows()) for _ in range(3)] == [["a1"]] * 3
    assert len(opens) == 1  # kept open between reads

    def broken(p: Any, c: Any) -> None:
        raise ValueError("a read that fails")

    with pytest.raises(ValueError, match="a read that fails"):
        reader.run(broken)
    assert reader.run(lambda p, c: c.flows()) == ["a1"] and len(opens) == 2  # opened again
    deadline = time.monotonic() + 5
    while reader._thread is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reader._thread is None  # idle: stores closed, thread ended
    assert reader.run(lambda p, c: p.flows()) == ["a1"] and len(opens) == 3
