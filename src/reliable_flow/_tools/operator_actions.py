"""The operator actions, once, for every face that offers them: the command
line (:mod:`.operator_cli`) and the console (:mod:`reliable_flow.console`).

Each function takes an opened ``Producer`` / ``Consumer`` (see
:func:`opened_owner`), calls the public admin method (``producer.admin.*``,
``consumer.admin.*``), which checks, decides and records, and answers
``(record, sentence)``: the recorded :class:`~reliable_flow.records.OperatorAction`
and one sentence of what happened.  A refusal by the rules raises
:class:`~reliable_flow.errors.NotResolvable`, nothing changed.

A consumer on another host (a location on Redis, ``redis://host:port/db#NAME``)
is opened as its remote read view; an action on it is sent to the bridge
serving it, which runs the same call there (when started allowing actions)
and records it in that consumer's store; the record and sentence, or the
refusal, come back.  Its result is checked there, against the bridge's own
effect registry and producer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..records import OperatorAction, PruneResult
from .stores import Location

__all__ = ["DRY_RUN_CAP", "delivery_action", "effect_action", "inbox_action", "opened_owner", "prune_action",
           "registry_action", "store_kind", "would_prune"]

#: A dry run counts what a prune would remove up to this many rows of each kind.
DRY_RUN_CAP = 100_000

Done = tuple[OperatorAction, str]


@contextmanager
def opened_owner(kind: str, location: Location, protocol: Any = None, effects: Any = None) -> Iterator[Any]:
    """The store at ``location`` as a ``Producer`` (``kind`` "producer") or a
    ``Consumer`` (with ``effects``, an ``EffectRegistry`` or None), only if it
    exists already: it is first opened read only (a missing file or schema is
    refused, nothing created).  ``protocol``: the one to open it with; None:
    the one the store records (:func:`~.loading.protocol_for`).  Closed on exit."""
    from .._consumer import Consumer
    from .._producer import Producer
    from .loading import protocol_for
    from .stores import is_remote, open_consumer, open_producer

    if kind == "consumer" and is_remote(location):  # on another host: acted on through its bridge
        remote = open_consumer(location)
        try:
            yield remote
        finally:
            remote.close()
        return
    (open_producer if kind == "producer" else open_consumer)(location).close()
    if protocol is None:
        protocol = protocol_for(None, (kind, location))
    owner = Producer(location, protocol) if kind == "producer" else Consumer(location, protocol, effects=effects)
    with owner:
        yield owner


def effect_action(consumer: Any, action: str, key: str, *, actor: str, reason: str, result: Any = None,
                  failure: bool = False, producer: Any = None) -> Done:
    """``retry`` / ``resolve`` / ``amend`` / ``cancel`` the effect ``key``.
    ``resolve`` first checks the result (``check_feedback``, against
    ``producer`` when given), as ``amend`` does itself."""
    from .._effects.feedstep import check_feedback

    who = {"actor": actor, "reason": reason}
    remote = getattr(consumer, "act_remotely", None)
    if remote is not None and action in ("retry", "resolve", "amend", "cancel"):
        extra: dict[str, Any] = {"result": result} if action in ("resolve", "amend") else {}
        if action == "amend":
            extra["failure"] = failure
        done: Done = remote(f"{action}_effect", key=key, **extra, **who)
        return done
    if action == "retry":
        return consumer.admin.retry_effect(key, **who), f"effect {key!r} is pending again, due now"
    if action == "resolve":
        effect = consumer.scheduled_effect(key)
        if effect is not None:  # an unknown key: resolve_effect says so
            check_feedback(effect, consumer.effect_registry, producer, result=result)
        record = consumer.admin.resolve_effect(key, result=result, **who)
        return record, f"effect {key!r} is succeeded, result {json.dumps(result)}"
    if action == "amend":
        record = consumer.admin.amend_effect(key, result=result, failure=failure, producer=producer, **who)
        if failure:
            return record, f"effect {key!r} is cancelled: its failure step is fed on the next executor pass"
        return record, f"effect {key!r} is succeeded, result {json.dumps(result)}: fed on the next executor pass"
    if action == "cancel":
        return consumer.admin.cancel_effect(key, **who), f"effect {key!r} is cancelled: it will never run"
    raise ValueError(f"action must be retry, resolve, amend or cancel, got {action!r}")


def schedule_action(consumer: Any, action: str, name: str, *, actor: str, reason: str) -> Done:
    """``pause`` / ``resume`` / ``remove`` the recurring schedule ``name``."""
    if getattr(consumer, "act_remotely", None) is not None:
        raise ValueError("schedule actions act on the consumer's own store (a SQLite file or a postgresql:// "
                         "location), not through a bridge")
    who = {"actor": actor, "reason": reason}
    if action == "pause":
        return consumer.admin.pause_schedule(name, **who), f"schedule {name!r} is paused: no tick until resumed"
    if action == "resume":
        record = consumer.admin.resume_schedule(name, **who)
        stored = next((s for s in consumer.admin.schedules() if s.schedule == name), None)
        after = "" if stored is None else f", next tick at {stored.next_at:.3f}"
        return record, f"schedule {name!r} is resumed{after}"
    if action == "remove":
        return consumer.admin.remove_schedule(name, **who), (
            f"schedule {name!r} is removed (an executor declaring it records it again when it opens)")
    raise ValueError(f"action must be pause, resume or remove, got {action!r}")


def delivery_action(producer: Any, action: str, consumer: str, event_id: str, *, actor: str, reason: str) -> Done:
    """``redeliver`` / ``skip`` the event ``event_id`` for the consumer named ``consumer``."""
    if action not in ("redeliver", "skip"):
        raise ValueError(f"action must be redeliver or skip, got {action!r}")
    act = producer.admin.redeliver if action == "redeliver" else producer.admin.skip
    record = act(event_id, consumer=consumer, actor=actor, reason=reason)
    was = f"(was {record.previous_state})"
    if action == "redeliver":
        return record, f"event {event_id!r} is pending again for consumer {consumer!r}, due now {was}"
    return record, f"consumer {consumer!r} will never get event {event_id!r} {was}"


def inbox_action(consumer: Any, action: str, event_id: str, *, actor: str, reason: str,
                 envelope: str | None = None) -> Done:
    """``skip`` the accepted event ``event_id``, or ``replace`` it by
    ``envelope`` (the corrected envelope's JSON text)."""
    remote = getattr(consumer, "act_remotely", None)
    if remote is not None and action in ("skip", "replace"):
        if action == "replace" and envelope is None:
            raise ValueError("replace needs the corrected envelope")
        extra = {"envelope": envelope} if action == "replace" else {}
        done: Done = remote(f"{action}_event", event_id=event_id, actor=actor, reason=reason, **extra)
        return done
    if action == "skip":
        record = consumer.admin.skip_event(event_id, actor=actor, reason=reason)
    elif action == "replace":
        if envelope is None:
            raise ValueError("replace needs the corrected envelope")
        record = consumer.admin.replace_event(event_id, envelope, actor=actor, reason=reason)
    else:
        raise ValueError(f"action must be skip or replace, got {action!r}")
    step = f"flow {record.flow_id!r} seq {record.seq}, was {record.previous_state}"
    if action == "skip":
        return record, f"event {event_id!r} skipped ({step}): the flow goes on past it"
    return record, f"event {event_id!r} replaced by {record.replacement_event_id!r} ({step}), stored pending"


def registry_action(producer: Any, action: str, name: str, *, actor: str, reason: str,
                    from_now: bool = False, topics: list[str] | None = None) -> Done:
    """``register`` (every event, or with ``from_now`` only those committed
    from now on; with ``topics`` only theirs) / ``remove`` / ``subscribe``
    (to ``topics``, from now on) the consumer name ``name``."""
    if action == "register":
        record = producer.admin.register_consumer(name, from_now, topics=topics, actor=actor, reason=reason)
        gets = "events committed from now on" if from_now else "every event from the first one"
        of = "" if topics is None else f" of topics {', '.join(record.topics)}"
        return record, f"consumer {name!r} registered: it gets {gets}{of}"
    if action == "remove":
        return producer.admin.remove_consumer(name, actor=actor, reason=reason), \
            f"consumer {name!r} removed, with its deliveries"
    if action == "subscribe":
        if topics is None:
            raise ValueError("subscribe needs topics")
        record = producer.admin.subscribe(name, topics, actor=actor, reason=reason)
        held = next(c.topics_from for c in producer.admin.consumers() if c.name == name)
        return record, (f"consumer {name!r} subscribed to topics {', '.join(record.topics)}: "
                        f"for events committed after outbox position {held}")
    raise ValueError(f"action must be register, remove or subscribe, got {action!r}")


def store_kind(location: Location) -> str:
    """``producer`` or ``consumer``: the kind of the existing store at
    ``location`` (opened read only; a missing one raises, nothing created)."""
    from ..errors import WrongFile
    from .stores import is_remote, open_consumer, open_producer

    if is_remote(location):  # a consumer on another host, served by its bridge
        open_consumer(location).close()
        return "consumer"
    try:
        open_producer(location).close()
        return "producer"
    except WrongFile:
        open_consumer(location).close()
        return "consumer"


def _pruned(kind: str, result: PruneResult) -> str:
    what = (f"{result.events} events, {result.deliveries} deliveries" if kind == "producer" else
            f"{result.events} inbox rows, {result.effect_records} effect records, {result.effect_rows} effect rows")
    more = "" if result.complete else "; the limit stopped it with more left"
    forgot = f", {result.tombstones_forgotten} tombstones forgotten" if result.tombstones_forgotten else ""
    return f"pruned {what}{forgot} in {result.transactions} transactions{more}"


def prune_action(owner: Any, kind: str, older_than: float, *, actor: str, reason: str, now: float | None = None,
                 batch_size: int = 500, limit: int | None = None, forget_after: float | None = None) -> Done:
    """``prune`` the opened ``Producer`` / ``Consumer`` (``kind``), recorded;
    a consumer on another host prunes on its host, through its bridge."""
    remote = getattr(owner, "act_remotely", None)
    if remote is not None:
        done: Done = remote("prune", older_than=older_than, now=now, limit=limit, forget_after=forget_after,
                            actor=actor, reason=reason)
        return done
    result = owner.admin.prune(older_than, actor=actor, reason=reason, now=now, batch_size=batch_size, limit=limit,
                               forget_after=forget_after)
    assert result.action is not None  # every prune is recorded
    return result.action, _pruned(kind, result)


def would_prune(location: Location, older_than: float, now: float, *, limit: int | None = None,
                forget_after: float | None = None, cap: int = DRY_RUN_CAP) -> tuple[dict[str, Any], str]:
    """What ``prune`` would remove from the store at ``location`` now, read
    only (nothing is written, nothing recorded): ``{"kind", "horizon",
    "events", "effect_rows", "tombstones", "capped"}`` and one sentence.
    Each count stops at ``limit`` (as the prune would) or ``cap``; the rows
    that go with them (deliveries, effect records) are not counted."""
    from .._checks import check_finite, check_optional_count
    from .stores import open_consumer, open_producer

    age, at = check_finite("older_than", older_than), check_finite("now", now)
    if age < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than!r}")
    most = min(cap, check_optional_count("limit", limit) or cap)
    keep = None if forget_after is None else check_finite("forget_after", forget_after)
    if keep is not None and keep < age:
        raise ValueError(f"forget_after must be >= older_than ({age:g} s), got {forget_after!r}")
    kind = store_kind(location)
    store = (open_producer if kind == "producer" else open_consumer)(location)
    try:
        with store.read() as reads:
            step = reads.prunable(at - age, most)
            tombstones = 0 if keep is None else reads.tombstones_before(at - keep, cap)
    finally:
        store.close()
    counts = {"kind": kind, "horizon": at - age, "events": step.events, "effect_rows": step.effect_rows,
              "tombstones": tombstones, "capped": most}
    rows = f"{step.events} events" if kind == "producer" else \
        f"{step.events} inbox rows and {step.effect_rows} finished effect rows"
    rows += f", {tombstones} tombstones to forget" if keep is not None else ""
    at_most = f" (counted up to {most})" if max(step.events, step.effect_rows, tombstones) >= most else ""
    return counts, f"dry run: the prune would remove {rows}{at_most}; nothing changed"
