"""What a transport carries for a producer on another host: a request to
advance one step at its flow's current seq (an effect's result or failure
fed back), and its answer (the producer's :class:`~reliable_flow.records.AdvanceResult`,
or the error its side raised).

Broker-neutral and standard library only, as :mod:`._wire` is; every
field is checked when read (:class:`~._wire.BadMessage` names the field).
The step itself is checked by the producer as any advance is: a payload
its protocol refuses is answered ``InvalidEnvelope`` and stores nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._envelope import MAX_BODY_BYTES
from ..errors import InvalidEnvelope, RemoteError, WrongFile
from ..records import AdvanceResult
from ..statuses import AdvanceStatus
from ._wire import VERSION, BadMessage, deadline_field, text_field, version_field

__all__ = ["Advance", "AdvanceAnswer", "advance_answer_fields", "advance_fields", "parse_advance",
           "parse_advance_answer"]

_STATUSES = {s.value: s for s in AdvanceStatus}
_MAX_TEXT = 1024


@dataclass(frozen=True, slots=True)
class Advance:
    """Advance ``kind`` with ``payload`` (and ``meta``) as event
    ``event_id`` of flow ``flow_id`` at the flow's current seq, in the
    producer whose storage has ``uid``; answered on ``reply`` before
    ``deadline`` (seconds since the epoch, the sender's clock), or not at all."""

    id: str
    reply: str
    deadline: float
    uid: str
    event_id: str
    flow_id: str
    kind: str
    schema: int
    payload: Any
    meta: dict[str, str] | None
    check: bool = False  # only check it: the same transaction, rolled back (an operator's resolve / amend)


@dataclass(frozen=True, slots=True)
class AdvanceAnswer:
    """The answer to request ``id``: the producer's ``result``, or
    ``error`` (``(type name, message)``) when its side raised and nothing
    was stored.  ``uid`` and ``location`` are the answering producer's."""

    id: str
    uid: str
    location: str
    result: AdvanceResult | None
    error: tuple[str, str] | None

    def outcome(self) -> AdvanceResult:
        """The result, or raise what the far side raised: a step the
        protocol refused as :class:`~reliable_flow.errors.InvalidEnvelope`
        (so feedback records it as refused), a producer storage of the
        wrong kind as :class:`~reliable_flow.errors.WrongFile` (retrying
        cannot heal it), anything else as :class:`~reliable_flow.errors.RemoteError`."""
        if self.error is not None:
            kind, message = self.error
            if kind in ("InvalidEnvelope", "ValueError", "TypeError"):
                field, _, problem = message.partition(": ")
                raise InvalidEnvelope(field, problem) if problem else InvalidEnvelope("envelope", message)
            if kind == "WrongFile":
                raise WrongFile(message)
            raise RemoteError(kind, message)
        assert self.result is not None
        return self.result


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def advance_fields(request: Advance) -> dict[str, str]:
    return {"v": VERSION, "id": request.id, "reply": request.reply, "deadline": repr(request.deadline),
            "uid": request.uid, "event_id": request.event_id, "flow_id": request.flow_id, "kind": request.kind,
            "schema": str(request.schema), "payload": _json(request.payload),
            "meta": _json(request.meta or {}), **({"check": "1"} if request.check else {})}


def advance_answer_fields(request_id: str, uid: str, location: str, result: AdvanceResult) -> dict[str, str]:
    return {"v": VERSION, "id": request_id, "uid": uid, "location": location[:_MAX_TEXT],
            "result": _json([result.status.value, result.event_id, result.flow_id, result.seq, result.reason])}


def parse_advance(fields: Mapping[str, str]) -> Advance:
    """A request to advance, every field checked (the step itself is the producer's to check)."""
    version_field(fields)
    deadline = deadline_field(fields)
    schema_text = text_field(fields, "schema", limit=16)
    if not schema_text.isdigit() or int(schema_text) < 1:
        raise BadMessage("schema", f"must be an int >= 1, got {schema_text!r}")
    try:
        payload = json.loads(text_field(fields, "payload", limit=MAX_BODY_BYTES))
    except ValueError:
        raise BadMessage("payload", "not JSON") from None
    try:
        meta = json.loads(text_field(fields, "meta", limit=MAX_BODY_BYTES))
    except ValueError:
        raise BadMessage("meta", "not JSON") from None
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise BadMessage("meta", "must be a JSON object of strings")
    return Advance(id=text_field(fields, "id"), reply=text_field(fields, "reply"), deadline=deadline,
                   uid=text_field(fields, "uid"), event_id=text_field(fields, "event_id"),
                   flow_id=text_field(fields, "flow_id"), kind=text_field(fields, "kind"), schema=int(schema_text),
                   payload=payload, meta=meta or None, check=_check_flag(fields))


def _check_flag(fields: Mapping[str, str]) -> bool:
    value = fields.get("check")
    if value not in (None, "1"):
        raise BadMessage("check", f"must be 1 or absent, got {value!r}")
    return value == "1"


def parse_advance_answer(fields: Mapping[str, str]) -> AdvanceAnswer:
    """An answer to an advance request, every field checked."""
    version_field(fields)
    request_id, uid = text_field(fields, "id"), text_field(fields, "uid")
    location = text_field(fields, "location", required=False)
    if "error" in fields:
        return AdvanceAnswer(request_id, uid, location, None,
                             (text_field(fields, "error", limit=128), text_field(fields, "message", required=False)))
    try:
        row = json.loads(text_field(fields, "result"))
    except ValueError:
        raise BadMessage("result", "not JSON") from None
    if not isinstance(row, list) or len(row) != 5:
        raise BadMessage("result", "must be [status, event_id, flow_id, seq, reason]")
    status, event_id, flow_id, seq, reason = row
    if status not in _STATUSES:
        raise BadMessage("result", f"unknown status {status!r}")
    if not isinstance(event_id, str) or not isinstance(flow_id, str):
        raise BadMessage("result", "event_id and flow_id must be strings")
    if seq is not None and (type(seq) is not int or seq < 1):  # a bool is not a seq
        raise BadMessage("result", f"seq must be an int >= 1 or null, got {seq!r}")
    if reason is not None and not isinstance(reason, str):
        raise BadMessage("result", "reason must be a string or null")
    return AdvanceAnswer(request_id, uid, location, AdvanceResult(_STATUSES[status], event_id, flow_id, seq, reason),
                         None)
