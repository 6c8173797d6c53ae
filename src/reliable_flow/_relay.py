"""``relay`` and ``relay_batch``: deliver a producer's events to a consumer.

This is the face of the operation: it checks the arguments, opens each unit
of work on the producer's store, lets :mod:`reliable_flow._core.relay`
decide inside it (binding the consumer's name, claiming, marking, backing
off), hands the bodies to the :class:`~reliable_flow._receiver.Receiver`
between units, and logs what happened once it committed.  The receiver
commits first; the marks follow in a second transaction (see the core
module for why that is at-least-once delivery, stored exactly once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ._checks import check_count, check_flag
from ._consumer import Consumer
from ._core.conflicts import rerun_on_conflict
from ._core.relay import (
    DELIVERED,
    PLAIN,
    batch_result,
    bind_in,
    claim_in,
    horizon,
    mark_in,
    relay_result,
    retry_in,
)
from ._core.topics import Routing, policy_by_topic
from ._observe import INFO, RELAY, WARNING, body_fields, log
from ._producer import Producer
from ._receiver import Receiver, is_receiver
from ._store import OutboxStore
from ._topics import Topic
from .crash import crash_point
from .delivery import DeliveryPolicy, error_text
from .errors import InvalidEnvelope, UnknownEvent
from .records import ReceiveResult, RelayBatchResult, RelayResult
from .statuses import ReceiveStatus, RelayStatus
from .tracing import traced

#: What a relay uses for each event (from its body): its topic's lease and backoff, or the relay's policy.
PolicyOf = Callable[[str], DeliveryPolicy]

__all__ = ["DeliveryPolicy", "relay", "relay_batch", "relay_batch_to", "relay_to"]


def _check_pair(producer: object, consumer: object) -> None:
    if not isinstance(producer, Producer):
        raise TypeError(f"producer must be a reliable_flow Producer, got {type(producer).__name__}")
    # A Consumer is checked by its class; only another Receiver pays for the
    # structural check, which is slow (it inspects every member).
    if not isinstance(consumer, Consumer) and not is_receiver(consumer):
        raise TypeError(
            f"consumer must be a Consumer (or another Receiver), got {type(consumer).__name__}"
        )


@traced("reliable_flow.relay", lambda producer, consumer, *a, **k: {
    "reliable_flow.consumer": str(getattr(consumer, "name", ""))})
def relay(
    producer: Producer,
    consumer: Receiver,
    event_id: str | None = None,
    *,
    policy: DeliveryPolicy | None = None,
    register: bool = False,
) -> RelayResult:
    """Deliver one event to ``consumer`` and record its answer in the producer file.

    Without ``event_id``: the oldest event still pending for this consumer
    (with a ``policy``: the oldest that is due, see
    :mod:`reliable_flow._core.relay`); set-aside events are skipped, so one
    conflicting event never holds the others back.  With ``event_id``: that
    event, whatever its delivery state and due time (how an operator
    re-delivers a set-aside event).

    Marks the event accepted only on ``accepted`` or ``duplicate``, after
    the consumer committed it.  On ``id_conflict`` / ``sequence_conflict`` the
    event is set aside (never accepted, never retried automatically).
    ``idle``: nothing pending (with a policy: nothing due now) for this
    consumer.  ``refused``: the consumer's inbox is full (``max_inbox``);
    the event stays pending and the refusal is recorded like a failed send
    (attempts, ``last_error`` "InboxFull: ...", next due time after
    backoff).  ``applied``: the consumer also applied the event in the
    commit that received it (``Consumer.applying()``).  If
    ``consumer.receive`` raises, the failure is recorded the same way and
    the exception propagates.

    A consumer name the producer has not registered raises
    :class:`UnknownConsumer` (nothing sent), unless ``register=True``
    registers it now (every committed event becomes pending for it), or it
    is the first consumer of a producer that has none, which is registered
    implicitly.  See ``producer.admin.register_consumer``.
    """
    if event_id is not None and (not isinstance(event_id, str) or not event_id):
        raise InvalidEnvelope("event_id", f"must be a non-empty string, got {event_id!r}")
    _check_pair(producer, consumer)
    return relay_to(producer.store, consumer, event_id, policy, check_flag("register", register), producer.topics)


@traced("reliable_flow.relay_batch", lambda producer, consumer, *a, **k: {
    "reliable_flow.consumer": str(getattr(consumer, "name", ""))})
def relay_batch(
    producer: Producer,
    consumer: Receiver,
    limit: int = 100,
    *,
    policy: DeliveryPolicy | None = None,
    register: bool = False,
) -> RelayBatchResult:
    """Deliver up to ``limit`` events in one consumer and one producer transaction.

    The same choice of events, statuses and marks as ``limit`` calls of
    :func:`relay`, at the cost of two commits instead of ``2 * limit``.
    Events a full inbox (``max_inbox``) refuses stay pending, with a backoff
    recorded, and are counted in ``refused`` (their results say
    ``refused``); the rest of the batch is still delivered.  If ``receive_many`` raises, nothing of the batch was stored,
    the failure is recorded on every event of the batch, and the exception
    propagates.  An unregistered consumer name: as for :func:`relay`
    (``register=True`` registers it).

    Next to other relays of the same consumer and a pruner (``prune``), an
    event picked here that another relay delivered and the pruner removed
    before its body was read counts as delivered by someone else: it is not
    sent and nothing is recorded for it (the same holds for :func:`relay`).
    """
    check_count("limit", limit)
    _check_pair(producer, consumer)
    return relay_batch_to(producer.store, consumer, limit, policy, check_flag("register", register),
                          producer.topics)


# -- the driver: one unit of work per step, the core deciding inside it ---------------


def relay_to(
    store: OutboxStore, receiver: Receiver, event_id: str | None, policy: DeliveryPolicy | None,
    register: bool = False, topics: Sequence[Topic] = (),
) -> RelayResult:
    """One event to ``receiver``; see :func:`relay`.  ``topics``: the
    producer's (each event's lease and backoff follow its topic's policy)."""
    policy, name = _start(store, receiver, policy, register)
    policy_of = policy_by_topic(Routing(tuple(topics)) if topics else None, policy)
    if event_id is None:
        # Without a lease, one read picks the event with its body.
        found = _claim(store, name, policy, 1, policy_of)
        if not found:
            return RelayResult(RelayStatus.IDLE)
        [(pos, body)] = found
    else:
        stored = store.latest.event_for(event_id, name)
        if stored is None:
            raise UnknownEvent(f"event_id {event_id!r} is not in the outbox of {store.location}")
        pos, body, for_it = stored
        if not for_it:
            raise UnknownEvent(f"event_id {event_id!r} is not for consumer {name!r} of {store.location}: "
                               f"none of the topics it subscribes to carries it")
    try:
        sent = receiver.accept(body)
    except Exception as exc:
        _failed(store, name, [(pos, exc)], policy, {pos: policy_of(body)})
        _observe_failure(name, [body], exc)
        raise
    answer = sent
    if answer.status == ReceiveStatus.REFUSED:
        _refused(store, name, [(pos, answer)], {pos: body}, policy, policy_of)
    else:
        _mark(store, name, [(pos, answer)], policy)
        if answer.status not in DELIVERED or RELAY.isEnabledFor(INFO):
            _observe(name, [(pos, answer)], {pos: body})
    return relay_result(answer)


