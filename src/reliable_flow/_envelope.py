"""The envelope: validation and canonical JSON (SPEC section 4).

An envelope is a flat JSON object::

    {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved",
     "schema": 1, "payload": {"amount": 3}, "meta": {"trace": "t-9"}}

Validation is the same on both sides (``advance`` builds one, ``receive``
checks one it did not build) and rejects anything outside the rules with
:class:`InvalidEnvelope` naming the field.  The canonical body is the
sorted-key compact UTF-8 JSON; it is what is stored, and two events are "the
same" only if their canonical bodies are equal as whole strings.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from .errors import InvalidEnvelope

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DELIVERED_BYTES",
    "MAX_ID_CHARS",
    "MAX_INT",
    "MAX_SCHEMA",
    "Envelope",
    "body_hash",
    "canonical",
    "check_expected_seq",
    "check_name",
    "delivered",
    "make",
    "parse",
    "previous",
]

MAX_ID_CHARS = 128
MAX_INT = 2**53 - 1
MAX_SCHEMA = 1000
MAX_PAYLOAD_KEYS = 32
MAX_KEY_CHARS = 64
MAX_TEXT_CHARS = 4096
MAX_META_ENTRIES = 8
MAX_BODY_BYTES = 16 * 1024
#: A delivered body: the canonical body and a ``prev_seq`` (at most 27 bytes more).
MAX_DELIVERED_BYTES = MAX_BODY_BYTES + 32

REQUIRED = ("event_id", "flow_id", "seq", "kind", "schema", "payload")
# ``prev_seq`` is delivery data (issue 32): the seq of the flow's previous
# event *for the consumer it is delivered to*, when that is not ``seq - 1``
# (a consumer subscribed to some topics only).  The producer's event has
# none; the relay adds it per consumer, and the consumer stores and compares
# the body it was delivered (the same delivery always carries the same one).
ALLOWED = frozenset(REQUIRED + ("meta", "prev_seq"))

Scalar = Union[None, bool, int, float, str]  # noqa: UP007 - a runtime alias on 3.10


@dataclass(frozen=True, slots=True)
class Envelope:
    """A validated envelope and its canonical body."""

    event_id: str
    flow_id: str
    seq: int
    kind: str
    schema: int
    payload: dict[str, Scalar]
    meta: dict[str, str]
    body: str
    prev_seq: int | None = None

    @property
    def previous(self) -> int:
        """The seq of the flow's previous event for this consumer (``seq - 1``
        unless the delivery said otherwise)."""
        return self.seq - 1 if self.prev_seq is None else self.prev_seq


def _utf8(field: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidEnvelope(field, "must be valid Unicode (lone surrogate found)") from None


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def check_name(field: str, value: object) -> str:
    """Ids and kind: str, 1-128 characters, no control characters."""
    if not isinstance(value, str):
        raise InvalidEnvelope(field, f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise InvalidEnvelope(field, f"must be 1 to {MAX_ID_CHARS} characters, got {len(value)}")
    if _CONTROL.search(value) is not None:
        raise InvalidEnvelope(field, "must not contain control characters")
    _utf8(field, value)
    return value


def _check_int(field: str, value: object, low: int, high: int, high_text: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEnvelope(field, f"must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidEnvelope(field, f"must be between {low} and {high_text}, got {value}")
    return value


def check_expected_seq(value: object) -> int:
    """``expected_seq`` of ``advance``: an int >= 0 (not bool) whose successor is a valid seq."""
    return _check_int("expected_seq", value, 0, MAX_INT - 1, "2**53-2")


def _check_value(field: str, value: object) -> Scalar:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            raise InvalidEnvelope(field, "integers must be within +-(2**53-1)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEnvelope(field, "floats must be finite")
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise InvalidEnvelope(field, f"strings must be at most {MAX_TEXT_CHARS} characters")
        _utf8(field, value)
        return value
    raise InvalidEnvelope(
        field,
        f"must be null, bool, int, float or str (no nested objects or lists), "
        f"got {type(value).__name__}",
    )


def _check_key(field: str, key: object) -> str:
    if not isinstance(key, str):
        raise InvalidEnvelope(field, f"keys must be strings, got {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        raise InvalidEnvelope(field, f"keys must be 1 to {MAX_KEY_CHARS} characters, got {key!r}")
    _utf8(field, key)
    return key


Item = TypeVar("Item")


def _check_object(
    field: str, value: object, what: str, limit: int, unit: str, check_item: Callable[[str, object], Item]
) -> dict[str, Item]:
    if not isinstance(value, Mapping):
        raise InvalidEnvelope(field, f"must be {what}, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidEnvelope(field, f"must have at most {limit} {unit}, got {len(value)}")
    out: dict[str, Item] = {}
    for key, item in value.items():
        name = _check_key(field, key)
        out[name] = check_item(f"{field}.{name}", item)
    return out


def _check_payload(value: object) -> dict[str, Scalar]:
    return _check_object("payload", value, "an object", MAX_PAYLOAD_KEYS, "keys", _check_value)


def _check_meta_value(field: str, item: object) -> str:
    if not isinstance(item, str):
        raise InvalidEnvelope(field, f"must be a string, got {type(item).__name__}")
    if len(item) > MAX_TEXT_CHARS:
        raise InvalidEnvelope(field, f"must be at most {MAX_TEXT_CHARS} characters")
    _utf8(field, item)
    return item


def _check_meta(value: object) -> dict[str, str]:
    if value is None:
        return {}
    return _check_object("meta", value, "an object or null", MAX_META_ENTRIES, "entries", _check_meta_value)


# One encoder for every call: json.dumps() with these options builds a new
# encoder each time, which costs more than encoding a small envelope.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical(obj: Mapping[str, Any]) -> str:
    """Sorted-key compact JSON, non-ASCII kept as UTF-8 text."""
    return _ENCODER.encode(obj)


def body_hash(body: str) -> bytes:
    """SHA-256 of a canonical body's UTF-8 bytes: what a tombstone keeps of a
    pruned event, enough to tell the same body from another one."""
    return hashlib.sha256(body.encode("utf-8")).digest()


def make(
    *,
    event_id: object,
    flow_id: object,
    seq: object,
    kind: object,
    schema: object,
    payload: object,
    meta: object = None,
    prev_seq: object = None,
) -> Envelope:
    """Validate the fields of one envelope and compute its canonical body.

    An empty ``meta`` is the same as no ``meta``: both leave the key out of
    the body, so they never make two otherwise equal events differ.
    ``prev_seq`` (a delivery's, see ``ALLOWED``): None leaves the key out,
    else an int ``0 <= prev_seq < seq`` (kept in the body even when it is
    ``seq - 1``: a subscriber to topics always gets one, so its gap names
    the event it misses).  The size limit is the event's body's, without it.
    """
    fields: dict[str, Any] = {
        "event_id": check_name("event_id", event_id),
        "flow_id": check_name("flow_id", flow_id),
        "seq": _check_int("seq", seq, 1, MAX_INT, "2**53-1"),
        "kind": check_name("kind", kind),
        "schema": _check_int("schema", schema, 1, MAX_SCHEMA, str(MAX_SCHEMA)),
        "payload": _check_payload(payload),
    }
    checked_meta = _check_meta(meta)
    if checked_meta:
        fields["meta"] = checked_meta
    body = canonical(fields)
    size = len(body.encode("utf-8"))
    if size > MAX_BODY_BYTES:
        raise InvalidEnvelope("envelope", f"canonical body is {size} bytes; at most {MAX_BODY_BYTES}")
    prev: int | None = None
    if prev_seq is not None:
        prev = _check_int("prev_seq", prev_seq, 0, fields["seq"] - 1, "seq - 1")
        fields["prev_seq"] = prev
        body = canonical(fields)
    env = Envelope(body=body, meta=checked_meta, prev_seq=prev,
                   **{k: v for k, v in fields.items() if k not in ("meta", "prev_seq")})
    _remember(env)
    return env


# Bodies this process validated lately, by their canonical text.  A relay in
# the same process as the advance hands the consumer the very text advance
# built; parsing it again would only repeat the same checks and encoding.
# A body equal to a remembered one is the same envelope (the canonical body
# determines every field), so it is answered from here, with its own copies
# of the payload and meta (a handler may change what it is given).
_RECENT: dict[str, Envelope] = {}
_RECENT_MAX = 1024


def _remember(env: Envelope) -> None:
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.pop(next(iter(_RECENT)))  # the oldest: dicts keep insertion order
    _RECENT[env.body] = env


def _recalled(text: str) -> Envelope | None:
    env = _RECENT.get(text)
    if env is None:
        return None
    return Envelope(env.event_id, env.flow_id, env.seq, env.kind, env.schema, dict(env.payload), dict(env.meta),
                    env.body, env.prev_seq)


def _reject_constant(name: str) -> Any:
    raise InvalidEnvelope("envelope", f"JSON constant {name} is not allowed")


class _JsonObject(dict):  # type: ignore[type-arg]
    """A parsed JSON object that remembers keys it saw twice, so the error can
    name the field with its place (``payload.amount``), known only later."""

    duplicates: tuple[str, ...] = ()


def _keep_duplicates(pairs: list[tuple[str, Any]]) -> _JsonObject:
    out = _JsonObject()
    seen = []
    for key, value in pairs:
        if key in out:
            seen.append(key)
        out[key] = value
    out.duplicates = tuple(seen)
    return out


def _refuse_duplicates(prefix: str, obj: object) -> None:
    duplicates = getattr(obj, "duplicates", ())
    if duplicates:
        raise InvalidEnvelope(prefix + duplicates[0], "appears twice in the JSON object")


def _loads(text: str) -> object:
    try:
        return json.loads(text, object_pairs_hook=_keep_duplicates, parse_constant=_reject_constant)
    except InvalidEnvelope:
        raise
    except json.JSONDecodeError as exc:
        raise InvalidEnvelope("envelope", f"is not valid JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer literal longer than int_max_str_digits
        raise InvalidEnvelope("envelope", f"cannot be parsed: {exc}") from None
    except RecursionError:
        raise InvalidEnvelope("envelope", "is nested too deeply") from None


def parse(envelope: object) -> Envelope:
    """Validate an envelope given as a mapping, JSON text or UTF-8 bytes."""
    if isinstance(envelope, (bytes, bytearray)):
        try:
            envelope = bytes(envelope).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidEnvelope("envelope", "bytes are not valid UTF-8") from None
    if isinstance(envelope, str):
        if len(envelope) > 4 * MAX_BODY_BYTES:
            # Early cap so a huge text is refused before it is parsed.
            raise InvalidEnvelope("envelope", f"JSON text longer than {4 * MAX_BODY_BYTES} characters")
        known = _recalled(envelope)
        if known is not None:
            return known
        fast = _canonical_text(envelope)
        if fast is not None:
            return fast
        envelope = _loads(envelope)
    return _from_mapping(envelope)


def _canonical_text(text: str) -> Envelope | None:
    """The envelope, if ``text`` already is a valid canonical body; else None.

    What a relay sends is the producer's canonical body, so the usual case
    needs only the C parser: a text equal to its own canonical form cannot
    hide duplicate keys or NaN (they would not survive the round trip).
    Anything else takes the careful path, which also finds the right error.
    """
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if type(obj) is not dict:
        return None
    try:
        env = _from_mapping(obj)
    except InvalidEnvelope:
        return None
    return env if env.body == text else None


def _from_mapping(envelope: object) -> Envelope:
    if not isinstance(envelope, Mapping):
        raise InvalidEnvelope("envelope", f"must be an object, got {type(envelope).__name__}")
    _refuse_duplicates("", envelope)
    _refuse_duplicates("payload.", envelope.get("payload"))
    _refuse_duplicates("meta.", envelope.get("meta"))
    for key in envelope:
        if key not in ALLOWED:
            raise InvalidEnvelope(str(key), "is not an envelope field")
    for key in REQUIRED:
        if key not in envelope:
            raise InvalidEnvelope(key, "is required")
    return make(
        event_id=envelope["event_id"],
        flow_id=envelope["flow_id"],
        seq=envelope["seq"],
        kind=envelope["kind"],
        schema=envelope["schema"],
        payload=envelope["payload"],
        meta=envelope.get("meta"),
        prev_seq=envelope.get("prev_seq"),
    )


def delivered(body: str, prev_seq: int | None) -> str:
    """The text a relay sends one consumer: the event's canonical ``body``,
    with the consumer's ``prev_seq`` when the delivery has one (None: the
    body unchanged)."""
    if prev_seq is None:
        return body
    obj = json.loads(body)
    obj["prev_seq"] = prev_seq
    return canonical(obj)


def previous(body: str) -> int | None:
    """The ``prev_seq`` a stored (delivered) ``body`` carries: the seq of the
    flow's previous event for the consumer that stored it; None when it
    carries none (every event is for it: the previous one is ``seq - 1``)."""
    if '"prev_seq":' not in body:  # the usual body: nothing to parse
        return None
    prev = json.loads(body).get("prev_seq")
    return None if prev is None else int(prev)
