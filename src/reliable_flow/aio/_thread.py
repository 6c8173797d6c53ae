"""The thread a store object lives on, for the asyncio face.

A store object belongs to the thread that opened it (one connection per
thread; SQLite has one writer), so each async object owns one daemon thread
and runs every call of its sync object there, one after another, in the
order they were submitted -- the way aiosqlite runs a connection.  The event
loop only awaits a future: it never waits on storage I/O.

Cancellation: a task cancelled while it awaits :meth:`StoreThread.run`
cancels the call if the thread has not started it yet (then it never runs:
nothing happened), and otherwise lets it finish on the thread (a transaction
is never left half done) and drops its result.  So a cancelled ``advance``
either did not happen or committed, and a retry answers ``existing``.

Each hop (loop -> thread -> loop, or one store thread waiting for another
in a relay) wakes a thread, which costs far more than the Python around it
on a small machine (a wake-up on another CPU, caches cold there); so the
bookkeeping per call is kept to the least: a lock as the "started or
cancelled" gate of an awaited call, a ``SimpleQueue`` for the answer of a
blocking :meth:`StoreThread.call`, and ``concurrent.futures`` only where a
caller wants a future (:meth:`StoreThread.submit`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["StoreThread"]

_T = TypeVar("_T")
_STOP = object()

# What a queued call is, so the thread knows how to start it and where its answer goes.
_RUN = 0  # awaited from a loop (run): gate a Lock, answer (loop, asyncio future)
_SUBMIT = 1  # submit: gate a concurrent.futures.Future that takes the answer too
_CALL = 2  # a blocking call from another thread: no gate (it cannot be cancelled), answer a SimpleQueue


class StoreThread:
    """One daemon thread that runs calls in submission order."""

    def __init__(self, name: str) -> None:
        #: What a call after the thread's end raises (the owner sets the
        #: ``StorageError`` its sync face raises once closed).
        self.closed_error: Callable[[], BaseException] = lambda: RuntimeError("this object is closed")
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"reliable_flow.aio:{name}"[:60], daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[_T]:
        """Queue ``fn(*args, **kwargs)``; its future (from any thread).
        Cancelling the future before the thread started the call means it
        never runs."""
        if self._stopped:
            raise self.closed_error()
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._calls.put((_SUBMIT, future, fn, args, kwargs, None))
        return future

    async def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(*args, **kwargs)`` on the thread and await its result (see
        the module for what cancelling the awaiting task does).

        The answer comes back through one ``call_soon_threadsafe`` into a
        future of the loop (half the cost of ``asyncio.wrap_future``'s two
        chained futures).  Whether the call starts or is cancelled is decided
        by one lock, taken without waiting by whichever comes first: the
        thread about to start the call, or the task being cancelled."""
        if self._stopped:
            raise self.closed_error()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_T] = loop.create_future()
        gate = threading.Lock()
        self._calls.put((_RUN, gate, fn, args, kwargs, (loop, answer)))
        try:
            return await answer
        except asyncio.CancelledError:
            # Taken here: the thread had not started it, and now never will.
            # Already taken by the thread: it runs to its end, its answer is dropped.
            gate.acquire(blocking=False)
            raise

    def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run it on the thread and wait here (outside an event loop, from
        another store thread -- a relay's producer waiting for its consumer
        -- or to open a store in a constructor)."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        if self._stopped:
            raise self.closed_error()
        reply: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        self._calls.put((_CALL, None, fn, args, kwargs, reply))
        result, error = reply.get()
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle through the traceback's frame
        return result  # type: ignore[no-any-return]

    async def finish(self, fn: Callable[..., _T], *args: Any) -> _T | None:
        """Run ``fn(*args)`` as the thread's last call (after those already
        queued), let the thread end, and await it.  Once asked for, it
        happens even if the awaiting task is cancelled (a close must not be
        lost).  None, and nothing run, when the thread was stopped already."""
        if self._stopped:
            return None
        last = self.submit(fn, *args)
        self.stop()
        return await asyncio.shield(asyncio.wrap_future(last))

    def stop(self) -> None:
        """Let the thread end once the calls already queued are done."""
        if not self._stopped:
            self._stopped = True
            self._calls.put(_STOP)

    def _serve(self) -> None:
        get = self._calls.get
        while True:
            item = get()
            if item is _STOP:
                return
            how, gate, fn, args, kwargs, back = item
            if how == _RUN:
                if not gate.acquire(blocking=False):
                    continue  # cancelled before it started: it never runs
            elif how == _SUBMIT and not gate.set_running_or_notify_cancel():
                continue  # cancelled before it started: it never runs
            try:
                result, error = fn(*args, **kwargs), None
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
                result, error = None, exc
            if how == _RUN:
                loop, answer = back
                try:
                    loop.call_soon_threadsafe(_deliver, answer, result, error)
                except RuntimeError:  # the loop is closed: nobody awaits the answer any more
                    pass
            elif how == _CALL:
                back.put((result, error))
            elif error is None:
                gate.set_result(result)
            else:
                gate.set_exception(error)
            del item, gate, fn, args, kwargs, back, result, error  # hold nothing while waiting for the next


def _deliver(answer: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if answer.done():  # the awaiting task was cancelled: the answer is dropped
        return
    if error is None:
        answer.set_result(result)
    else:
        answer.set_exception(error)
