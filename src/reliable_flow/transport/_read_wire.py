"""What a transport carries when an operator's tool on one host asks a
consumer on another (issue 31, item 6): a *question* (a read of the
consumer's store, or an operator action) and its answer.

Broker-neutral and standard library only, as :mod:`._wire` is.

* **Reads** are the methods of :class:`~reliable_flow._store.inbox.InboxReads`
  named in :data:`READS`, an allow-list: a method added to the read view
  is served remotely once its name is added here.  Their arguments and
  answers are (de)serialized by the method's own type hints, once, for
  every method (:func:`plain` and :func:`typed`), and checked on read as
  the rest of the wire is: a value of the wrong type, an unknown enum
  value, a missing or extra record field, a number that is not finite,
  raises :class:`~._wire.BadMessage` naming where; nothing read from the
  broker is trusted.
* **Actions** (:data:`ACTIONS`) are the consumer-side operator actions,
  each with the arguments it takes; the bridge runs them only when it was
  started allowing actions.

A question carries its deadline and its reply address; the answer is
``ok`` (the value as JSON) or ``error`` and ``message``.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from typing import Any

from .._envelope import MAX_BODY_BYTES
from .._store.inbox import InboxReads
from ..records import OperatorAction
from ..statuses import ActionTarget, InboxState
from ._wire import MAX_FIELD_BYTES, VERSION, BadMessage, deadline_field, text_field, version_field

__all__ = ["ACTIONS", "KINDS", "READS", "Question", "answer_fields", "call_args", "error_fields",
           "parse_answer", "parse_question", "plain", "question_fields", "typed"]

#: The read methods a bridge answers (each a method of ``InboxReads``, read
#: only).  Add a new read method's name here to serve it to other hosts.
READS: tuple[str, ...] = (
    "meta", "meta_value", "projection", "effects", "flows", "projected_flows", "open_flows", "tombstone",
    "inbox_rows", "inbox_row", "inbox_actions", "inbox_counts", "retention_actions", "prunable", "tombstones_before",
    "waiting_flows", "flows_by_correlation", "waiting_summary", "applies_recorded", "attention_effects",
    "effect", "effect_list", "effect_counts", "effect_timers", "effect_actions", "effect_history", "effect_starts",
    "held_effect_counts", "unfed_effects", "next_effect_due_at", "schedules", "schedule", "schedule_actions",
)
#: The operator actions a bridge runs when allowed, with their arguments
#: beside ``actor`` and ``reason`` (names and types).
ACTIONS: dict[str, dict[str, Any]] = {
    "skip_event": {"event_id": str},
    "replace_event": {"event_id": str, "envelope": str},
    "retry_effect": {"key": str},
    "resolve_effect": {"key": str, "result": Any},
    "amend_effect": {"key": str, "result": Any, "failure": bool},
    "cancel_effect": {"key": str},
    "prune": {"older_than": float, "now": float | None, "limit": int | None, "forget_after": float | None},
}
KINDS = ("read", "act")
#: An action's answer: the recorded action and one sentence.
ACTED = tuple[OperatorAction, str]
_MAX_TEXT = 1024
_MAX_ARGS = 2 * MAX_BODY_BYTES + 4096  # a replacement envelope and its text


@dataclass(frozen=True, slots=True)
class Question:
    """A read (``kind`` "read": ``method`` of :data:`READS`) or an action
    (``kind`` "act": ``method`` of :data:`ACTIONS`) with its checked
    ``args``; for the consumer whose storage has ``uid`` ("" for a read:
    the answer says whose it is); answered on ``reply`` before ``deadline``."""

    id: str
    reply: str
    deadline: float
    kind: str
    method: str
    args: dict[str, Any]
    uid: str = ""


# -- one (de)serialization for every read ------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: a record (a dataclass) as its fields by
    name, an enum as its value, bytes as hex, tuples and sets as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    return value


def typed(hint: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as ``hint`` says it is, checked; a
    :class:`~._wire.BadMessage` naming ``where`` otherwise."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # X | None: what is wrong with it as X, said where
            return typed(options[0], value, where)
        problems = []
        for option in options:
            try:
                return typed(option, value, where)
            except BadMessage as exc:
                problems.append(str(exc))
        raise BadMessage(where, "neither " + " nor ".join(problems))
    if hint is type(None):
        if value is not None:
            raise BadMessage(where, f"must be null, got {_shown(value)}")
        return None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value) if isinstance(value, str) else _no(where, f"a {hint.__name__} value", value)
        except ValueError:
            raise BadMessage(where, f"unknown {hint.__name__} {_shown(value)}") from None
    if hint is bool:
        return value if type(value) is bool else _no(where, "true or false", value)
    if hint is int:
        return value if type(value) is int else _no(where, "a whole number", value)
    if hint is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            _no(where, "a finite number", value)
        return float(value)
    if hint is str:
        return value if isinstance(value, str) else _no(where, "text", value)
    if hint is bytes:
        try:
            return bytes.fromhex(value) if isinstance(value, str) else _no(where, "hex text", value)
        except ValueError:
            raise BadMessage(where, "not hex text") from None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _record(hint, value, where)
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            _no(where, "an object", value)
        key, item = args or (str, Any)
        return {typed(key, k, f"{where}.key"): typed(item, v, f"{where}[{k!r}]") for k, v in value.items()}
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):  # a fixed-length tuple
        if not isinstance(value, list) or len(value) != len(args):
            _no(where, f"a list of {len(args)}", value)
        return tuple(typed(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (list, tuple, Sequence, Collection, set, frozenset, AbstractSet):
        if not isinstance(value, list):
            _no(where, "a list", value)
        items = [typed(args[0] if args else Any, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else set(items) if origin in (set, frozenset, AbstractSet) else items
    raise BadMessage(where, f"cannot be read as {hint!r}")  # a hint this module does not know: refuse


def _no(where: str, wanted: str, value: Any) -> Any:
    raise BadMessage(where, f"must be {wanted}, got {_shown(value)}")


def _shown(value: Any) -> str:
    return repr(value)[:60]


def _record(cls: type, value: Any, where: str) -> Any:
    """A record (dataclass) from its fields by name: every field, no other."""
    if not isinstance(value, dict):
        _no(where, f"a {cls.__name__} object", value)
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    missing, extra = [n for n in names if n not in value], sorted(set(value) - set(names))
    if missing or extra:
        raise BadMessage(where, f"a {cls.__name__} needs exactly its fields: missing {missing}, extra {extra}")
    fields = {n: typed(hints[n], value[n], f"{where}.{n}") for n in names}
    if cls is OperatorAction and fields["target"] is ActionTarget.INBOX and fields["previous_state"] is not None:
        fields["previous_state"] = typed(InboxState, value["previous_state"], f"{where}.previous_state")
    return cls(**fields)


@cache
def _hints(owner: Any) -> dict[str, Any]:
    return typing.get_type_hints(owner)


@cache
def _signature(method: str) -> tuple[inspect.Signature, dict[str, Any]]:
    """The signature of the read ``method`` (without ``self``) and its type hints."""
    function = getattr(InboxReads, method)
    signature = inspect.signature(function)
    signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature, _hints(function)


def call_args(method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of a call of the read ``method``, by name, as JSON-able
    data (a ``TypeError`` for arguments the method does not take)."""
    if method not in READS:
        raise AttributeError(f"{method!r} is not a read a bridge answers (see reliable_flow.transport._read_wire)")
    signature, _ = _signature(method)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return {name: plain(value) for name, value in bound.arguments.items()}


