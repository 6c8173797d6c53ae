"""``AsyncConsumer``: :class:`~reliable_flow.Consumer`, awaited.

Every method runs the sync ``Consumer``'s method on the consumer's own
:class:`~reliable_flow.aio._thread.StoreThread` (the thread that opened its
store): the same arguments, statuses, results, errors and guarantees.
Handlers run on that thread, inside the apply transaction, exactly as in
the sync face (so a handler must not await, and it blocks only this
consumer's thread, never the event loop).

Cancellation: a cancelled call either was cancelled before the thread
started it (nothing happened) or finishes on the thread with its result
dropped: a ``receive`` cancelled while running still stores the event (a
retry answers ``duplicate``); an ``apply_next`` still applies its step (a
retry looks at the following seq).
"""

from __future__ import annotations

from typing import Any

from .._consumer import Consumer
from .._consumer.receive import ConsumerView
from ._admin import AsyncConsumerAdmin
from ._face import OnThread, awaited, same_arguments

__all__ = ["AsyncApplying", "AsyncConsumer"]


class AsyncApplying(ConsumerView):
    """An :class:`AsyncConsumer` in the receive-and-apply mode, as
    :meth:`AsyncConsumer.applying` gives it: what ``aio.relay`` /
    ``aio.relay_batch`` deliver to (like the sync ``Consumer.applying()``).
    ``applied`` counts the events applied on arrival through it."""

    def __init__(self, consumer: AsyncConsumer) -> None:
        self.consumer: AsyncConsumer = consumer
        self.target = consumer.sync.applying()

    @property
    def applied(self) -> int:
        """How many events relays through this object applied on arrival."""
        return self.target.applied


class AsyncConsumer(OnThread[Consumer]):
    """:class:`~reliable_flow.Consumer`, awaited: the same arguments, statuses,
    results, errors and guarantees (it calls the same core and store).

    The store lives on a thread of its own and every method runs there, one
    call at a time; ``handlers`` (and ``clock``, ``app_schema``) run there
    too, inside the apply transaction, as in the sync face.  Opening blocks
    once (bad arguments raise from the constructor, as for ``Consumer``);
    ``await AsyncConsumer.open(...)`` opens without blocking the loop.
    ``async with AsyncConsumer(...) as c:`` closes it on exit.  See
    :mod:`reliable_flow.aio._consumer` for what cancelling a call does.
    """

    @same_arguments(Consumer.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(Consumer, *args, **kwargs)

    @classmethod
    @same_arguments(Consumer.__init__)
    async def open(cls, *args: Any, **kwargs: Any) -> AsyncConsumer:
        """Like the constructor, without blocking the event loop."""
        return await cls._opened(Consumer, args, kwargs)

    def _adopted(self) -> None:
        self._admin = AsyncConsumerAdmin(self, self.run_sync, self._sync.admin)

    @property
    def admin(self) -> AsyncConsumerAdmin:
        """The operator's actions, awaited: see :class:`AsyncConsumerAdmin`."""
        return self._admin

    @property
    def name(self) -> str:
        """The name producers keep this consumer's delivery state under."""
        return self._sync.name

    receive = awaited(Consumer.receive)
    receive_many = awaited(Consumer.receive_many)
    accept = awaited(Consumer.accept)
    accept_many = awaited(Consumer.accept_many)

    def applying(self) -> AsyncApplying:
        """This consumer in the receive-and-apply mode, for ``aio.relay`` /
        ``aio.relay_batch`` (like ``Consumer.applying``)."""
        return AsyncApplying(self)

    apply_next = awaited(Consumer.apply_next)
    drain = awaited(Consumer.drain, "Cancelled, it still drains to its end on the thread.")
    process_all = awaited(Consumer.process_all, "Cancelled, it still runs to its end on the thread.")
    projection = awaited(Consumer.projection)
    applied = awaited(Consumer.applied)
    inbox = awaited(Consumer.inbox)
    flows = awaited(Consumer.flows)
    open_flows = awaited(Consumer.open_flows)
    stuck = awaited(Consumer.stuck)
    event = awaited(Consumer.event)
    scheduled_effect = awaited(Consumer.scheduled_effect)
    scheduled_effects = awaited(Consumer.scheduled_effects)
    effect_history = awaited(Consumer.effect_history)
    effect_counts = awaited(Consumer.effect_counts)
    metrics = awaited(Consumer.metrics)
