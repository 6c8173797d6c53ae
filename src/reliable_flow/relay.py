"""The relay: hands outbox events to a consumer and records what it answered.

There is no transaction spanning the two files.  The consumer commits the
event into its inbox first; only then does the relay mark it accepted in the
producer file, in a second transaction.  A crash between the two leaves the
event unmarked, so it is sent again and the inbox answers ``duplicate``:
events are delivered at least once and stored exactly once.

Which event goes next: the oldest commit among the events that are pending
for this consumer and due.  A new event is due at once; an event whose send
failed is due again after its backoff; an event leased by another relay is
due when the lease expires.  So a flow whose events keep failing is skipped
while it backs off, the others go first, and once it is due again it is
older than anything committed since, so it cannot be starved by new work.
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .crash import crash_point
from .errors import ConsumerMismatch, InboxFull, InvalidEnvelope, UnknownEvent
from .statuses import ReceiveResult, ReceiveStatus, RelayBatchResult, RelayResult, RelayStatus

if TYPE_CHECKING:
    from .consumer import Consumer
    from .producer import Producer

__all__ = ["DeliveryPolicy", "relay", "relay_batch"]


@dataclass(frozen=True)
class DeliveryPolicy:
    """How a relay claims events and retries failed sends.

    lease_seconds: None (the default for plain :func:`relay`) sends without
        claiming.  A number makes the relay first claim the event for that
        long, so concurrent relays (threads or processes) skip it; a relay
        that dies mid-send loses the claim when it expires and the event is
        sent again.  Use it whenever several relays share one producer.
    wait_for_due: True: only events that are due are sent, so ``idle``
        means "nothing due now" and a backing-off event waits its turn.
        Plain ``relay()`` without a policy uses False: it sends the next
        pending event even if it is backing off, so its ``idle`` means
        "nothing left to deliver".
    backoff_base, backoff_cap: after the n-th consecutive failure to send,
        the event waits ``random() * min(cap, base * 2**(n-1))`` seconds
        (exponential backoff with full jitter).
    clock, random: injectable for tests; ``clock`` returns seconds.
    """

    lease_seconds: float | None = None
    wait_for_due: bool = True
    backoff_base: float = 0.5
    backoff_cap: float = 300.0
    clock: Callable[[], float] = time.time
    random: Callable[[], float] = random.random
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        if self.lease_seconds is not None and not (
            isinstance(self.lease_seconds, (int, float)) and not isinstance(self.lease_seconds, bool)
            and self.lease_seconds > 0
        ):
            raise ValueError(f"lease_seconds must be None or a number > 0, got {self.lease_seconds!r}")
        for name in ("backoff_base", "backoff_cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failed sends (>= 1)."""
        ceiling = min(self.backoff_cap, self.backoff_base * 2 ** min(failures - 1, 62))
        return float(self.random() * ceiling)


_PLAIN = DeliveryPolicy(wait_for_due=False)


def _outside_batch(producer: Producer) -> None:
    # Inside an open producer.batch() the connection would read the batch's
    # uncommitted events and hand them to the consumer: refuse.
    if producer._db.conn.in_transaction:
        raise RuntimeError("relay() cannot run inside an open producer.batch(); relay after the block")


