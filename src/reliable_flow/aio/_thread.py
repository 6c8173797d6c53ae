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


class StoreThread:
    """One daemon thread that runs calls in submission order."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"reliable_flow.aio:{name}"[:60], daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[_T]:
        """Queue ``fn(*args, **kwargs)``; its future (from any thread)."""
        if self._stopped:
            raise RuntimeError("this object is closed")
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._calls.put((future, fn, args, kwargs, None))
        return future

    async def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(*args, **kwargs)`` on the thread and await its result (see
        the module for what cancelling the awaiting task does).

        The answer comes back through one ``call_soon_threadsafe`` into a
        future of the loop (half the cost of ``asyncio.wrap_future``'s two
        chained futures); the thread-side future only says whether the call
        was cancelled before it started."""
        if self._stopped:
            raise RuntimeError("this object is closed")
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_T] = loop.create_future()
        started: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._calls.put((started, fn, args, kwargs, (loop, answer)))
        try:
            return await answer
        except asyncio.CancelledError:
            started.cancel()  # not started yet: it never runs; started: it finishes, its answer dropped
            raise

    def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run it on the thread and wait here (outside an event loop, or to
        open a store in a constructor)."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

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
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            future, fn, args, kwargs, awaited = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started: it never runs
            try:
                result, error = fn(*args, **kwargs), None
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
                result, error = None, exc
            if awaited is None:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
                continue
            loop, answer = awaited
            try:
                loop.call_soon_threadsafe(_deliver, answer, result, error)
            except RuntimeError:  # the loop is closed: nobody awaits the answer any more
                pass


def _deliver(answer: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if answer.done():  # the awaiting task was cancelled: the answer is dropped
        return
    if error is None:
        answer.set_result(result)
    else:
        answer.set_exception(error)
