"""Helpers the contract test files share: envelopes, and the few unit-of-work
steps every file needs.  Only the store interface is used."""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import Any

from reliable_flow._envelope import Envelope, make
from reliable_flow._store.records import as_flow_dict
from reliable_flow.records import InboxEntry

__all__ = [
    "add_consumer", "append", "bind", "body_of", "contract_members", "contract_problems", "entries", "env",
    "event_body", "flow", "protocol_members",
]


def env(event_id: str, flow_id: str = "F", seq: int = 1, kind: str = "created", n: int | None = None) -> Envelope:
    """A valid envelope; the payload carries the id and ``n`` (default: the seq)."""
    return make(event_id=event_id, flow_id=flow_id, seq=seq, kind=kind, schema=1,
                payload={"id": event_id, "n": seq if n is None else n}, meta=None)


def append(store: Any, *envs: Envelope) -> list[int]:
    """Commit the events in one unit of work; their positions."""
    with store.write() as unit:
        for e in envs:
            unit.append_event(e)
        return [unit.find_event(e.event_id).pos for e in envs]


def add_consumer(unit: Any, name: str, uid: str) -> None:
    """Register ``name`` (every committed event pending for it) and bind it to
    ``uid`` at once, as a relay's first call does."""
    unit.register_consumer(name, 0.0, False)
    unit.bind_consumer(name, uid)


def bind(store: Any, *names: str) -> None:
    """Bind each consumer name to the uid ``uid-<name>``."""
    with store.write() as unit:
        for name in names:
            add_consumer(unit, name, "uid-" + name)


def event_body(reads: Any, event_id: str) -> str | None:
    """The producer's stored body of ``event_id``, or None."""
    stored = reads.find_event(event_id)
    return None if stored is None else stored.body


def flow(reads: Any, flow_id: str) -> dict[str, Any] | None:
    """The producer's flow as ``Producer.flow`` shows it."""
    return as_flow_dict(reads.flow_state(flow_id))


def body_of(reads: Any, event_id: str) -> str | None:
    """The consumer's stored body of ``event_id``, or None."""
    row = reads.inbox_row(event_id)
    return None if row is None else row.body


def entries(reads: Any, flow_id: str) -> list[InboxEntry]:
    """The flow's inbox rows as ``Consumer.inbox`` shows them."""
    return [row.entry() for row in reads.inbox_rows(flow_id)]


def protocol_members(*protocols: type) -> set[str]:
    """The public members the store contract declares on these protocols."""
    names: set[str] = set()
    for proto in protocols:
        for cls in proto.__mro__:
            if cls.__module__.startswith("reliable_flow._store"):
                names |= {n for n in vars(cls) if not n.startswith("_")}
    return names


def protocol_properties(*protocols: type) -> set[str]:
    """The members of ``protocol_members`` that are properties (values, not calls)."""
    return {
        name for proto in protocols for cls in proto.__mro__
        if cls.__module__.startswith("reliable_flow._store")
        for name, member in vars(cls).items() if isinstance(member, property)
    }


def offers(obj: object, name: str, properties: set[str]) -> bool:
    """Whether ``obj`` offers the contract member ``name``: a call, or a
    property's value (an engine name is a non-empty string)."""
    value = getattr(obj, name)
    if name in properties:
        return value is not None
    return callable(value)


_ATTRIBUTE = object()  # a contract member declared by annotation only (``lost: BaseException | None``)


def contract_members(*protocols: type) -> dict[str, Any]:
    """Every public member the store contract declares on these protocols
    (methods, properties, annotated attributes), by name, the most derived
    declaration winning."""
    declared: dict[str, Any] = {}
    for proto in protocols:
        for cls in reversed(proto.__mro__):
            if not cls.__module__.startswith("reliable_flow._store"):
                continue
            for name in vars(cls).get("__annotations__", {}):
                if not name.startswith("_"):
                    declared[name] = _ATTRIBUTE
            for name, member in vars(cls).items():
                if not name.startswith("_"):
                    declared[name] = member
    return declared


def _parameters(function: Any) -> list[tuple[str, Any, bool]]:
    """(name, kind, has a default) of each parameter after ``self``."""
    params = list(inspect.signature(function).parameters.values())[1:]
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in params]


def contract_problems(obj: object, protocols: tuple[type, ...], extras: Collection[str] = ()) -> list[str]:
    """How ``obj`` (an engine's store or view object) departs from the
    contract: a declared member missing; a method that is not a method, or
    whose parameters differ in name, kind or default; a property or
    attribute that is a method; a public member that is neither declared nor
    listed in ``extras`` (the engine's documented additions).  [] when it
    offers exactly the contract."""
    cls = type(obj)
    problems: list[str] = []
    declared = contract_members(*protocols)
    for name, member in sorted(declared.items()):
        if not hasattr(obj, name):
            problems.append(f"{cls.__name__} lacks {name}")
            continue
        found = inspect.getattr_static(obj, name)
        if inspect.isfunction(member):
            if not inspect.isfunction(found):
                problems.append(f"{cls.__name__}.{name} is not a method")
            elif _parameters(found) != _parameters(member):
                problems.append(f"{cls.__name__}.{name}{inspect.signature(found)} differs from the contract's "
                                f"{name}{inspect.signature(member)}")
        elif inspect.isfunction(found):
            problems.append(f"{cls.__name__}.{name} is a method; the contract declares a value")
    for name in sorted(n for n in dir(obj) if not n.startswith("_")):
        if name not in declared and name not in extras:
            problems.append(f"{cls.__name__}.{name} is public but not in the contract")
    return problems
