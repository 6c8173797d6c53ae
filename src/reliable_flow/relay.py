"""The relay: hands outbox events to a consumer and records what it answered.

There is no transaction spanning the two files.  The consumer commits the
event into its inbox first; only then does the relay mark it accepted in the
producer file, in a second transaction.  A crash between the two leaves the
event unmarked, so it is sent again and the inbox answers ``duplicate``:
events are delivered at least once and stored exactly once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .crash import crash_point
from .errors import ConsumerMismatch, InvalidEnvelope, UnknownEvent
from .statuses import ReceiveStatus, RelayResult, RelayStatus

if TYPE_CHECKING:
    from .consumer import Consumer
    from .producer import Producer

__all__ = ["relay"]


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


def relay(producer: Producer, consumer: Consumer, event_id: str | None = None) -> RelayResult:
    """Deliver one event to ``consumer`` and record its answer in the producer file.

    Without ``event_id``: the oldest event still pending for this consumer;
    set-aside events are skipped, so one conflicting event never holds the
    others back.  With ``event_id``: that event, whatever its delivery state
    (this is how an operator re-delivers a set-aside event).

    Marks the event accepted only on ``accepted`` or ``duplicate``, after
    the consumer committed it.  On ``id_conflict`` / ``sequence_conflict`` the
    event is set aside (never accepted) and the answer returned.  ``idle``:
    nothing pending for this consumer.
    """
    if event_id is not None and (not isinstance(event_id, str) or not event_id):
        raise InvalidEnvelope("event_id", f"must be a non-empty string, got {event_id!r}")
    _bind(producer, consumer)
    conn = producer._db.conn
    if event_id is None:
        row = conn.execute(
            "SELECT o.pos, o.body FROM delivery d JOIN outbox o ON o.pos = d.pos "
            "WHERE d.consumer = ? AND d.state = 'pending' ORDER BY d.pos LIMIT 1",
            (consumer.name,),
        ).fetchone()
        if row is None:
            return RelayResult(RelayStatus.IDLE)
    else:
        row = conn.execute("SELECT pos, body FROM outbox WHERE event_id = ?", (event_id,)).fetchone()
        if row is None:
            raise UnknownEvent(f"event_id {event_id!r} is not in the outbox of {producer.path}")
    pos, body = row
    answer = consumer.receive(body)
    delivered = answer.status in (ReceiveStatus.ACCEPTED, ReceiveStatus.DUPLICATE)
    with producer._db.write() as conn:
        if delivered:
            conn.execute(
                "UPDATE delivery SET state = 'accepted', last_status = ?, attempts = attempts + 1 "
                "WHERE consumer = ? AND pos = ?",
                (answer.status.value, consumer.name, pos),
            )
        else:
            # A conflict never turns into "accepted", and never undoes one.
            conn.execute(
                "UPDATE delivery SET state = CASE state WHEN 'accepted' THEN state ELSE 'set_aside' END, "
                "last_status = ?, attempts = attempts + 1 WHERE consumer = ? AND pos = ?",
                (answer.status.value, consumer.name, pos),
            )
        crash_point("relay.after_mark")
    crash_point("relay.after_commit")
    return RelayResult(RelayStatus(answer.status.value), answer.event_id, answer.flow_id, answer.seq, answer.reason)
