"""Rows the stores hand to the decision code: plain values, no engine types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FlowState", "NextRow", "StoredEvent"]


@dataclass(frozen=True, slots=True)
class FlowState:
    """A flow as last committed (producer) or applied (consumer): its state,
    its last seq and the protocol's data."""

    state: str
    seq: int
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An outbox event: its position in commit order, its seq and canonical body."""

    pos: int
    seq: int
    body: str


#: The first inbox row of a flow at or after a seq: ``(seq, event_id, body)``.
#: A plain tuple, as the engine returns it: apply asks for one per event.
NextRow = tuple[int, str, str]