def read_args(method: str, args: Any) -> dict[str, Any]:
    """The arguments of a question for the read ``method``, checked by its hints."""
    signature, hints = _signature(method)
    names = list(signature.parameters)
    if not isinstance(args, dict) or sorted(args) != sorted(names):
        raise BadMessage("args", f"{method} takes exactly {names}")
    return {n: typed(hints[n], args[n], f"args.{n}") for n in names}


def read_answer(method: str, value: Any) -> Any:
    """The answer to the read ``method`` (parsed JSON), checked by its return hint."""
    return typed(_signature(method)[1]["return"], value, "ok")


def action_args(method: str, args: Any) -> dict[str, Any]:
    """The arguments of an action question, checked (``actor`` and ``reason`` as text)."""
    wanted = {**ACTIONS[method], "actor": str, "reason": str}
    if not isinstance(args, dict) or sorted(args) != sorted(wanted):
        raise BadMessage("args", f"{method} takes exactly {sorted(wanted)}")
    return {n: typed(h, args[n], f"args.{n}") for n, h in wanted.items()}


def action_answer(value: Any) -> ACTED:
    """An action's answer: the recorded action and its sentence, checked."""
    if not isinstance(value, dict) or sorted(value) != ["record", "sentence"]:
        raise BadMessage("ok", "an action's answer is {record, sentence}")
    sentence = typed(str, value["sentence"], "ok.sentence")
    if len(sentence) > _MAX_TEXT:
        raise BadMessage("ok.sentence", f"longer than {_MAX_TEXT} characters")
    return typed(OperatorAction, value["record"], "ok.record"), sentence


