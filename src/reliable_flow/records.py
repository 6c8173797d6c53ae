"""Records: the frozen dataclasses the library answers with, all defined here.

Results say what one call did (``AdvanceResult``, ``ApplyResult``, ...);
records describe a row as it stands (``OutboxEntry``, ``InboxEntry``,
``ScheduledEffect``, ...); operator actions are the audit trail of what an
operator changed, each an ``OperatorAction`` (its ``target``, a
:class:`~reliable_flow.statuses.ActionTarget`, says what it acted on); the
running totals of a worker and an executor are ``WorkerStats`` and
``ExecutorStats``.  None of them is built by user code; compare a result's
``status`` with the enums in :mod:`reliable_flow.statuses`::

    from reliable_flow import Producer, AdvanceStatus
    from reliable_flow.records import AdvanceResult

Names used for the same kind of thing: an *applied event* is an event a
consumer applied (``AppliedEvent``, from ``Consumer.applied``); a *scheduled
effect* is a row of the effect outbox (``ScheduledEffect``, from
``Consumer.scheduled_effect`` / ``Consumer.scheduled_effects``), and each
step of its durable history an ``EffectTransition`` (from
``Consumer.effect_history``); the *effect
registry* (``reliable_flow.EffectRegistry``) maps an effect's name to its function.

The operator reads (``InboxRow``, ``StuckFlow``, ``ConsumerEntry``,
``PruneResult``) give times in seconds since the epoch on the clock of the
side that wrote them (the consumer's ``clock``, the producer's
``time.time``); None where the file does not know (rows stored before the
upgrade that added the column).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .statuses import (
    ActionTarget,
    AdvanceStatus,
    ApplyStatus,
    BlockReason,
    DeliveryState,
    DrainStop,
    EffectState,
    FlowWait,
    InboxState,
    ReceiveStatus,
    RelayStatus,
    Transition,
)

__all__ = [
    "AdvanceResult",
    "AppliedEvent",
    "ApplyResult",
    "ConsumerEntry",
    "DeliveryRecord",
    "DrainResult",
    "EffectSchedule",
    "EffectTransition",
    "ExecutorStats",
    "InboxEntry",
    "InboxRow",
    "OperatorAction",
    "OutboxEntry",
    "PassResult",
    "PruneResult",
    "ReceiveResult",
    "RelayBatchResult",
    "RelayResult",
    "ScheduledEffect",
    "StuckFlow",
    "WorkerStats",
]


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
    - ``registry`` (``register`` / ``remove`` / ``subscribe``): ``consumer``,
      the name (a name a relay registered has actor ``relay``), and
      ``topics``, the topic names it subscribed to (None: every event).
    - ``retention`` (``prune``): ``horizon``, the time before which finished
      rows were removed (``now - older_than``), and ``forget_before``, the
      time before which tombstones were forgotten (None without
      ``forget_after``).  Recorded in the prune's first transaction, so no
      row is removed without it; what each transaction removed is in the
      store's ``prune_action`` table.
    - ``schedule`` (``pause`` / ``resume`` / ``remove``): ``schedule``, the
      recurring schedule's name.

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
    horizon: float | None = None
    forget_before: float | None = None
    topics: tuple[str, ...] | None = None
    schedule: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields its ``target`` fills, by name, as every JSON output
        shows it (``--json``, ``inspect``, ``snapshot``, ``compare``), values
        as they are (enums are str).  A delivery's ``previous_state`` is left
        out when None (a listed action: it is not stored)."""
        shown = {name: getattr(self, name) for name in _ACTION_FIELDS[self.target]}
        if self.target is ActionTarget.DELIVERY and self.previous_state is None:
            del shown["previous_state"]
        if self.target is ActionTarget.REGISTRY and self.topics is not None:
            shown["topics"] = list(self.topics)
        return shown


