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

import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from .._consumer import Consumer
from .._effects import EffectRegistry
from .._handlers import AppSchema, Handler
from .._store.open import Location
from .._store.sqlite.connection import DEFAULT_BUSY_TIMEOUT
from ..errors import StorageError
from ..metrics import ConsumerMetrics
from ..protocol import Protocol
from ..records import (
    AppliedEvent,
    ApplyResult,
    DrainResult,
    EffectTransition,
    InboxEntry,
    ReceiveResult,
    ScheduledEffect,
    StuckFlow,
)
from ..statuses import EffectState
from ._admin import AsyncConsumerAdmin
from ._producer import open_on_thread, open_on_thread_async
from ._thread import StoreThread

__all__ = ["AsyncApplying", "AsyncConsumer"]

_T = TypeVar("_T")


class AsyncApplying:
    """An :class:`AsyncConsumer` in the receive-and-apply mode, as
    :meth:`AsyncConsumer.applying` gives it: what ``aio.relay`` /
    ``aio.relay_batch`` deliver to (like the sync ``Consumer.applying()``).
    ``applied`` counts the events applied on arrival through it."""

    def __init__(self, consumer: AsyncConsumer) -> None:
        self.consumer = consumer
        self.target = consumer.sync.applying()

    @property
    def applied(self) -> int:
        """How many events relays through this object applied on arrival."""
        return self.target.applied

    @property
    def name(self) -> str:
        """The consumer's name (as ``AsyncConsumer.name``)."""
        return self.consumer.name

    @property
    def uid(self) -> str:
        """The consumer store's identity (as ``AsyncConsumer.uid``)."""
        return self.consumer.uid

    @property
    def location(self) -> str:
        """Where the consumer's store lives (as ``AsyncConsumer.location``)."""
        return self.consumer.location

    def __repr__(self) -> str:
        return f"{self.consumer!r}.applying()"