def _bind(producer: Producer, consumer: Consumer) -> None:
    """Make sure the producer keeps delivery state for this consumer file."""
    key = (consumer.name, consumer.uid)
    if key in producer._registered:
        return
    with producer._db.write() as conn:
        row = conn.execute("SELECT uid FROM consumer WHERE name = ?", (consumer.name,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO consumer(name, uid) VALUES (?, ?)", key)
            # Every event already committed is pending for a new consumer.
            conn.execute(
                "INSERT INTO delivery(consumer, pos) SELECT ?, pos FROM outbox", (consumer.name,)
            )
        elif row[0] != consumer.uid:
            raise ConsumerMismatch(
                f"producer {producer.path} delivers to a consumer named {consumer.name!r} "
                f"stored in another file (uid {row[0]}); {consumer.path} has uid {consumer.uid}. "
                f"Give each consumer file its own name."
            )
    producer._registered.add(key)


_NEXT_DUE = (
    # INDEXED BY: without ANALYZE statistics SQLite prefers the primary key
    # and would walk every delivery of the consumer, accepted ones included.
    "SELECT pos FROM delivery INDEXED BY delivery_due WHERE consumer = ? AND state = 'pending' AND due_at <= ? "
    "ORDER BY pos LIMIT ?"
)


_NEXT_DUE_BODY = (
    "SELECT d.pos, o.body FROM delivery d INDEXED BY delivery_due JOIN outbox o ON o.pos = d.pos "
    "WHERE d.consumer = ? AND d.state = 'pending' AND d.due_at <= ? ORDER BY d.pos LIMIT 1"
)


def _claim(producer: Producer, consumer: Consumer, policy: DeliveryPolicy, now: float, limit: int = 1) -> list[int]:
    """Pick up to ``limit`` next due events; with a lease, claim them first."""
    conn = producer._db.conn
    name = consumer.name
    # Not waiting for due times: every pending event counts as due.
    horizon = now if policy.wait_for_due else float("inf")
    if policy.lease_seconds is None:
        return [int(r[0]) for r in conn.execute(_NEXT_DUE, (name, horizon, limit))]
    if conn.execute(_NEXT_DUE, (name, horizon, 1)).fetchone() is None:
        return []  # cheap idle check without taking the write lock
    # A lease is only a hint to other relays: losing it in a crash means at
    # worst one more send, which the inbox answers with "duplicate".  So the
    # claim is committed without waiting for fsync.
    with producer._db.write(durable=False) as conn:
        picked = [int(r[0]) for r in conn.execute(_NEXT_DUE, (name, horizon, limit))]
        conn.executemany(
            "UPDATE delivery SET due_at = ?, lease_owner = ?, updated_at = ? WHERE consumer = ? AND pos = ?",
            [(now + policy.lease_seconds, policy.owner, now, name, pos) for pos in picked],
        )
    return picked


def _record_failure(
    producer: Producer, consumer: Consumer, positions: list[int], policy: DeliveryPolicy, exc: BaseException
) -> None:
    now = policy.clock()
    error = f"{type(exc).__name__}: {exc}"[:1000]
    with producer._db.write(durable=False) as conn:
        for pos in positions:
            row = conn.execute(
                "SELECT failures FROM delivery WHERE consumer = ? AND pos = ? AND state = 'pending'",
                (consumer.name, pos),
            ).fetchone()
            if row is None:
                continue  # delivered or set aside meanwhile by someone else
            failures = row[0] + 1
            conn.execute(
                "UPDATE delivery SET attempts = attempts + 1, failures = ?, due_at = ?, lease_owner = NULL, "
                "last_error = ?, updated_at = ? WHERE consumer = ? AND pos = ?",
                (failures, now + policy.backoff(failures), error, now, consumer.name, pos),
            )


def _mark(producer: Producer, consumer: Consumer, marks: list[tuple[int, ReceiveResult]], now: float) -> None:
    """Record the consumer's answers in the producer file, in one transaction."""
    delivered, conflicts = [], []
    for pos, answer in marks:
        row = (answer.status.value, now, consumer.name, pos)
        if answer.status in (ReceiveStatus.ACCEPTED, ReceiveStatus.DUPLICATE):
            delivered.append(row)
        else:
            conflicts.append(row)
    with producer._db.write() as conn:
        if delivered:
            conn.executemany(
                "UPDATE delivery SET state = 'accepted', last_status = ?, attempts = attempts + 1, "
                "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = ? "
                "WHERE consumer = ? AND pos = ?",
                delivered,
            )
        # A conflict never turns into "accepted", and never undoes one.
        if conflicts:
            conn.executemany(
                "UPDATE delivery SET state = CASE state WHEN 'accepted' THEN state ELSE 'set_aside' END, "
                "last_status = ?, attempts = attempts + 1, lease_owner = NULL, updated_at = ? "
                "WHERE consumer = ? AND pos = ?",
                conflicts,
            )
        crash_point("relay.after_mark")
    crash_point("relay.after_commit")


def _as_relay(answer: ReceiveResult) -> RelayResult:
    return RelayResult(RelayStatus(answer.status.value), answer.event_id, answer.flow_id, answer.seq, answer.reason)


def relay(
    producer: Producer,
    consumer: Consumer,
    event_id: str | None = None,
    *,
    policy: DeliveryPolicy | None = None,
) -> RelayResult:
    """Deliver one event to ``consumer`` and record its answer in the producer file.

    Without ``event_id``: the oldest event still pending for this consumer
    (with a ``policy``: the oldest that is due, see the module docstring);
    set-aside events are skipped, so one
    conflicting event never holds the others back.  With ``event_id``: that
    event, whatever its delivery state and due time (how an operator
    re-delivers a set-aside event).

    Marks the event accepted only on ``accepted`` or ``duplicate``, after
    the consumer committed it.  On ``id_conflict`` / ``sequence_conflict`` the
    event is set aside (never accepted, never retried automatically).
    ``idle``: nothing pending (with a policy: nothing due now) for this
    consumer.  If ``consumer.receive`` raises,
    the failure is recorded (attempts, last error, next due time after
    backoff) and the exception propagates.
    """
    if event_id is not None and (not isinstance(event_id, str) or not event_id):
        raise InvalidEnvelope("event_id", f"must be a non-empty string, got {event_id!r}")
    policy = policy or _PLAIN
    _outside_batch(producer)
    _bind(producer, consumer)
    conn = producer._db.conn
    if event_id is None:
        if policy.lease_seconds is None:
            # No claim to write: pick the event and read its body in one query.
            horizon = policy.clock() if policy.wait_for_due else float("inf")
            row = conn.execute(_NEXT_DUE_BODY, (consumer.name, horizon)).fetchone()
            if row is None:
                return RelayResult(RelayStatus.IDLE)
            pos, body = row
        else:
            picked = _claim(producer, consumer, policy, policy.clock())
            if not picked:
                return RelayResult(RelayStatus.IDLE)
            pos = picked[0]
            body = conn.execute("SELECT body FROM outbox WHERE pos = ?", (pos,)).fetchone()[0]
    else:
        row = conn.execute("SELECT pos, body FROM outbox WHERE event_id = ?", (event_id,)).fetchone()
        if row is None:
            raise UnknownEvent(f"event_id {event_id!r} is not in the outbox of {producer.path}")
        pos, body = row
    try:
        answer = consumer.receive(body)
    except Exception as exc:
        _record_failure(producer, consumer, [pos], policy, exc)
        raise
    _mark(producer, consumer, [(pos, answer)], policy.clock())
    return _as_relay(answer)


def relay_batch(
    producer: Producer,
    consumer: Consumer,
    limit: int = 100,
    *,
    policy: DeliveryPolicy | None = None,
) -> RelayBatchResult:
    """Deliver up to ``limit`` events in one consumer and one producer transaction.

    The same choice of events, statuses and marks as ``limit`` calls of
    :func:`relay`, at the cost of two commits instead of ``2 * limit``.
    Events a full inbox (``max_inbox``) refuses stay pending, with a backoff
    recorded, and are counted in ``refused``; the rest of the batch is still
    delivered.  If ``receive_many`` raises, nothing of the batch was stored,
    the failure is recorded on every event of the batch, and the exception
    propagates.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    policy = policy or _PLAIN
    _outside_batch(producer)
    _bind(producer, consumer)
    picked = _claim(producer, consumer, policy, policy.clock(), limit)
    if not picked:
        return RelayBatchResult((), {})
    conn = producer._db.conn
    bodies: dict[int, str] = {}
    for start in range(0, len(picked), 500):  # old SQLite allows 999 variables per statement
        chunk = picked[start:start + 500]
        bodies.update(conn.execute(f"SELECT pos, body FROM outbox WHERE pos IN ({','.join('?' * len(chunk))})", chunk))
    try:
        answers = consumer.receive_many([bodies[pos] for pos in picked])
    except Exception as exc:
        _record_failure(producer, consumer, picked, policy, exc)
        raise
    marks = [(pos, a) for pos, a in zip(picked, answers) if a is not None]
    refused = [pos for pos, a in zip(picked, answers) if a is None]
    if marks:
        _mark(producer, consumer, marks, policy.clock())
    if refused:
        _record_failure(producer, consumer, refused, policy, InboxFull("inbox full (max_inbox)"))
    results = tuple(_as_relay(a) for _, a in marks)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    return RelayBatchResult(results, counts, len(refused))
