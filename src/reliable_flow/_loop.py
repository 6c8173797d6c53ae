"""The loop behind ``Worker.run`` and ``EffectExecutor.run``: passes until
stopped, idle sleeps, ``until_idle``, and SIGTERM / SIGINT handling.

One mechanism for every long-running loop, so they stop the same way: the
signal handler only sets a flag; the pass in progress (and so the call or
transaction in progress, and its record) finishes normally, then ``run``
returns.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from .errors import (
    ConsumerMismatch,
    TransportDenied,
    UnknownConsumer,
    WrongFile,
    WrongProcess,
    WrongThread,
)
from .records import PassResult

__all__ = ["CANNOT_HEAL", "UNTIL_IDLE_MAX_SLEEP", "UNTIL_IDLE_PAUSE", "Loop", "sooner", "until_due"]

# Errors that retrying cannot heal (a consumer name bound to another file, a
# file of the wrong kind or too new, an object used after fork or in another
# thread, a broker that refuses our credentials or commands): a loop records
# them, then raises them instead of retrying forever.
CANNOT_HEAL = (ConsumerMismatch, TransportDenied, UnknownConsumer, WrongFile, WrongProcess, WrongThread)

# run(until_idle=True) looks again at least this often while something waits,
# and pauses this long when something is due already but the pass did nothing.
UNTIL_IDLE_MAX_SLEEP = 5.0
UNTIL_IDLE_PAUSE = 0.05


def until_due(waits: list[float]) -> float | None:
    """How long ``until_idle`` sleeps, given the seconds until each waiting
    thing is due (<= 0: due already): None when nothing waits."""
    if not waits:
        return None
    # Due already, yet the pass did nothing (a consumer failed and the relay
    # moved on to the next one): a short pause, never a spin.
    wait = min(waits)
    return min(wait if wait > 0 else UNTIL_IDLE_PAUSE, UNTIL_IDLE_MAX_SLEEP)


def sooner(idle_sleep: float, wake_in: float | None) -> float:
    """How long a loop without ``until_idle`` sleeps after a pass with no
    work: ``idle_sleep``, or less when the pass knows of work due sooner
    (a call in flight to tend, a delivery or effect due)."""
    return idle_sleep if wake_in is None else min(idle_sleep, wake_in)


class Loop:
    """Stop flag, signal handlers and idle sleeps of one loop object."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._signalled = False

    def stop(self) -> None:
        """Ask the loop to return after the pass in progress."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._signalled or self._stop.is_set()

    def run(
        self, one_pass: Callable[[], PassResult], *, idle_sleep: float, max_passes: int | None,
        handle_signals: bool, until_idle: bool, woken: Sequence[threading.Event] = (),
        idle: Callable[[float, Sequence[threading.Event]], None] | None = None,
    ) -> None:
        """Call ``one_pass`` until :meth:`stop`, SIGTERM / SIGINT (handled
        only when ``handle_signals`` and in the main thread; the previous
        handlers are put back on return), or ``max_passes``.  After a pass
        that did no work: sleep ``idle_sleep``, or with ``until_idle`` sleep
        the pass's ``wake_in``, returning when it is None; a sleep ends early
        once one of ``woken`` is set (an effect call ended).  ``idle``: how to
        sleep instead of :meth:`idle` (a worker serving its producer waits on
        the transport, so a request wakes it)."""
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            passes = 0
            while not self.stopping:
                done = one_pass()
                passes += 1
                if max_passes is not None and passes >= max_passes:
                    break
                if done.work == 0:
                    wait = done.wake_in if until_idle else sooner(idle_sleep, done.wake_in)
                    if wait is None:
                        break
                    (idle or self.idle)(wait, woken)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def idle(self, seconds: float, woken: Sequence[threading.Event] = ()) -> None:
        """Sleep ``seconds``, returning early on a stop, a signal, or once one of ``woken`` is set."""
        # Short slices rather than one Event.wait(): the signal handler must
        # not touch the Event's lock (it may be held by this very thread).
        # With one event to wake on, the slices wait on it (an ended call
        # wakes the loop at once); with several, each slice looks at them.
        deadline = time.monotonic() + seconds
        sleeper = woken[0] if len(woken) == 1 else self._stop
        while not self.stopping and not any(event.is_set() for event in woken):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sleeper.wait(min(left, 0.05))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a plain attribute write: safe whatever the main thread holds.
        self._signalled = True
