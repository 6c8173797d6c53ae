"""reliable_flow.aio: the library for asyncio code, awaited.

``AsyncProducer``, ``AsyncConsumer``, ``relay`` and ``relay_batch`` take the
same arguments and give the same statuses, results, records, errors and
guarantees as the sync face: they call the same core and stores.  Each
object's store lives on a thread of its own (one connection per thread),
so the event loop never waits on storage I/O.

Cancellation: a task cancelled while it awaits a store call never leaves a
transaction half done.  If the thread had not started the call, it never
runs; otherwise it finishes on the thread and its result is dropped (an
``advance`` cancelled after its commit is committed: a retry answers
``existing``).

Quick tour::

    from reliable_flow.aio import AsyncConsumer, AsyncProducer, relay
    from reliable_flow.reservation import RESERVATION

    async with AsyncProducer("producer.db", RESERVATION) as producer, \\
            AsyncConsumer("consumer.db", RESERVATION) as consumer:
        await producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        await relay(producer, consumer)
        await consumer.apply_next("A")
"""

from __future__ import annotations

from ._admin import AsyncConsumerAdmin, AsyncProducerAdmin
from ._consumer import AsyncApplying, AsyncConsumer
from ._executor import AsyncEffectExecutor
from ._producer import AsyncBatch, AsyncProducer
from ._relay import relay, relay_batch
from ._worker import AsyncWorker

__all__ = [
    "AsyncApplying",
    "AsyncBatch",
    "AsyncConsumer",
    "AsyncConsumerAdmin",
    "AsyncEffectExecutor",
    "AsyncProducer",
    "AsyncProducerAdmin",
    "AsyncWorker",
    "relay",
    "relay_batch",
]
