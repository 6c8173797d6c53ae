"""The loop behind ``AsyncWorker.run`` and ``AsyncEffectExecutor.run``:
passes until stopped, woken (never polling) by what ends meanwhile.

The asyncio twin of :class:`reliable_flow._loop.Loop`, with the same
contract: after a pass that did no work, wait the idle time (or, with
``until_idle``, until the earliest due time, returning when nothing waits),
woken early by an ended effect call, a heartbeat or a stop.  The passes
themselves are the sync steps, run on their stores' threads.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from .._loop import sooner
from ..records import PassResult

__all__ = ["Signals", "Waker", "run_passes"]


class Waker:
    """An ``asyncio.Event`` of one loop that any thread may set: what a call
    ending on another thread, a heartbeat, or a stop uses to wake a driver."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def set(self) -> None:
        """Wake the driver (from any thread; nothing happens once the loop is closed)."""
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    async def wait(self, seconds: float) -> None:
        """Until woken or ``seconds`` pass; the wake is then taken."""
        try:
            await asyncio.wait_for(self.event.wait(), max(seconds, 0.0))
        except asyncio.TimeoutError:
            pass
        self.event.clear()


async def run_passes(one_pass: Callable[[], Awaitable[PassResult]], idle_sleep: float, until_idle: bool,
                     waker: Waker, stopping: Callable[[], bool], max_passes: int | None) -> None:
    """``one_pass`` until ``stopping()`` or ``max_passes``; after a pass that
    did no work, wait as :meth:`reliable_flow._loop.Loop.run` does
    (``idle_sleep``, less when ``wake_in`` is sooner; with ``until_idle``
    ``wake_in``, returning when it is None), woken early by ``waker``."""
    passes = 0
    while not stopping():
        done = await one_pass()
        passes += 1
        if max_passes is not None and passes >= max_passes:
            return
        if done.work:
            continue
        seconds = done.wake_in if until_idle else sooner(idle_sleep, done.wake_in)
        if seconds is None:
            return
        if not stopping():
            await waker.wait(seconds)


class Signals:
    """SIGTERM / SIGINT ask ``stop`` through the running loop, while inside
    the block (main thread, a loop that supports it); put back on exit."""

    def __init__(self, enabled: bool, stop: Callable[[], None]) -> None:
        self.enabled, self.stop = enabled, stop
        self.previous: dict[signal.Signals, Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> Signals:  # noqa: PYI034 - Self needs Python 3.11
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return self
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError, ValueError):  # not supported here
                continue
            self.previous[sig] = previous
        self.loop = loop
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is None:
            return
        for sig, previous in self.previous.items():
            self.loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
