"""``relay`` and ``relay_batch``: deliver a producer's events to a consumer.

The decisions live in :mod:`reliable_flow._core.relay`; this module is the
public face: it checks the arguments and hands the producer's store and the
:class:`~reliable_flow._receiver.Receiver` to the core.
"""

from __future__ import annotations

from ._checks import check_count, check_flag
from ._consumer import Consumer
from ._core.relay import relay_batch_to, relay_to
from ._producer import Producer
from ._receiver import Receiver, is_receiver
from .delivery import DeliveryPolicy
from .errors import InvalidEnvelope
from .records import RelayBatchResult, RelayResult
from .tracing import traced

__all__ = ["DeliveryPolicy", "relay", "relay_batch"]


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
    return relay_to(producer.store, consumer, event_id, policy, check_flag("register", register))


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
    return relay_batch_to(producer.store, consumer, limit, policy, check_flag("register", register))
