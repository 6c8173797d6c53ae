"""What an operator reads when something is stuck: why a flow waits, the
inbox rows in full, the producer's consumer registry, and what a prune
removed.  The recorded ways out (skipping or replacing an accepted event,
registering or removing a consumer) are
:class:`~reliable_flow.records.OperatorAction` records.

Like :mod:`reliable_flow.statuses`, plain values: frozen dataclasses and a
string enum.  Times are seconds since the epoch on the clock of the side
that wrote them (the consumer's ``clock``, the producer's ``time.time``);
None where the file does not know (rows stored before the upgrade that
added the column).
"""

from __future__ import annotations

from dataclasses import dataclass

from .statuses import BlockReason, InboxState, _StrEnum

__all__ = ["ConsumerEntry", "FlowWait", "InboxRow", "PruneResult", "StuckFlow"]


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


@dataclass(frozen=True, slots=True)
class InboxRow:
    """One inbox row in full: :class:`~reliable_flow.records.InboxEntry` plus its flow,
    the block's ``detail``, when it was received and when it became blocked
    (kept after it applied; None if never, or if stored before the upgrade)."""

    event_id: str
    flow_id: str
    seq: int
    state: InboxState
    reason: BlockReason | None
    detail: str | None
    received_at: float | None
    blocked_at: float | None


@dataclass(frozen=True, slots=True)
class StuckFlow:
    """Why a consumer's flow waits (``Consumer.stuck``).

    ``state`` / ``last_seq``: the projection (None / 0 before the first
    apply); ``next_seq`` = ``last_seq + 1``.  ``since``: when the wait began
    as far as the file knows (ready: the row arrived; blocked: it became
    blocked; gap: the oldest row waiting behind the gap arrived; effect: the
    effect waited behind was last written); None when idle or unknown.
    ``reason`` / ``detail``: the block (for a gap, ``detail`` names the
    missing seq; for an effect wait, both effects and the state).  ``rows``: the flow's rows from
    ``next_seq`` on, every state (a replaced row just before its
    replacement).
    """

    flow_id: str
    state: str | None
    last_seq: int
    next_seq: int
    wait: FlowWait
    since: float | None
    reason: BlockReason | None
    detail: str | None
    rows: tuple[InboxRow, ...]


@dataclass(frozen=True, slots=True)
class ConsumerEntry:
    """One consumer in a producer's registry (``producer.admin.consumers``).

    ``uid``: the consumer file bound to the name (None until its first
    relay: ``bound`` is False).  ``registered_at``: None if unknown
    (registered before the upgrade).  ``from_now``: registered to get only
    events committed afterwards.  ``backlog``: deliveries still pending;
    ``set_aside``: deliveries set aside by a conflict.
    """

    name: str
    uid: str | None
    bound: bool
    registered_at: float | None
    from_now: bool
    backlog: int
    set_aside: int


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What one ``producer.admin.prune`` or ``consumer.admin.prune`` call removed.

    ``events``: outbox events (producer) or inbox rows (consumer) removed,
    each leaving a tombstone; ``deliveries``: their delivery rows
    (producer); ``effect_records`` / ``effect_rows``: effect records of the
    pruned events and finished effect-outbox rows (consumer);
    ``transactions``: how many commits it took; ``complete``: False when
    ``limit`` was reached (there may be more to prune: call again);
    ``tombstones_forgotten``: tombstones removed by ``forget_after``.
    """

    events: int
    deliveries: int
    effect_records: int
    effect_rows: int
    transactions: int
    complete: bool
    tombstones_forgotten: int = 0
