"""Where an executor's calls run while its own thread keeps the store, and
how a call's ending is classified.

A store object belongs to the thread that opened it (SQLite has one writer,
and a connection is not shared across threads), so every claim, renewal and
outcome is written by the executor's thread; only the effect functions run
elsewhere: plain functions on a thread pool, ``async def`` functions on an
event loop the executor owns, in a thread of its own (or on the loop it
was given: ``EffectExecutor(loop=...)``, which it never starts or stops).
Each finished call,
and each ``heartbeat()``, is put on one queue that the executor's thread
waits on, so it wakes the moment there is something to write.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._core.effects import Outcome, Plan
from ..delivery import error_text
from ..records import ScheduledEffect
from .registry import EffectCall, EffectSpec, Lease, OutcomeUnknown, PermanentFailure, RetryLater

__all__ = ["HEARTBEAT_WAIT", "Flight", "Flights", "acall", "areconciled", "call", "classified", "reconciled"]

#: How long ``heartbeat()`` waits for the executor's thread to write the
#: renewal (seconds); it returns then anyway (the automatic renewal goes on).
HEARTBEAT_WAIT = 5.0


@dataclass
class Flight:
    """One call in flight: the effect as claimed, what was chosen for it, the
    call it was given and the future of its answer (clock values are the
    executor's policy clock)."""

    effect: ScheduledEffect
    chosen: Plan
    spec: EffectSpec
    call: EffectCall
    future: concurrent.futures.Future[Any]
    started: float
    renewed: float
    timed_out: bool = False
    beat: bool = False  # a heartbeat asked for a renewal
    beaten: threading.Event = field(default_factory=threading.Event)  # ... and it was written

    @property
    def lease(self) -> Lease:
        assert self.call.lease is not None
        return self.call.lease


class Flights:
    """The calls in flight of one executor, and the threads they run on."""

    def __init__(self, concurrency: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.concurrency = concurrency
        self.by_key: dict[str, Flight] = {}
        self._events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._given = loop  # the caller's loop: used, never created, started or stopped here
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.ended = threading.Event()  # set whenever a call ends; cleared by whoever records them
        # Called (from any thread) when a call ends or a heartbeat asks for a
        # renewal: how an asyncio driver is woken instead of looking.
        self.wakers: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self.by_key)

    @property
    def free(self) -> int:
        return self.concurrency - len(self.by_key)

    def lease_for(self, key: str) -> Lease:
        """A lease handle whose ``renew`` (a heartbeat, from any thread) wakes
        the executor and waits until it wrote the renewal."""
        return Lease(lambda: self._heartbeat(key))

    def _heartbeat(self, key: str) -> None:
        flight = self.by_key.get(key)
        if flight is None:  # the call has ended already
            return
        flight.beaten.clear()
        flight.beat = True  # a plain write; the executor's thread reads it
        self._wake(key)
        if self._given is not None and _running_loop() is self._given:
            # On the caller's loop, whose own tasks drive the executor: waiting
            # here would hold them up; the next pump writes the renewal.
            return
        flight.beaten.wait(HEARTBEAT_WAIT)

    def start(self, flight_of: Callable[[concurrent.futures.Future[Any]], Flight],
              fn: Callable[[EffectCall], Any], call: EffectCall, is_async: bool) -> Flight:
        """Start ``fn(call)`` off this thread, the flight known before the call
        begins (so its first heartbeat finds it)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        flight = flight_of(future)
        self.by_key[call.key] = flight
        future.add_done_callback(lambda _: self._ended(call.key))
        if is_async:
            loop = self._event_loop()
            loop.call_soon_threadsafe(self._schedule, loop, future, fn, call)
        else:
            # A daemon thread per call rather than a ThreadPoolExecutor, whose
            # threads the interpreter joins at exit: a call that never returns
            # (it timed out) must not keep a stopping process alive.
            threading.Thread(target=_run, args=(future, fn, call), name=f"reliable_flow-effect-{call.key}"[:60],
                             daemon=True).start()
        return flight

    def _schedule(self, loop: asyncio.AbstractEventLoop, future: concurrent.futures.Future[Any],
                  fn: Callable[[EffectCall], Any], call: EffectCall) -> None:
        task = loop.create_task(_awaited(future, fn, call))
        self._tasks.add(task)  # a task only weakly referenced by the loop could be collected
        task.add_done_callback(self._tasks.discard)

    def _ended(self, key: str) -> None:
        self.ended.set()
        self._wake(key)

    def _wake(self, key: str) -> None:
        self._events.put(key)
        for waker in list(self.wakers):
            waker()

    def wait(self, seconds: float) -> None:
        """Until a call ends or a heartbeat comes (or ``seconds`` pass)."""
        try:
            self._events.get(timeout=max(seconds, 0.0))
        except queue.Empty:
            return
        while True:  # take what else is there, so one wake handles it all
            try:
                self._events.get_nowait()
            except queue.Empty:
                return

    def finished(self) -> list[Flight]:
        """The flights whose call has ended, in the order they were started."""
        self.ended.clear()  # before the look: a call that ends after it sets it again
        return [f for f in self.by_key.values() if f.future.done()]

    def forget(self, key: str) -> None:
        self.by_key.pop(key, None)

    def close(self) -> None:
        """Stop the event loop once its calls are done (a call still running
        keeps its thread until it returns; every thread is a daemon).  A
        loop given by the caller is left running."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._given is not None:
            return self._given
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name="reliable_flow-effects-loop",
                                          daemon=True)
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop


