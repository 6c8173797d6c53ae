"""Protocols: the business rules a flow follows, supplied by user code.

A protocol says which states exist, which steps are legal from each state,
what a payload must look like in each schema version, and how a step changes
the flow's data.  The library enforces it on both sides: ``advance`` refuses
an illegal step before anything is committed, and ``apply_next`` blocks an
event that breaks it instead of guessing.

A step's ``kind`` names the state the flow moves to.  A minimal protocol::

    from reliable_flow.protocol import Protocol, exact, integer

    COUNTER = Protocol(
        name="counter",
        initial="idle",
        transitions={"idle": ["running"], "running": ["running", "done"]},
        schemas={1: exact({"n": integer(1, 100)})},
    )

Rules that depend on earlier steps go in ``step``; what the consumer shows as
its projection goes in ``project``.  Both are plain functions of plain data.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .statuses import BlockReason

__all__ = [
    "Check",
    "Decoder",
    "PayloadError",
    "Protocol",
    "Rejected",
    "boolean",
    "by_kind",
    "exact",
    "integer",
    "number",
    "optional",
    "text",
]

Data = dict[str, Any]
Check = Callable[[str, Any], Any]
Decoder = Callable[[str, Mapping[str, Any]], Data]
Step = Callable[[str, str, Data, Data], Data]
Project = Callable[[str, Data], Data]


class PayloadError(ValueError):
    """Raised by decoders and ``step`` functions: the payload breaks a rule."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"payload.{field}: {problem}")


