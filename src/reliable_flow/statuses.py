"""Statuses and result types: the one place where every answer is defined.

Each status is a string enum, so ``result.status == "committed"`` holds and
the value prints as the plain word.  Results are frozen dataclasses: they
describe what happened and cannot be edited afterwards.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "AdvanceResult",
    "AdvanceStatus",
    "ApplyResult",
    "ApplyStatus",
    "BlockReason",
    "DeliveryState",
    "DrainResult",
    "DrainStop",
    "InboxState",
    "ReceiveResult",
    "ReceiveStatus",
    "RelayBatchResult",
    "RelayResult",
    "RelayStatus",
]


class _StrEnum(str, enum.Enum):
    """``enum.StrEnum`` for Python 3.10: equal to, and printed as, its value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class AdvanceStatus(_StrEnum):
    COMMITTED = "committed"
    EXISTING = "existing"
    CONFLICT = "conflict"
    STALE = "stale"
    INVALID_TRANSITION = "invalid_transition"
    INVALID_PAYLOAD = "invalid_payload"
    BACKLOG_FULL = "backlog_full"


class ReceiveStatus(_StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    ID_CONFLICT = "id_conflict"
    SEQUENCE_CONFLICT = "sequence_conflict"


class RelayStatus(_StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    ID_CONFLICT = "id_conflict"
    SEQUENCE_CONFLICT = "sequence_conflict"
    IDLE = "idle"


class ApplyStatus(_StrEnum):
    APPLIED = "applied"
    GAP = "gap"
    BLOCKED = "blocked"
    IDLE = "idle"


class BlockReason(_StrEnum):
    UNSUPPORTED_SCHEMA = "unsupported_schema"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_TRANSITION = "invalid_transition"


class DrainStop(_StrEnum):
    GAP = "gap"
    BLOCKED = "blocked"
    IDLE = "idle"
    LIMIT = "limit"


class InboxState(_StrEnum):
    """State of a row in the consumer's inbox."""

    PENDING = "pending"
    BLOCKED = "blocked"
    APPLIED = "applied"


class DeliveryState(_StrEnum):
    """State of an outbox event towards one named consumer.

    ``set_aside``: the consumer answered with a conflict.  The event is not
    delivered, is skipped by ``relay()`` so other events keep flowing, and
    stays visible until an operator resolves it.  ``skipped``: an operator
    decided this consumer will never get the event (recorded with who, when
    and why); never set automatically.
    """

    PENDING = "pending"
    ACCEPTED = "accepted"
    SET_ASIDE = "set_aside"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class AdvanceResult:
    """Outcome of ``Producer.advance``.

    ``seq`` is the event's position in its flow when the event exists (it was
    committed now, or earlier for ``existing`` / ``conflict``), else None.
    ``reason`` explains every status other than ``committed``.
    """

    status: AdvanceStatus
    event_id: str
    flow_id: str
    seq: int | None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ReceiveResult:
    """Outcome of ``Consumer.receive``; only ``accepted`` stored a new row."""

    status: ReceiveStatus
    event_id: str
    flow_id: str
    seq: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class RelayResult:
    """Outcome of one ``relay`` step; ``idle`` carries no event."""

    status: RelayStatus
    event_id: str | None = None
    flow_id: str | None = None
    seq: int | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class RelayBatchResult:
    """Outcome of ``relay_batch``: one result per event sent, and counts by status.

    ``refused`` counts events the consumer's full inbox turned away; they
    stay pending and are retried after a backoff.  Nothing sent: ``idle``.
    """

    results: tuple[RelayResult, ...]
    counts: dict[str, int]
    refused: int = 0

    @property
    def idle(self) -> bool:
        return not self.results and not self.refused


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """Outcome of ``Consumer.apply_next``.

    ``seq`` is the seq that was looked at (last_seq + 1), ``event_id`` the
    event found there (None for ``gap`` and ``idle``), ``reason`` a
    :class:`BlockReason` for ``blocked``, and ``detail`` a readable message.
    """

    status: ApplyStatus
    flow_id: str
    seq: int
    event_id: str | None = None
    reason: BlockReason | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class DrainResult:
    """Outcome of ``Consumer.drain``: how many applied and why it stopped."""

    flow_id: str
    applied: int
    stop: DrainStop
    last: ApplyResult | None = None
