"""What a transport carries: a request (a batch of event bodies for one
consumer) and its answer (one :class:`~reliable_flow.ReceiveResult` per
body, or the error the consumer's side raised), as flat string fields that
any broker can hold (a Redis stream entry, a message's headers and body).

Broker-neutral and standard library only, so a second broker reuses it.
Every field is checked when read: a message that is not one of ours, has
the wrong types or is too large raises :class:`BadMessage` naming the
field, and is never applied.  The bodies are checked by the consumer as
any body is (``envelope.parse``), each on its own, so one bad body is
refused without touching the others' requests.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._envelope import MAX_DELIVERED_BYTES
from ..errors import ConsumerMismatch, RemoteError
from ..records import ReceiveResult
from ..statuses import ReceiveStatus

__all__ = [
    "MAX_BODIES",
    "MAX_FIELD_BYTES",
    "VERSION",
    "Answer",
    "BadMessage",
    "Request",
    "answer_fields",
    "deadline_field",
    "error_fields",
    "parse_answer",
    "parse_request",
    "request_fields",
    "text_field",
    "version_field",
]

#: The wire format's version; a message of another version is refused.
VERSION = "1"
#: At most this many bodies in one request (``relay_batch``'s ``limit``).
MAX_BODIES = 1000
#: A field's size limit: MAX_BODIES bodies of the envelope's largest size, and room for JSON.
MAX_FIELD_BYTES = MAX_BODIES * (MAX_DELIVERED_BYTES + 64)
_MAX_TEXT = 1024  # ids, reply addresses, uids, error texts
_STATUSES = {s.value: s for s in ReceiveStatus}


class BadMessage(ValueError):
    """A message on the transport that is not a well-formed request or
    answer of this version: ``field`` names what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Request:
    """A batch of canonical bodies for the consumer whose storage has
    ``uid``; answered on ``reply`` before ``deadline`` (seconds since the
    epoch, the sender's clock), or not at all."""

    id: str
    reply: str
    deadline: float
    uid: str
    bodies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to request ``id``: ``results`` in the order of its
    bodies, or ``error`` (``(type name, message)``) when the consumer's
    receive raised and nothing was stored.  ``uid`` and ``location`` are
    the answering consumer's."""

    id: str
    uid: str
    location: str
    results: tuple[ReceiveResult, ...] | None
    error: tuple[str, str] | None

    def outcome(self) -> list[ReceiveResult]:
        """The results, or raise what the far side raised (a mismatched
        consumer as :class:`ConsumerMismatch`, which retrying cannot heal)."""
        if self.error is not None:
            kind, message = self.error
            if kind == "ConsumerMismatch":
                raise ConsumerMismatch(message)
            raise RemoteError(kind, message)
        assert self.results is not None
        return list(self.results)


def new_id() -> str:
    return uuid.uuid4().hex


def request_fields(request: Request) -> dict[str, str]:
    return {
        "v": VERSION,
        "id": request.id,
        "reply": request.reply,
        "deadline": repr(request.deadline),
        "uid": request.uid,
        "bodies": json.dumps(list(request.bodies), ensure_ascii=False, separators=(",", ":")),
    }


def answer_fields(request_id: str, uid: str, location: str, results: Sequence[ReceiveResult]) -> dict[str, str]:
    rows = [[r.status.value, r.event_id, r.flow_id, r.seq, r.reason, r.applied] for r in results]
    return {"v": VERSION, "id": request_id, "uid": uid, "location": location[:_MAX_TEXT],
            "results": json.dumps(rows, ensure_ascii=False, separators=(",", ":"))}


def error_fields(request_id: str, uid: str, location: str, exc: BaseException) -> dict[str, str]:
    return {"v": VERSION, "id": request_id, "uid": uid, "location": location[:_MAX_TEXT],
            "error": type(exc).__name__, "message": str(exc)[:_MAX_TEXT]}


# -- reading: every field checked ------------------------------------------------------


