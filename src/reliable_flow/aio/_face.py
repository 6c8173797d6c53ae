"""What the awaited objects share, written once.

An awaited method is declared from the sync method it runs
(``receive = awaited(Consumer.receive)``): the same parameters, for
``inspect`` and type checkers, and a docstring naming the sync method (whose
docstring says what the call guarantees).  :class:`OnThread` is an
:class:`AsyncProducer` / :class:`AsyncConsumer` without its own calls: the
sync object opened on a thread of its own, every call run there, the close.
See :mod:`reliable_flow.aio._thread` for what cancelling a call does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from .._consumer import Consumer
from .._producer import Producer
from ..errors import StorageError
from ..protocol import Protocol
from ._thread import StoreThread

__all__ = ["OnThread", "awaited", "open_on_thread_async", "same_arguments"]

P = ParamSpec("P")
R = TypeVar("R")
First = TypeVar("First")
S = TypeVar("S", Producer, Consumer)
F = TypeVar("F", bound="OnThread[Any]")
_O = TypeVar("_O")


def awaited(fn: Callable[Concatenate[Any, P], R], note: str = "") -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The awaited form of the sync method ``fn``, for an async class's body:
    it runs ``fn`` on the object's ``_sync`` through the object's ``_run``
    (on the store's thread) and awaits it.  Its docstring names ``fn``, then
    adds ``note`` (what a cancelled call leaves, say)."""

    async def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._run(fn, self._sync, *args, **kwargs)  # type: ignore[no-any-return]

    method.__name__, method.__qualname__ = fn.__name__, f"Async{fn.__qualname__}"  # AsyncConsumer.receive
    method.__doc__ = f"Like ``{fn.__qualname__}``; awaited.  {note}".rstrip()
    method.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return method


def same_arguments(
    like: Callable[Concatenate[Any, P], Any],
) -> Callable[[Callable[Concatenate[First, ...], R]], Callable[Concatenate[First, P], R]]:
    """For a constructor or an ``open`` that hands its arguments on to the
    sync class's constructor ``like``: they are ``like``'s arguments (after
    its own ``self`` / ``cls``, and with its own result), for ``inspect``
    and type checkers."""

    def same(fn: Callable[Concatenate[First, ...], R]) -> Callable[Concatenate[First, P], R]:
        mine, theirs = inspect.signature(fn), inspect.signature(like)
        fn.__signature__ = theirs.replace(  # type: ignore[attr-defined]
            parameters=[*list(mine.parameters.values())[:1], *list(theirs.parameters.values())[1:]],
            return_annotation=mine.return_annotation)
        return fn

    return same


def _close_if_opened(opened: concurrent.futures.Future[Any]) -> None:
    """On the thread, after an open whose awaiting task went away: close what it opened."""
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


async def open_on_thread_async(thread: StoreThread, factory: Callable[..., _O], *args: Any, **kwargs: Any) -> _O:
    """``factory(*args, **kwargs)`` on ``thread``, awaited.  If the awaiting
    task is cancelled the open still finishes on the thread; what it opened
    is then closed there and the thread stops."""
    opened = thread.submit(factory, *args, **kwargs)
    try:
        return await asyncio.wrap_future(opened)
    except BaseException:
        thread.submit(_close_if_opened, opened)
        thread.stop()
        raise


class OnThread(Generic[S]):
    """A sync ``Producer`` / ``Consumer`` (:attr:`sync`) opened by ``factory``
    on a thread of its own (:attr:`thread`); every call runs there, one at a
    time, so the event loop never waits on storage I/O.  Opening blocks once
    (bad arguments raise right there, as for the sync class).  Once closed,
    a call raises ``StorageError``, as the sync object's calls do."""

    def __init__(self, factory: Callable[..., S], *args: Any, **kwargs: Any) -> None:
        thread = StoreThread(factory.__name__.lower())
        try:
            sync = thread.call(factory, *args, **kwargs)
        except BaseException:
            thread.stop()
            raise
        self._adopt(thread, sync)

    @classmethod
    async def _opened(cls: type[F], factory: Callable[..., Any], args: Any, kwargs: Any) -> F:  # noqa: PYI019
        """The constructor, without blocking the event loop.  If the awaiting
        task is cancelled the open still finishes on the thread; what it
        opened is then closed there and the thread stops."""
        thread = StoreThread(factory.__name__.lower())
        sync = await open_on_thread_async(thread, factory, *args, **kwargs)
        self = cls.__new__(cls)
        self._adopt(thread, sync)
        return self

    def _adopt(self, thread: StoreThread, sync: S) -> None:
        kind, location = type(sync).__name__.lower(), sync.location
        thread.closed_error = lambda: StorageError(f"the {kind} {location} is closed")
        self._thread, self._lock = thread, asyncio.Lock()
        self._sync: S = sync
        weakref.finalize(self, thread.stop)  # a forgotten object does not keep its thread
        self._adopted()

    def _adopted(self) -> None:
        """What the subclass sets up once :attr:`sync` is there."""

    def _run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> Awaitable[R]:
        return self.run_sync(fn, *args, **kwargs)  # what an awaited method runs through

    async def run_sync(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run ``fn`` on the store's thread and await it; for the aio face's own use."""
        return await self._thread.run(fn, *args, **kwargs)

    @property
    def sync(self) -> S:
        """The sync object behind this one; for the aio face's own use, and
        only on :attr:`thread`."""
        return self._sync

    @property
    def thread(self) -> StoreThread:
        """The thread the store lives on; for the aio face's own use."""
        return self._thread

    @property
    def location(self) -> str:
        """Where the store lives (password masked)."""
        return self._sync.location

    @property
    def protocol(self) -> Protocol:
        """The protocol the store was opened for."""
        return self._sync.protocol

    @property
    def uid(self) -> str:
        """The identity of the store (as the sync object's ``uid``)."""
        return self._sync.uid

    async def close(self) -> None:
        """Close the store (the sync ``close``), then the thread ends.  Once
        asked for, the close happens even if the awaiting task is cancelled;
        calls queued before it finish first."""
        async with self._lock:
            await self._thread.finish(self._sync.close)

    async def reopen(self) -> None:
        """The sync ``reopen``, awaited: a new connection, on the same thread."""
        await self.run_sync(self._sync.reopen)

    async def __aenter__(self: F) -> F:  # noqa: PYI019 - Self needs Python 3.11
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"
