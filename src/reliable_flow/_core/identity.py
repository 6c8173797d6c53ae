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

import uuid
from typing import Protocol

__all__ = ["PROTOCOL_PATH", "STORE_UID", "new_uid", "other_path_note", "protocol_path_in"]

#: The ``meta`` key holding the recorded ``module:ATTRIBUTE``.
PROTOCOL_PATH = "protocol_path"
#: The ``meta`` key holding a producer store's identity (a consumer store has its own ``uid`` row).
STORE_UID = "uid"


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
