"""``relay`` and ``relay_batch``: hand outbox events to a :class:`Receiver` and
record what it answered.

There is no transaction spanning the two stores.  The receiver commits the
event into its inbox first; only then is it marked accepted on the producer
side, in a second transaction.  A crash between the two leaves the event
unmarked, so it is sent again and the inbox answers ``duplicate``: events
are delivered at least once and stored exactly once.

Which event goes next: the oldest commit among the events that are pending
for this consumer and due.  A new event is due at once; an event whose send
failed is due again after its backoff; an event leased by another relay is
due when the lease expires.  So a flow whose events keep failing is skipped
while it backs off, the others go first, and once it is due again it is
older than anything committed since, so it cannot be starved by new work.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from typing import cast

from .._deprecated import InboxFull, Refused
from .._observe import INFO, RELAY, WARNING, body_fields, log
from .._receiver import Receiver
from .._store import OutboxStore
from ..crash import crash_point
from ..delivery import DeliveryPolicy, claim_until, error_text, retry_after
from ..errors import ConsumerMismatch, UnknownEvent
from ..records import OperatorAction, ReceiveResult, RelayBatchResult, RelayResult
from ..statuses import ActionTarget, ReceiveStatus, RelayStatus
from .conflicts import rerun_on_conflict
from .operate import unknown_consumer

__all__ = ["relay_batch_to", "relay_to"]

PLAIN = DeliveryPolicy(wait_for_due=False)
_DELIVERED = (ReceiveStatus.ACCEPTED, ReceiveStatus.DUPLICATE)


def _observe(consumer: str, marks: Sequence[tuple[int, ReceiveResult]], bodies: dict[int, str]) -> None:
    """Log what the consumer answered, once the marks committed: delivered at
    INFO, a conflict (the event is set aside) at WARNING."""
    for pos, answer in marks:
        body = bodies[pos]
        delivered = answer.status in _DELIVERED
        level = INFO if delivered else WARNING
        if RELAY.isEnabledFor(level):
            log(RELAY, level, str(answer.status) if delivered else f"set aside ({answer.status})",
                body_fields(body, answer.status, consumer, reason=answer.reason))


def _observe_failure(consumer: str, bodies: Sequence[str], exc: BaseException, level: int = WARNING) -> None:
    """Log a send that failed (recorded, retried after a backoff)."""
    if RELAY.isEnabledFor(level):
        for body in bodies:
            log(RELAY, level, "send failed, will retry", body_fields(body, "failed", consumer, error=error_text(exc)))


def _outside_batch(store: OutboxStore) -> None:
    # Inside an open transaction (a producer.batch(), or a protocol hook
    # running during advance) the connection would read uncommitted events
    # and hand them to the consumer: refuse.
    if store.in_transaction():
        raise RuntimeError(
            "relay() cannot run inside an open transaction of this producer (a batch, or a protocol "
            "hook during advance); relay after it has committed"
        )


def _bind(store: OutboxStore, receiver: Receiver, register: bool = False) -> None:
    """Make sure the producer keeps delivery state for this consumer: a
    registered name is bound to the receiver's file on its first relay.  An
    unknown name is registered only when asked (``register``), or when it is
    the first consumer of a producer that has none."""
    name, uid = receiver.name, receiver.uid
    if store.known_binding(name, uid):
        return
    with store.write() as unit:
        if not unit.is_registered(name):
            first = not unit.has_consumers()
            if not (register or first):
                raise unknown_consumer(store.location, name, unit.consumers())
            now = time.time()
            unit.register_consumer(name, now, False)
            why = "relay(register=True)" if register else "the producer's first consumer, on its first relay"
            unit.record_registry_action(OperatorAction(at=now, target=ActionTarget.REGISTRY, consumer=name,
                                                       action="register", actor="relay", reason=why))
        bound = unit.bound_uid(name)
        if bound is None:
            unit.bind_consumer(name, uid)
        elif bound != uid:
            raise ConsumerMismatch(
                f"producer {store.location} delivers to a consumer named {name!r} "
                f"stored in another file (uid {bound}); {receiver.location} has uid {uid}. "
                f"Give each consumer file its own name."
            )
    store.remember_binding(name, uid)


def _claim(
    store: OutboxStore, consumer: str, policy: DeliveryPolicy, now: float, limit: int = 1
) -> list[tuple[int, str]]:
    """Pick up to ``limit`` next due events, each its position and body (one
    read: an event pruned meanwhile is not picked); with a lease, claim them
    first."""
    # Not waiting for due times: every pending event counts as due.
    horizon = now if policy.wait_for_due else float("inf")
    if policy.lease_seconds is None:
        return store.latest.next_due(consumer, horizon, limit)
    if not store.latest.next_due(consumer, horizon, 1):
        return []  # cheap idle check without taking the write lock
    # A lease is only a hint to other relays: losing it in a crash means at
    # worst one more send, which the inbox answers with "duplicate".  So the
    # claim is committed without waiting for the disk.
    def once() -> list[tuple[int, str]]:
        with store.write(durable=False) as unit:
            picked = unit.next_due(consumer, horizon, limit)
            unit.claim(consumer, [pos for pos, _ in picked], claim_until(policy, now), policy.owner, now)
        return picked

    return rerun_on_conflict(once)


def _record_failure(
    store: OutboxStore, consumer: str, positions: Sequence[int], policy: DeliveryPolicy, exc: BaseException
) -> None:
    _record_failures(store, consumer, [(pos, exc) for pos in positions], policy)


def _record_failures(
    store: OutboxStore, consumer: str, failed: Sequence[tuple[int, BaseException]], policy: DeliveryPolicy
) -> None:
    """One more failure and a backoff for each event, in one transaction."""
    now = policy.clock()

    def once() -> None:
        with store.write(durable=False) as unit:
            for pos, exc in failed:
                failures = unit.pending_failures(consumer, pos)
                if failures is None:
                    continue  # delivered or set aside meanwhile by someone else
                unit.set_retry(consumer, pos, retry_after(policy, failures, now, exc), now)

    rerun_on_conflict(once)


def _mark(store: OutboxStore, consumer: str, marks: Sequence[tuple[int, ReceiveResult]], now: float) -> None:
    """Record the consumer's answers on the producer side, in one transaction.

    Committed without waiting for the disk: the consumer already owns the
    event durably, and a mark lost with the page cache (power loss, OS
    crash) only leaves the event pending, so it is sent again and the inbox
    answers ``duplicate`` (or the same conflict) without writing anything.
    In WAL mode the next durable commit of this file makes the mark durable
    too, and recovery never keeps a later commit without an earlier one.
    See docs/guarantees.md, "The durability budget"."""
    delivered, conflicts = [], []
    for pos, answer in marks:
        if answer.status in (ReceiveStatus.ACCEPTED, ReceiveStatus.DUPLICATE):
            delivered.append((pos, answer.status.value))
        else:
            conflicts.append((pos, answer.status.value))

    def once() -> None:
        with store.write(durable=False) as unit:
            unit.mark(consumer, delivered, conflicts, now)
            crash_point("relay.after_mark")

    rerun_on_conflict(once)
    crash_point("relay.after_commit")


def _as_relay(answer: ReceiveResult) -> RelayResult:
    return RelayResult(RelayStatus(answer.status.value), answer.event_id, answer.flow_id, answer.seq, answer.reason,
                       answer.applied)


def _answered(answer: object, body: str) -> ReceiveResult:
    """The receiver's answer to ``body`` as a :class:`ReceiveResult`; the
    deprecated ``Refused`` object of the old protocol becomes ``refused``."""
    if isinstance(answer, Refused):
        warnings.warn(
            "a Receiver answered the deprecated Refused object; answer a ReceiveResult of status "
            "ReceiveStatus.REFUSED instead", DeprecationWarning, stacklevel=2,
        )
        event = json.loads(body)
        return ReceiveResult(ReceiveStatus.REFUSED, event["event_id"], event["flow_id"], event["seq"], answer.reason)
    return cast(ReceiveResult, answer)


def _refused(store: OutboxStore, consumer: str, refused: Sequence[tuple[int, ReceiveResult]],
             bodies: dict[int, str], policy: DeliveryPolicy) -> None:
    """Record the events a full inbox turned away as failed sends (one more
    failure, a backoff, ``last_error`` "InboxFull: ..."): they stay pending."""
    failed = [(pos, InboxFull(answer.reason or "inbox full")) for pos, answer in refused]
    _record_failures(store, consumer, failed, policy)
    for pos, full in failed:
        _observe_failure(consumer, [bodies[pos]], full, INFO)


def _start(store: OutboxStore, receiver: Receiver, policy: DeliveryPolicy | None,
           register: bool) -> tuple[DeliveryPolicy, str]:
    """What every relay call does first: refuse inside an open transaction,
    make sure the receiver is bound; the policy to use and the receiver's name."""
    _outside_batch(store)
    _bind(store, receiver, register)
    return policy or PLAIN, receiver.name


