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
"""

from __future__ import annotations

from collections.abc import Sequence

from .._consumer import Applying, Consumer
from .._receiver import Receiver
from .._relay import relay as sync_relay
from .._relay import relay_batch as sync_relay_batch
from ..delivery import DeliveryPolicy
from ..records import ReceiveResult, RelayBatchResult, RelayResult
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
        self._thread, self._target, self._named = thread, target, (name, uid, location)

    # Properties, not instance attributes: the relay's is_receiver check then
    # knows the class after its first look (one set look-up a relay).
    @property
    def name(self) -> str:
        return self._named[0]

    @property
    def uid(self) -> str:
        return self._named[1]

    @property
    def location(self) -> str:
        return self._named[2]

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
    return await p.run_sync(sync_relay, p.sync, _receiver(consumer), event_id, policy=policy, register=register)


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
    return await p.run_sync(sync_relay_batch, p.sync, _receiver(consumer), limit, policy=policy, register=register)
