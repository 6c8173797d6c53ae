"""Rows the stores hand to the decision code: plain values, no engine types."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..records import InboxEntry, InboxRow

__all__ = [
    "DeliveryCounts",
    "FlowState",
    "InboxCounts",
    "Keep",
    "NextRow",
    "OutboxCounts",
    "PendingSummary",
    "PruneStep",
    "SetAside",
    "StoredEvent",
    "StoredRow",
    "Tombstone",
    "WaitingSummary",
    "as_flow_dict",
]


@dataclass(frozen=True, slots=True)
class FlowState:
    """A flow as last committed (producer) or applied (consumer): its state,
    its last seq and the protocol's data."""

    state: str
    seq: int
    data: dict[str, Any]


def as_flow_dict(flow: FlowState | None) -> dict[str, Any] | None:
    """A producer's flow as ``Producer.flow`` shows it: ``{"state", "seq", **data}``, or None."""
    return None if flow is None else {"state": flow.state, "seq": flow.seq, **flow.data}


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An outbox event: its position in commit order, its seq and canonical body."""

    pos: int
    seq: int
    body: str


@dataclass(frozen=True, slots=True)
class StoredRow(InboxRow):
    """An inbox row as stored: what an operator sees of it (its
    :class:`~reliable_flow.records.InboxRow` fields, alone: :meth:`row`),
    and its canonical body (whose ``meta`` a reader sees: :meth:`entry`)."""

    body: str

    def row(self) -> InboxRow:
        """The row in full, as a plain :class:`~reliable_flow.records.InboxRow` (no body)."""
        return InboxRow(*(getattr(self, f.name) for f in fields(InboxRow)))

    def entry(self) -> InboxEntry:
        """The row as :class:`~reliable_flow.records.InboxEntry`, with the event's ``meta``."""
        return InboxEntry(self.event_id, self.seq, self.state, self.reason,
                          dict(json.loads(self.body).get("meta", {})))


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What stays of a pruned event: its flow, its seq and the SHA-256 of its
    canonical body (:func:`reliable_flow._envelope.body_hash`)."""

    flow_id: str
    seq: int
    body_hash: bytes


@dataclass(frozen=True, slots=True)
class PruneStep:
    """What one pruning transaction removed: events (or inbox rows), each
    leaving a tombstone, and the rows that went with them."""

    events: int
    deliveries: int = 0
    effect_records: int = 0
    effect_rows: int = 0
    #: Producer: how many candidates the step looked at (kept ones too: an
    #: event its topic keeps longer), and the last one's position (None:
    #: as many as it removed).
    looked: int | None = None
    last_pos: int | None = None


#: A pruning step's test of a candidate (position, body): True keeps it (its
#: topic's retention has not passed).
Keep = Callable[[int, str], bool]


#: The first inbox row of a flow at or after a seq: ``(seq, event_id, body)``.
#: A plain tuple, as the engine returns it: apply asks for one per event.
NextRow = tuple[int, str, str]


@dataclass(frozen=True, slots=True)
class DeliveryCounts:
    """The deliveries to one consumer in one state, counted (what metrics read).

    ``retries``: attempts beyond each delivery's first; ``failing``: ones
    whose last send failed (consecutive failures > 0); ``leased``: claimed
    by a relay whose lease has not ended at the ``now`` asked about;
    ``untried``: never sent (no attempt); ``oldest_touch``: the earliest
    time one of them was last written (claimed, failed, marked, resolved),
    None when none was written since it was committed.
    """

    consumer: str
    state: str
    count: int
    retries: int
    failing: int
    leased: int
    untried: int
    oldest_touch: float | None


@dataclass(frozen=True, slots=True)
class OutboxCounts:
    """The producer side counted: events, flows, the consumers bound, and
    their deliveries per state (a consumer with no delivery has no group)."""

    events: int
    flows: int
    consumers: tuple[str, ...]
    deliveries: tuple[DeliveryCounts, ...]


@dataclass(frozen=True, slots=True)
class InboxCounts:
    """The consumer side counted: inbox rows per state (only states with
    rows), blocked rows per reason, and flows stopped at a gap (their first
    unapplied row is past ``last_seq + 1``)."""

    by_state: dict[str, int]
    blocked: dict[str, int]
    gaps: int


@dataclass(frozen=True, slots=True)
class SetAside:
    """A delivery set aside (its consumer answered with a conflict): to whom,
    which event, and the answer."""

    consumer: str
    event_id: str
    flow_id: str
    seq: int
    last_status: str | None


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """The pending deliveries to one consumer, counted up to a cap (a count
    equal to the cap means at least that many): ``leased`` among them
    (claimed by a relay, the lease not ended), and when the oldest of them
    was committed (None: none pending, or committed before times were kept)."""

    pending: int
    leased: int
    oldest_committed_at: float | None


@dataclass(frozen=True, slots=True)
class WaitingSummary:
    """The inbox rows still waiting (pending, blocked), counted together up
    to a cap (when the two add up to the cap there may be more), and the
    earliest arrival among those counted (None: none, or all stored before
    arrival times were kept)."""

    pending: int
    blocked: int
    oldest_received_at: float | None
