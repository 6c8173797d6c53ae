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
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from typing import Any, TypeVar

from .._producer import Batch, Producer
from .._topics import Topic
from .._wait import check_wait, deadline_of, left_until, open_watch, passed
from ..records import AdvanceResult
from ._admin import AsyncProducerAdmin
from ._face import OnThread, awaited, open_on_thread_async, same_arguments
from ._thread import StoreThread

__all__ = ["AsyncBatch", "AsyncProducer"]

_T = TypeVar("_T")


class AsyncBatch:
    """The awaited :class:`~reliable_flow._producer.Batch`: made by
    :meth:`AsyncProducer.batch`; ``await b.advance(...)`` inside its block."""

    def __init__(self, owner: AsyncProducer, batch: Batch) -> None:
        # Straight on the thread: the block holds the producer's lock (its
        # advances may come from tasks it started, which do not hold it).
        self._sync, self._run = batch, owner.thread.run

    @property
    def results(self) -> list[AdvanceResult]:
        """Every advance's result, in order (they hold once the block exited normally)."""
        return list(self._sync.results)

    @property
    def committed(self) -> int:
        """How many advances of this batch will commit (status ``committed``)."""
        return self._sync.committed

    advance = awaited(Batch.advance, "Cancelled, the advance either did not run or ran inside the batch; "
                      "the block then ends with the ``CancelledError`` and the whole batch rolls back (unless caught).")


def _rollback(entered: Any, cm: AbstractContextManager[Batch]) -> None:
    """On the thread: roll back a batch whose entering task went away."""
    if entered.exception() is None:
        cancelled = asyncio.CancelledError()
        try:
            cm.__exit__(asyncio.CancelledError, cancelled, None)
        except BaseException:  # noqa: BLE001, S110 - nothing is left to tell; the rollback is done
            pass


class AsyncProducer(OnThread[Producer]):
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

    @same_arguments(Producer.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(Producer, *args, **kwargs)

    @classmethod
    @same_arguments(Producer.__init__)
    async def open(cls, *args: Any, **kwargs: Any) -> AsyncProducer:
        """Like the constructor, without blocking the event loop."""
        return await cls._opened(Producer, args, kwargs)

    def _adopted(self) -> None:
        self._batch_task: asyncio.Task[Any] | None = None
        self._admin = AsyncProducerAdmin(self, self.run_sync, self._sync.admin)

    async def run_sync(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` on the store's thread, after any batch another task has
        open, and await it; for the aio face's own use."""
        if self._batch_task is not None and self._batch_task is asyncio.current_task():
            return await self._thread.run(fn, *args, **kwargs)  # inside this task's own batch
        async with self._lock:
            return await self._thread.run(fn, *args, **kwargs)

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a batch is open; for the aio face's own use (relay)."""
        return self._lock

    @property
    def admin(self) -> AsyncProducerAdmin:
        """The operator's actions, awaited: see :class:`AsyncProducerAdmin`."""
        return self._admin

    @property
    def max_backlog(self) -> int | None:
        """``advance`` answers ``backlog_full`` at this many pending deliveries (None: never)."""
        return self._sync.max_backlog

    @property
    def topics(self) -> tuple[Topic, ...]:
        """The declared topics (as the sync object's ``topics``)."""
        return self._sync.topics

    advance = awaited(Producer.advance, "Cancelled after the thread started it, it still commits (or not) "
                      "as a whole; a retry of the same call then answers ``existing``.")

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

    flow = awaited(Producer.flow)
    flows = awaited(Producer.flows)
    outbox = awaited(Producer.outbox)
    event = awaited(Producer.event)
    metrics = awaited(Producer.metrics)

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
