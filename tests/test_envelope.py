"""Envelope rules (SPEC section 4) on both sides: ``Consumer.receive`` and ``Producer.advance``.

Every malformed input must raise :class:`reliable_flow.errors.InvalidEnvelope` naming
the offending field and must leave nothing behind in the file; every valid
edge case must be accepted, and two spellings of the same event (dict, JSON
text, bytes, other key order or whitespace) must be one event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import count, is_pg, new_location, rows
from reliable_flow import Consumer, Producer, ReliableFlowError, relay
from reliable_flow._envelope import MAX_BODY_BYTES, Envelope, canonical, make, parse
from reliable_flow.errors import InvalidEnvelope
from reliable_flow.records import InboxEntry
from reliable_flow.reservation import RESERVATION
from support import canonical_body, envelope

FLOW = "F"
MAX_INT = 2**53 - 1


def base(**changes: Any) -> dict[str, Any]:
    """A valid envelope for flow F, with some fields replaced."""
    return {**envelope("E1", FLOW, 1), **changes}


def without(key: str) -> dict[str, Any]:
    env = base()
    del env[key]
    return env


def with_payload(payload: Any) -> dict[str, Any]:
    return base(payload=payload)


def with_meta(meta: Any) -> dict[str, Any]:
    return base(meta=meta)


def text_of(env: dict[str, Any]) -> str:
    """JSON text of a dict envelope, built by hand so no key is lost or merged."""
    return json.dumps(env)


def valid_text(**changes: str) -> str:
    """JSON text of the base envelope with some values replaced by raw JSON fragments."""
    parts = {key: json.dumps(value) for key, value in base().items()}
    parts.update(changes)
    return "{" + ",".join(f"{json.dumps(key)}:{value}" for key, value in parts.items()) + "}"


def inbox_bodies(path: str) -> list[str]:
    return [r[0] for r in rows(path, "SELECT body FROM inbox ORDER BY event_id")]


# -- malformed envelopes --------------------------------------------------------------

LONG = "x" * 129
BIG_BODY_PAYLOAD = {f"k{i}": "v" * 4000 for i in range(5)}

# (id, envelope, field): passed to receive() as a dict *and* as JSON text.
BOTH_FORMS: list[tuple[str, Any, str]] = [
    ("missing-event_id", without("event_id"), "event_id"),
    ("missing-flow_id", without("flow_id"), "flow_id"),
    ("missing-seq", without("seq"), "seq"),
    ("missing-kind", without("kind"), "kind"),
    ("missing-schema", without("schema"), "schema"),
    ("missing-payload", without("payload"), "payload"),
    ("extra-key", base(extra=1), "extra"),
    ("extra-key-case-variant", base(Seq=1), "Seq"),
    ("extra-key-null", base(trace=None), "trace"),
    ("top-level-list", [base()], "envelope"),
    ("top-level-empty-list", [], "envelope"),
    ("top-level-number", 42, "envelope"),
    ("top-level-string", "hello", "envelope"),
    ("top-level-null", None, "envelope"),
    ("event_id-empty", base(event_id=""), "event_id"),
    ("flow_id-empty", base(flow_id=""), "flow_id"),
    ("kind-empty", base(kind=""), "kind"),
    ("event_id-129-chars", base(event_id=LONG), "event_id"),
    ("flow_id-129-chars", base(flow_id=LONG), "flow_id"),
    ("kind-129-chars", base(kind=LONG), "kind"),
    ("event_id-newline", base(event_id="E\n1"), "event_id"),
    ("flow_id-nul", base(flow_id="F\x00"), "flow_id"),
    ("kind-del-0x7f", base(kind="reserved\x7f"), "kind"),
    ("event_id-nel-0x85", base(event_id="E\x851"), "event_id"),
    ("flow_id-tab", base(flow_id="\tF"), "flow_id"),
    ("event_id-int", base(event_id=1), "event_id"),
    ("flow_id-null", base(flow_id=None), "flow_id"),
    ("kind-list", base(kind=["reserved"]), "kind"),
    ("seq-0", base(seq=0), "seq"),
    ("seq-minus-1", base(seq=-1), "seq"),
    ("seq-true", base(seq=True), "seq"),
    ("seq-float-1.0", base(seq=1.0), "seq"),
    ("seq-string", base(seq="1"), "seq"),
    ("seq-2**53", base(seq=2**53), "seq"),
    ("seq-null", base(seq=None), "seq"),
    ("schema-0", base(schema=0), "schema"),
    ("schema-1001", base(schema=1001), "schema"),
    ("schema-true", base(schema=True), "schema"),
    ("schema-string", base(schema="1"), "schema"),
    ("payload-list", with_payload([["amount", 3]]), "payload"),
    ("payload-string", with_payload("amount=3"), "payload"),
    ("payload-null", with_payload(None), "payload"),
    ("payload-nested-object", with_payload({"a": {"b": 1}}), "payload.a"),
    ("payload-nested-list", with_payload({"a": [1, 2]}), "payload.a"),
    ("payload-33-keys", with_payload({f"k{i}": i for i in range(33)}), "payload"),
    ("payload-empty-key", with_payload({"": 1}), "payload"),
    ("payload-65-char-key", with_payload({"k" * 65: 1}), "payload"),
    ("payload-4097-char-string", with_payload({"s": "s" * 4097}), "payload.s"),
    ("payload-int-2**53", with_payload({"n": 2**53}), "payload.n"),
    ("payload-int-minus-2**53", with_payload({"n": -(2**53)}), "payload.n"),
    ("meta-list", with_meta(["a", "b"]), "meta"),
    ("meta-string", with_meta("trace=1"), "meta"),
    ("meta-9-entries", with_meta({f"m{i}": "v" for i in range(9)}), "meta"),
    ("meta-int-value", with_meta({"trace": 7}), "meta.trace"),
    ("meta-null-value", with_meta({"trace": None}), "meta.trace"),
    ("meta-65-char-key", with_meta({"m" * 65: "v"}), "meta"),
    ("meta-empty-key", with_meta({"": "v"}), "meta"),
    ("body-over-16KiB", with_payload(BIG_BODY_PAYLOAD), "envelope"),
    # json.dumps writes these as \ud800 escapes, which JSON text can express.
    ("event_id-lone-surrogate", base(event_id="E\ud8001"), "event_id"),
    ("payload-value-lone-surrogate", with_payload({"s": "\udfff"}), "payload.s"),
    ("meta-value-lone-surrogate", with_meta({"trace": "\ud800"}), "meta.trace"),
]

# Python values JSON cannot express (or would express differently).
DICT_ONLY: list[tuple[str, Any, str]] = [
    ("payload-bool-key", with_payload({True: 1}), "payload"),
    ("payload-int-key", with_payload({1: 1}), "payload"),
    ("payload-nan", with_payload({"x": float("nan")}), "payload.x"),
    ("payload-inf", with_payload({"x": float("inf")}), "payload.x"),
    ("payload-minus-inf", with_payload({"x": float("-inf")}), "payload.x"),
    ("payload-key-lone-surrogate", with_payload({"\ud800": 1}), "payload"),
    ("payload-tuple-value", with_payload({"t": (1, 2)}), "payload.t"),
    ("payload-bytes-value", with_payload({"b": b"x"}), "payload.b"),
    ("payload-tuple", with_payload(("amount", 3)), "payload"),
    ("meta-int-key", with_meta({1: "v"}), "meta"),
    ("top-level-int-key", {**base(), 1: "x"}, "1"),
    ("seq-nan", base(seq=float("nan")), "seq"),
    ("top-level-tuple", tuple(base().items()), "envelope"),
    ("top-level-set", {"event_id"}, "envelope"),
]

# JSON text (or bytes) with no dict equivalent.
TEXT_ONLY: list[tuple[str, Any, str]] = [
    ("invalid-json-truncated", '{"event_id": "E1", "flow_id":', "envelope"),
    ("invalid-json-empty", "", "envelope"),
    ("invalid-json-whitespace", "   \n", "envelope"),
    ("invalid-json-single-quotes", "{'event_id': 'E1'}", "envelope"),
    ("invalid-json-trailing-garbage", valid_text() + " x", "envelope"),
    ("invalid-json-trailing-comma", valid_text()[:-1] + ",}", "envelope"),
    ("invalid-json-two-objects", valid_text() + valid_text(), "envelope"),
    ("nan-constant", valid_text(payload='{"amount": NaN}'), "envelope"),
    ("infinity-constant", valid_text(payload='{"amount": Infinity}'), "envelope"),
    ("minus-infinity-constant", valid_text(payload='{"amount": -Infinity}'), "envelope"),
    ("nan-as-seq", valid_text(seq="NaN"), "envelope"),
    ("1e400-in-payload", valid_text(payload='{"x": 1e400}'), "payload.x"),
    ("minus-1e400-in-payload", valid_text(payload='{"x": -1e400}'), "payload.x"),
    ("1e400-as-seq", valid_text(seq="1e400"), "seq"),
    ("seq-exponent-float", valid_text(seq="1e0"), "seq"),
    ("duplicate-key-top-level", valid_text()[:-1] + ',"seq":2}', "seq"),
    ("duplicate-key-same-value", valid_text()[:-1] + ',"event_id":"E1"}', "event_id"),
    ("lone-surrogate-escape-in-kind", valid_text(kind='"re\\udc00served"'), "kind"),
    ("deeply-nested", "[" * 20000 + "]" * 20000, "envelope"),
    ("text-over-64K-chars", " " * (4 * MAX_BODY_BYTES + 1) + valid_text(), "envelope"),
    ("bytes-not-utf8", b'{"event_id": "\xff\xfe"}', "envelope"),
    ("bytes-latin1", valid_text(flow_id='"\u00c4"').encode("latin-1"), "envelope"),
    ("bytes-utf8-bom", b"\xef\xbb\xbf" + valid_text().encode(), "envelope"),
    ("bytes-utf16", valid_text().encode("utf-16"), "envelope"),
    ("bytearray-top-level-list", bytearray(b"[]"), "envelope"),
]


def _malformed_params() -> Iterator[Any]:
    for case_id, env, field in BOTH_FORMS:
        yield pytest.param(env, field, id=f"dict-{case_id}")
        yield pytest.param(text_of(env), field, id=f"json-{case_id}")
    for case_id, env, field in DICT_ONLY:
        yield pytest.param(env, field, id=f"dict-{case_id}")
    for case_id, text, field in TEXT_ONLY:
        yield pytest.param(text, field, id=f"json-{case_id}")


def test_there_are_enough_distinct_malformed_cases() -> None:
    ids = [c[0] for c in BOTH_FORMS + DICT_ONLY + TEXT_ONLY]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 30


def _refuses_and_stores_nothing(consumer: Consumer, bad: Any, field: str) -> None:
    with pytest.raises(InvalidEnvelope) as info:
        consumer.receive(bad)
    assert info.value.field == field, str(info.value)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ReliableFlowError)
    assert str(info.value).startswith(f"{field}: ")
    assert consumer.inbox(FLOW) == []
    assert consumer.flows() == []
    assert count(consumer.location, "inbox") == 0


@pytest.mark.parametrize(("bad", "field"), list(_malformed_params()))
def test_receive_refuses_malformed_envelope_and_stores_nothing(tmp_path: Path, bad: Any, field: str) -> None:
    """One fresh SQLite store per case.  (The next test runs every case on
    both engines through one store: a new PostgreSQL store per case would
    cost ~0.3 s each for nothing more, validation coming before storage.)"""
    with Consumer(new_location("sqlite", tmp_path, "consumer"), RESERVATION) as consumer:
        _refuses_and_stores_nothing(consumer, bad, field)


def test_receive_refuses_every_malformed_envelope_and_stores_nothing(consumer: Consumer) -> None:
    for case in _malformed_params():
        bad, field = case.values
        _refuses_and_stores_nothing(consumer, bad, field)


@pytest.mark.parametrize(("bad", "field"), list(_malformed_params()))
def test_parse_refuses_malformed_envelope(bad: Any, field: str) -> None:
    with pytest.raises(InvalidEnvelope) as info:
        parse(bad)
    assert info.value.field == field


def test_malformed_envelope_after_a_good_one_leaves_the_good_one_alone(consumer: Consumer) -> None:
    assert consumer.receive(base()).status == "accepted"
    before = inbox_bodies(consumer.location)
    with pytest.raises(InvalidEnvelope):
        consumer.receive(base(event_id="E2", seq=2, payload={"a": [1]}))
    with pytest.raises(InvalidEnvelope):
        consumer.receive(base(seq=1, extra="x"))
    assert inbox_bodies(consumer.location) == before
    assert [r.event_id for r in consumer.inbox(FLOW)] == ["E1"]


@pytest.mark.parametrize("where", ["seq", "payload"])
def test_receive_refuses_integer_too_long_to_parse(consumer: Consumer, where: str) -> None:
    digits = "1" * 5000
    if where == "seq":
        text = valid_text(seq=digits)
    else:
        text = valid_text(payload='{"n": ' + digits + "}")
    # Regression: json.loads raises a plain ValueError (int_max_str_digits) here.
    with pytest.raises(InvalidEnvelope) as info:
        consumer.receive(text)
    assert info.value.field == "envelope"
    assert consumer.inbox(FLOW) == []
    assert count(consumer.location, "inbox") == 0


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        ({"payload": '{"amount": 3, "amount": 4}'}, "payload.amount"),
        ({"payload": '{"amount": 3}', "meta": '{"trace": "a", "trace": "b"}'}, "meta.trace"),
    ],
    ids=["payload", "meta"],
)
def test_duplicate_key_inside_payload_or_meta_names_the_dotted_field(
    consumer: Consumer, fragment: dict[str, str], field: str
) -> None:
    text = valid_text(**fragment)
    with pytest.raises(InvalidEnvelope) as info:
        consumer.receive(text)
    assert count(consumer.location, "inbox") == 0
    assert info.value.field == field


def test_duplicate_key_inside_payload_is_refused(consumer: Consumer) -> None:
    with pytest.raises(InvalidEnvelope):
        consumer.receive(valid_text(payload='{"amount": 3, "amount": 4}'))
    assert consumer.inbox(FLOW) == []
    assert count(consumer.location, "inbox") == 0


# -- advance with malformed arguments ---------------------------------------------------

GOOD_ADVANCE: dict[str, Any] = {
    "event_id": "A1",
    "flow_id": FLOW,
    "expected_seq": 0,
    "kind": "reserved",
    "payload": {"amount": 3},
    "schema": 1,
    "meta": None,
}

BAD_ADVANCE: list[tuple[str, dict[str, Any], str]] = [
    ("expected_seq-minus-1", {"expected_seq": -1}, "expected_seq"),
    ("expected_seq-true", {"expected_seq": True}, "expected_seq"),
    ("expected_seq-false", {"expected_seq": False}, "expected_seq"),
    ("expected_seq-1.5", {"expected_seq": 1.5}, "expected_seq"),
    ("expected_seq-0.0", {"expected_seq": 0.0}, "expected_seq"),
    ("expected_seq-2**53-1", {"expected_seq": 2**53 - 1}, "expected_seq"),
    ("expected_seq-string", {"expected_seq": "0"}, "expected_seq"),
    ("expected_seq-none", {"expected_seq": None}, "expected_seq"),
    ("event_id-empty", {"event_id": ""}, "event_id"),
    ("event_id-129-chars", {"event_id": LONG}, "event_id"),
    ("event_id-int", {"event_id": 1}, "event_id"),
    ("event_id-lone-surrogate", {"event_id": "A\ud800"}, "event_id"),
    ("flow_id-nul", {"flow_id": "F\x00"}, "flow_id"),
    ("flow_id-none", {"flow_id": None}, "flow_id"),
    ("kind-newline", {"kind": "reserved\n"}, "kind"),
    ("kind-0x85", {"kind": "\x85"}, "kind"),
    ("schema-0", {"schema": 0}, "schema"),
    ("schema-1001", {"schema": 1001}, "schema"),
    ("schema-true", {"schema": True}, "schema"),
    ("payload-list", {"payload": [("amount", 3)]}, "payload"),
    ("payload-none", {"payload": None}, "payload"),
    ("payload-nested", {"payload": {"amount": {"n": 3}}}, "payload.amount"),
    ("payload-33-keys", {"payload": {f"k{i}": 1 for i in range(33)}}, "payload"),
    ("payload-nan", {"payload": {"amount": float("nan")}}, "payload.amount"),
    ("payload-int-2**53", {"payload": {"amount": 2**53}}, "payload.amount"),
    ("meta-9-entries", {"meta": {f"m{i}": "v" for i in range(9)}}, "meta"),
    ("meta-list", {"meta": ["trace"]}, "meta"),
    ("meta-int-value", {"meta": {"trace": 1}}, "meta.trace"),
    ("meta-65-char-key", {"meta": {"m" * 65: "v"}}, "meta"),
    ("body-over-16KiB", {"payload": BIG_BODY_PAYLOAD}, "envelope"),
]


@pytest.mark.parametrize(
    ("changes", "field"), [pytest.param(c, f, id=i) for i, c, f in BAD_ADVANCE]
)
def test_advance_refuses_malformed_arguments_and_writes_nothing(
    producer: Producer, changes: dict[str, Any], field: str
) -> None:
    args = {**GOOD_ADVANCE, **changes}
    event_id, flow_id = args.pop("event_id"), args.pop("flow_id")
    with pytest.raises(InvalidEnvelope) as info:
        producer.advance(event_id, flow_id, **args)
    assert info.value.field == field, str(info.value)
    assert isinstance(info.value, ValueError)
    assert producer.flow(FLOW) is None
    assert producer.outbox(FLOW) == []
    assert producer.outbox() == []
    assert producer.flows() == []
    assert count(producer.location, "outbox") == 0
    # The same call with good arguments still works: the refusal left no trace.
    assert producer.advance("A1", FLOW, expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"


def test_advance_accepts_the_largest_expected_seq_as_an_argument(producer: Producer) -> None:
    # 2**53-2 is a valid expected_seq (its successor is the largest seq): the
    # answer is a status about the flow, not an InvalidEnvelope.
    r = producer.advance("A1", FLOW, expected_seq=2**53 - 2, kind="reserved", payload={"amount": 3})
    assert r.status == "stale"
    assert producer.flow(FLOW) is None


# -- valid edge cases -----------------------------------------------------------------

UNICODE = "流程-Ä-😀"
MIXED_PAYLOAD: dict[str, Any] = {
    "null": None,
    "true": True,
    "false": False,
    "max": MAX_INT,
    "min": -MAX_INT,
    "zero": 0,
    "float": 1.5,
    "neg_float": -2.25e-10,
    "big_float": 1.7976931348623157e308,
    "text": "t" * 4096,
    "empty": "",
    "unicode": UNICODE,
    "k" * 64: "64-char key",
}
MIXED_PAYLOAD.update({f"pad{i:02d}": i for i in range(32 - len(MIXED_PAYLOAD))})
assert len(MIXED_PAYLOAD) == 32


def _exactly_16k() -> dict[str, Any]:
    payload: dict[str, Any] = {"a": "a" * 4096, "b": "b" * 4096, "c": "c" * 4096, "d": ""}
    size = len(make(**base(payload=payload)).body.encode("utf-8"))
    payload["d"] = "d" * (MAX_BODY_BYTES - size)
    return base(payload=payload)


VALID: list[tuple[str, dict[str, Any]]] = [
    ("minimal", base()),
    ("empty-payload", base(payload={})),
    ("unicode-ids", base(event_id=UNICODE, flow_id=UNICODE, kind=UNICODE)),
    ("128-char-ids", base(event_id="e" * 128, flow_id="f" * 128, kind="k" * 128)),
    ("128-astral-chars", base(event_id="😀" * 128, flow_id="流" * 128)),
    ("meta-8-entries", base(meta={f"{i}" * 64: f"value-{i}-{UNICODE}" for i in range(8)})),
    ("payload-32-mixed-keys", base(payload=MIXED_PAYLOAD)),
    ("seq-max", base(seq=MAX_INT)),
    ("schema-1000", base(schema=1000)),
    ("kind-with-spaces-and-nbsp", base(kind="a b\u00a0c")),
    ("body-exactly-16KiB", _exactly_16k()),
    # Only ids and kind exclude control characters; payload and meta text may hold any.
    ("control-chars-in-payload-and-meta", base(payload={"s": "a\x00b\n\x85"}, meta={"t": "\t\x7f"})),
]


def _reordered_text(env: dict[str, Any]) -> str:
    """Same event: keys in reverse order (also inside payload/meta), odd whitespace, raw UTF-8."""
    flipped = {
        key: (dict(reversed(list(value.items()))) if isinstance(value, dict) else value)
        for key, value in reversed(list(env.items()))
    }
    return json.dumps(flipped, ensure_ascii=False, indent=3, separators=(" ,  ", " :\t"))


def _expected_body(env: dict[str, Any]) -> str:
    fields = dict(env)
    if not fields.get("meta"):
        fields.pop("meta", None)
    return canonical_body(fields)


@pytest.mark.parametrize("first", ["dict", "json"])
@pytest.mark.parametrize("env", [pytest.param(e, id=i) for i, e in VALID])
def test_valid_edge_case_is_accepted_once_in_every_spelling(
    consumer: Consumer, env: dict[str, Any], first: str
) -> None:
    spellings: dict[str, Any] = {
        "dict": env,
        "json": json.dumps(env),
        "json-utf8": json.dumps(env, ensure_ascii=False),
        "reordered": _reordered_text(env),
        "bytes": json.dumps(env, ensure_ascii=False).encode("utf-8"),
        "bytearray": bytearray(json.dumps(env).encode("ascii")),
    }
    r = consumer.receive(spellings[first])
    assert (r.status, r.event_id, r.flow_id, r.seq) == ("accepted", env["event_id"], env["flow_id"], env["seq"])
    for name, spelling in spellings.items():
        if name != first:
            assert consumer.receive(spelling).status == "duplicate", name
    assert consumer.inbox(env["flow_id"]) == [
        InboxEntry(event_id=env["event_id"], seq=env["seq"], state="pending", reason=None,
                   meta=env.get("meta", {}))
    ]
    assert count(consumer.location, "inbox") == 1
    # Stored as the canonical body: sorted keys, compact, non-ASCII as UTF-8 text.
    assert inbox_bodies(consumer.location) == [_expected_body(env)]


@pytest.mark.parametrize("extra", [0, 1], ids=["at-the-text-cap", "one-over"])
def test_json_text_length_cap_is_exact(consumer: Consumer, extra: int) -> None:
    text = valid_text()
    padded = text + " " * (4 * MAX_BODY_BYTES - len(text) + extra)
    if extra:
        with pytest.raises(InvalidEnvelope) as info:
            consumer.receive(padded)
        assert info.value.field == "envelope"
        assert count(consumer.location, "inbox") == 0
    else:
        assert consumer.receive(padded).status == "accepted"
        assert inbox_bodies(consumer.location) == [_expected_body(base())]


def test_a_different_body_under_the_same_id_is_id_conflict(consumer: Consumer) -> None:
    assert consumer.receive(base(meta={"trace": "t"})).status == "accepted"
    assert consumer.receive(base(meta={"trace": "u"})).status == "id_conflict"
    assert consumer.receive(base()).status == "id_conflict"
    assert consumer.receive(base(meta={"trace": "t"}, payload={"amount": 4})).status == "id_conflict"
    assert consumer.receive(base(meta={"trace": "t"}, schema=2)).status == "id_conflict"
    assert consumer.receive(base(meta={"trace": "t"})).status == "duplicate"
    assert count(consumer.location, "inbox") == 1


def test_float_spellings_of_the_same_value_are_one_event(consumer: Consumer) -> None:
    assert consumer.receive(base(payload={"x": 1.5})).status == "accepted"
    assert consumer.receive(valid_text(payload='{"x": 1.50}')).status == "duplicate"
    assert consumer.receive(valid_text(payload='{"x": 15e-1}')).status == "duplicate"
    assert consumer.receive(valid_text(payload='{"x": 1.25}')).status == "id_conflict"


def test_escaped_and_raw_unicode_in_json_text_are_one_event(consumer: Consumer) -> None:
    escaped = valid_text(flow_id='"\\u6d41\\u7a0b-\\u00c4-\\ud83d\\ude00"')
    raw = valid_text(flow_id=f'"{UNICODE}"')
    assert consumer.receive(escaped).status == "accepted"
    assert consumer.receive(raw).status == "duplicate"
    assert consumer.inbox(UNICODE)[0].event_id == "E1"
    body = inbox_bodies(consumer.location)[0]
    assert UNICODE in body and "\\u" not in body


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("absent", "empty"),
        ("empty", "absent"),
        ("absent", "null"),
        ("null", "empty"),
    ],
)
def test_empty_meta_null_meta_and_no_meta_are_the_same_event(
    consumer: Consumer, first: str, second: str
) -> None:
    forms: dict[str, dict[str, Any]] = {"absent": base(), "empty": base(meta={}), "null": base(meta=None)}
    assert consumer.receive(forms[first]).status == "accepted"
    assert consumer.receive(forms[second]).status == "duplicate"
    assert consumer.receive(json.dumps(forms[second])).status == "duplicate"
    assert inbox_bodies(consumer.location) == [_expected_body(base())]


def test_advance_with_empty_meta_and_no_meta_is_the_same_event(producer: Producer) -> None:
    r = producer.advance("A1", FLOW, expected_seq=0, kind="reserved", payload={"amount": 3}, meta={})
    assert r.status == "committed"
    again = producer.advance("A1", FLOW, expected_seq=0, kind="reserved", payload={"amount": 3})
    assert again.status == "existing"
    with_none = producer.advance("A1", FLOW, expected_seq=0, kind="reserved", payload={"amount": 3}, meta=None)
    assert with_none.status == "existing"
    other = producer.advance("A1", FLOW, expected_seq=0, kind="reserved", payload={"amount": 3}, meta={"t": "x"})
    assert other.status == "conflict"
    assert len(producer.outbox(FLOW)) == 1


def test_advance_edge_values_survive_relay_unchanged(producer: Producer, consumer: Consumer) -> None:
    meta = {f"key{i}": f"{UNICODE}-{i}" for i in range(8)}
    r = producer.advance(
        UNICODE, "f" * 128, expected_seq=0, kind="reserved", payload={"amount": 1_000_000}, schema=1, meta=meta
    )
    assert (r.status, r.seq, r.event_id) == ("committed", 1, UNICODE)
    assert producer.flow("f" * 128) == {"state": "reserved", "seq": 1, "amount": 1_000_000}
    assert producer.event(UNICODE) == {
        "event_id": UNICODE, "flow_id": "f" * 128, "seq": 1, "kind": "reserved",
        "schema": 1, "payload": {"amount": 1_000_000}, "meta": meta,
    }
    assert relay(producer, consumer).status == "accepted"
    assert consumer.inbox("f" * 128) == [InboxEntry(event_id=UNICODE, seq=1, state="pending", reason=None, meta=meta)]
    assert consumer.apply_next("f" * 128).status == "applied"
    assert consumer.projection("f" * 128) == {"state": "reserved", "last_seq": 1, "held": 1_000_000}


# -- canonical / make / parse -------------------------------------------------------------


def test_canonical_sorts_keys_compacts_and_keeps_utf8() -> None:
    text = canonical({"b": 1, "a": {"z": None, "y": [1.5, True]}, "ü": UNICODE})
    assert text == '{"a":{"y":[1.5,true],"z":null},"b":1,"ü":"' + UNICODE + '"}'
    assert " " not in text
    assert "\\u" not in text
    assert canonical({"b": 1, "a": 2}) == canonical({"a": 2, "b": 1})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_canonical_refuses_non_finite_floats(value: float) -> None:
    with pytest.raises(ValueError):
        canonical({"x": value})


def test_make_builds_the_canonical_body() -> None:
    env = make(
        event_id="E1", flow_id=UNICODE, seq=7, kind="confirmed", schema=2,
        payload={"z": 1, "a": "x y"}, meta={"b": "2", "a": "1"},
    )
    assert isinstance(env, Envelope)
    assert (env.event_id, env.flow_id, env.seq, env.kind, env.schema) == ("E1", UNICODE, 7, "confirmed", 2)
    assert env.payload == {"z": 1, "a": "x y"}
    assert env.meta == {"b": "2", "a": "1"}
    assert env.body == (
        '{"event_id":"E1","flow_id":"' + UNICODE + '","kind":"confirmed",'
        '"meta":{"a":"1","b":"2"},"payload":{"a":"x y","z":1},"schema":2,"seq":7}'
    )
    assert json.loads(env.body)["flow_id"] == UNICODE


def test_make_leaves_empty_meta_out_of_the_body() -> None:
    bodies = {
        make(event_id="E", flow_id="F", seq=1, kind="k", schema=1, payload={}, meta=meta).body
        for meta in (None, {})
    }
    assert bodies == {'{"event_id":"E","flow_id":"F","kind":"k","payload":{},"schema":1,"seq":1}'}
    with_meta_body = make(event_id="E", flow_id="F", seq=1, kind="k", schema=1, payload={}, meta={"a": "b"}).body
    assert '"meta":{"a":"b"}' in with_meta_body


def test_make_refuses_a_body_one_byte_over_16KiB() -> None:
    env = _exactly_16k()
    assert len(make(**env).body.encode("utf-8")) == MAX_BODY_BYTES
    payload = dict(env["payload"])
    payload["d"] += "d"
    with pytest.raises(InvalidEnvelope) as info:
        make(**{**env, "payload": payload})
    assert info.value.field == "envelope"


def test_body_limit_counts_utf8_bytes_not_characters() -> None:
    # 4 keys of 1400 three-byte characters: about 5,600 characters but 16,800 bytes.
    payload = {k: "流" * 1400 for k in "abcd"}
    with pytest.raises(InvalidEnvelope) as info:
        make(**base(payload=payload))
    assert info.value.field == "envelope"


def test_parse_accepts_dict_text_and_bytes_with_one_body() -> None:
    env = base(flow_id=UNICODE, meta={"trace": "t"})
    from_dict = parse(env)
    assert parse(json.dumps(env)) == from_dict
    assert parse(json.dumps(env, ensure_ascii=False).encode("utf-8")) == from_dict
    assert parse(_reordered_text(env)) == from_dict
    assert from_dict.body == _expected_body(env)
    assert UNICODE.encode("utf-8") in from_dict.body.encode("utf-8")


def test_envelope_is_frozen() -> None:
    import dataclasses

    env = parse(base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.seq = 2  # type: ignore[misc]


def test_parse_does_not_keep_a_reference_to_the_callers_payload() -> None:
    payload = {"amount": 3}
    env = parse(base(payload=payload))
    payload["amount"] = 4
    assert env.payload == {"amount": 3}
    assert json.loads(env.body)["payload"] == {"amount": 3}


def test_files_are_real(tmp_path: Path, consumer: Consumer) -> None:
    # Guard for the raw-count helper: it must read the consumer's own store.
    if not is_pg(consumer.location):
        assert Path(consumer.location).parent == tmp_path
    assert count(consumer.location, "inbox") == 0
    consumer.receive(base())
    assert count(consumer.location, "inbox") == 1


def test_a_body_parsed_again_in_the_same_process_is_the_same_envelope_with_its_own_payload() -> None:
    """parse() answers a text it validated lately without validating it again:
    same fields, but payload and meta are copies, so a handler that changes
    what it was given cannot change what the next reader of the text gets."""
    from reliable_flow import _envelope as module

    made = module.make(event_id="R1", flow_id="R", seq=1, kind="reserved", schema=1,
                       payload={"amount": 3}, meta={"trace_id": "t"})
    first = module.parse("".join(made.body))  # a new str object, as read back from a file
    assert first == made and first.payload is not made.payload and first.meta is not made.meta
    first.payload["amount"] = 99
    first.meta["trace_id"] = "changed"
    again = module.parse(made.body)
    assert again.payload == {"amount": 3} and again.meta == {"trace_id": "t"}
    # A text that is not canonical is never taken for a remembered one.
    spaced = made.body.replace(",", ", ")
    assert module.parse(spaced) == made


def test_the_memory_of_recent_bodies_is_bounded() -> None:
    from reliable_flow import _envelope as module

    for i in range(module._RECENT_MAX + 50):
        module.make(event_id=f"B{i}", flow_id="B", seq=1, kind="k", schema=1, payload={})
    assert len(module._RECENT) == module._RECENT_MAX
