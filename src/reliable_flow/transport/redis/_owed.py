"""The effects a consumer's side owes its producers, published for the
producer's side to read (issue 30, item 5): what ``reliable-flow inspect
PRODUCER redis://host#CONSUMER`` (or ``inspect PRODUCER`` alone, once the
producer was served) shows as flows waiting for a result.

A bridge publishes, with each announcement of its consumer (every 5 s),
the summary of :mod:`reliable_flow._core.owed` in the hash
``<prefix>:{NAME}:owed`` (field ``summary``: JSON, bounded, as of its
``at``; kept 7 days after its last write).  It is a
view for operators, never an authority: nothing reads it to decide.  The
worker that serves a producer (``serve_as``) records where in the
producer's store (``meta`` row ``served_as``, the URL without its password).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..._consumer import Consumer
from ..._core.identity import served_as_in
from ..._core.owed import owed_effects, owed_summary, parse_summary
from ..._effects.executor import EffectExecutor
from ..._producer import Producer
from .. import _wire as wire
from ._connect import Keys, connect, shown, talking
from ._producer import RemoteProducer

__all__ = ["OWED_TTL", "announced", "feeding", "publish_owed", "read_owed", "record_served"]

#: Seconds a summary outlives its last publication (a bridge gone for good
#: leaves no litter; a stopped one's summary stays readable as stale).
OWED_TTL = 7 * 24 * 3600

Targets = dict[str, tuple[str | None, Callable[[str], str] | None]]


def feeding(consumer: Consumer, executors: Sequence[EffectExecutor]) -> Targets:
    """Per effect name registered with ``feedback=``: the producer its
    executor here feeds (a served producer's name, a local producer's uid;
    None when no executor here feeds it: one may run elsewhere) and the
    ``Feedback``'s flow function."""
    targets: Targets = {}
    for executor in executors:
        target = executor.producer
        producer = None if target is None else (
            target.name if isinstance(target, RemoteProducer) else
            target.uid if isinstance(target, Producer) else target.location)
        for name in executor.effects:
            spec = executor.effects.get(name)
            if spec is not None and spec.feedback is not None and targets.get(name, (None,))[0] is None:
                targets[name] = (producer, spec.feedback.flow)
    registry = consumer.effect_registry
    for name in registry or ():
        spec = registry.get(name) if registry is not None else None
        if spec is not None and spec.feedback is not None:
            targets.setdefault(name, (None, spec.feedback.flow))
    return targets


def publish_owed(client: Any, keys: Keys, consumer: Consumer, executors: Sequence[EffectExecutor]) -> None:
    """Publish ``consumer``'s summary of owed steps (read in one snapshot of
    its store; a storage error propagates, a Redis error is the caller's)."""
    targets = feeding(consumer, executors)
    now = time.time()
    with consumer.store.read() as reads:
        effects, truncated = owed_effects(reads, targets, now)
    summary = owed_summary(consumer.name, consumer.uid, effects, truncated, targets, now)
    # HSET and EXPIRE: commands a bridge's ACL user has already (docs/transport.md, "Security")
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.owed, mapping={"summary": json.dumps(summary, sort_keys=True)})
    pipe.expire(keys.owed, OWED_TTL)
    pipe.execute()


def record_served(producer: Producer, url: str, name: str, prefix: str) -> None:
    """Record in ``producer``'s store where it is served (first place stays)."""
    with producer.store.write() as unit:
        served_as_in(unit, name, shown(url), prefix)


def announced(url: str, consumer: str, prefix: str = "rf") -> tuple[dict[str, str] | None, dict[str, Any] | str | None]:
    """What is published for ``consumer`` on the Redis server at ``url``:
    its bridge's announcement (``uid``, ``location``, ``bridge``, ``at``)
    or None, and its summary of owed steps (checked), None when there is
    none, or a text saying why it cannot be read."""
    keys = Keys(prefix, consumer)
    client = connect(url, timeout=10.0)
    try:
        def both() -> tuple[Any, Any]:
            pipe = client.pipeline(transaction=False)
            pipe.hgetall(keys.consumer)
            pipe.hgetall(keys.owed)  # HGETALL: a command a relay's ACL user has already
            got = pipe.execute()
            return got[0], got[1]

        raw, owed = talking(url, f"reading what consumer {consumer!r} publishes", both)
    finally:
        client.close()
    text = (owed or {}).get(b"summary", (owed or {}).get("summary"))
    try:
        announcement = wire.decode(raw) if raw else None
    except wire.BadMessage:
        announcement = None
    return announcement, read_owed(text)


def read_owed(text: bytes | str | None) -> dict[str, Any] | str | None:
    """A stored summary, checked; None for none; the reason when it is unreadable."""
    if text is None:
        return None
    try:
        return parse_summary(text)
    except ValueError as exc:
        return str(exc)
