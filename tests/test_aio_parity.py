"""The asyncio face answers like the sync face: each async class has the
public methods of its sync class, with the same parameters, and nothing
more than what belongs to the asyncio face itself.

A method is a ``def`` / ``async def`` (or a class method) of the class or a
base; properties and attributes are left out.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from reliable_flow import Consumer, ConsumerAdmin, EffectExecutor, Producer, ProducerAdmin, Worker
from reliable_flow._producer import Batch
from reliable_flow.aio import AsyncConsumer, AsyncEffectExecutor, AsyncProducer, AsyncWorker
from reliable_flow.aio._admin import AsyncConsumerAdmin, AsyncProducerAdmin
from reliable_flow.aio._producer import AsyncBatch

# What belongs to one face only, and why.
ASYNC_ONLY = {
    "open",  # opens the store without blocking the event loop (the constructor blocks once)
    "run_sync",  # runs a sync call on the store's thread: the aio face's own plumbing
}
SYNC_ONLY = {
    # The steps of a worker's pass, each on one store: the asyncio face runs
    # them on their stores' threads (AsyncWorker drives them, it does not offer them).
    (Worker, "relay_step"), (Worker, "apply_step"), (Worker, "serve_step"), (Worker, "delivery_waits"),
    (Worker, "passed"),
}
PAIRS = [(Producer, AsyncProducer), (Consumer, AsyncConsumer), (EffectExecutor, AsyncEffectExecutor),
         (Worker, AsyncWorker), (ProducerAdmin, AsyncProducerAdmin), (ConsumerAdmin, AsyncConsumerAdmin),
         (Batch, AsyncBatch)]


def methods(cls: type) -> dict[str, Any]:
    out = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        found = inspect.getattr_static(cls, name)
        if isinstance(found, (classmethod, staticmethod)):
            found = found.__func__
        if inspect.isfunction(found):
            out[name] = found
    return out


def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=[a.__name__ for _s, a in PAIRS])
def test_the_async_class_has_the_sync_class_methods(sync: type, aio: type) -> None:
    mine, theirs = methods(aio), methods(sync)
    assert sorted(set(theirs) - set(mine) - {name for cls, name in SYNC_ONLY if cls is sync}) == []
    assert sorted(set(mine) - set(theirs) - ASYNC_ONLY) == []


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=[a.__name__ for _s, a in PAIRS])
def test_each_method_takes_the_same_parameters(sync: type, aio: type) -> None:
    mine, theirs = methods(aio), methods(sync)
    differ = {name: (parameters(theirs[name]), parameters(mine[name]))
              for name in sorted(set(mine) & set(theirs)) if parameters(mine[name]) != parameters(theirs[name])}
    assert differ == {}


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=[a.__name__ for _s, a in PAIRS])
def test_what_does_io_is_awaited(sync: type, aio: type) -> None:
    """A method of the async class is ``async def`` unless it only sets a
    flag or builds an object (``stop``, ``batch``, ``applying``)."""
    plain = {"stop", "batch", "applying", "open"}
    mine = methods(aio)
    assert sorted(n for n, fn in mine.items()
                  if n not in plain | ASYNC_ONLY and not inspect.iscoroutinefunction(fn)) == []
