"""Consumer: receive statuses, apply_next / drain / process_all, argument
checks, and an SQL failure injected with a trigger on the effect table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_reads import allow_inserts, count, integrity_error, reject_inserts, rows
from reliable_flow import Consumer
from reliable_flow.errors import InvalidEnvelope
from reliable_flow.records import AppliedEvent, InboxEntry
from reliable_flow.reservation import RESERVATION
from support import canonical_body, envelope


def raw_inbox(path: str) -> list[tuple[Any, ...]]:
    return rows(path, "SELECT event_id, flow_id, seq, body, state, reason FROM inbox ORDER BY flow_id, seq")


def receive_all(consumer: Consumer, *envelopes: dict[str, Any]) -> None:
    for e in envelopes:
        assert consumer.receive(e).status == "accepted", e


def a_flow(flow: str = "A", upto: int = 3) -> list[dict[str, Any]]:
    return [envelope(f"{flow}{n}", flow, n) for n in range(1, upto + 1)]


# -- receive ----------------------------------------------------------------------------


def test_receive_accepted_stores_one_pending_row(consumer: Consumer) -> None:
    r = consumer.receive(envelope("A1", "A", 1))
    assert (r.status, r.event_id, r.flow_id, r.seq, r.reason) == ("accepted", "A1", "A", 1, None)
    assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]
    assert count(consumer.location, "inbox") == 1
    assert consumer.projection("A") is None  # accepted is not applied
    assert consumer.applied("A") == []


def test_receive_json_text_and_duplicate_by_canonical_body(consumer: Consumer) -> None:
    e = envelope("A1", "A", 1)
    assert consumer.receive(json.dumps(e)).status == "accepted"
    before = raw_inbox(consumer.location)
    # Same event, other key order and spacing, as text and as dict: duplicate.
    reordered = json.dumps(dict(reversed(list(e.items()))), indent=2)
    for again in (e, reordered, json.dumps(e).encode("utf-8")):
        r = consumer.receive(again)
        assert (r.status, r.event_id, r.seq) == ("duplicate", "A1", 1)
    assert raw_inbox(consumer.location) == before


def test_receive_duplicate_after_the_event_was_applied(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1))
    assert consumer.apply_next("A").status == "applied"
    assert consumer.receive(envelope("A1", "A", 1)).status == "duplicate"
    assert consumer.apply_next("A").status == "idle"
    assert len(consumer.applied("A")) == 1


@pytest.mark.parametrize(
    "changed",
    [
        envelope("A1", "A", 1, payload={"amount": 4}),
        envelope("A1", "A", 2, kind="confirmed"),
        envelope("A1", "B", 1),
        envelope("A1", "A", 1, schema=2),
        {**envelope("A1", "A", 1), "meta": {"correlation_id": "c"}},
    ],
    ids=["amount", "seq", "flow", "schema", "meta"],
)
def test_receive_id_conflict_creates_no_row(consumer: Consumer, changed: dict[str, Any]) -> None:
    receive_all(consumer, envelope("A1", "A", 1))
    before = raw_inbox(consumer.location)
    r = consumer.receive(changed)
    assert (r.status, r.event_id) == ("id_conflict", "A1")
    assert r.reason
    assert raw_inbox(consumer.location) == before
    assert count(consumer.location, "inbox") == 1


def test_receive_id_conflict_wins_over_sequence_conflict(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1), envelope("A2", "A", 2))
    r = consumer.receive(envelope("A1", "A", 2, kind="confirmed"))  # id A1 known, and seq 2 held by A2
    assert r.status == "id_conflict"
    assert count(consumer.location, "inbox") == 2


def test_receive_sequence_conflict_creates_no_row(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1))
    before = raw_inbox(consumer.location)
    r = consumer.receive(envelope("X1", "A", 1))
    assert (r.status, r.event_id, r.flow_id, r.seq) == ("sequence_conflict", "X1", "A", 1)
    assert r.reason is not None and "A1" in r.reason
    assert raw_inbox(consumer.location) == before
    assert count(consumer.location, "inbox") == 1
    # The same id in another flow's slot is fine.
    assert consumer.receive(envelope("X1", "X", 1)).status == "accepted"


def test_receive_schema_2_is_accepted_and_stored_unchanged(consumer: Consumer) -> None:
    e = {**envelope("A2", "A", 2, schema=2, payload={"units": 3}), "meta": {"trace": "t-9"}}
    r = consumer.receive(e)
    assert r.status == "accepted"
    stored = raw_inbox(consumer.location)
    assert stored == [("A2", "A", 2, canonical_body(e), "pending", None)]
    assert consumer.receive(e).status == "duplicate"


def test_receive_malformed_envelope_stores_nothing(consumer: Consumer) -> None:
    with pytest.raises(InvalidEnvelope) as info:
        consumer.receive({**envelope("A1", "A", 1), "extra": 1})
    assert info.value.field == "extra"
    with pytest.raises(InvalidEnvelope) as info:
        consumer.receive({**envelope("A1", "A", 1), "seq": True})
    assert info.value.field == "seq"
    assert count(consumer.location, "inbox") == 0
    assert consumer.store.in_transaction() is False


# -- apply_next -------------------------------------------------------------------------


def test_apply_next_applied_commits_projection_effect_and_mark(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1))
    r = consumer.apply_next("A")
    assert (r.status, r.flow_id, r.seq, r.event_id, r.reason) == ("applied", "A", 1, "A1", None)
    assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert consumer.applied("A") == [AppliedEvent(event_id="A1", flow_id="A", seq=1, kind="reserved")]
    assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="applied", reason=None)]


def test_apply_next_walks_the_whole_flow(consumer: Consumer) -> None:
    receive_all(consumer, *a_flow())
    views = [
        {"state": "reserved", "last_seq": 1, "held": 3},
        {"state": "confirmed", "last_seq": 2, "held": 3},
        {"state": "released", "last_seq": 3, "held": 0},
    ]
    for n, view in enumerate(views, start=1):
        r = consumer.apply_next("A")
        assert (r.status, r.seq, r.event_id) == ("applied", n, f"A{n}")
        assert consumer.projection("A") == view
    assert [(e.seq, e.kind) for e in consumer.applied("A")] == [(1, "reserved"), (2, "confirmed"), (3, "released")]
    r = consumer.apply_next("A")
    assert (r.status, r.seq, r.event_id) == ("idle", 4, None)


def test_apply_next_gap_names_the_missing_seq(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A2", "A", 2))
    r = consumer.apply_next("A")
    assert (r.status, r.seq, r.event_id, r.reason) == ("gap", 1, None, None)
    assert r.detail and "1" in r.detail
    assert consumer.projection("A") is None
    assert consumer.inbox("A") == [InboxEntry(event_id="A2", seq=2, state="pending", reason=None)]
    receive_all(consumer, envelope("A1", "A", 1), envelope("A3", "A", 3))
    assert consumer.apply_next("A").status == "applied"
    assert consumer.apply_next("A").status == "applied"
    assert consumer.apply_next("A").status == "applied"


def test_apply_next_gap_after_applied_prefix(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1), envelope("A3", "A", 3))
    assert consumer.apply_next("A").status == "applied"
    r = consumer.apply_next("A")
    assert (r.status, r.seq) == ("gap", 2)
    assert r.detail and "2" in r.detail
    assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}


def test_apply_next_idle_on_empty_and_unknown_flow(consumer: Consumer) -> None:
    r = consumer.apply_next("A")
    assert (r.status, r.seq, r.event_id) == ("idle", 1, None)
    receive_all(consumer, envelope("B1", "B", 1))
    assert consumer.apply_next("A").status == "idle"
    assert consumer.inbox("B")[0].state == "pending"


BLOCKS = [
    pytest.param([envelope("A1", "A", 1, schema=2)], 1, "unsupported_schema", id="unsupported_schema"),
    pytest.param([envelope("A1", "A", 1, schema=7, payload={"x": 1})], 1, "unsupported_schema", id="unknown-schema"),
    pytest.param([envelope("A1", "A", 1, payload={"amount": 0})], 1, "invalid_payload", id="amount-0"),
    pytest.param([envelope("A1", "A", 1, payload={"amount": 3, "x": 1})], 1, "invalid_payload", id="extra-key"),
    pytest.param([envelope("A1", "A", 1), envelope("A2", "A", 2, payload={"amount": 4})], 2, "invalid_payload",
                 id="amount-changed"),
    pytest.param([envelope("A1", "A", 1, kind="confirmed")], 1, "invalid_transition", id="seq1-confirmed"),
    pytest.param([envelope("A1", "A", 1), envelope("A2", "A", 2, kind="released")], 2, "invalid_transition",
                 id="skip"),
    pytest.param([envelope("A1", "A", 1, kind="cancelled")], 1, "invalid_transition", id="unknown-kind"),
]


@pytest.mark.parametrize(("envelopes", "seq", "reason"), BLOCKS)
def test_apply_next_blocked_marks_the_row_and_is_reexamined(
    consumer: Consumer, envelopes: list[dict[str, Any]], seq: int, reason: str
) -> None:
    receive_all(consumer, *envelopes)
    for n in range(1, seq):
        assert consumer.apply_next("A").status == "applied"
    projection_before = consumer.projection("A")
    effects_before = consumer.applied("A")
    for _ in range(2):  # re-examined on every call, same answer
        r = consumer.apply_next("A")
        assert (r.status, r.seq, r.event_id, r.reason) == ("blocked", seq, f"A{seq}", reason)
        assert r.detail
        assert consumer.inbox("A")[seq - 1] == InboxEntry(event_id=f"A{seq}", seq=seq, state="blocked", reason=reason)
        assert consumer.projection("A") == projection_before
        assert consumer.applied("A") == effects_before
    assert count(consumer.location, "effect") == seq - 1


def test_blocked_row_is_applied_unchanged_by_an_upgraded_consumer(consumer: Consumer) -> None:
    e = envelope("A1", "A", 1, schema=2)
    receive_all(consumer, e)
    assert consumer.apply_next("A").reason == "unsupported_schema"
    body_before = raw_inbox(consumer.location)[0][3]
    path = consumer.location
    consumer.close()
    with Consumer(path, RESERVATION, schemas={1, 2}) as upgraded:
        r = upgraded.apply_next("A")
        assert (r.status, r.seq, r.event_id, r.reason) == ("applied", 1, "A1", None)
        assert upgraded.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="applied", reason=None)]
        assert upgraded.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert raw_inbox(path)[0][3] == body_before == canonical_body(e)


def test_blocked_reason_is_recomputed_on_reexamination(consumer: Consumer) -> None:
    # schema 2 with a bad payload: unsupported for the default consumer, invalid for an upgraded one.
    receive_all(consumer, envelope("A1", "A", 1, schema=2, payload={"units": 0}))
    assert consumer.apply_next("A").reason == "unsupported_schema"
    path = consumer.location
    consumer.close()
    with Consumer(path, RESERVATION, schemas={1, 2}) as upgraded:
        r = upgraded.apply_next("A")
        assert (r.status, r.reason) == ("blocked", "invalid_payload")
        assert upgraded.inbox("A")[0].reason == "invalid_payload"


@pytest.mark.parametrize("flow_id", ["", "F" * 129, 5, None], ids=["empty", "129-chars", "int", "none"])
def test_apply_next_bad_flow_id_raises(consumer: Consumer, flow_id: Any) -> None:
    with pytest.raises(InvalidEnvelope) as info:
        consumer.apply_next(flow_id)
    assert info.value.field == "flow_id"
    assert consumer.store.in_transaction() is False


def test_apply_next_flow_id_of_128_chars_is_fine(consumer: Consumer) -> None:
    flow = "F" * 128
    receive_all(consumer, envelope("F1", flow, 1))
    assert consumer.apply_next(flow).status == "applied"


# -- drain ------------------------------------------------------------------------------


def test_drain_stops_at_gap(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1), envelope("A3", "A", 3))
    d = consumer.drain("A")
    assert (d.flow_id, d.applied, d.stop) == ("A", 1, "gap")
    assert d.last is not None and (d.last.status, d.last.seq) == ("gap", 2)


def test_drain_stops_at_blocked(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1), envelope("A2", "A", 2, schema=2), envelope("A3", "A", 3))
    d = consumer.drain("A")
    assert (d.applied, d.stop) == (1, "blocked")
    assert d.last is not None and (d.last.seq, d.last.reason) == (2, "unsupported_schema")
    assert [row.state for row in consumer.inbox("A")] == ["applied", "blocked", "pending"]


def test_drain_stops_idle_with_applied_count(consumer: Consumer) -> None:
    assert (consumer.drain("A").applied, consumer.drain("A").stop) == (0, "idle")
    receive_all(consumer, *a_flow())
    d = consumer.drain("A")
    assert (d.applied, d.stop) == (3, "idle")
    assert d.last is not None and (d.last.status, d.last.seq) == ("idle", 4)
    assert consumer.projection("A") == {"state": "released", "last_seq": 3, "held": 0}


def test_drain_stops_at_limit(consumer: Consumer) -> None:
    receive_all(consumer, *a_flow())
    d = consumer.drain("A", limit=2)
    assert (d.applied, d.stop) == (2, "limit")
    assert consumer.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}
    d = consumer.drain("A", limit=2)
    assert (d.applied, d.stop) == (1, "idle")


def test_drain_limit_exactly_reached_is_limit(consumer: Consumer) -> None:
    receive_all(consumer, *a_flow())
    d = consumer.drain("A", limit=3)
    assert (d.applied, d.stop) == (3, "limit")
    assert d.last is not None and (d.last.status, d.last.seq) == ("applied", 3)
    assert consumer.drain("A", limit=3).stop == "idle"


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "2", None])
def test_invalid_limit_raises_value_error(consumer: Consumer, limit: Any) -> None:
    receive_all(consumer, envelope("A1", "A", 1))
    with pytest.raises(ValueError):
        consumer.drain("A", limit=limit)
    with pytest.raises(ValueError):
        consumer.process_all(limit=limit)
    assert consumer.projection("A") is None
    assert consumer.inbox("A")[0].state == "pending"


# -- process_all ------------------------------------------------------------------------


def test_process_all_only_reports_flows_with_unapplied_rows(consumer: Consumer) -> None:
    assert consumer.process_all() == {}
    receive_all(consumer, envelope("C1", "C", 1))
    assert consumer.drain("C").applied == 1
    receive_all(consumer, *a_flow("A"), *a_flow("B", 2), envelope("D2", "D", 2))
    results = consumer.process_all()
    assert sorted(results) == ["A", "B", "D"]
    assert (results["A"].applied, results["A"].stop) == (3, "idle")
    assert (results["B"].applied, results["B"].stop) == (2, "idle")
    assert (results["D"].applied, results["D"].stop) == (0, "gap")
    assert all(results[f].flow_id == f for f in results)
    again = consumer.process_all()
    assert sorted(again) == ["D"]
    assert consumer.projection("C") == {"state": "reserved", "last_seq": 1, "held": 3}


def test_process_all_limit_is_per_flow(consumer: Consumer) -> None:
    receive_all(consumer, *a_flow("A"), *a_flow("B"), *a_flow("C", 1))
    results = consumer.process_all(limit=2)
    assert {f: (d.applied, d.stop) for f, d in results.items()} == {
        "A": (2, "limit"), "B": (2, "limit"), "C": (1, "idle"),
    }
    results = consumer.process_all(limit=2)
    assert {f: (d.applied, d.stop) for f, d in results.items()} == {"A": (1, "idle"), "B": (1, "idle")}
    assert consumer.process_all(limit=2) == {}


def test_process_all_keeps_reporting_a_blocked_flow(consumer: Consumer) -> None:
    receive_all(consumer, envelope("A1", "A", 1, kind="confirmed"), *a_flow("B"))
    results = consumer.process_all()
    assert (results["A"].applied, results["A"].stop) == (0, "blocked")
    assert results["A"].last is not None and results["A"].last.reason == "invalid_transition"
    assert (results["B"].applied, results["B"].stop) == (3, "idle")
    again = consumer.process_all()
    assert sorted(again) == ["A"] and again["A"].stop == "blocked"


# -- SQL failure injected with a trigger -------------------------------------------------


@pytest.mark.parametrize("done", [0, 1], ids=["first-step", "second-step"])
def test_trigger_rejected_effect_insert_rolls_back_apply(consumer: Consumer, done: int) -> None:
    receive_all(consumer, *a_flow())
    for _ in range(done):
        assert consumer.apply_next("A").status == "applied"
    projection_before = consumer.projection("A")
    effects_before = consumer.applied("A")
    inbox_before = raw_inbox(consumer.location)
    reject_inserts(consumer.location, "effect", "rejected")
    with pytest.raises(integrity_error(consumer.location), match="rejected"):
        consumer.apply_next("A")
    assert consumer.store.in_transaction() is False
    assert consumer.projection("A") == projection_before
    assert projection_before == (None if done == 0 else {"state": "reserved", "last_seq": 1, "held": 3})
    assert consumer.applied("A") == effects_before
    assert len(effects_before) == done
    assert consumer.inbox("A")[done] == InboxEntry(event_id=f"A{done + 1}", seq=done + 1, state="pending", reason=None)
    assert raw_inbox(consumer.location) == inbox_before
    assert count(consumer.location, "effect") == done
    # drain propagates the error as well, never counting it as applied
    with pytest.raises(integrity_error(consumer.location)):
        consumer.drain("A")
    assert consumer.projection("A") == projection_before

    allow_inserts(consumer.location, "effect")
    r = consumer.apply_next("A")
    assert (r.status, r.seq, r.event_id) == ("applied", done + 1, f"A{done + 1}")
    assert [e.event_id for e in consumer.applied("A")] == [f"A{n}" for n in range(1, done + 2)]
    assert consumer.inbox("A")[done].state == "applied"
