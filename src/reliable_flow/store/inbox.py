"""What the consumer side asks of its storage (:class:`InboxStore`).

``receive``, ``apply_next`` and the reads of a consumer work through these
methods alone.  The contract suite (``tests/contract/test_inbox_store.py``)
holds each engine to every promise written here.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..envelope import Envelope
from ..statuses import BlockReason, EffectRecord, InboxEntry
from .base import Store
from .effects import EffectReads, EffectUnit
from .records import FlowState, NextRow

__all__ = ["InboxReads", "InboxStore", "InboxUnit"]


class InboxReads(EffectReads, Protocol):
    """Reads of the consumer side; inside :meth:`InboxStore.read` they share one snapshot."""

    def meta(self) -> dict[str, str]:
        """The store's identity: ``protocol``, ``name``, ``uid``."""

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "last_seq", **view}`` as applied, or None."""

    def effects(self, flow_id: str) -> list[EffectRecord]:
        """The flow's effect records in apply order."""

    def inbox(self, flow_id: str) -> list[InboxEntry]:
        """The flow's inbox rows by seq."""

    def flows(self) -> list[str]:
        """Every flow with an inbox row, sorted."""

    def open_flows(self) -> list[str]:
        """Flows with a row not yet applied, sorted."""


class InboxUnit(InboxReads, EffectUnit, Protocol):
    """One write transaction on the consumer side: all of it commits, or none."""

    def insert_new(self, env: Envelope) -> bool:
        """Store the event as pending unless its id or (flow, seq) is taken; True if stored."""

    def insert(self, env: Envelope) -> None:
        """Store the event as pending; a taken id or (flow, seq) raises the engine's integrity error."""

    def body_of(self, event_id: str) -> str | None:
        """The stored body of ``event_id``, or None."""

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id stored at (flow, seq), or None."""

    def unapplied(self, cap: int) -> int:
        """Rows not yet applied, counted up to ``cap``."""

    def last_seq(self, flow_id: str) -> int:
        """The flow's last applied seq (0 before any)."""

    def flow_state(self, flow_id: str) -> FlowState | None:
        """The flow's applied state, last seq and data, or None."""

    def next_row(self, flow_id: str, seq: int) -> NextRow | None:
        """The flow's first row at or after ``seq``, or None."""

    def block(self, event_id: str, reason: BlockReason) -> None:
        """Mark the row blocked for ``reason`` (writing nothing if it already is)."""

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        """Create or replace the flow's projection."""

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record and its row marked applied; a second
        effect for the event or (flow, seq) raises the engine's integrity error."""


class InboxStore(Store[InboxReads, InboxUnit], Protocol):
    """A consumer's storage: see :class:`~reliable_flow.store.base.Store`."""