class Rejected(Exception):
    """Internal: why a step is refused (becomes a status, never escapes)."""

    def __init__(self, reason: BlockReason, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(detail)


# -- field checks -----------------------------------------------------------------


def integer(low: int, high: int) -> Check:
    """An int (not bool) in ``low..high``."""

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PayloadError(name, f"must be an int, got {type(value).__name__}")
        if not low <= value <= high:
            raise PayloadError(name, f"must be between {low} and {high}, got {value}")
        return value

    return check


def number(low: float, high: float) -> Check:
    """An int or float (not bool) in ``low..high``."""

    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PayloadError(name, f"must be a number, got {type(value).__name__}")
        if not low <= value <= high:
            raise PayloadError(name, f"must be between {low} and {high}, got {value}")
        return value

    return check


def text(min_len: int = 1, max_len: int = 4096, choices: Collection[str] | None = None) -> Check:
    """A string of ``min_len..max_len`` characters, optionally one of ``choices``."""
    allowed = frozenset(choices) if choices is not None else None

    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise PayloadError(name, f"must be a string, got {type(value).__name__}")
        if not min_len <= len(value) <= max_len:
            raise PayloadError(name, f"must be {min_len} to {max_len} characters, got {len(value)}")
        if allowed is not None and value not in allowed:
            raise PayloadError(name, f"must be one of {sorted(allowed)}, got {value!r}")
        return value

    return check


def boolean() -> Check:
    """A JSON true or false."""

    def check(name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise PayloadError(name, f"must be true or false, got {type(value).__name__}")
        return value

    return check


def optional(inner: Check) -> Check:
    """Marks a field of :func:`exact` that may be absent (absent stays absent)."""

    def check(name: str, value: Any) -> Any:
        return inner(name, value)

    check.optional = True  # type: ignore[attr-defined]
    return check


# -- decoders ---------------------------------------------------------------------


def exact(fields: Mapping[str, Check], *, rename: Mapping[str, str] | None = None) -> Decoder:
    """A payload with exactly these keys (optional ones may be absent), each checked.

    ``rename`` maps payload keys to the names the protocol's ``step`` sees, so
    two schema versions can spell a field differently and decode to one shape.
    """
    names = dict(rename or {})
    unknown = sorted(set(names) - set(fields))
    if unknown:
        raise ValueError(f"rename names keys that are not fields: {unknown}")
    targets = [names.get(k, k) for k in fields]
    if len(set(targets)) != len(targets):
        raise ValueError(f"rename makes two fields share a name: {sorted(targets)}")
    required = {k for k, c in fields.items() if not getattr(c, "optional", False)}

    def decode(kind: str, payload: Mapping[str, Any]) -> Data:
        for key in payload:
            if key not in fields:
                raise PayloadError(key, "is not allowed here")
        for key in sorted(required):
            if key not in payload:
                raise PayloadError(key, "is required")
        return {names.get(k, k): fields[k](k, v) for k, v in payload.items()}

    return decode


def by_kind(decoders: Mapping[str, Decoder]) -> Decoder:
    """A decoder per step kind, for protocols whose payload differs by step."""
    table = dict(decoders)

    def decode(kind: str, payload: Mapping[str, Any]) -> Data:
        try:
            inner = table[kind]
        except KeyError:
            raise PayloadError("*", f"no payload rule for kind {kind!r}") from None
        return inner(kind, payload)

    decode.kinds = frozenset(table)  # type: ignore[attr-defined]  # checked by Protocol
    return decode


def _merge(state: str, kind: str, value: Data, data: Data) -> Data:
    return {**data, **value}


def _same(state: str, data: Data) -> Data:
    return dict(data)


# -- the protocol -----------------------------------------------------------------


RESERVED_KEYS = frozenset({"state", "seq", "last_seq"})


@dataclass(frozen=True, eq=False)
class Protocol:
    """A flow's rules.

    name: stored in every file created for the protocol; opening a file with
        another protocol is refused.
    initial: the state of a flow before its first event.
    transitions: ``{state: [kind, ...]}``; a kind is the state it leads to.
    schemas: ``{schema_version: decoder}``; a decoder turns a payload into
        the value ``step`` sees, raising :class:`PayloadError` if it breaks a rule.
    step: ``step(state, kind, value, data) -> new data``; may raise
        :class:`PayloadError` for rules that depend on earlier steps.
        Default: merge ``value`` into ``data``.
    project: ``project(state, data) -> dict`` of the fields the consumer's
        ``projection()`` shows besides state and last_seq.  Default: ``data``.
    consumer_schemas: versions a ``Consumer`` decodes unless told otherwise
        (default: all of ``schemas``).
    producer_schemas: versions ``advance`` accepts (default: all of
        ``schemas``); any other is ``invalid_payload``.  Lets you publish a
        new version to consumers first and switch producers over later.

    Data and projection keys must not be ``state``, ``seq`` or ``last_seq``:
    those are the library's own fields.  Protocols compare by identity.

    A protocol remembers the module that built it, so that
    :meth:`import_path` can say where another process imports it from (a
    store records that path; the command line uses it when ``--protocol``
    is not given).
    """

    name: str
    initial: str
    transitions: Mapping[str, Collection[str]]
    schemas: Mapping[int, Decoder]
    step: Step = _merge
    project: Project = _same
    consumer_schemas: Collection[int] | None = None
    producer_schemas: Collection[int] | None = None
    states: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        for attr in ("name", "initial"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Protocol {attr} must be a non-empty string, got {value!r}")
        for attr in ("step", "project"):
            if not callable(getattr(self, attr)):
                raise TypeError(f"Protocol {attr} must be a function, got {getattr(self, attr)!r}")
        table = _transition_table(self.transitions)
        if not isinstance(self.schemas, Mapping):
            raise TypeError(
                f"Protocol schemas must be a mapping {{version: decoder}}, got {type(self.schemas).__name__}"
            )
        schemas = dict(self.schemas)
        if not schemas:
            raise ValueError("Protocol schemas must hold at least one version")
        for version, decoder in schemas.items():
            if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= 1000:
                raise ValueError(f"Protocol schemas: versions must be ints 1..1000 (not bools), got {version!r}")
            if not callable(decoder):
                raise TypeError(f"Protocol schemas[{version}] must be a decoder function, got {decoder!r}")
        chosen = {}
        for attr in ("consumer_schemas", "producer_schemas"):
            value = getattr(self, attr)
            if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, Collection)):
                raise TypeError(f"{attr} must be None or a collection of schema versions, got {value!r}")
            if value is not None and any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise ValueError(f"{attr} must hold int schema versions (not bools), got {value!r}")
            wanted = frozenset(schemas if value is None else value)
            if not wanted or not wanted <= schemas.keys():
                raise ValueError(f"{attr} must be a non-empty subset of schemas {sorted(schemas)}")
            chosen[attr] = wanted
        kinds = {k for ks in table.values() for k in ks}
        for version, decoder in schemas.items():
            covered = getattr(decoder, "kinds", None)
            if covered is not None and not kinds <= covered:
                raise ValueError(f"schemas[{version}] has no payload rule for kinds {sorted(kinds - covered)}")
        object.__setattr__(self, "transitions", table)
        object.__setattr__(self, "schemas", schemas)
        object.__setattr__(self, "consumer_schemas", chosen["consumer_schemas"])
        object.__setattr__(self, "producer_schemas", chosen["producer_schemas"])
        object.__setattr__(self, "states", frozenset({self.initial} | set(table) | kinds))
        object.__setattr__(self, "_module", _caller_module())

    def import_path(self) -> str | None:
        """``module:ATTRIBUTE`` naming this very object, as ``--protocol``
        takes it, or None when there is none: the module that built it does
        not hold it under exactly one name (a protocol built in a function,
        or bound to two names), or that module is a script run by path
        (``__main__`` without a module name).  Nothing is imported."""
        module_name = self.__dict__.get("_module")
        module = sys.modules.get(module_name) if module_name else None
        if module is None:
            return None
        if module_name == "__main__":  # run as python -m NAME: importable as NAME
            spec = getattr(module, "__spec__", None)
            module_name = getattr(spec, "name", None)
            if not module_name or module_name == "__main__":
                return None
        names = [name for name, value in list(vars(module).items()) if value is self]
        return f"{module_name}:{names[0]}" if len(names) == 1 else None

    def next_data(
        self,
        state: str,
        data: Data,
        kind: str,
        schema: int,
        payload: Mapping[str, Any],
        schemas: Collection[int] | None = None,
    ) -> Data:
        """The flow's data after this step, or :class:`Rejected` saying why not.

        Order: transition, then schema known (to the protocol, and among
        ``schemas`` if given), then payload rules; the same on the producer
        and consumer side.
        """
        if kind not in self.transitions.get(state, ()):
            allowed = sorted(self.transitions.get(state, ()))
            raise Rejected(
                BlockReason.INVALID_TRANSITION,
                f"{kind!r} is not a legal step from state {state!r} (allowed: {allowed})",
            )
        decoder = self.schemas.get(schema)
        if decoder is None:
            raise Rejected(
                BlockReason.INVALID_PAYLOAD,
                f"schema {schema} is not defined by protocol {self.name!r} (known: {sorted(self.schemas)})",
            )
        if schemas is not None and schema not in schemas:
            raise Rejected(
                BlockReason.INVALID_PAYLOAD,
                f"schema {schema} is not accepted here (accepted: {sorted(schemas)})",
            )
        try:
            value = decoder(kind, payload)
            new = self.step(state, kind, value, data)
        except PayloadError as exc:
            raise Rejected(BlockReason.INVALID_PAYLOAD, str(exc)) from None
        _check_keys(self.name, "step", new)
        return new

    def view(self, state: str, data: Data) -> Data:
        """What the consumer's ``projection()`` shows besides state and last_seq."""
        shown = self.project(state, data)
        _check_keys(self.name, "project", shown)
        return shown


def _caller_module() -> str | None:
    """The module whose code built the protocol being initialised: the
    first frame outside this module and ``dataclasses`` (``replace``)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "dataclasses"):
        frame = frame.f_back  # type: ignore[assignment] # None ends the walk
    return None if frame is None else frame.f_globals.get("__name__")


def _transition_table(transitions: object) -> dict[str, frozenset[str]]:
    """``transitions`` checked: a mapping of non-empty state names to collections of kinds."""
    if not isinstance(transitions, Mapping):
        raise TypeError(
            f"Protocol transitions must be a mapping {{state: [kind, ...]}}, got {type(transitions).__name__}"
        )
    table: dict[str, frozenset[str]] = {}
    for source, kinds in transitions.items():
        if not isinstance(source, str) or not source:
            raise ValueError(f"transitions: a state must be a non-empty string, got {source!r}")
        if isinstance(kinds, (str, bytes)) or not isinstance(kinds, Collection):
            raise TypeError(f"transitions[{source!r}] must be a collection of kinds, got {kinds!r}")
        for kind in kinds:
            if not isinstance(kind, str) or not kind:
                raise ValueError(f"transitions[{source!r}]: a kind must be a non-empty string, got {kind!r}")
        table[source] = frozenset(kinds)
    return table


def _check_keys(protocol: str, function: str, value: object) -> None:
    # A protocol bug, not a property of the event: raise, so the transaction
    # rolls back, rather than blocking the event.
    if not isinstance(value, dict):
        raise TypeError(f"protocol {protocol!r}: {function}() must return a dict, got {type(value).__name__}")
    clash = RESERVED_KEYS.intersection(value)
    if clash:
        raise ValueError(f"protocol {protocol!r}: {function}() returned reserved keys {sorted(clash)}")
