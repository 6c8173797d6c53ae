"""``python -m reliable_flow._tools.apidoc``: the API reference (``docs/api.md``),
generated from ``reliable_flow.__all__``, the ``__all__`` of the public
namespaces (``records``, ``errors``, ``statuses``, the asyncio face, the
Redis transport ``reliable_flow.transport.redis``, the operator console
``reliable_flow.console``, the protocol's field checks), the signatures and the docstrings.

A test regenerates it and compares, so the page cannot fall behind the code:
every public name, every public method and argument, and every result field
is on it.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import reliable_flow

__all__ = ["render"]

_SECTIONS: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("Namespaces", inspect.ismodule),
    ("Exceptions your code raises", lambda obj: isinstance(obj, type) and issubclass(obj, BaseException)),
    ("Statuses", lambda obj: isinstance(obj, type) and issubclass(obj, enum.Enum)),
    ("Values you build", lambda obj: dataclasses.is_dataclass(obj) and isinstance(obj, type)),
    ("Classes", lambda obj: isinstance(obj, type)),
    ("Functions", callable),
    ("Values", lambda obj: True),
)

_HEADER = """# API reference

Generated from the code by `python -m reliable_flow._tools.apidoc > docs/api.md`
(`tests/test_api_doc.py` fails when this page and the code differ). The
first sections are the names importable from `reliable_flow` (what you write
daily); then, one section each, the namespaces `reliable_flow.errors` (every
error), `reliable_flow.statuses` (every status enum; the common ones are at
the top level too), `reliable_flow.records` (every result and record) and
the asyncio face `reliable_flow.aio`, the Redis transport
`reliable_flow.transport.redis` (the extra `.[redis]`), the operator console
`reliable_flow.console` and the field checks of
`reliable_flow.protocol`. The other public modules are
`reliable_flow.delivery`, `reliable_flow.reservation`, `reliable_flow.metrics`,
`reliable_flow.crash` and `reliable_flow.tracing`; every other module is
internal. Guides: [concepts](concepts.md), [effects](effects.md),
[asyncio](asyncio.md), [worker](worker.md), [transport](transport.md),
[operations](operations.md), [console](console.md), [writing a protocol](writing-a-protocol.md).
"""

# name -> where its heading is: a namespace documents its own names, so a
# top-level status enum or ReliableFlowError has one heading, in its namespace.
_NAMESPACES = ("errors", "statuses", "records")
_PROTOCOL_CHECKS = ("integer", "number", "text", "boolean", "optional", "exact", "by_kind")


def _doc(obj: Any) -> str:
    if isinstance(obj, type):
        # A class's own docstring only: what is inherited differs between
        # Python versions (enums say "An enumeration." on 3.10).
        own = obj.__dict__.get("__doc__")
        return inspect.cleandoc(own) if isinstance(own, str) else ""
    text = inspect.getdoc(obj) or ""
    return text.strip()


class _Bare:
    """An annotation shown as written (``str``, not ``'str'``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _bare(annotation: Any) -> Any:
    return _Bare(annotation) if isinstance(annotation, str) else annotation


def _signature(obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    # Annotations are strings (from __future__ import annotations): show them
    # bare; a default that is a string keeps its quotes (prefix: str = 'rf').
    parameters = [p.replace(annotation=_bare(p.annotation)) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=_bare(signature.return_annotation)))


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, (types.FunctionType, property)):
            yield name, member
    # Public methods inherited from the library's own base classes (none on Producer / Consumer).
    seen = set(vars(cls))
    for base in cls.__mro__[1:]:
        if not base.__module__.startswith("reliable_flow"):
            continue
        for name, member in sorted(vars(base).items()):
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, (types.FunctionType, property)):
                yield name, member


