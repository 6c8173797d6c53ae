"""Producer.advance: every status with its seq and reason, the check order of
SPEC section 2, rejections that store nothing, and an SQL failure injected
with a trigger."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_reads import allow_inserts, count, integrity_error, reject_inserts, rows
from reliable_flow import Producer
from reliable_flow.errors import InvalidEnvelope
from reliable_flow.records import AdvanceResult

BODY_FIELDS = ("flow_id", "kind", "schema", "payload", "meta", "expected_seq")
STEPS = (("A1", 0, "reserved"), ("A2", 1, "confirmed"), ("A3", 2, "released"))

Rows = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]


def raw_rows(path: str) -> Rows:
    """Every flow row and outbox row, read through connections of their own."""
    flows = rows(path, "SELECT flow_id, seq, state, data FROM flow ORDER BY flow_id")
    events = rows(path, "SELECT pos, event_id, flow_id, seq, body FROM outbox ORDER BY pos")
    return flows, events


def raw_counts(path: str) -> tuple[int, int]:
    return count(path, "flow"), count(path, "outbox")


def step(producer: Producer, n: int, *, amount: int = 3, meta: dict[str, str] | None = None) -> AdvanceResult:
    """Commit step ``n`` (1-based) of flow A with the given amount."""
    event_id, expected, kind = STEPS[n - 1]
    r = producer.advance(event_id, "A", expected_seq=expected, kind=kind, payload={"amount": amount}, meta=meta)
    assert r.status == "committed"
    return r


def advance_a1(producer: Producer, **changes: Any) -> AdvanceResult:
    """advance() with the arguments of A1, except ``changes``."""
    args: dict[str, Any] = {
        "event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved",
        "payload": {"amount": 3}, "schema": 1, "meta": {"correlation_id": "c-1"},
    }
    args.update(changes)
    return producer.advance(args.pop("event_id"), args.pop("flow_id"), **args)


# -- committed --------------------------------------------------------------------------


def test_committed_first_step_writes_flow_row_and_one_outbox_row(producer: Producer) -> None:
    assert raw_counts(producer.location) == (0, 0)
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert (r.status, r.seq, r.event_id, r.flow_id, r.reason) == ("committed", 1, "A1", "A", None)
    assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
    assert [(e.event_id, e.seq, e.accepted) for e in producer.outbox("A")] == [("A1", 1, False)]
    assert raw_counts(producer.location) == (1, 1)
    assert producer.event("A1") == {
        "event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1, "payload": {"amount": 3},
    }


def test_committed_seq_is_expected_seq_plus_one_at_every_step(producer: Producer) -> None:
    for n, (event_id, expected, kind) in enumerate(STEPS, start=1):
        r = producer.advance(event_id, "A", expected_seq=expected, kind=kind, payload={"amount": 3})
        assert (r.status, r.seq, r.event_id) == ("committed", expected + 1, event_id)
        assert producer.flow("A") == {"state": kind, "seq": n, "amount": 3}
        assert raw_counts(producer.location) == (1, n)
    assert [(e.event_id, e.seq) for e in producer.outbox("A")] == [("A1", 1), ("A2", 2), ("A3", 3)]


def test_committed_schema_2_units_and_amount_bounds(producer: Producer) -> None:
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"units": 1_000_000}, schema=2)
    assert (r.status, r.seq) == ("committed", 1)
    assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 1_000_000}
    r = producer.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 1})
    assert (r.status, r.seq) == ("committed", 1)
    assert producer.flow("B") == {"state": "reserved", "seq": 1, "amount": 1}


def test_flow_returns_state_seq_amount_or_none(producer: Producer) -> None:
    assert producer.flow("A") is None
    step(producer, 1, amount=7)
    step(producer, 2, amount=7)
    flow = producer.flow("A")
    assert flow == {"state": "confirmed", "seq": 2, "amount": 7}
    assert set(flow) == {"state", "seq", "amount"}
    assert producer.flow("B") is None


# -- existing ---------------------------------------------------------------------------


def test_existing_same_id_and_body_writes_nothing(producer: Producer) -> None:
    meta = {"correlation_id": "c-1", "causation_id": "k-0"}
    step(producer, 1, meta=meta)
    before = raw_rows(producer.location)
    reordered = dict(reversed(list(meta.items())))  # same meta, other key order
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta=reordered)
    assert (r.status, r.seq, r.event_id, r.flow_id) == ("existing", 1, "A1", "A")
    assert raw_rows(producer.location) == before


def test_existing_after_the_flow_moved_on_to_seq_3(producer: Producer) -> None:
    meta = {"correlation_id": "c-1"}
    step(producer, 1, meta=meta)
    step(producer, 2)
    step(producer, 3)
    before = raw_rows(producer.location)
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta={"correlation_id": "c-1"})
    assert (r.status, r.seq, r.event_id) == ("existing", 1, "A1")
    r = producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
    assert (r.status, r.seq, r.event_id) == ("existing", 2, "A2")
    assert producer.flow("A") == {"state": "released", "seq": 3, "amount": 3}
    assert raw_rows(producer.location) == before


def test_existing_empty_meta_is_the_same_as_no_meta(producer: Producer) -> None:
    step(producer, 1)
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta={})
    assert (r.status, r.seq) == ("existing", 1)


def test_existing_carries_a_reason_as_documented(producer: Producer) -> None:
    step(producer, 1)
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert r.status == "existing"
    assert r.reason


# -- conflict ---------------------------------------------------------------------------


CONFLICTS = [
    pytest.param({"payload": {"amount": 4}}, "payload", id="changed-amount"),
    pytest.param({"flow_id": "B"}, "flow_id", id="changed-flow_id"),
    pytest.param({"schema": 2}, "schema", id="changed-schema"),
    pytest.param({"expected_seq": 1}, "expected_seq", id="changed-expected_seq"),
    pytest.param({"meta": {"correlation_id": "c-2"}}, "meta", id="changed-meta"),
    pytest.param({"meta": None}, "meta", id="dropped-meta"),
    pytest.param({"kind": "confirmed"}, "kind", id="changed-kind"),
]


@pytest.mark.parametrize(("changes", "field"), CONFLICTS)
def test_conflict_names_the_differing_field_and_stores_nothing(
    producer: Producer, changes: dict[str, Any], field: str
) -> None:
    assert advance_a1(producer).status == "committed"
    before = raw_rows(producer.location)
    r = advance_a1(producer, **changes)
    assert (r.status, r.seq, r.event_id) == ("conflict", 1, "A1")
    assert r.reason is not None and field in r.reason
    for other in BODY_FIELDS:
        if other != field:
            assert other not in r.reason, (other, r.reason)
    assert raw_rows(producer.location) == before
    assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
    assert producer.flow("B") is None


@pytest.mark.parametrize(("changes", "field"), CONFLICTS)
def test_conflict_wins_over_stale_after_the_flow_moved_on(
    producer: Producer, changes: dict[str, Any], field: str
) -> None:
    assert advance_a1(producer).status == "committed"
    step(producer, 2)
    step(producer, 3)
    before = raw_rows(producer.location)
    r = advance_a1(producer, **changes)
    assert (r.status, r.seq) == ("conflict", 1)
    assert r.reason is not None and field in r.reason
    assert raw_rows(producer.location) == before


# Regression: the reason once compared decoded values with Python ==, where
# 3 == 3.0 == True, and so named no field for these conflicts.
@pytest.mark.parametrize(
    ("stored", "sent"), [(3, 3.0), (1, True)], ids=["int-vs-float", "int-vs-bool"]
)
def test_conflict_reason_names_payload_when_only_the_json_type_differs(
    producer: Producer, stored: int, sent: object
) -> None:
    assert advance_a1(producer, payload={"amount": stored}).status == "committed"
    r = advance_a1(producer, payload={"amount": sent})
    assert (r.status, r.seq) == ("conflict", 1)
    assert r.reason is not None and "payload" in r.reason


# -- stale ------------------------------------------------------------------------------


@pytest.mark.parametrize("expected_seq", [0, 1, 3, 5], ids=["low-0", "low-1", "high-3", "high-5"])
def test_stale_new_id_with_wrong_expected_seq(producer: Producer, expected_seq: int) -> None:
    step(producer, 1)
    step(producer, 2)
    before = raw_rows(producer.location)
    r = producer.advance("A3x", "A", expected_seq=expected_seq, kind="released", payload={"amount": 3})
    assert (r.status, r.seq, r.event_id, r.flow_id) == ("stale", None, "A3x", "A")
    assert r.reason is not None and "expected_seq" in r.reason and str(expected_seq) in r.reason
    assert raw_rows(producer.location) == before
    assert producer.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}
    # The rejected id was not stored: it can still be used for the right step.
    r = producer.advance("A3x", "A", expected_seq=2, kind="released", payload={"amount": 3})
    assert (r.status, r.seq) == ("committed", 3)


def test_stale_on_a_new_flow_stores_nothing(producer: Producer) -> None:
    r = producer.advance("Z1", "Z", expected_seq=1, kind="reserved", payload={"amount": 3})
    assert (r.status, r.seq) == ("stale", None)
    assert r.reason is not None and "expected_seq" in r.reason
    assert producer.flow("Z") is None
    assert raw_counts(producer.location) == (0, 0)


def test_stale_wins_over_invalid_transition(producer: Producer) -> None:
    step(producer, 1)
    before = raw_rows(producer.location)
    # "released" is not legal from "reserved", and expected_seq is wrong: stale first.
    r = producer.advance("Ax", "A", expected_seq=0, kind="released", payload={"amount": 3})
    assert (r.status, r.seq) == ("stale", None)
    r = producer.advance("Ax", "A", expected_seq=0, kind="no-such-kind", payload={"amount": 3})
    assert r.status == "stale"
    assert raw_rows(producer.location) == before


def test_stale_wins_over_invalid_payload(producer: Producer) -> None:
    step(producer, 1)
    before = raw_rows(producer.location)
    r = producer.advance("Ax", "A", expected_seq=4, kind="confirmed", payload={"amount": 0})
    assert (r.status, r.seq) == ("stale", None)
    assert raw_rows(producer.location) == before


def test_existing_wins_over_stale_and_conflict_over_invalid(producer: Producer) -> None:
    step(producer, 1)
    step(producer, 2)
    # Same id as A1 with a bad amount, at an expected_seq that is now stale: the id check
    # comes first, so this is conflict, not stale or invalid_payload.
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 0}, meta=None)
    assert (r.status, r.seq) == ("conflict", 1)
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert (r.status, r.seq) == ("existing", 1)


# -- invalid_transition -----------------------------------------------------------------


TRANSITIONS = [
    pytest.param(0, "confirmed", id="skip-new-to-confirmed"),
    pytest.param(0, "released", id="skip-new-to-released"),
    pytest.param(1, "released", id="skip-reserved-to-released"),
    pytest.param(1, "reserved", id="repeat-reserved"),
    pytest.param(3, "reserved", id="reopen-after-released"),
    pytest.param(3, "confirmed", id="back-after-released"),
    pytest.param(0, "cancelled", id="unknown-kind-new"),
    pytest.param(2, "cancelled", id="unknown-kind-confirmed"),
]


@pytest.mark.parametrize(("done", "kind"), TRANSITIONS)
def test_invalid_transition_stores_nothing(producer: Producer, done: int, kind: str) -> None:
    for n in range(1, done + 1):
        step(producer, n)
    flow_before = producer.flow("A")
    before = raw_rows(producer.location)
    r = producer.advance("Ax", "A", expected_seq=done, kind=kind, payload={"amount": 3})
    assert (r.status, r.seq, r.event_id) == ("invalid_transition", None, "Ax")
    assert r.reason is not None and kind in r.reason
    assert raw_rows(producer.location) == before
    assert raw_counts(producer.location) == (1 if done else 0, done)
    assert producer.flow("A") == flow_before
    assert len(producer.outbox("A")) == done


def test_invalid_transition_wins_over_invalid_payload(producer: Producer) -> None:
    r = producer.advance("A1", "A", expected_seq=0, kind="released", payload={"amount": 0})
    assert (r.status, r.seq) == ("invalid_transition", None)
    r = producer.advance("A1", "A", expected_seq=0, kind="cancelled", payload={"nope": "x"}, schema=3)
    assert r.status == "invalid_transition"
    assert raw_counts(producer.location) == (0, 0)


# -- invalid_payload --------------------------------------------------------------------


PAYLOADS = [
    pytest.param({"amount": 0}, 1, "amount", id="amount-0"),
    pytest.param({"amount": -1}, 1, "amount", id="amount-negative"),
    pytest.param({"amount": 1_000_001}, 1, "amount", id="amount-1_000_001"),
    pytest.param({"amount": True}, 1, "amount", id="amount-bool"),
    pytest.param({"amount": 3.0}, 1, "amount", id="amount-float"),
    pytest.param({"amount": "3"}, 1, "amount", id="amount-str"),
    pytest.param({"amount": None}, 1, "amount", id="amount-null"),
    pytest.param({"amount": 3, "note": "x"}, 1, "note", id="extra-key"),
    pytest.param({}, 1, "amount", id="missing-key"),
    pytest.param({"units": 3}, 1, "units", id="schema-1-with-units"),
    pytest.param({"amount": 3}, 2, "amount", id="schema-2-with-amount"),
    pytest.param({"units": 3, "amount": 3}, 2, "amount", id="schema-2-with-both"),
    pytest.param({"amount": 3}, 3, "schema 3", id="unknown-schema-3"),
]


@pytest.mark.parametrize(("payload", "schema", "named"), PAYLOADS)
def test_invalid_payload_on_a_new_flow_stores_nothing(
    producer: Producer, payload: dict[str, Any], schema: int, named: str
) -> None:
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload=payload, schema=schema)
    assert (r.status, r.seq, r.event_id) == ("invalid_payload", None, "A1")
    assert r.reason is not None and named in r.reason
    assert producer.flow("A") is None
    assert producer.outbox("A") == []
    assert raw_counts(producer.location) == (0, 0)
    # Nothing was stored under the id: the correct call still commits.
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert (r.status, r.seq) == ("committed", 1)


@pytest.mark.parametrize(
    ("payload", "schema"),
    [({"amount": 4}, 1), ({"units": 2}, 2), ({"amount": 3, "x": 1}, 1)],
    ids=["amount-changed", "units-changed", "extra-key"],
)
def test_invalid_payload_on_confirmed_step_keeps_the_flow(
    producer: Producer, payload: dict[str, Any], schema: int
) -> None:
    step(producer, 1)
    before = raw_rows(producer.location)
    r = producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload=payload, schema=schema)
    assert (r.status, r.seq) == ("invalid_payload", None)
    assert r.reason
    assert raw_rows(producer.location) == before
    assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
    # Same amount in schema 2 spelling is the same n: legal.
    r = producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"units": 3}, schema=2)
    assert (r.status, r.seq) == ("committed", 2)


# -- malformed arguments (check 1) -------------------------------------------------------


MALFORMED = [
    pytest.param({"expected_seq": -1}, "expected_seq", id="expected_seq-negative"),
    pytest.param({"expected_seq": True}, "expected_seq", id="expected_seq-bool"),
    pytest.param({"expected_seq": 0.0}, "expected_seq", id="expected_seq-float"),
    pytest.param({"expected_seq": "0"}, "expected_seq", id="expected_seq-str"),
    pytest.param({"event_id": ""}, "event_id", id="event_id-empty"),
    pytest.param({"flow_id": "F" * 129}, "flow_id", id="flow_id-129"),
    pytest.param({"kind": 5}, "kind", id="kind-int"),
    pytest.param({"schema": True}, "schema", id="schema-bool"),
    pytest.param({"schema": 1001}, "schema", id="schema-1001"),
    pytest.param({"payload": {"amount": [3]}}, "payload.amount", id="payload-list"),
    pytest.param({"meta": {"k": 1}}, "meta.k", id="meta-non-str"),
]


@pytest.mark.parametrize(("changes", "field"), MALFORMED)
def test_malformed_arguments_raise_before_any_check(
    producer: Producer, changes: dict[str, Any], field: str
) -> None:
    assert advance_a1(producer).status == "committed"
    before = raw_rows(producer.location)
    with pytest.raises(InvalidEnvelope) as info:
        advance_a1(producer, **changes)
    assert info.value.field == field
    assert raw_rows(producer.location) == before
    assert producer.store.in_transaction() is False


# -- SQL failure injected with a trigger -------------------------------------------------


@pytest.mark.parametrize("existing_flow", [False, True], ids=["new-flow", "existing-flow"])
def test_trigger_rejected_outbox_insert_propagates_and_rolls_back(
    producer: Producer, existing_flow: bool
) -> None:
    if existing_flow:
        step(producer, 1)
        event_id, expected, kind = STEPS[1]
    else:
        event_id, expected, kind = STEPS[0]
    flow_before = producer.flow("A")
    outbox_before = producer.outbox("A")
    before = raw_rows(producer.location)
    reject_inserts(producer.location, "outbox", "rejected by test")
    with pytest.raises(integrity_error(producer.location), match="rejected by test"):
        producer.advance(event_id, "A", expected_seq=expected, kind=kind, payload={"amount": 3})
    assert producer.store.in_transaction() is False
    assert producer.flow("A") == flow_before
    assert flow_before == (
        {"state": "reserved", "seq": 1, "amount": 3} if existing_flow else None
    )
    assert producer.outbox("A") == outbox_before
    assert raw_rows(producer.location) == before

    allow_inserts(producer.location, "outbox")
    r = producer.advance(event_id, "A", expected_seq=expected, kind=kind, payload={"amount": 3})
    assert (r.status, r.seq) == ("committed", expected + 1)
    assert producer.flow("A") == {"state": kind, "seq": expected + 1, "amount": 3}
    assert [e.event_id for e in producer.outbox("A")] == [s[0] for s in STEPS[: expected + 1]]
    stored = json.loads(raw_rows(producer.location)[1][-1][4])
    assert stored["event_id"] == event_id