def relay_to(
    store: OutboxStore, receiver: Receiver, event_id: str | None, policy: DeliveryPolicy | None,
    register: bool = False,
) -> RelayResult:
    """One event to ``receiver``; see :func:`reliable_flow.relay`."""
    policy, name = _start(store, receiver, policy, register)
    if event_id is None:
        # Without a lease, one read picks the event with its body.
        found = _claim(store, name, policy, policy.clock())
        if not found:
            return RelayResult(RelayStatus.IDLE)
        [(pos, body)] = found
    else:
        stored = store.latest.find_event(event_id)
        if stored is None:
            raise UnknownEvent(f"event_id {event_id!r} is not in the outbox of {store.location}")
        pos, body = stored.pos, stored.body
    try:
        sent = receiver.accept(body)
    except Exception as exc:
        _record_failure(store, name, [pos], policy, exc)
        _observe_failure(name, [body], exc)
        raise
    answer = _answered(sent, body)
    if answer.status == ReceiveStatus.REFUSED:
        _refused(store, name, [(pos, answer)], {pos: body}, policy)
        return _as_relay(answer)
    _mark(store, name, [(pos, answer)], policy.clock())
    if answer.status not in _DELIVERED or RELAY.isEnabledFor(INFO):
        _observe(name, [(pos, answer)], {pos: body})
    return _as_relay(answer)