def _class(name: str, cls: type, out: list[str]) -> None:
    if issubclass(cls, enum.Enum):
        out.append(f"### `{name}`\n")
        out.append(_doc(cls) + "\n" if _doc(cls) else "")
        out.append("Values: " + ", ".join(f"`{m.value}`" for m in cls) + "\n")
        return
    if dataclasses.is_dataclass(cls):
        fields = ", ".join(f"`{f.name}`" for f in dataclasses.fields(cls))
        out.append(f"### `{name}`\n")
        out.append(_doc(cls) + "\n")
        out.append(f"Fields: {fields}\n")
        for member_name, member in _members(cls):
            if isinstance(member, property) or member_name in {f.name for f in dataclasses.fields(cls)}:
                continue
            out.append(f"* `{member_name}{_signature(member)}` — {_first_line(member)}")
        out.append("")
        return
    if issubclass(cls, BaseException):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        out.append(f"### `{name}({bases})`\n")
        out.append(_doc(cls) + "\n")
        return
    out.append(f"### `{name}{_signature(cls)}`\n")
    out.append(_doc(cls) + "\n")
    for member_name, member in _members(cls):
        if isinstance(member, property):
            out.append(f"#### `{name}.{member_name}` (property)\n")
            out.append((_doc(member) or "") + "\n")
        else:
            out.append(f"#### `{name}.{member_name}{_signature(member)}`\n")
            out.append((_doc(member) or "") + "\n")


def _first_line(obj: Any) -> str:
    return (_doc(obj).splitlines() or [""])[0]


def _entry(name: str, obj: Any, out: list[str]) -> None:
    if isinstance(obj, type):
        _class(name, obj, out)
    elif inspect.ismodule(obj):
        out.append(f"### `{name}`\n")
        out.append(f"`reliable_flow.{name}` (its section below): {_first_line(obj)}\n")
    elif callable(obj):
        out.append(f"### `{name}{_signature(obj)}`\n")
        out.append(_doc(obj) + "\n")
    else:
        out.append(f"### `{name}`\n")
        out.append(f"`{obj!r}`\n")


def render() -> str:
    """The whole page, deterministic."""
    elsewhere = {n for space in _NAMESPACES for n in getattr(reliable_flow, space).__all__}
    names = [n for n in reliable_flow.__all__ if n != "__version__" and n not in elsewhere]
    placed: set[str] = set()
    out = [_HEADER]
    for title, belongs in _SECTIONS:
        chosen = [n for n in names if n not in placed and belongs(getattr(reliable_flow, n))]
        if not chosen:
            continue
        out.append(f"## {title}\n")
        for name in chosen:
            placed.add(name)
            _entry(name, getattr(reliable_flow, name), out)
    for space in _NAMESPACES:
        module = getattr(reliable_flow, space)
        out.append(f"## `reliable_flow.{space}`\n")
        out.append(_doc(module).split("\n\n")[0] + "\n")
        for name in sorted(module.__all__):
            _entry(name, getattr(module, name), out)
    from reliable_flow import aio

    out.append("## `reliable_flow.aio`: the asyncio face\n")
    out.append(_doc(aio).split("\n\n")[0] + " See [asyncio](asyncio.md).\n")
    for name in sorted(aio.__all__):
        _entry(name, getattr(aio, name), out)
    # The extra .[redis] (the test extra has it): the page always documents the transport.
    from reliable_flow.transport import redis as transport_redis

    out.append("## `reliable_flow.transport.redis`: a consumer on another host\n")
    out.append(_doc(transport_redis).split("\n\n")[0] + " See [transport](transport.md).\n")
    for name in sorted(transport_redis.__all__):
        _entry(name, getattr(transport_redis, name), out)
    from reliable_flow import console

    out.append("## `reliable_flow.console`: the operator console\n")
    out.append(_doc(console).split("\n\n")[0] + " See [console](console.md).\n")
    for name in sorted(console.__all__):
        _entry(name, getattr(console, name), out)
    out.append("## `reliable_flow.protocol`: field checks\n")
    out.append("What a protocol's ``schemas`` are written with, next to `Protocol` "
               "(see [writing a protocol](writing-a-protocol.md)).\n")
    protocol = reliable_flow.protocol
    for name in _PROTOCOL_CHECKS:
        _entry(name, getattr(protocol, name), out)
    text = "\n".join(part.rstrip("\n") + "\n" for part in out if part is not None)
    return text.replace("\n\n\n", "\n\n")


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
