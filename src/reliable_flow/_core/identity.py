"""Which protocol import path a store records (its ``meta`` row
``protocol_path``), so that the command line can open it without being told
``--protocol``.

The rule: the first path recorded stays.  A store's protocol is fixed when
the store is created (its name is checked on every open, and another name
is refused), so the path is only where that same protocol is imported
from.  Opening the store with a protocol of that name from another path
(the module moved, or the protocol is re-exported elsewhere) keeps the
first and logs a warning naming both: an automatic rewrite would let any
program that happens to open the store change what every later command
imports.  A protocol without an importable path
(:meth:`~reliable_flow.protocol.Protocol.import_path` is None) records
nothing.
"""

from __future__ import annotations

import json
import uuid
from typing import Protocol

__all__ = ["PROTOCOL_PATH", "SERVED_AS", "STORE_UID", "new_uid", "other_path_note", "protocol_path_in",
           "served_as_in", "served_where"]

#: The ``meta`` key holding the recorded ``module:ATTRIBUTE``.
PROTOCOL_PATH = "protocol_path"
#: The ``meta`` key holding a producer store's identity (a consumer store has its own ``uid`` row).
STORE_UID = "uid"
#: The ``meta`` key of a producer store served to other hosts (``serve_as``):
#: where, so that ``reliable-flow inspect PRODUCER`` finds its consumers'
#: summaries.  The first place recorded stays, as for the protocol path;
#: the URL is recorded without its password.
SERVED_AS = "served_as"


def new_uid() -> str:
    """A new store identity."""
    return uuid.uuid4().hex


class _MetaUnit(Protocol):
    def add_meta(self, key: str, value: str) -> str: ...


def protocol_path_in(unit: _MetaUnit, path: str) -> str:
    """Record ``path`` in ``unit`` unless a path is recorded already (by
    another process since it was read); the path the store holds after."""
    return unit.add_meta(PROTOCOL_PATH, path)


def other_path_note(location: str, held: str | None, path: str | None) -> str | None:
    """When the store at ``location`` holds a path other than ``path``: the
    warning the face logs, else None."""
    if held is None or path is None or held == path:
        return None
    note = (f"{location} keeps its recorded protocol path {held!r}; this process opened it with the "
            f"same protocol from {path!r} (the first path recorded stays)")
    return note


def served_as_in(unit: _MetaUnit, name: str, url: str, prefix: str) -> str:
    """Record that the producer is served as ``name`` on the Redis server
    at ``url`` (given without its password) under ``prefix``, unless a place
    is recorded already; the value the store holds after (JSON)."""
    return unit.add_meta(SERVED_AS, json.dumps({"name": name, "url": url, "prefix": prefix}, sort_keys=True))


def served_where(value: str | None) -> dict[str, str] | None:
    """The recorded ``{"name", "url", "prefix"}`` (:func:`served_as_in`), or
    None when none is recorded or it is not readable."""
    if value is None:
        return None
    try:
        held = json.loads(value)
    except ValueError:
        return None
    if not isinstance(held, dict) or not all(isinstance(held.get(k), str) for k in ("name", "url", "prefix")):
        return None
    return {k: str(held[k]) for k in ("name", "url", "prefix")}