# -- the fields of a question and of its answer ---------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _loads(text: str, field: str) -> Any:
    def refuse(constant: str) -> Any:
        raise BadMessage(field, f"not JSON ({constant})")

    try:
        return json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, BadMessage):
            raise
        raise BadMessage(field, "not JSON") from None


def question_fields(q: Question) -> dict[str, str]:
    return {"v": VERSION, "id": q.id, "reply": q.reply, "deadline": repr(q.deadline), "kind": q.kind,
            "method": q.method, "uid": q.uid, "args": _dumps(q.args)}


def parse_question(fields: Mapping[str, str]) -> Question:
    """A question, every field checked; its arguments by the method's hints."""
    version_field(fields)
    deadline = deadline_field(fields)
    kind = text_field(fields, "kind", limit=16)
    if kind not in KINDS:
        raise BadMessage("kind", f"must be one of {list(KINDS)}, got {kind[:20]!r}")
    method = text_field(fields, "method", limit=64)
    allowed: Collection[str] = READS if kind == "read" else ACTIONS
    if method not in allowed:
        what = "an action a bridge runs" if kind == "act" else "a read method a bridge answers"
        raise BadMessage("method", f"{method[:64]!r} is not {what}")
    raw = _loads(text_field(fields, "args", limit=_MAX_ARGS), "args")
    args = read_args(method, raw) if kind == "read" else action_args(method, raw)
    uid = text_field(fields, "uid", required=kind == "act")
    return Question(text_field(fields, "id"), text_field(fields, "reply"), deadline, kind, method, args, uid)


def answer_fields(question_id: str, uid: str, value: Any) -> dict[str, str]:
    """The answer ``value`` (a read's return value, or an action's (record,
    sentence)), or, when its JSON is larger than the wire takes, the error
    saying so."""
    text = _dumps(plain(value if not isinstance(value, tuple) or len(value) != 2
                        or not isinstance(value[0], OperatorAction)
                        else {"record": value[0], "sentence": value[1]}))
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FIELD_BYTES:
        return error_fields(question_id, uid, "AnswerTooLarge",
                            f"the answer is larger than {MAX_FIELD_BYTES} bytes: read it on the consumer's host")
    return {"v": VERSION, "id": question_id, "uid": uid, "ok": text}


def error_fields(question_id: str, uid: str, kind: str, message: str) -> dict[str, str]:
    return {"v": VERSION, "id": question_id, "uid": uid, "error": kind[:128], "message": message[:_MAX_TEXT]}


def parse_answer(fields: Mapping[str, str], question_id: str,
                 read: Callable[[Any], Any]) -> tuple[str, Any, tuple[str, str] | None]:
    """The answer to ``question_id``: the answering store's uid, the value
    (``read`` checks it) or the error ``(type name, message)``."""
    version_field(fields)
    if text_field(fields, "id") != question_id:
        raise BadMessage("id", "not the question asked")
    uid = text_field(fields, "uid", required=False)
    if "error" in fields:
        return uid, None, (text_field(fields, "error", limit=128), text_field(fields, "message", required=False))
    return uid, read(_loads(text_field(fields, "ok", limit=MAX_FIELD_BYTES), "ok")), None
