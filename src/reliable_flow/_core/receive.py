"""``receive``: store an arriving event once, or say why not, in the consumer's
unit of work."""

from __future__ import annotations

from collections.abc import Sequence

from .._envelope import Envelope, body_hash
from .._store import InboxUnit
from ..crash import crash_point
from ..records import ReceiveResult
from ..statuses import ReceiveStatus
from .apply import ApplyRules, apply_arrived
from .order import LATEST, STRICT, late_arrival_in, superseded_detail

__all__ = ["receive_in", "receive_many_in"]


def receive_in(
    unit: InboxUnit, env: Envelope, max_inbox: int | None, location: str, now: float | None = None,
    apply: ApplyRules | None = None, order: str = STRICT,
) -> ReceiveResult:
    """Decide and write one receive inside ``unit``'s transaction; a stored
    row is stamped as received at ``now``.  With ``apply`` (the
    receive-and-apply mode), a stored event that is its flow's next step is
    applied in the same transaction if it applies cleanly
    (:func:`~reliable_flow._core.apply.apply_arrived`).

    Answers ``refused`` (having written nothing) when ``max_inbox``
    unapplied rows are held and the event is not its flow's next step.

    ``order`` is the consumer's (:mod:`.order`): a new event at or before
    the flow's last applied seq is a ``sequence_conflict`` in the
    ``strict`` order, stored ``superseded`` in the ``latest`` order
    (``accepted``, with the reason as its detail), and stored to apply in
    the ``any`` order.
    """
    # The common case first: a new event is stored by one statement; only
    # when a unique key refused it do we look at why.
    if max_inbox is None and unit.insert_new(env, now):
        return _stored(unit, env, apply)
    return _refused(unit, env, max_inbox, location, now, apply, order)


def receive_many_in(
    unit: InboxUnit, envs: Sequence[Envelope], max_inbox: int | None, location: str, now: float | None = None,
    apply: ApplyRules | None = None, order: str = STRICT,
) -> list[ReceiveResult]:
    """:func:`receive_in` of each event in order, inside ``unit``'s transaction.

    Where no event of the set can change another's answer (distinct ids and
    distinct (flow, seq); no ``max_inbox``, whose count each stored event
    changes; no handler, whose SQL could touch the inbox), they are stored
    by a few statements, and then each is answered in order as
    :func:`receive_in` would: the refused ones by the same reads, after which
    the applies on arrival run one by one (an apply only raises a flow's
    last seq, which could only have refused a later event of the set that
    the stored state refused already)."""
    if (len(envs) < 2 or max_inbox is not None
            or (apply is not None and apply.handlers) or not _independent(envs)):
        return [receive_in(unit, env, max_inbox, location, now, apply, order) for env in envs]
    stored = unit.insert_new_many(envs, now)
    return [_stored(unit, env, apply) if ok else _refused(unit, env, None, location, now, apply, order)
            for env, ok in zip(envs, stored)]


def _independent(envs: Sequence[Envelope]) -> bool:
    """True when no two events share an id or a (flow, seq)."""
    return (len({env.event_id for env in envs}) == len(envs)
            and len({(env.flow_id, env.seq) for env in envs}) == len(envs))


def _refused(
    unit: InboxUnit, env: Envelope, max_inbox: int | None, location: str, now: float | None,
    apply: ApplyRules | None, order: str = STRICT,
) -> ReceiveResult:
    """Why the event is not new (or, with ``max_inbox``, whether there is
    room for it), storing it when it is new after all."""
    held = unit.inbox_row(env.event_id)
    if held is not None:
        if held.body == env.body:
            return ReceiveResult(ReceiveStatus.DUPLICATE, env.event_id, env.flow_id, env.seq)
        return ReceiveResult(
            ReceiveStatus.ID_CONFLICT, env.event_id, env.flow_id, env.seq,
            "an event with this id and a different body is already in the inbox",
        )
    tomb = unit.tombstone(env.event_id)
    if tomb is not None:
        if tomb.body_hash == body_hash(env.body):
            return ReceiveResult(ReceiveStatus.DUPLICATE, env.event_id, env.flow_id, env.seq)
        return ReceiveResult(
            ReceiveStatus.ID_CONFLICT, env.event_id, env.flow_id, env.seq,
            f"an event with this id and a different body was received (flow {tomb.flow_id!r}, "
            f"seq {tomb.seq}) and since pruned",
        )
    other = unit.holder(env.flow_id, env.seq)
    if other is not None:
        return ReceiveResult(
            ReceiveStatus.SEQUENCE_CONFLICT, env.event_id, env.flow_id, env.seq,
            f"seq {env.seq} of flow {env.flow_id!r} is already held by event {other!r}",
        )
    last = unit.last_seq(env.flow_id)
    if order == LATEST and late_arrival_in(unit, env, last, now):
        crash_point("receive.after_inbox_insert")
        return ReceiveResult(ReceiveStatus.ACCEPTED, env.event_id, env.flow_id, env.seq, superseded_detail(last))
    if env.seq <= last and order == STRICT:
        # Every seq up to last_seq was held by a row; none is left, so it was pruned.
        return ReceiveResult(
            ReceiveStatus.SEQUENCE_CONFLICT, env.event_id, env.flow_id, env.seq,
            f"seq {env.seq} of flow {env.flow_id!r} was already applied, and its event since pruned",
        )
    if max_inbox is not None:
        full = _no_room(unit, env, max_inbox, location)
        if full is not None:
            return ReceiveResult(ReceiveStatus.REFUSED, env.event_id, env.flow_id, env.seq, full)
    unit.insert(env, now)
    return _stored(unit, env, apply)


def _stored(unit: InboxUnit, env: Envelope, apply: ApplyRules | None) -> ReceiveResult:
    crash_point("receive.after_inbox_insert")
    applied = apply is not None and apply_arrived(unit, apply, env)
    return ReceiveResult(ReceiveStatus.ACCEPTED, env.event_id, env.flow_id, env.seq, applied=applied)


def _no_room(unit: InboxUnit, env: Envelope, cap: int, location: str) -> str | None:
    """Why a full inbox refuses the event, or None when it is let in."""
    used = unit.unapplied(cap)
    if used < cap:
        return None
    if env.previous <= unit.last_seq(env.flow_id) < env.seq:
        return None  # the flow's very next step: refusing it could deadlock a full inbox
    return (
        f"inbox full (max_inbox {cap}): {location} holds {used} unapplied events; "
        f"event {env.event_id!r} (flow {env.flow_id!r}, seq {env.seq}) refused, nothing stored"
    )
