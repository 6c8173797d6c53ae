"""The relay's decisions, each on a unit of work its caller opened
(:mod:`reliable_flow._relay` drives them: it opens each unit, hands the
bodies to the receiver and logs).

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

from collections.abc import Callable, Mapping, Sequence

from .._store import OutboxUnit
from ..crash import crash_point
from ..delivery import DeliveryPolicy, claim_until, retry_after
from ..errors import ConsumerMismatch
from ..records import OperatorAction, ReceiveResult, RelayBatchResult, RelayResult
from ..statuses import ActionTarget, ReceiveStatus, RelayStatus
from .operate import unknown_consumer

__all__ = [
    "DELIVERED", "PLAIN", "batch_result", "bind_in", "claim_in", "horizon", "mark_in", "relay_result", "retry_in",
]

#: The policy of a relay called without one: every pending event is due.
PLAIN = DeliveryPolicy(wait_for_due=False)
#: The answers that mark an event delivered; any other but ``refused`` sets it aside.
DELIVERED = (ReceiveStatus.ACCEPTED, ReceiveStatus.DUPLICATE)


def bind_in(unit: OutboxUnit, name: str, uid: str, register: bool, now: float, location: str,
            receiver_location: str) -> None:
    """Make sure the producer keeps delivery state for ``name`` and that the
    name is bound to the receiver's file ``uid``.  An unknown name is
    registered only when asked (``register``), or when it is the first
    consumer of a producer that has none (recorded as the relay's registry
    action); otherwise :class:`UnknownConsumer`.  A name bound to another
    file raises :class:`ConsumerMismatch`."""
    if not unit.is_registered(name):
        first = not unit.has_consumers()
        if not (register or first):
            raise unknown_consumer(location, name, unit.consumers())
        unit.register_consumer(name, now, False)
        why = "relay(register=True)" if register else "the producer's first consumer, on its first relay"
        unit.record_action(OperatorAction(at=now, target=ActionTarget.REGISTRY, consumer=name,
                                          action="register", actor="relay", reason=why))
    bound = unit.bound_uid(name)
    if bound is None:
        unit.bind_consumer(name, uid)
    elif bound != uid:
        raise ConsumerMismatch(
            f"producer {location} delivers to a consumer named {name!r} "
            f"stored in another file (uid {bound}); {receiver_location} has uid {uid}. "
            f"Give each consumer file its own name."
        )


def horizon(policy: DeliveryPolicy, now: float) -> float:
    """Up to when an event counts as due: ``now``, or, for a policy that
    does not wait for due times, forever (every pending event is due)."""
    return now if policy.wait_for_due else float("inf")


def claim_in(unit: OutboxUnit, consumer: str, policy: DeliveryPolicy, now: float,
             limit: int, policy_of: Callable[[str], DeliveryPolicy] | None = None) -> list[tuple[int, str]]:
    """Pick up to ``limit`` next due events, each its position and body, and
    lease them to ``policy.owner`` until the policy's lease ends (a unit the
    caller may commit without waiting for the disk: a lease is only a hint
    to other relays, and losing it costs at worst one more send, which the
    inbox answers ``duplicate``)."""
    picked = unit.next_due(consumer, horizon(policy, now), limit)
    if policy_of is None:
        unit.claim(consumer, [pos for pos, _ in picked], claim_until(policy, now), policy.owner, now)
        return picked
    # Each event leased for its topic's lease (``policy_of``: topics.policy_by_topic).
    until: dict[float, list[int]] = {}
    for pos, body in picked:
        until.setdefault(claim_until(policy_of(body), now), []).append(pos)
    for ends, positions in until.items():
        unit.claim(consumer, positions, ends, policy.owner, now)
    return picked


def retry_in(unit: OutboxUnit, consumer: str, failed: Sequence[tuple[int, BaseException]],
             policy: DeliveryPolicy, now: float, policies: Mapping[int, DeliveryPolicy] | None = None) -> None:
    """One more failure and the policy's backoff for each failed send (an
    event's own from ``policies``, by position, when given: its topic's); an
    event delivered or set aside meanwhile by someone else is left alone."""
    for pos, exc in failed:
        failures = unit.pending_failures(consumer, pos)
        if failures is None:
            continue
        own = policy if policies is None else policies.get(pos, policy)
        unit.set_retry(consumer, pos, retry_after(own, failures, now, exc), now)


def mark_in(unit: OutboxUnit, consumer: str, marks: Sequence[tuple[int, ReceiveResult]], now: float) -> None:
    """Record the consumer's answers: ``accepted`` / ``duplicate`` mark the
    event delivered, a conflict sets it aside (crash point
    ``relay.after_mark`` before the caller commits)."""
    delivered: list[tuple[int, str]] = []
    conflicts: list[tuple[int, str]] = []
    for pos, answer in marks:
        (delivered if answer.status in DELIVERED else conflicts).append((pos, answer.status.value))
    unit.mark(consumer, delivered, conflicts, now)
    crash_point("relay.after_mark")


def relay_result(answer: ReceiveResult) -> RelayResult:
    """The relay's answer for the consumer's ``answer``."""
    return RelayResult(RelayStatus(answer.status.value), answer.event_id, answer.flow_id, answer.seq, answer.reason,
                       answer.applied)


def batch_result(answers: Sequence[ReceiveResult]) -> RelayBatchResult:
    """The batch's answer: one result per event sent, counts by status and
    how many a full inbox refused."""
    results = tuple(relay_result(a) for a in answers)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    return RelayBatchResult(results, counts, sum(1 for a in answers if a.status == ReceiveStatus.REFUSED))