def relay_batch_to(
    store: OutboxStore, receiver: Receiver, limit: int, policy: DeliveryPolicy | None,
    register: bool = False, topics: Sequence[Topic] = (),
) -> RelayBatchResult:
    """Up to ``limit`` events to ``receiver``; see :func:`relay_batch` and :func:`relay_to`."""
    policy, name = _start(store, receiver, policy, register)
    policy_of = policy_by_topic(Routing(tuple(topics)) if topics else None, policy)
    claimed = _claim(store, name, policy, limit, policy_of)
    if not claimed:
        return RelayBatchResult((), {})
    picked, bodies = [pos for pos, _ in claimed], dict(claimed)
    try:
        answers = receiver.accept_many([bodies[pos] for pos in picked])
    except Exception as exc:
        _failed(store, name, [(pos, exc) for pos in picked], policy, {p: policy_of(bodies[p]) for p in picked})
        _observe_failure(name, [bodies[pos] for pos in picked], exc)
        raise
    answered = list(zip(picked, answers))
    marks = [(pos, a) for pos, a in answered if a.status != ReceiveStatus.REFUSED]
    refused = [(pos, a) for pos, a in answered if a.status == ReceiveStatus.REFUSED]
    if marks:
        _mark(store, name, marks, policy)
        _observe(name, marks, bodies)
    if refused:
        _refused(store, name, refused, bodies, policy, policy_of)
    return batch_result([a for _, a in answered])