#: The fields each target's record fills, in the order they are shown.
_ACTION_FIELDS: dict[ActionTarget, tuple[str, ...]] = {
    ActionTarget.DELIVERY: ("at", "consumer", "event_id", "action", "actor", "reason", "previous_state"),
    ActionTarget.INBOX: ("at", "event_id", "flow_id", "seq", "action", "previous_state", "actor", "reason",
                         "replacement_event_id"),
    ActionTarget.EFFECT: ("at", "key", "action", "actor", "reason"),
    ActionTarget.REGISTRY: ("at", "consumer", "action", "actor", "reason"),
    ActionTarget.RETENTION: ("at", "action", "horizon", "forget_before", "actor", "reason"),
    ActionTarget.SCHEDULE: ("at", "schedule", "action", "actor", "reason"),
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
class EffectSchedule:
    """A recurring effect schedule as the consumer's store holds it (see
    ``EffectRegistry.every`` and ``Consumer.schedules``).

    ``schedule``: its name (what identifies it); ``name``: the registered
    effect each tick performs, with ``payload``; ``interval`` (seconds) or
    ``cron`` with ``tz``; ``missed``: ``one``, ``all`` or ``skip``.
    ``next_at``: the next tick's time (epoch seconds; while ``paused``, the
    first tick after the pause is lifted is worked out then);
    ``last_tick``: the time of the latest tick made an effect (None before
    the first); ``skipped``: how many ticks were missed and not performed
    (``missed="one"`` / ``"skip"``, or past the ``"all"`` bound).  Each
    tick is an ordinary effect with the key ``schedule:<schedule>:<tick>``
    (:meth:`tick_key`).
    """

    schedule: str
    name: str
    payload: dict[str, Any]
    interval: float | None
    cron: str | None
    tz: str
    missed: str
    paused: bool
    next_at: float
    last_tick: float | None
    skipped: int
    created_at: float
    updated_at: float

    def tick_key(self, tick: float) -> str:
        """The idempotency key of the effect the tick at ``tick`` becomes."""
        return tick_key(self.schedule, tick)

    def as_dict(self) -> dict[str, Any]:
        """Its fields by name (what ``inspect --json`` shows)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def tick_key(schedule: str, tick: float) -> str:
    """``schedule:<schedule>:<tick>``: the tick's time in epoch seconds, to
    the millisecond, trailing zeros left out (``schedule:digest:1733126400``)."""
    text = f"{round(tick, 3):.3f}".rstrip("0").rstrip(".")
    return f"schedule:{schedule}:{text}"


@dataclass(frozen=True, slots=True)
class EffectTransition:
    """One row of an effect's durable history (``consumer.effect_history(key)``),
    written in the same transaction as the change it records.

    ``attempt``: the effect's attempts so far (the call's number for
    ``claimed``); ``owner``: the executor that made the change (its claim
    owner), None for an apply or an operator; ``detail``: what happened, in
    words (the error, the reconcile answer, the due time, the actor and
    reason of an operator).  ``due_at``: when the transition left the effect
    due to be taken up again (``scheduled``, ``rate_limited``,
    ``retry_planned``, ``in_doubt``, ``released``, an operator's
    ``retry``); None when it left the effect final or held under a lease,
    and for rows written before the field existed."""

    key: str
    name: str
    at: float
    transition: Transition
    attempt: int
    owner: str | None = None
    detail: str | None = None
    due_at: float | None = None


# -- what an operator reads when something is stuck ---------------------------------


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
    ``set_aside``: deliveries set aside by a conflict.  ``topics``: the
    topics it subscribes to (None: every event, as before topics), holding
    for the events committed after outbox position ``topics_from`` (0:
    from the first event; None without topics).
    """

    name: str
    uid: str | None
    bound: bool
    registered_at: float | None
    from_now: bool
    backlog: int
    set_aside: int
    topics: tuple[str, ...] | None = None
    topics_from: int | None = None


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What one ``producer.admin.prune`` or ``consumer.admin.prune`` call removed.

    ``events``: outbox events (producer) or inbox rows (consumer) removed,
    each leaving a tombstone; ``deliveries``: their delivery rows
    (producer); ``effect_records`` / ``effect_rows``: effect records of the
    pruned events and finished effect-outbox rows (consumer);
    ``transactions``: how many commits it took; ``complete``: False when
    ``limit`` was reached (there may be more to prune: call again);
    ``tombstones_forgotten``: tombstones removed by ``forget_after``;
    ``action``: the call's recorded :class:`OperatorAction` (target
    ``retention``: who, when, why, the horizon).
    """

    events: int
    deliveries: int
    effect_records: int
    effect_rows: int
    transactions: int
    complete: bool
    tombstones_forgotten: int = 0
    action: OperatorAction | None = None


# -- a pass of a long-running object, and running totals ------------------------------


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one pass of a ``Worker``, an ``EffectExecutor`` or a ``Bridge``
    did (``run_once``), and when that object next has work.

    ``work``: the steps that did something (an event relayed or applied, an
    effect call started, recorded or taken up, a request answered); 0 when
    the pass found nothing to do.  ``wake_in``: seconds until the object
    next has work it knows of -- 0.0 when the pass did work (call again at
    once); a positive number when something waits for its time (a delivery
    leased or backing off, an effect due later, a call in flight to tend;
    at most :data:`~reliable_flow._loop.UNTIL_IDLE_MAX_SLEEP`, so a loop
    looks again); None when nothing waits, so only new events or effects
    give it work.  ``run(until_idle=True)`` returns on a pass with no work
    and ``wake_in`` None, and otherwise sleeps ``wake_in``."""

    work: int
    wake_in: float | None


@dataclass
class WorkerStats:
    """Running totals since the worker started (in this process only)."""

    passes: int = 0
    relayed: Counter[str] = field(default_factory=Counter)
    applied: int = 0
    stops: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    last_error: str | None = None
    effects: Counter[str] = field(default_factory=Counter)
    #: Steps fed back from other hosts and advanced here (``serve_as``), by status.
    served: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """The totals as plain JSON-ready values (what ``reliable-flow run``
        prints; ``served`` only when the worker serves its producer)."""
        out = {
            "passes": self.passes,
            "relayed": dict(sorted(self.relayed.items())),
            "applied": self.applied,
            "stops": dict(sorted(self.stops.items())),
            "errors": self.errors,
            "last_error": self.last_error,
            "effects": dict(sorted(self.effects.items())),
        }
        if self.served:
            out["served"] = dict(sorted(self.served.items()))
        return out


@dataclass
class ExecutorStats:
    """Running totals of one executor object (this process only)."""

    passes: int = 0
    started: int = 0  # calls started off the executor's thread
    started_by_name: Counter[str] = field(default_factory=Counter)  # calls of each effect's function started
    renewals: int = 0  # leases renewed (by the executor, or a heartbeat)
    heartbeats: int = 0  # heartbeat() calls that renewed a lease
    rate_limited: int = 0  # effects put off by their rate_limit
    outcomes: Counter[str] = field(default_factory=Counter)
    fed: int = 0
    feedback_errors: int = 0
    errors: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "started": self.started,
                "started_by_name": dict(sorted(self.started_by_name.items())), "renewals": self.renewals,
                "heartbeats": self.heartbeats, "rate_limited": self.rate_limited,
                "outcomes": dict(sorted(self.outcomes.items())), "fed": self.fed,
                "feedback_errors": self.feedback_errors, "errors": self.errors, "last_error": self.last_error}
