"""Hearing that a flow may have moved, from any process: what ``wait`` waits on.

An engine gives a :class:`Signal` (``OutboxStore.watch()``): a connection
of its own that learns of commits made by anyone -- on PostgreSQL a
``LISTEN`` on the channel every advance notifies on commit, on SQLite the
file's ``PRAGMA data_version``, checked every :data:`POLL` seconds.
:class:`Watch` waits on it until it hears of the flow, the time is up or
another thread wakes it (an awaiting task was cancelled): it sleeps in a
selector, so a wake-up or a notification ends the sleep at once.

A signal only says "read the flow again": the flow itself is always read
through the store, so what ``wait`` returns is what ``flow`` returns.
"""

from __future__ import annotations

import contextlib
import hashlib
import selectors
import socket
import time
from typing import Protocol

__all__ = ["POLL", "Signal", "Watch", "channel"]

#: How often :class:`Watch` asks a signal without a descriptor (SQLite's
#: ``PRAGMA data_version``: a look at the WAL index in shared memory, about
#: 4 µs) for news.  The latency of ``wait`` on SQLite is at most this, plus
#: a read of the flow.
POLL = 0.05


def channel(name: str) -> str:
    """The notification channel of the producer store ``name`` (a PostgreSQL
    schema): an identifier of 35 bytes, whatever the name's length."""
    return "rf_" + hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class Signal(Protocol):
    """What an engine gives ``wait``: a connection of its own, opened by
    ``OutboxStore.watch()`` on the thread that will use it."""

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when news arrive, or None: then
        :meth:`news` is asked every :data:`POLL` seconds."""

    def news(self, flow_id: str) -> bool:
        """True if a commit since the last call may have moved ``flow_id``
        (it never waits; a false alarm only costs a read)."""

    def close(self) -> None:
        """Release the connection (stop listening)."""


class Watch:
    """Waits on a :class:`Signal` for one flow; :meth:`wake` (from any
    thread) ends a wait at once and every later one."""

    def __init__(self, signal: Signal, flow_id: str) -> None:
        self._signal = signal
        self._flow_id = flow_id
        self._woken = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        fd = signal.fileno()
        if fd is not None:
            self._selector.register(fd, selectors.EVENT_READ)
        self._poll = None if fd is not None else POLL

    def wait(self, timeout: float | None) -> bool:
        """Until the flow may have moved (True), ``timeout`` seconds passed
        (None: no limit) or :meth:`wake` was called (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._woken:
            if self._signal.news(self._flow_id):
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if self._poll is not None:
                left = self._poll if left is None else min(left, self._poll)
            self._selector.select(left)
        return False

    def wake(self) -> None:
        """End the wait in progress, and every later one (thread-safe)."""
        self._woken = True
        with contextlib.suppress(OSError):  # closed already: nobody waits
            self._wake_w.send(b"\0")

    def close(self) -> None:
        """Close the signal's connection and the wake-up sockets."""
        try:
            self._signal.close()
        finally:
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