def text_field(fields: Mapping[str, str], name: str, *, required: bool = True, limit: int = _MAX_TEXT) -> str:
    value = fields.get(name)
    if value is None:
        if required:
            raise BadMessage(name, "missing")
        return ""
    if not isinstance(value, str):
        raise BadMessage(name, f"must be text, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise BadMessage(name, f"larger than {limit} bytes")
    if required and not value:
        raise BadMessage(name, "empty")
    return value


def version_field(fields: Mapping[str, str]) -> None:
    version = text_field(fields, "v")
    if version != VERSION:
        raise BadMessage("v", f"wire version {version!r} is not {VERSION!r}")


def decode(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """Field names and values as text; a field that is not UTF-8 is refused."""
    out: dict[str, str] = {}
    for key, value in raw.items():
        try:
            k = key.decode("utf-8") if isinstance(key, bytes) else key
            v = value.decode("utf-8") if isinstance(value, bytes) else value
        except UnicodeDecodeError:
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            raise BadMessage(name[:64], "not UTF-8 text") from None
        if not isinstance(k, str) or not isinstance(v, str):
            raise BadMessage(str(k)[:64], "not text")
        out[k] = v
    return out


def deadline_field(fields: Mapping[str, str]) -> float:
    """The ``deadline`` field: finite seconds since the epoch."""
    text = text_field(fields, "deadline", limit=64)
    try:
        deadline = float(text)
    except ValueError:
        raise BadMessage("deadline", f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(deadline):
        raise BadMessage("deadline", f"must be finite, got {text!r}")
    return deadline


def parse_request(fields: Mapping[str, str]) -> Request:
    """A request, every field checked (the bodies only as strings of at most
    the envelope's size: the consumer parses each as any body)."""
    version_field(fields)
    deadline = deadline_field(fields)
    raw = text_field(fields, "bodies", limit=MAX_FIELD_BYTES)
    try:
        bodies = json.loads(raw)
    except ValueError:
        raise BadMessage("bodies", "not JSON") from None
    if not isinstance(bodies, list) or not bodies:
        raise BadMessage("bodies", "must be a non-empty JSON list of event bodies")
    if len(bodies) > MAX_BODIES:
        raise BadMessage("bodies", f"more than {MAX_BODIES} bodies")
    for i, body in enumerate(bodies):
        if not isinstance(body, str):
            raise BadMessage(f"bodies[{i}]", f"must be a string, got {type(body).__name__}")
        if len(body.encode("utf-8", "surrogatepass")) > MAX_DELIVERED_BYTES:
            raise BadMessage(f"bodies[{i}]", f"larger than {MAX_DELIVERED_BYTES} bytes")
    return Request(id=text_field(fields, "id"), reply=text_field(fields, "reply"), deadline=deadline,
                   uid=text_field(fields, "uid"), bodies=tuple(bodies))


def _result(i: int, row: object) -> ReceiveResult:
    where = f"results[{i}]"
    if not isinstance(row, list) or len(row) != 6:
        raise BadMessage(where, "must be [status, event_id, flow_id, seq, reason, applied]")
    status, event_id, flow_id, seq, reason, applied = row
    if status not in _STATUSES:
        raise BadMessage(where, f"unknown status {status!r}")
    if not isinstance(event_id, str) or not isinstance(flow_id, str):
        raise BadMessage(where, "event_id and flow_id must be strings")
    if type(seq) is not int or seq < 1:  # a bool is not a seq
        raise BadMessage(where, f"seq must be an int >= 1, got {seq!r}")
    if reason is not None and not isinstance(reason, str):
        raise BadMessage(where, "reason must be a string or null")
    if type(applied) is not bool:
        raise BadMessage(where, f"applied must be true or false, got {applied!r}")
    return ReceiveResult(_STATUSES[status], event_id, flow_id, seq, reason, applied)


def parse_answer(fields: Mapping[str, str]) -> Answer:
    """An answer, every field checked."""
    version_field(fields)
    request_id = text_field(fields, "id")
    uid = text_field(fields, "uid")
    location = text_field(fields, "location", required=False)
    if "error" in fields:
        return Answer(request_id, uid, location, None,
                      (text_field(fields, "error", limit=128), text_field(fields, "message", required=False)))
    raw = text_field(fields, "results", limit=MAX_FIELD_BYTES)
    try:
        rows = json.loads(raw)
    except ValueError:
        raise BadMessage("results", "not JSON") from None
    if not isinstance(rows, list):
        raise BadMessage("results", "must be a JSON list")
    return Answer(request_id, uid, location, tuple(_result(i, row) for i, row in enumerate(rows)), None)


def matches(answer: Answer, request: Request, event_ids: Sequence[str]) -> bool:
    """The answer is one result per body of the request, for the same events, in order."""
    if answer.id != request.id:
        return False
    if answer.results is None:
        return True
    return [r.event_id for r in answer.results] == list(event_ids)
