"""``wait``: the flow, once its seq passes a given one -- for both faces.

The flow is read through the producer's own read (``Producer.flow``), so
``wait`` returns the very dict ``flow`` returns.  Between two reads it
waits on the store's signal (:mod:`reliable_flow._store.watch`): a
notification on PostgreSQL, ``PRAGMA data_version`` on SQLite, each on a
connection of its own, opened for this wait and closed when it ends.  The
signal is opened *before* the first read, so a commit between the read and
the wait is heard, never missed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ._envelope import check_name
from ._store import OutboxStore
from ._store.watch import Watch

__all__ = ["check_wait", "deadline_of", "left_until", "open_watch", "passed", "wait_sync"]

Flow = dict[str, Any]


def check_wait(flow_id: object, after_seq: object, timeout: object) -> None:
    """Refuse bad arguments of ``wait``, naming the field, before anything is opened."""
    check_name("flow_id", flow_id)
    if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
        raise ValueError(f"after_seq must be an int >= 0, got {after_seq!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise ValueError(f"timeout must be None (no limit) or a finite number of seconds >= 0, got {timeout!r}")


def open_watch(store: OutboxStore, flow_id: str) -> Watch:
    """A :class:`Watch` of ``flow_id`` on ``store``'s signal, opened on the calling thread."""
    signal = store.watch()
    try:
        return Watch(signal, flow_id)
    except BaseException:
        signal.close()
        raise


def passed(flow: Flow | None, after_seq: int) -> bool:
    """True when the flow exists and its seq is past ``after_seq``."""
    return flow is not None and int(flow["seq"]) > after_seq


def deadline_of(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` at which a wait of ``timeout`` seconds ends (None: never)."""
    return None if timeout is None else time.monotonic() + timeout


def left_until(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (None: no limit; never below 0)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def wait_sync(watch: Watch, read: Callable[[], Flow | None], after_seq: int, timeout: float | None) -> Flow | None:
    """Read, and wait on ``watch`` between reads, until the flow passes
    ``after_seq`` (the flow) or ``timeout`` seconds passed (None)."""
    deadline = deadline_of(timeout)
    while True:
        flow = read()
        if passed(flow, after_seq):
            return flow
        left = left_until(deadline)
        if left == 0 or not watch.wait(left):
            return None
