"""Statuses: every answer the library gives, as a string enum.

Each status is a string enum, so ``result.status == "committed"`` holds and
the value prints as the plain word.  The results that carry them are frozen
dataclasses, public as :mod:`reliable_flow.records` (defined here): they
describe what happened and cannot be edited afterwards.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# The enums.  The result and record dataclasses defined below are public as
# ``reliable_flow.records`` (the names stay importable from here, for the
# library's own modules).
__all__ = [
    "AdvanceStatus",
    "ApplyStatus",
    "BlockReason",
    "DeliveryState",
    "DrainStop",
    "EffectState",
    "FlowWait",  # noqa: F822 - from _operations.py, through __getattr__
    "InboxState",
    "ReceiveStatus",
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
    """What ``Producer.advance`` answered (see ``AdvanceResult``)."""

    COMMITTED = "committed"
    EXISTING = "existing"
    CONFLICT = "conflict"
    STALE = "stale"
    INVALID_TRANSITION = "invalid_transition"
    INVALID_PAYLOAD = "invalid_payload"
    BACKLOG_FULL = "backlog_full"


class ReceiveStatus(_StrEnum):
    """What ``Consumer.receive`` answered; only ``accepted`` stored a row
    (``refused``: a full inbox, ``max_inbox``; the relay retries later)."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    ID_CONFLICT = "id_conflict"
    SEQUENCE_CONFLICT = "sequence_conflict"
    REFUSED = "refused"


class RelayStatus(_StrEnum):
    """What one ``relay`` step did: the consumer's answer, or ``idle``."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    ID_CONFLICT = "id_conflict"
    SEQUENCE_CONFLICT = "sequence_conflict"
    REFUSED = "refused"
    IDLE = "idle"


class ApplyStatus(_StrEnum):
    """What ``Consumer.apply_next`` did with the flow's next seq."""

    APPLIED = "applied"
    GAP = "gap"
    BLOCKED = "blocked"
    IDLE = "idle"


class BlockReason(_StrEnum):
    """Why an event is blocked: it cannot be applied as it is."""

    UNSUPPORTED_SCHEMA = "unsupported_schema"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_TRANSITION = "invalid_transition"


class DrainStop(_StrEnum):
    """Why ``drain`` / ``process_all`` stopped with a flow."""

    GAP = "gap"
    BLOCKED = "blocked"
    IDLE = "idle"
    LIMIT = "limit"


class InboxState(_StrEnum):
    """State of a row in the consumer's inbox.

    ``skipped`` / ``replaced``: an operator moved the flow past the event, or
    put a corrected event in its place (recorded, never automatic; see
    ``consumer.admin.skip_event`` / ``replace_event``).
    """

    PENDING = "pending"
    BLOCKED = "blocked"
    APPLIED = "applied"
    SKIPPED = "skipped"
    REPLACED = "replaced"


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


class EffectState(_StrEnum):
    """State of a side effect in the effect outbox (see docs/effects.md).

    ``pending``: due at ``due_at``.  ``running``: claimed by an executor,
    whose lease ends at ``due_at``.  ``in_doubt``: an attempt may or may not
    have taken effect (a timeout, or a lease that ran out while running); it
    is reconciled, or re-run when the target deduplicates by key, before any
    new attempt.  ``unknown``: in doubt and nothing can settle it
    automatically; parked for an operator.  ``succeeded`` / ``dead``
    (permanent failure or attempts exhausted) / ``expired`` / ``superseded``
    / ``cancelled``: final until an operator acts.
    """

    PENDING = "pending"
    RUNNING = "running"
    IN_DOUBT = "in_doubt"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    UNKNOWN = "unknown"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"


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
    """Outcome of ``Consumer.receive``; only ``accepted`` stored a new row.

    ``reason`` explains every other status.  ``applied``: the event was
    also applied in the same transaction (only
    with ``Consumer(..., apply_on_receive=True)``, when it was its flow's
    next step and applied cleanly)."""

    status: ReceiveStatus
    event_id: str
    flow_id: str
    seq: int
    reason: str | None = None
    applied: bool = False


