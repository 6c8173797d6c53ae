"""``AsyncProducer``: :class:`~reliable_flow.Producer`, awaited.

Nothing is decided here: every method runs the sync ``Producer``'s method
on the producer's own :class:`~reliable_flow.aio._thread.StoreThread` (the
thread that opened its store), so the arguments, statuses, results, errors
and guarantees are the sync face's.  The event loop only awaits.

Cancellation (see :mod:`reliable_flow.aio._thread`): a task cancelled while
it awaits a call either cancelled it before the thread started it (nothing
happened) or the call finishes on the thread and its result is dropped.  An
``advance`` cancelled after it started commits; retrying it answers
``existing``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from typing import Any, TypeVar

from .._producer import Batch, Producer
from .._store.open import Location
from .._store.sqlite.connection import DEFAULT_BUSY_TIMEOUT
from .._wait import check_wait, deadline_of, left_until, open_watch, passed
from ..errors import StorageError
from ..metrics import ProducerMetrics
from ..protocol import Protocol
from ..records import AdvanceResult, OutboxEntry
from ._admin import AsyncProducerAdmin
from ._thread import StoreThread

__all__ = ["AsyncBatch", "AsyncProducer", "open_on_thread", "open_on_thread_async"]

_T = TypeVar("_T")
_O = TypeVar("_O")


def _close_if_opened(opened: Any) -> None:
    """On the thread, after an open whose awaiting task went away: close what it opened."""
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


def open_on_thread(thread: StoreThread, factory: Callable[..., _O], *args: Any, **kwargs: Any) -> _O:
    """Open the sync object on ``thread`` and wait (blocking); stop the
    thread if it raises."""
    try:
        return thread.call(factory, *args, **kwargs)
    except BaseException:
        thread.stop()
        raise


async def open_on_thread_async(thread: StoreThread, factory: Callable[..., _O], *args: Any, **kwargs: Any) -> _O:
    """:func:`open_on_thread`, awaited.  If the awaiting task is cancelled
    the open still finishes on the thread; what it opened is then closed
    there and the thread stops."""
    opened = thread.submit(factory, *args, **kwargs)
    try:
        return await asyncio.wrap_future(opened)
    except BaseException:
        thread.submit(_close_if_opened, opened)
        thread.stop()
        raise


class AsyncBatch:
    """The awaited :class:`~reliable_flow._producer.Batch`: made by
    :meth:`AsyncProducer.batch`; ``await b.advance(...)`` inside its block."""

    def __init__(self, owner: AsyncProducer, batch: Batch) -> None:
        self._owner = owner
        self._batch = batch

    @property
    def results(self) -> list[AdvanceResult]:
        """Every advance's result, in order (they hold once the block exited normally)."""
        return list(self._batch.results)

    @property
    def committed(self) -> int:
        """How many advances of this batch will commit (status ``committed``)."""
        return self._batch.committed

    async def advance(
        self, event_id: str, flow_id: str, *, expected_seq: int, kind: str, payload: dict[str, Any],
        schema: int = 1, meta: dict[str, str] | None = None,
    ) -> AdvanceResult:
        """Like ``Batch.advance``; awaited.  Cancelled, the advance either did
        not run or ran inside the batch; the block then ends with the
        ``CancelledError`` and the whole batch rolls back (unless caught)."""
        return await self._owner.thread.run(
            self._batch.advance, event_id, flow_id, expected_seq=expected_seq, kind=kind, payload=payload,
            schema=schema, meta=meta,
        )


def _rollback(entered: Any, cm: AbstractContextManager[Batch]) -> None:
    """On the thread: roll back a batch whose entering task went away."""
    if entered.exception() is None:
        cancelled = asyncio.CancelledError()
        try:
            cm.__exit__(asyncio.CancelledError, cancelled, None)
        except BaseException:  # noqa: BLE001, S110 - nothing is left to tell; the rollback is done
            pass