def _start(store: OutboxStore, receiver: Receiver, policy: DeliveryPolicy | None,
           register: bool) -> tuple[DeliveryPolicy, str]:
    """What every relay call does first: refuse inside an open transaction
    of this producer (the connection would read uncommitted events and hand
    them on), and make sure the receiver's name is registered and bound to
    its file (one unit, once per name and file and object); the policy to
    use and the receiver's name."""
    if store.in_transaction():
        raise RuntimeError(
            "relay() cannot run inside an open transaction of this producer (a batch, or a protocol "
            "hook during advance); relay after it has committed"
        )
    name, uid = receiver.name, receiver.uid
    if not store.known_binding(name, uid):
        with store.write() as unit:
            bind_in(unit, name, uid, register, time.time(), store.location, receiver.location)
        store.remember_binding(name, uid)
    return policy or PLAIN, name


def _claim(store: OutboxStore, consumer: str, policy: DeliveryPolicy, limit: int,
           policy_of: PolicyOf) -> list[tuple[int, str]]:
    """Up to ``limit`` next due events, each its position and body (one
    read: an event pruned meanwhile is not picked); with a lease, claimed
    in a unit committed without waiting for the disk."""
    now = policy.clock()
    if policy.lease_seconds is None:
        return store.latest.next_due(consumer, horizon(policy, now), limit)
    if not store.latest.next_due(consumer, horizon(policy, now), 1):
        return []  # cheap idle check without taking the write lock

    def once() -> list[tuple[int, str]]:
        with store.write(durable=False) as unit:
            return claim_in(unit, consumer, policy, now, limit, policy_of)

    return rerun_on_conflict(once)


def _failed(store: OutboxStore, consumer: str, failed: Sequence[tuple[int, BaseException]],
            policy: DeliveryPolicy, policies: dict[int, DeliveryPolicy] | None = None) -> None:
    """Record failed sends (one more failure, a backoff each: its topic's
    when ``policies`` has one), in one unit."""
    now = policy.clock()

    def once() -> None:
        with store.write(durable=False) as unit:
            retry_in(unit, consumer, failed, policy, now, policies)

    rerun_on_conflict(once)


def _mark(store: OutboxStore, consumer: str, marks: Sequence[tuple[int, ReceiveResult]],
          policy: DeliveryPolicy) -> None:
    """Record the consumer's answers on the producer side, in one unit.

    Committed without waiting for the disk: the consumer already owns the
    event durably, and a mark lost with the page cache (power loss, OS
    crash) only leaves the event pending, so it is sent again and the inbox
    answers ``duplicate`` (or the same conflict) without writing anything.
    In WAL mode the next durable commit of this file makes the mark durable
    too, and recovery never keeps a later commit without an earlier one.
    See docs/guarantees.md, "The durability budget"."""
    now = policy.clock()

    def once() -> None:
        with store.write(durable=False) as unit:
            mark_in(unit, consumer, marks, now)

    rerun_on_conflict(once)
    crash_point("relay.after_commit")


class InboxFull(Exception):
    """How a send a full inbox turned away is recorded: its name starts the
    ``last_error`` ("InboxFull: ..."), as operators read it."""


def _refused(store: OutboxStore, consumer: str, refused: Sequence[tuple[int, ReceiveResult]],
             bodies: dict[int, str], policy: DeliveryPolicy, policy_of: PolicyOf) -> None:
    """Record the events a full inbox turned away as failed sends (one more
    failure, a backoff, ``last_error`` "InboxFull: ..."): they stay pending."""
    failed = [(pos, InboxFull(answer.reason or "inbox full")) for pos, answer in refused]
    _failed(store, consumer, failed, policy, {pos: policy_of(bodies[pos]) for pos, _ in refused})
    for pos, full in failed:
        _observe_failure(consumer, [bodies[pos]], full, INFO)


def _observe(consumer: str, marks: Sequence[tuple[int, ReceiveResult]], bodies: dict[int, str]) -> None:
    """Log what the consumer answered, once the marks committed: delivered at
    INFO, a conflict (the event is set aside) at WARNING."""
    for pos, answer in marks:
        delivered = answer.status in DELIVERED
        level = INFO if delivered else WARNING
        if RELAY.isEnabledFor(level):
            log(RELAY, level, str(answer.status) if delivered else f"set aside ({answer.status})",
                body_fields(bodies[pos], answer.status, consumer, reason=answer.reason))


def _observe_failure(consumer: str, bodies: Sequence[str], exc: BaseException, level: int = WARNING) -> None:
    """Log a send that failed (recorded, retried after a backoff)."""
    if RELAY.isEnabledFor(level):
        for body in bodies:
            log(RELAY, level, "send failed, will retry", body_fields(body, "failed", consumer, error=error_text(exc)))
