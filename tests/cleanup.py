"""Nothing left behind: the one clean-up the test helpers share (private
PostgreSQL servers in ``tests/pg_cluster.py``, private Redis servers in
``tests/redis_server.py``, test hosts in ``tests/netns.py``).

A helper registers how to stop each thing it starts, and forgets it once it
is stopped::

    cleanup.register(server, server.destroy)     # when it is made
    cleanup.forget(server)                       # in destroy()

What is registered is stopped, newest first, by :func:`stop_all` (pytest's
session-finish hook calls it), at exit (``atexit``), and on a signal that
arrives while the run is stuck:

- the first SIGTERM / SIGHUP raises ``KeyboardInterrupt`` in the main thread
  (after the handler that was there before, which is still called), so pytest
  unwinds as on Ctrl-C: fixtures are torn down, the session-finish hook stops
  the rest, and the run exits with pytest's "interrupted" code;
- a second one (the first was swallowed, or the clean-up hangs) stops
  everything there and then, and the process ends by that signal.

SIGINT keeps Python's own handler (``KeyboardInterrupt`` already, and
``asyncio.run`` only cancels its task gently under that one); a second Ctrl-C
that cuts the unwinding short still leaves the ``atexit`` backstop.

The handlers are installed once per process, on the first registration, and
only over a signal's default or a Python handler (an ignored signal stays
ignored).  A ``fork()``ed child inherits them but not what its parent
registered: signalled, it ends as it would have without them, and at its exit
it stops only what it registered itself.  Every call here may run any number
of times.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "forget", "register", "stop_all"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

#: What to stop, by the thing it stops: (the registering process, how).
_stops: dict[object, tuple[int, Callable[[], None]]] = {}
#: "pid": the process the handlers act for; "signalled": its first signal came.
_state: dict[str, int] = {}
#: The handlers ours replaced: called first, as if ours were not there.
_previous: dict[int, Callable[..., Any] | None] = {}


def register(thing: object, stop: Callable[[], None]) -> None:
    """Have ``stop()`` run for ``thing`` at :func:`stop_all`, at exit and on an
    interrupting signal, unless :func:`forget` comes first.  Registering a
    thing again replaces how it is stopped."""
    _install()
    _stops[thing] = (os.getpid(), stop)


def forget(thing: object) -> None:
    """``thing`` is stopped (or someone else's): nothing more to do for it."""
    _stops.pop(thing, None)


def stop_all() -> None:
    """Stop everything this process registered and has not forgotten, newest
    first, each once; a stop that fails does not keep the others from running."""
    pid = os.getpid()
    for thing, (owner, stop) in reversed(list(_stops.items())):
        if owner == pid and _stops.pop(thing, None) is not None:
            with contextlib.suppress(Exception):
                stop()


def _end_by(signum: int, handler: Callable[..., Any] | int | None) -> None:
    signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    os.kill(os.getpid(), signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum)
    if os.getpid() != _state.get("pid"):
        _end_by(signum, previous)  # a fork()ed child: as if we were not there
        return
    if "signalled" not in _state:
        _state["signalled"] = signum
        if previous is not None:
            previous(signum, frame)
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
    stop_all()  # signalled again: the unwinding did not get there
    _end_by(signum, None)


def _install() -> None:
    pid = os.getpid()
    if _state.get("pid") == pid:
        return
    if not _state:  # atexit's list survives a fork(): once is enough (stop_all looks at the pid)
        atexit.register(stop_all)
    _state.clear()
    _state["pid"] = pid
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a signal handler
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue  # inherited through a fork(): _previous came along too
        if current == signal.SIG_DFL or callable(current):
            _previous[signum] = current if callable(current) else None
            signal.signal(signum, _on_signal)
