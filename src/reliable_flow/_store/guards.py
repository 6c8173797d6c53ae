"""What a store's connection object checks before it touches its connection,
so a misuse raises a clear library error rather than a driver one.  The
same for every engine: each asks its own driver whether a transaction is
open and hands the answer to :func:`refuse_nested`."""

from __future__ import annotations

import threading

from ..errors import WrongThread

__all__ = ["Opener", "check_thread", "opener", "refuse_nested"]

Opener = tuple[int, str]  # the opening thread's ident and name


def opener() -> Opener:
    """The current thread, as :func:`check_thread` remembers it."""
    return threading.get_ident(), threading.current_thread().name


def check_thread(opened: Opener, kind: str, location: str) -> None:
    """Raise :class:`WrongThread` unless this is the thread that opened the connection."""
    if threading.get_ident() != opened[0]:
        raise WrongThread(
            f"this {kind} object for {location} was opened in thread {opened[1]!r} and is used in "
            f"thread {threading.current_thread().name!r}; its connection and open transaction "
            f"belong to that thread: use one object per thread"
        )


def refuse_nested(in_transaction: bool, kind: str, location: str) -> None:
    """Refuse to open a transaction inside one this object already has open
    (a batch, a hook or handler calling back into its own object)."""
    if not in_transaction:
        return
    if kind == "producer":
        where = "a batch, or a protocol hook during advance"
        advice = "use the batch's advance inside the block; read after it"
    else:
        where = "an apply handler or a protocol hook during a call"
        advice = "make this call after that one returned"
    raise RuntimeError(
        f"this {kind} object ({location}) is inside an open transaction of its own ({where}): {advice}"
    )
