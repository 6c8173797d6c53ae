"""Each consumer's own order (issue 32, item 5), on both engines: what each
order does with arrivals out of order, the ``superseded`` state, bad input,
a reopen with another order, and what ``stuck``, the metrics and
``inspect`` say of each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reliable_flow import Consumer, Producer, Protocol, relay
from reliable_flow._tools.inspection import format_report, inspect_files
from reliable_flow.aio import AsyncConsumer
from reliable_flow.errors import WrongFile
from reliable_flow.metrics import prometheus_text
from support import envelope

#: The reservation's steps, each event carrying the state it leads to (a
#: snapshot: the default step merges it in), so a step applies from any
#: state's data -- what a ``latest`` or ``any`` consumer's protocol must allow
#: (the seed's RESERVATION checks each amount against the previous step's).
RESERVATION = Protocol(
    name="reservation", initial="new",
    transitions={"new": ["reserved"], "reserved": ["confirmed"], "confirmed": ["released"]},
    schemas={1: lambda kind, payload: dict(payload), 2: lambda kind, payload: dict(payload)},
    consumer_schemas={1},
)
# reserved (seq 1), confirmed (2), released (3).
E1, E2, E3 = envelope("E1", "F", 1), envelope("E2", "F", 2), envelope("E3", "F", 3)


@pytest.mark.parametrize("bad", ["STRICT", "", "newest", 1, None, True, b"any", ["any"]])
def test_a_bad_order_is_refused_naming_order_and_nothing_is_stored(new_store: Any, bad: object) -> None:
    location = new_store("c")
    with pytest.raises(ValueError, match="order must be one of 'strict', 'latest', 'any'"):
        Consumer(location, RESERVATION, order=bad)  # type: ignore[arg-type]
    with Consumer(location, RESERVATION, order="any") as c:  # nothing was recorded: any order may be first
        assert c.order == "any"


def test_a_reopen_with_another_order_is_refused_naming_both(new_store: Any) -> None:
    location = new_store("c")
    with Consumer(location, RESERVATION, order="latest") as c:
        c.receive(E1)
    for other in ("strict", "any"):
        with pytest.raises(WrongFile, match=f"order='latest' consumer; it cannot be opened with order='{other}'"):
            Consumer(location, RESERVATION, order=other)
    with pytest.raises(WrongFile, match="order='strict'"):
        Consumer(location, RESERVATION)  # the default is strict: refused too
    with Consumer(location, RESERVATION, order="latest") as c:
        assert (c.order, c.projection("F")) == ("latest", None)  # nothing changed
        assert [e.state for e in c.inbox("F")] == ["pending"]


def test_a_store_first_opened_as_strict_stays_strict(new_store: Any) -> None:
    location = new_store("c")
    Consumer(location, RESERVATION).close()
    with pytest.raises(WrongFile, match="order='strict' consumer; it cannot be opened with order='any'"):
        Consumer(location, RESERVATION, order="any")


def test_latest_applies_only_newer_states_and_supersedes_the_older(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, order="latest") as c:
        assert c.receive(E3).status == "accepted"
        assert c.receive(E1).status == "accepted"
        assert c.apply_next("F").status == "applied"  # the newest waiting: E3, as a snapshot
        assert c.projection("F")["last_seq"] == 3  # type: ignore[index]
        assert c.apply_next("F").status == "idle"  # never waits for E2
        late = c.receive(E2)  # older than the projection: stored superseded
        assert (late.status, late.reason) == ("accepted", "superseded by seq 3")
        assert {e.event_id: e.state for e in c.inbox("F")} == {
            "E1": "superseded", "E2": "superseded", "E3": "applied"}
        assert c.store.latest.inbox_row("E1").detail == "superseded by seq 3"  # type: ignore[union-attr]
        assert [a.event_id for a in c.applied("F")] == ["E3"]
        assert c.receive(E2).status == "duplicate"  # dedup unchanged
        assert c.receive({**E2, "payload": {"amount": 9}}).status == "id_conflict"  # body comparison unchanged
        assert c.stuck("F").wait == "idle"
        m = c.metrics()
        assert (m.order, m.inbox["superseded"], m.gaps) == ("latest", 2, 0)
        text = prometheus_text([m])
        assert 'reliable_flow_consumer_order{consumer="default",order="latest"} 1' in text
        assert 'reliable_flow_inbox_rows{consumer="default",state="superseded"} 2' in text


def test_any_applies_each_once_on_arrival_in_any_order(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, order="any", apply_on_receive=True) as c:
        assert c.receive(E3).applied  # no gap: applies at once
        assert c.receive(E1).applied  # older than last_seq: still applies
        assert c.projection("F")["last_seq"] == 3  # type: ignore[index]  # the highest applied
        assert c.projection("F")["state"] == "released"  # the highest applied event's kind
        assert c.receive(E1).status == "duplicate"
        assert c.receive(E2).status == "accepted"
        assert sorted(a.seq for a in c.applied("F")) == [1, 2, 3]
        assert [a.event_id for a in c.applied("F")] == ["E3", "E1", "E2"]  # arrival order
        assert c.apply_next("F").status == "idle"
        assert (c.metrics().gaps, c.metrics().order) == (0, "any")


def test_any_without_apply_on_receive_applies_on_the_next_pass(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, order="any") as c:
        c.receive(E3)
        c.receive(E2)
        assert c.stuck("F").wait == "ready"  # not a gap: the next pass applies them
        assert c.metrics().gaps == 0
        assert c.process_all()["F"].applied == 2
        c.receive(E1)
        assert c.apply_next("F").status == "applied"
        assert sorted(a.seq for a in c.applied("F")) == [1, 2, 3]


def test_strict_is_unchanged_a_missing_event_is_a_gap(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION) as c:
        assert c.order == "strict"
        c.receive(E3)
        assert (c.apply_next("F").status, c.stuck("F").wait) == ("gap", "gap")
        assert c.metrics().gaps == 1


def test_a_blocked_event_does_not_hold_an_any_consumer_s_other_events(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, order="any", schemas={1}) as c:
        c.receive(envelope("E2", "F", 2, schema=2))  # not decoded here: blocks
        c.receive(E1)
        c.receive(E3)
        c.process_all()
        assert sorted(a.seq for a in c.applied("F")) == [1, 3]
        assert {e.event_id: e.state for e in c.inbox("F")}["E2"] == "blocked"
        assert c.stuck("F").wait == "blocked"


def test_a_newer_event_moves_a_latest_consumer_past_a_blocked_one(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, order="latest", schemas={1}) as c:
        c.receive(envelope("E2", "F", 2, schema=2))
        assert c.apply_next("F").status == "blocked"
        assert c.stuck("F").wait == "blocked"
        c.receive(E1)  # older than the blocked newest: the flow still waits for the operator
        assert c.apply_next("F").status == "blocked"
        c.receive(E3)
        assert c.apply_next("F").status == "applied"
        assert {e.event_id: e.state for e in c.inbox("F")} == {
            "E1": "superseded", "E2": "superseded", "E3": "applied"}


def test_a_superseded_row_is_pruned_like_an_applied_one(new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, order="latest", clock=lambda: 100.0) as c:
        for e in (E1, E3, E2):
            c.receive(e)
            c.process_all()
        assert c.admin.prune(0, now=200.0, actor="ops", reason="test").events == 3
        assert c.receive(E2).status == "duplicate"  # its tombstone answers a late copy


def test_the_order_travels_through_a_relay(new_store: Any) -> None:
    with Producer(new_store("p"), RESERVATION) as p, Consumer(new_store("c"), RESERVATION, order="latest") as c:
        for seq, kind in enumerate(("reserved", "confirmed", "released"), start=1):
            p.advance(f"E{seq}", "F", expected_seq=seq - 1, kind=kind, payload={"amount": 3})
        while relay(p, c).status != "idle":
            pass
        c.process_all()
        assert [a.seq for a in c.applied("F")] == [3]
        assert c.projection("F")["last_seq"] == 3  # type: ignore[index]


def test_the_inbox_records_its_order(new_store: Any) -> None:
    location = new_store("c")
    with Consumer(location, RESERVATION, order="any") as c:
        assert c.store.latest.meta_value("order") == "any"


def test_an_async_consumer_takes_the_order(new_store: Any) -> None:
    async def main() -> list[int]:
        async with AsyncConsumer(new_store("c"), RESERVATION, order="latest") as c:
            await c.receive(E3)
            await c.receive(E1)
            await c.process_all()
            return [a.seq for a in await c.applied("F")]

    assert asyncio.run(main()) == [3]


def test_inspect_names_the_order_and_explains_its_states(new_store: Any) -> None:
    p_at, c_at = new_store("p"), new_store("c")
    with Producer(p_at, RESERVATION) as p, Consumer(c_at, RESERVATION, order="latest") as c:
        p.admin.register_consumer("default", actor="ops", reason="test")
        for seq, kind in enumerate(("reserved", "confirmed", "released"), start=1):
            p.advance(f"E{seq}", "F", expected_seq=seq - 1, kind=kind, payload={"amount": 3})
        bodies = [b for _, b in p.store.latest.next_due("default", float("inf"), 10)]
        assert len(bodies) == 3
        for body in reversed(bodies):  # newest first
            c.accept(body)
        c.process_all()
    report = inspect_files(p_at, c_at, stuck_after=0)
    assert (report["consumer"]["order"], report["consumer"]["inbox"]["superseded"]) == ("latest", 2)
    assert report["consumer"]["gaps"] == []
    text = format_report(report)
    assert "consumer 'default' (reservation, order latest): 1 flows;" in text
    assert "2 superseded" in text
    assert "order latest: only an event newer than its flow's projection applies" in text