@dataclass(frozen=True, slots=True)
class RelayResult:
    """Outcome of one ``relay`` step; ``idle`` carries no event.  ``applied``:
    the consumer also applied it in the commit that received it."""

    status: RelayStatus
    event_id: str | None = None
    flow_id: str | None = None
    seq: int | None = None
    reason: str | None = None
    applied: bool = False


@dataclass(frozen=True, slots=True)
class RelayBatchResult:
    """Outcome of ``relay_batch``: one result per event sent, and counts by status.

    ``refused`` counts events the consumer's full inbox turned away (their
    results have status ``refused``, and ``counts`` has them too); they
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


# -- what the read methods return ----------------------------------------------------
# Fixed shapes are frozen dataclasses.  Two reads stay dicts on purpose:
# ``Producer.flow`` / ``Consumer.projection`` (their keys are the protocol's
# own data fields) and ``Producer.event`` (the envelope, a JSON object as
# it travels).


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """Where one outbox event stands towards one consumer.

    ``attempts`` counts sends, ``last_status`` is the consumer's last answer
    (None before the first), ``last_error`` the last failed send, and
    ``due_at`` when the event may be sent next (seconds, the policy's clock;
    0 = at once).  ``lease_owner`` is the relay holding a claim on it, if any.
    """

    state: DeliveryState
    last_status: str | None
    attempts: int
    last_error: str | None
    due_at: float
    lease_owner: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One outbox event with its delivery state (see ``Producer.outbox``)."""

    event_id: str
    flow_id: str
    seq: int
    accepted: bool
    state: DeliveryState
    last_status: str | None
    deliveries: dict[str, DeliveryRecord]


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """A recorded operator decision (``redeliver`` or ``skip``): who, when, why.

    ``previous_state`` is the delivery state the action changed; it is given
    in the value ``redeliver`` / ``skip`` return and is None in
    ``operator_actions()`` listings (it is not stored).
    """

    at: float
    consumer: str
    event_id: str
    action: str
    actor: str
    reason: str
    previous_state: DeliveryState | None = None


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One row of the consumer's inbox (see ``Consumer.inbox``); ``meta`` is
    the event's own ``meta`` (correlation ids, trace), as stored with it."""

    event_id: str
    seq: int
    state: InboxState
    reason: BlockReason | None
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AppliedEvent:
    """An event the consumer applied: the one row its apply left in the
    consumer file (see ``Consumer.effects``)."""

    event_id: str
    flow_id: str
    seq: int
    kind: str


@dataclass(frozen=True, slots=True)
class ScheduledEffect:
    """One side effect in the effect outbox, scheduled by an apply (see ``Consumer.effect_outbox``).

    ``key`` is its idempotency key, the same on every attempt.  ``payload``,
    ``meta`` and ``result`` are the JSON objects stored with it; ``reason``
    says why it ended (expired, superseded, cancelled, dead); ``due_at`` is
    when it may run next or, while ``running``, when the lease ends.

    ``waiting_behind`` / ``waiting_behind_state``: for an ordered effect not
    yet final (pending, running, in doubt) that waits behind an earlier
    ordered effect of its flow that is not resolved (pending, running, in
    doubt, dead or unknown), the key and state of the earliest such one (no
    executor takes it up before that one is resolved); None otherwise.
    Worked out when the effect is read, never stored.
    """

    key: str
    name: str
    payload: dict[str, Any]
    event_id: str
    flow_id: str
    seq: int
    meta: dict[str, str]
    state: EffectState
    ordered: bool
    deadline: float | None
    version: int | None
    attempts: int
    failures: int
    due_at: float
    lease_owner: str | None
    last_error: str | None
    result: Any
    reason: str | None
    fed: bool | None
    created_at: float
    updated_at: float
    waiting_behind: str | None = None
    waiting_behind_state: EffectState | None = None


@dataclass(frozen=True, slots=True)
class EffectAction:
    """A recorded operator decision on an effect (retry, resolve, cancel): who, when, why."""

    at: float
    key: str
    action: str
    actor: str
    reason: str


def __getattr__(name: str) -> Any:
    if name == "FlowWait":  # defined with the operator reads; an enum, so listed here
        from ._operations import FlowWait

        return FlowWait
    if name in ("Refused", "Effect", "EffectRecord"):  # deprecated, for one release
        from ._deprecated import old_name

        return old_name(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
