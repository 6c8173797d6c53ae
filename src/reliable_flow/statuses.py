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
    "ActionTarget",
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
    "Transition",
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


class ActionTarget(_StrEnum):
    """What an :class:`~reliable_flow.records.OperatorAction` acted on.

    ``delivery``: an outbox event towards one consumer (``producer.admin``
    ``redeliver`` / ``skip``).  ``inbox``: an accepted event in a consumer's
    inbox (``consumer.admin`` ``skip_event`` / ``replace_event``).
    ``effect``: a scheduled effect (``consumer.admin`` ``retry_effect`` /
    ``resolve_effect`` / ``cancel_effect``).  ``registry``: a consumer name
    in the producer's registry (``producer.admin`` ``register_consumer`` /
    ``remove_consumer``, or a relay registering one).
    """

    DELIVERY = "delivery"
    INBOX = "inbox"
    EFFECT = "effect"
    REGISTRY = "registry"


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


class Transition(_StrEnum):
    """One step in an effect's durable history (``consumer.effect_history``).

    ``scheduled`` by an apply; ``claimed`` by an executor to call its
    function (a start: what ``rate_limit`` counts) or ``reconciling`` to ask
    its reconcile; ``called`` (how the call ended) or ``reconciled`` (the
    answer); then what that left: ``succeeded``, ``retry_planned`` (with the
    due time), ``in_doubt``, ``dead`` or ``parked`` (unknown, for an
    operator).  ``lease_expired``: a claim's lease ran out (its executor died
    or stopped renewing) and another executor took the effect up;
    ``lease_lost``: an executor's outcome came after that and was discarded;
    ``timed_out``: the call outlived its ``timeout``, recorded in doubt and
    held; ``released``: that call returned, its outcome discarded.
    ``rate_limited``: over its ``rate_limit``, due again when a start
    leaves the window.  ``expired`` / ``superseded`` / ``cancelled``: it
    never ran.  ``operator``: an operator's retry, resolve or cancel.
    ``fed_back`` / ``feedback_refused``: its result advanced into the
    producer, or refused there.
    """

    SCHEDULED = "scheduled"
    CLAIMED = "claimed"
    RECONCILING = "reconciling"
    CALLED = "called"
    RECONCILED = "reconciled"
    IN_DOUBT = "in_doubt"
    RETRY_PLANNED = "retry_planned"
    LEASE_EXPIRED = "lease_expired"
    LEASE_LOST = "lease_lost"
    TIMED_OUT = "timed_out"
    RELEASED = "released"
    RATE_LIMITED = "rate_limited"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    PARKED = "parked"
    CANCELLED = "cancelled"
    OPERATOR = "operator"
    FED_BACK = "fed_back"
    FEEDBACK_REFUSED = "feedback_refused"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorAction:
    """A recorded operator decision: what it acted on (``target``), ``action``,
    who (``actor``), when (``at``) and why (``reason``).  One record type for
    every operator action; ``target`` says which optional fields it fills
    (the others are None):

    - ``delivery`` (``redeliver`` / ``skip``): ``event_id``, ``consumer``
      and ``previous_state``, the :class:`DeliveryState` it changed;
    - ``inbox`` (``skip`` / ``replace``): ``event_id``, ``flow_id``,
      ``seq``, ``previous_state`` (the :class:`InboxState` it changed) and,
      for ``replace``, ``replacement_event_id``, the corrected event that
      took its place;
    - ``effect`` (``retry`` / ``resolve`` / ``cancel``): ``key``;
    - ``registry`` (``register`` / ``remove``): ``consumer``, the name (a
      name a relay registered has actor ``relay``).

    ``previous_state`` of a delivery is given in the value ``redeliver`` /
    ``skip`` return and is None in ``operator_actions()`` listings (it is
    not stored); an inbox action stores it.  Times are seconds on the clock
    of the side that acted (the consumer's ``clock``, the producer's
    ``time.time``).  :meth:`as_dict` is its JSON shape.
    """

    at: float
    target: ActionTarget
    action: str
    actor: str
    reason: str
    event_id: str | None = None
    consumer: str | None = None
    flow_id: str | None = None
    seq: int | None = None
    key: str | None = None
    previous_state: DeliveryState | InboxState | None = None
    replacement_event_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields its ``target`` fills, by name, as every JSON output
        shows it (``--json``, ``inspect``, ``snapshot``, ``compare``), values
        as they are (enums are str).  A delivery's ``previous_state`` is left
        out when None (a listed action: it is not stored)."""
        shown = {name: getattr(self, name) for name in _ACTION_FIELDS[self.target]}
        if self.target is ActionTarget.DELIVERY and self.previous_state is None:
            del shown["previous_state"]
        return shown


#: The fields each target's record fills, in the order they are shown.
_ACTION_FIELDS: dict[ActionTarget, tuple[str, ...]] = {
    ActionTarget.DELIVERY: ("at", "consumer", "event_id", "action", "actor", "reason", "previous_state"),
    ActionTarget.INBOX: ("at", "event_id", "flow_id", "seq", "action", "previous_state", "actor", "reason",
                         "replacement_event_id"),
    ActionTarget.EFFECT: ("at", "key", "action", "actor", "reason"),
    ActionTarget.REGISTRY: ("at", "consumer", "action", "actor", "reason"),
}


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
    consumer file (see ``Consumer.applied``)."""

    event_id: str
    flow_id: str
    seq: int
    kind: str


@dataclass(frozen=True, slots=True)
class ScheduledEffect:
    """One side effect in the effect outbox, scheduled by an apply (see ``Consumer.scheduled_effects``).

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
class EffectTransition:
    """One row of an effect's durable history (``consumer.effect_history(key)``),
    written in the same transaction as the change it records.

    ``attempt``: the effect's attempts so far (the call's number for
    ``claimed``); ``owner``: the executor that made the change (its claim
    owner), None for an apply or an operator; ``detail``: what happened, in
    words (the error, the reconcile answer, the due time, the actor and
    reason of an operator)."""

    key: str
    name: str
    at: float
    transition: Transition
    attempt: int
    owner: str | None = None
    detail: str | None = None


def __getattr__(name: str) -> Any:
    if name == "FlowWait":  # defined with the operator reads; an enum, so listed here
        from ._operations import FlowWait

        return FlowWait
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