class AsyncConsumer:
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

    def __init__(
        self,
        location: Location,
        protocol: Protocol,
        *,
        schemas: Collection[int] | None = None,
        name: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_inbox: int | None = None,
        handlers: Sequence[Handler] = (),
        effects: EffectRegistry | None = None,
        app_schema: AppSchema | None = None,
        clock: Callable[[], float] = time.time,
        apply_on_receive: bool = False,
    ) -> None:
        thread = StoreThread("consumer")
        self._adopt(thread, open_on_thread(
            thread, Consumer, location, protocol, schemas=schemas, name=name, busy_timeout=busy_timeout,
            max_inbox=max_inbox, handlers=handlers, effects=effects, app_schema=app_schema, clock=clock,
            apply_on_receive=apply_on_receive,
        ))

    @classmethod
    async def open(
        cls,
        location: Location,
        protocol: Protocol,
        *,
        schemas: Collection[int] | None = None,
        name: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_inbox: int | None = None,
        handlers: Sequence[Handler] = (),
        effects: EffectRegistry | None = None,
        app_schema: AppSchema | None = None,
        clock: Callable[[], float] = time.time,
        apply_on_receive: bool = False,
    ) -> AsyncConsumer:
        """Like the constructor, without blocking the event loop."""
        thread = StoreThread("consumer")
        sync = await open_on_thread_async(
            thread, Consumer, location, protocol, schemas=schemas, name=name, busy_timeout=busy_timeout,
            max_inbox=max_inbox, handlers=handlers, effects=effects, app_schema=app_schema, clock=clock,
            apply_on_receive=apply_on_receive,
        )
        self = cls.__new__(cls)
        self._adopt(thread, sync)
        return self

    def _adopt(self, thread: StoreThread, sync: Consumer) -> None:
        location = sync.location
        thread.closed_error = lambda: StorageError(f"the consumer {location} is closed")
        self._thread = thread
        self._sync = sync
        self._admin = AsyncConsumerAdmin(self, self.run_sync, sync.admin)
        weakref.finalize(self, thread.stop)  # a forgotten object does not keep its thread

    async def run_sync(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` on the store's thread and await it; for the aio face's own use."""
        return await self._thread.run(fn, *args, **kwargs)

    # -- for the aio face's own use -------------------------------------------------

    @property
    def sync(self) -> Consumer:
        """The sync ``Consumer`` behind this object; for the aio face's own use,
        and only on :attr:`thread`."""
        return self._sync

    @property
    def thread(self) -> StoreThread:
        """The thread the store lives on; for the aio face's own use."""
        return self._thread

    # -- the consumer ------------------------------------------------------------------

    @property
    def admin(self) -> AsyncConsumerAdmin:
        """The operator's actions, awaited: see :class:`AsyncConsumerAdmin`."""
        return self._admin

    @property
    def name(self) -> str:
        """The name producers keep this consumer's delivery state under."""
        return self._sync.name

    @property
    def uid(self) -> str:
        """The identity of this consumer's store, fixed when it was created."""
        return self._sync.uid

    @property
    def location(self) -> str:
        """Where the store lives (password masked)."""
        return self._sync.location

    @property
    def protocol(self) -> Protocol:
        """The protocol this consumer was opened for."""
        return self._sync.protocol

    async def receive(self, envelope_in: dict[str, Any] | str | bytes) -> ReceiveResult:
        """Like ``Consumer.receive``; awaited."""
        return await self.run_sync(self._sync.receive, envelope_in)

    async def receive_many(self, envelopes: Sequence[dict[str, Any] | str | bytes]) -> list[ReceiveResult]:
        """Like ``Consumer.receive_many``; awaited."""
        return await self.run_sync(self._sync.receive_many, envelopes)

    async def accept(self, body: str) -> ReceiveResult:
        """Like ``Consumer.accept``; awaited."""
        return await self.run_sync(self._sync.accept, body)

    async def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        """Like ``Consumer.accept_many``; awaited."""
        return await self.run_sync(self._sync.accept_many, bodies)

    def applying(self) -> AsyncApplying:
        """This consumer in the receive-and-apply mode, for ``aio.relay`` /
        ``aio.relay_batch`` (like ``Consumer.applying``)."""
        return AsyncApplying(self)

    async def apply_next(self, flow_id: str) -> ApplyResult:
        """Like ``Consumer.apply_next``; awaited."""
        return await self.run_sync(self._sync.apply_next, flow_id)

    async def drain(self, flow_id: str, limit: int = 100, *, batch_size: int = 1) -> DrainResult:
        """Like ``Consumer.drain``; awaited.  Cancelled, it still drains to
        its end on the thread."""
        return await self.run_sync(self._sync.drain, flow_id, limit, batch_size=batch_size)

    async def process_all(self, limit: int = 1000, *, batch_size: int = 1) -> dict[str, DrainResult]:
        """Like ``Consumer.process_all``; awaited.  Cancelled, it still runs
        to its end on the thread."""
        return await self.run_sync(self._sync.process_all, limit, batch_size=batch_size)

    # -- reads ----------------------------------------------------------------------

    async def projection(self, flow_id: str) -> dict[str, Any] | None:
        """Like ``Consumer.projection``; awaited."""
        return await self.run_sync(self._sync.projection, flow_id)

    async def applied(self, flow_id: str) -> list[AppliedEvent]:
        """Like ``Consumer.applied``; awaited."""
        return await self.run_sync(self._sync.applied, flow_id)

    async def inbox(self, flow_id: str) -> list[InboxEntry]:
        """Like ``Consumer.inbox``; awaited."""
        return await self.run_sync(self._sync.inbox, flow_id)

    async def flows(self) -> list[str]:
        """Like ``Consumer.flows``; awaited."""
        return await self.run_sync(self._sync.flows)

    async def open_flows(self) -> list[str]:
        """Like ``Consumer.open_flows``; awaited."""
        return await self.run_sync(self._sync.open_flows)

    async def stuck(self, flow_id: str) -> StuckFlow:
        """Like ``Consumer.stuck``; awaited."""
        return await self.run_sync(self._sync.stuck, flow_id)

    async def event(self, event_id: str) -> dict[str, Any] | None:
        """Like ``Consumer.event``; awaited."""
        return await self.run_sync(self._sync.event, event_id)

    async def scheduled_effect(self, key: str) -> ScheduledEffect | None:
        """Like ``Consumer.scheduled_effect``; awaited."""
        return await self.run_sync(self._sync.scheduled_effect, key)

    async def scheduled_effects(
        self, *, state: EffectState | str | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[ScheduledEffect]:
        """Like ``Consumer.scheduled_effects``; awaited."""
        return await self.run_sync(self._sync.scheduled_effects, state=state, flow_id=flow_id, limit=limit)

    async def effect_history(self, key: str) -> list[EffectTransition]:
        """Like ``Consumer.effect_history``; awaited."""
        return await self.run_sync(self._sync.effect_history, key)

    async def effect_counts(self) -> dict[str, int]:
        """Like ``Consumer.effect_counts``; awaited."""
        return await self.run_sync(self._sync.effect_counts)

    async def metrics(self) -> ConsumerMetrics:
        """Like ``Consumer.metrics``; awaited."""
        return await self.run_sync(self._sync.metrics)

    # -- lifecycle ---------------------------------------------------------------

    async def close(self) -> None:
        """Like ``Consumer.close``; awaited, then the thread ends.  Once asked
        for, the close happens even if the awaiting task is cancelled; calls
        queued before it finish first."""
        await self._thread.finish(self._sync.close)

    async def reopen(self) -> None:
        """Like ``Consumer.reopen``; awaited (a new connection, on the same thread)."""
        await self.run_sync(self._sync.reopen)

    async def __aenter__(self) -> AsyncConsumer:  # noqa: PYI034 - Self needs Python 3.11
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncConsumer({self.location!r}, {self.protocol.name}, name={self.name!r})"
