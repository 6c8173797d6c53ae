"""Statuses: every answer the library gives, as a string enum, and nothing else.

Each status is a string enum, so ``result.status == "committed"`` holds and
the value prints as the plain word.  The results that carry them are the
frozen dataclasses of :mod:`reliable_flow.records`: they describe what
happened and cannot be edited afterwards.
"""

from __future__ import annotations

import enum

__all__ = [
    "ActionTarget",
    "AdvanceStatus",
    "ApplyStatus",
    "BlockReason",
    "DeliveryState",
    "DrainStop",
    "EffectState",
    "FlowWait",
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
    ``consumer.admin.skip_event`` / ``replace_event``).  ``superseded``: a
    ``latest`` consumer (``Consumer(order="latest")``) applied a newer event
    of the flow, so this one is never applied (its ``detail`` says by which
    seq); automatic, and as done as an applied row.
    """

    PENDING = "pending"
    BLOCKED = "blocked"
    APPLIED = "applied"
    SKIPPED = "skipped"
    REPLACED = "replaced"
    SUPERSEDED = "superseded"


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
    ``remove_consumer``, or a relay registering one).  ``retention``: a
    ``prune`` of either side (``producer.admin.prune`` /
    ``consumer.admin.prune``).  ``schedule``: a recurring effect schedule
    (``consumer.admin`` ``pause_schedule`` / ``resume_schedule`` /
    ``remove_schedule``).
    """

    DELIVERY = "delivery"
    INBOX = "inbox"
    EFFECT = "effect"
    REGISTRY = "registry"
    RETENTION = "retention"
    SCHEDULE = "schedule"


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


class FlowWait(_StrEnum):
    """What a consumer's flow waits for (see ``Consumer.stuck``).

    ``idle``: nothing unapplied.  ``ready``: its next seq is in the inbox,
    pending: the next apply takes it (waiting long means no apply runs).
    ``gap``: its next seq has not arrived, later ones have.  ``blocked``:
    its next seq is blocked, and stays so until fixed, upgraded, skipped or
    replaced.  ``effect``: nothing unapplied, but an ordered effect of the
    flow waits behind an earlier one that is not resolved (see
    ``ScheduledEffect.waiting_behind``): an executor resolves it, or, when it is dead
    or unknown, an operator.
    """

    IDLE = "idle"
    READY = "ready"
    GAP = "gap"
    BLOCKED = "blocked"
    EFFECT = "effect"