class AsyncProducer:
    """:class:`~reliable_flow.Producer`, awaited: the same arguments, statuses,
    results, errors and guarantees (it calls the same core and store).

    The store lives on a thread of its own (one connection, one thread);
    every method runs there, one at a time, so the event loop never waits
    on storage I/O.  Opening blocks once (the constructor opens the store
    and raises for bad arguments right there, as ``Producer`` does);
    ``await AsyncProducer.open(...)`` opens without blocking the loop.
    ``async with AsyncProducer(...) as p:`` closes it on exit.

    While a :meth:`batch` is open, every other call of this object (from
    any other task: advances, reads, admin actions, relays) waits until the
    batch's block ends, so nothing runs inside the open transaction but the
    batch's own advances.  See :mod:`reliable_flow.aio._producer` for what
    cancelling a call does.
    """

    def __init__(
        self,
        location: Location,
        protocol: Protocol,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_backlog: int | None = None,
    ) -> None:
        thread = StoreThread("producer")
        self._adopt(thread, open_on_thread(
            thread, Producer, location, protocol, busy_timeout=busy_timeout, max_backlog=max_backlog))

    @classmethod
    async def open(
        cls,
        location: Location,
        protocol: Protocol,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_backlog: int | None = None,
    ) -> AsyncProducer:
        """Like the constructor, without blocking the event loop."""
        thread = StoreThread("producer")
        sync = await open_on_thread_async(
            thread, Producer, location, protocol, busy_timeout=busy_timeout, max_backlog=max_backlog)
        self = cls.__new__(cls)
        self._adopt(thread, sync)
        return self

    def _adopt(self, thread: StoreThread, sync: Producer) -> None:
        location = sync.location
        thread.closed_error = lambda: StorageError(f"the producer {location} is closed")
        self._thread = thread
        self._sync = sync
        self._lock = asyncio.Lock()
        self._batch_task: asyncio.Task[Any] | None = None
        self._admin = AsyncProducerAdmin(self, self.run_sync, sync.admin)
        weakref.finalize(self, thread.stop)  # a forgotten object does not keep its thread

    async def run_sync(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` on the store's thread, after any batch another task has
        open, and await it; for the aio face's own use."""
        if self._batch_task is not None and self._batch_task is asyncio.current_task():
            return await self._thread.run(fn, *args, **kwargs)  # inside this task's own batch
        async with self._lock:
            return await self._thread.run(fn, *args, **kwargs)

    # -- for the aio face's own use -------------------------------------------------

    @property
    def sync(self) -> Producer:
        """The sync ``Producer`` behind this object; for the aio face's own use,
        and only on :attr:`thread`."""
        return self._sync

    @property
    def thread(self) -> StoreThread:
        """The thread the store lives on; for the aio face's own use."""
        return self._thread

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a batch is open; for the aio face's own use (relay)."""
        return self._lock

    # -- the producer ------------------------------------------------------------------

    @property
    def admin(self) -> AsyncProducerAdmin:
        """The operator's actions, awaited: see :class:`AsyncProducerAdmin`."""
        return self._admin

    @property
    def location(self) -> str:
        """Where the store lives (password masked)."""
        return self._sync.location

    @property
    def protocol(self) -> Protocol:
        """The protocol this producer was opened for."""
        return self._sync.protocol

    @property
    def max_backlog(self) -> int | None:
        """``advance`` answers ``backlog_full`` at this many pending deliveries (None: never)."""
        return self._sync.max_backlog

    async def advance(
        self, event_id: str, flow_id: str, *, expected_seq: int, kind: str, payload: dict[str, Any],
        schema: int = 1, meta: dict[str, str] | None = None,
    ) -> AdvanceResult:
        """Like ``Producer.advance``; awaited.  Cancelled after the thread
        started it, it still commits (or not) as a whole; a retry of the
        same call then answers ``existing``."""
        return await self.run_sync(
            self._sync.advance, event_id, flow_id, expected_seq=expected_seq, kind=kind, payload=payload,
            schema=schema, meta=meta,
        )

    def batch(self) -> AbstractAsyncContextManager[AsyncBatch]:
        """``async with producer.batch() as b: await b.advance(...)``: like
        ``Producer.batch`` (all or none commit when the block ends).

        The sync batch is entered and exited on the thread; until the block
        ends, every other call of this producer waits (see the class).  A
        block that raises (a cancellation included) rolls the batch back;
        a task cancelled while the block's exit commits sees
        ``CancelledError`` but the commit finishes.  One batch at a time per
        task: nesting raises ``RuntimeError``."""
        return self._batch()

    @asynccontextmanager
    async def _batch(self) -> AsyncIterator[AsyncBatch]:
        task = asyncio.current_task()
        if self._batch_task is not None and self._batch_task is task:
            raise RuntimeError("a batch of this producer is already open in this task")
        async with self._lock:
            cm = self._sync.batch()
            entered = self._thread.submit(cm.__enter__)
            try:
                batch = await asyncio.shield(asyncio.wrap_future(entered))
            except asyncio.CancelledError:
                self._thread.submit(_rollback, entered, cm)
                raise
            self._batch_task = task
            try:
                try:
                    yield AsyncBatch(self, batch)
                except BaseException as exc:
                    await asyncio.shield(asyncio.wrap_future(
                        self._thread.submit(cm.__exit__, type(exc), exc, exc.__traceback__)))
                    raise
                await asyncio.shield(asyncio.wrap_future(self._thread.submit(cm.__exit__, None, None, None)))
            finally:
                self._batch_task = None

    async def flow(self, flow_id: str) -> dict[str, Any] | None:
        """Like ``Producer.flow``; awaited."""
        return await self.run_sync(self._sync.flow, flow_id)

    async def flows(self) -> list[str]:
        """Like ``Producer.flows``; awaited."""
        return await self.run_sync(self._sync.flows)

    async def outbox(self, flow_id: str | None = None, *, consumer: str | None = None) -> list[OutboxEntry]:
        """Like ``Producer.outbox``; awaited."""
        return await self.run_sync(self._sync.outbox, flow_id, consumer=consumer)

    async def event(self, event_id: str) -> dict[str, Any] | None:
        """Like ``Producer.event``; awaited."""
        return await self.run_sync(self._sync.event, event_id)

    async def metrics(self, now: float | None = None) -> ProducerMetrics:
        """Like ``Producer.metrics``; awaited."""
        return await self.run_sync(self._sync.metrics, now)

    async def wait(self, flow_id: str, *, after_seq: int, timeout: float | None) -> dict[str, Any] | None:
        """Like ``Producer.wait`` (the flow once its seq is past ``after_seq``,
        or None at the timeout); awaited, and it never holds the store's
        thread: the flow is read there (one short call each time), and the
        wait in between runs on a thread of its own with a connection of
        its own, so the producer's other calls go on meanwhile.  Cancelled,
        the wait ends at once: its connection is closed before the
        ``CancelledError`` reaches the caller, and its thread ends right after."""
        check_wait(flow_id, after_seq, timeout)
        deadline = deadline_of(timeout)
        waiter = StoreThread("wait")
        watch = await open_on_thread_async(waiter, open_watch, self._sync.store, flow_id)
        try:
            while True:
                flow = await self.flow(flow_id)
                if passed(flow, after_seq):
                    return flow
                left = left_until(deadline)
                if left == 0 or not await waiter.run(watch.wait, left):
                    return None
        finally:
            watch.wake()  # a wait still running on the thread (its task was cancelled) ends now
            await waiter.finish(watch.close)

    # -- lifecycle ---------------------------------------------------------------

    async def close(self) -> None:
        """Like ``Producer.close``; awaited, then the thread ends.  Once asked
        for, the close happens even if the awaiting task is cancelled."""
        async with self._lock:
            await self._thread.finish(self._sync.close)

    async def reopen(self) -> None:
        """Like ``Producer.reopen``; awaited (a new connection, on the same thread)."""
        await self.run_sync(self._sync.reopen)

    async def __aenter__(self) -> AsyncProducer:  # noqa: PYI034 - Self needs Python 3.11
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncProducer({self.location!r}, {self.protocol.name})"
