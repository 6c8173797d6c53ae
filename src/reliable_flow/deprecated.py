"""Names kept for one release only: each access warns (``DeprecationWarning``)
with what to use instead.  Nothing in the package raises or returns them.

``reliable_flow.InboxFull`` / ``reliable_flow.errors.InboxFull`` and
``reliable_flow.Refused`` / ``reliable_flow.statuses.Refused``: a full
inbox is answered with ``ReceiveStatus.REFUSED`` on every path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .errors import ReliableFlowError

__all__ = ["old_name"]

_REFUSED = "a full inbox is answered with a ReceiveResult of status ReceiveStatus.REFUSED"


class InboxFull(ReliableFlowError):
    """Deprecated, no longer raised (see the module).  Its name still starts
    the ``last_error`` a relay records for a refused event."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Deprecated (see the module): what a ``Receiver`` answered when its
    inbox was full.  A relay still takes it as ``refused``, with a warning."""

    reason: str


_OLD: dict[str, dict[str, tuple[Any, str]]] = {
    "reliable_flow": {"InboxFull": (InboxFull, _REFUSED), "Refused": (Refused, _REFUSED)},
    "reliable_flow.errors": {"InboxFull": (InboxFull, _REFUSED)},
    "reliable_flow.statuses": {"Refused": (Refused, _REFUSED)},
}


def old_name(module: str, name: str) -> Any:
    """A module's ``__getattr__``: the deprecated ``name`` with a warning, or
    ``AttributeError`` as for any missing name."""
    found = _OLD.get(module, {}).get(name)
    if found is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value, instead = found
    warnings.warn(f"{module}.{name} is deprecated: {instead}", DeprecationWarning, stacklevel=3)
    return value