def classified(exc: Exception) -> tuple[Outcome, Any]:
    """How a call that raised ended.  Anything not known to have left
    nothing behind counts as "may have happened"."""
    if isinstance(exc, RetryLater):
        return Outcome.RETRY, exc
    if isinstance(exc, PermanentFailure):
        return Outcome.PERMANENT, exc
    if isinstance(exc, (OutcomeUnknown, TimeoutError)):
        return Outcome.UNKNOWN, exc
    return Outcome.UNKNOWN, RuntimeError(f"unclassified failure, treated as unknown: {error_text(exc)}")


def call(spec: EffectSpec, call: EffectCall) -> tuple[Outcome, Any]:
    """Call the function and classify how it ended."""
    try:
        return Outcome.SUCCEEDED, spec.run(call)
    except Exception as exc:  # noqa: BLE001 - classified; BaseException ends the executor
        return classified(exc)


async def acall(spec: EffectSpec, call: EffectCall) -> tuple[Outcome, Any]:
    try:
        return Outcome.SUCCEEDED, await spec.run(call)
    except Exception as exc:  # noqa: BLE001 - classified, as for a plain function
        return classified(exc)


def reconciled(spec: EffectSpec, call: EffectCall) -> object:
    """The reconcile's answer, or the exception it raised ("could not tell")."""
    assert spec.reconcile is not None
    try:
        return spec.reconcile(call)
    except Exception as exc:  # noqa: BLE001 - "could not tell", recorded
        return exc


async def areconciled(spec: EffectSpec, call: EffectCall) -> object:
    assert spec.reconcile is not None
    try:
        return await spec.reconcile(call)  # type: ignore[misc]
    except Exception as exc:  # noqa: BLE001 - "could not tell", recorded
        return exc


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _run(future: concurrent.futures.Future[Any], fn: Callable[[EffectCall], Any], call: EffectCall) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(call)
    except BaseException as exc:  # noqa: BLE001 - handed to the executor's thread, which decides
        future.set_exception(exc)
    else:
        future.set_result(result)


async def _awaited(future: concurrent.futures.Future[Any], fn: Callable[[EffectCall], Any],
                   call: EffectCall) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = await fn(call)
    except BaseException as exc:  # noqa: BLE001 - handed to the executor's thread, which decides
        future.set_exception(exc)
    else:
        future.set_result(result)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
