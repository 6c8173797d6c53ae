"""``relay`` and ``relay_batch``, awaited: :func:`reliable_flow.relay` /
:func:`reliable_flow.relay_batch` between an :class:`AsyncProducer` and an
:class:`AsyncConsumer` (or its :meth:`~AsyncConsumer.applying` mode).

The sync relay runs on the producer's thread; the consumer is handed to it
as a :class:`~reliable_flow.Receiver` whose ``accept`` / ``accept_many``
run the consumer's call on the consumer's thread and wait there.  So each
store is used only on its own thread, and nothing is decided twice.  No
deadlock: the producer's thread waits on the consumer's, never the other
way round (a consumer never calls a producer).

Cancellation: the relay is one call on the producer's thread.  Cancelled
before it started, nothing was sent; otherwise it runs to its end (the
consumer commits, then the producer marks) and the result is dropped -- the
guarantees of the sync relay hold whatever the task does: at least once
delivered, stored once (a later relay answers ``idle``, or ``duplicate``
for an event the producer had not marked).

To an :class:`AsyncConsumer` (or its ``applying()``), the relay calls the
sync relay's driver (:func:`~reliable_flow._relay.relay_to`) with the
sync relay's argument checks and span, less one: the structural
``isinstance(..., Receiver)`` check of a receiver, which costs some 15-20
microseconds a call on Python 3.11 (it inspects every member) and can only
pass for the receiver made here.  Any other receiver goes through
:func:`reliable_flow.relay` itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._checks import check_count, check_flag
from .._consumer import Applying, Consumer
from .._producer import Producer
from .._receiver import Receiver
from .._relay import relay as sync_relay
from .._relay import relay_batch as sync_relay_batch
from .._relay import relay_batch_to, relay_to
from ..delivery import DeliveryPolicy
from ..errors import InvalidEnvelope
from ..records import ReceiveResult, RelayBatchResult, RelayResult
from ..tracing import traced
from ._consumer import AsyncApplying, AsyncConsumer
from ._producer import AsyncProducer
from ._thread import StoreThread

__all__ = ["OnItsThread", "relay", "relay_batch"]


class OnItsThread:
    """A sync receiver (a ``Consumer`` or its ``Applying``) as a Receiver whose
    calls run on the consumer's thread, called from the producer's thread
    (which waits: :meth:`StoreThread.call`, one hop there and back)."""

    def __init__(self, thread: StoreThread, target: Receiver, name: str, uid: str,
                 location: str) -> None:
        self._thread = thread
        self._target = target
        self.name = name
        self.uid = uid
        self.location = location

    def accept(self, body: str) -> ReceiveResult:
        return self._thread.call(self._target.accept, body)

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        return self._thread.call(self._target.accept_many, bodies)


def _receiver(consumer: AsyncConsumer | AsyncApplying | Receiver) -> OnItsThread | Receiver:
    target: Consumer | Applying
    if isinstance(consumer, AsyncConsumer):
        c, target = consumer, consumer.sync
    elif isinstance(consumer, AsyncApplying):
        c, target = consumer.consumer, consumer.target
    elif isinstance(consumer, Consumer):
        raise TypeError("consumer must be an AsyncConsumer (a sync Consumer belongs to another thread)")
    else:
        return consumer  # another Receiver (a network client): called on the producer's thread
    return OnItsThread(c.thread, target, c.name, c.uid, c.location)


def _span(producer: Producer, consumer: Receiver, *args: object, **kwargs: object) -> dict[str, str]:
    return {"reliable_flow.consumer": str(getattr(consumer, "name", ""))}


@traced("reliable_flow.relay", _span)
def _relay_on_thread(producer: Producer, consumer: OnItsThread, event_id: str | None, *,
                     policy: DeliveryPolicy | None, register: bool) -> RelayResult:
    """:func:`reliable_flow.relay` to the receiver made by :func:`_receiver`:
    the same checks, span and core call, without the structural check."""
    if event_id is not None and (not isinstance(event_id, str) or not event_id):
        raise InvalidEnvelope("event_id", f"must be a non-empty string, got {event_id!r}")
    return relay_to(producer.store, consumer, event_id, policy, check_flag("register", register))


@traced("reliable_flow.relay_batch", _span)
def _relay_batch_on_thread(producer: Producer, consumer: OnItsThread, limit: int, *,
                           policy: DeliveryPolicy | None, register: bool) -> RelayBatchResult:
    """:func:`reliable_flow.relay_batch` to the receiver made by :func:`_receiver` (see above)."""
    check_count("limit", limit)
    return relay_batch_to(producer.store, consumer, limit, policy, check_flag("register", register))


def _producer(producer: object) -> AsyncProducer:
    if not isinstance(producer, AsyncProducer):
        raise TypeError(f"producer must be a reliable_flow.aio AsyncProducer, got {type(producer).__name__}")
    return producer


async def relay(
    producer: AsyncProducer,
    consumer: AsyncConsumer | AsyncApplying | Receiver,
    event_id: str | None = None,
    *,
    policy: DeliveryPolicy | None = None,
    register: bool = False,
) -> RelayResult:
    """Like :func:`reliable_flow.relay`; awaited.  ``consumer`` is an
    :class:`AsyncConsumer`, ``consumer.applying()``, or another
    :class:`~reliable_flow.Receiver` (whose blocking calls then run on the
    producer's thread).  Waits for any batch another task has open on the
    producer.  See the module for cancellation."""
    p = _producer(producer)
    receiver = _receiver(consumer)
    if isinstance(receiver, OnItsThread):
        return await p.run_sync(_relay_on_thread, p.sync, receiver, event_id, policy=policy, register=register)
    return await p.run_sync(sync_relay, p.sync, receiver, event_id, policy=policy, register=register)


async def relay_batch(
    producer: AsyncProducer,
    consumer: AsyncConsumer | AsyncApplying | Receiver,
    limit: int = 100,
    *,
    policy: DeliveryPolicy | None = None,
    register: bool = False,
) -> RelayBatchResult:
    """Like :func:`reliable_flow.relay_batch`; awaited (see :func:`relay`)."""
    p = _producer(producer)
    receiver = _receiver(consumer)
    if isinstance(receiver, OnItsThread):
        return await p.run_sync(_relay_batch_on_thread, p.sync, receiver, limit, policy=policy, register=register)
    return await p.run_sync(sync_relay_batch, p.sync, receiver, limit, policy=policy, register=register)