def relay_batch_to(
    store: OutboxStore, receiver: Receiver, limit: int, policy: DeliveryPolicy | None,
    register: bool = False,
) -> RelayBatchResult:
    """Up to ``limit`` events to ``receiver``; see :func:`reliable_flow.relay_batch`."""
    policy, name = _start(store, receiver, policy, register)
    claimed = _claim(store, name, policy, policy.clock(), limit)
    if not claimed:
        return RelayBatchResult((), {})
    picked, bodies = [pos for pos, _ in claimed], dict(claimed)
    try:
        answers = receiver.accept_many([bodies[pos] for pos in picked])
    except Exception as exc:
        _record_failure(store, name, picked, policy, exc)
        _observe_failure(name, [bodies[pos] for pos in picked], exc)
        raise
    answered = [(pos, _answered(a, bodies[pos])) for pos, a in zip(picked, answers)]
    marks = [(pos, a) for pos, a in answered if a.status != ReceiveStatus.REFUSED]
    refused = [(pos, a) for pos, a in answered if a.status == ReceiveStatus.REFUSED]
    if marks:
        _mark(store, name, marks, policy.clock())
        _observe(name, marks, bodies)
    if refused:
        _refused(store, name, refused, bodies, policy)
    results = tuple(_as_relay(a) for _, a in answered)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    return RelayBatchResult(results, counts, len(refused))
