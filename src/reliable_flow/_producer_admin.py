"""The operator's side of a producer (``producer.admin``): deliveries put
back in line or skipped, the consumer registry, and retention.

Nothing here runs by itself: each action is asked for by a person and
recorded with who, when and why.  See docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from . import _envelope as envelope
from ._checks import check_flag, check_text
from ._core.admin import delivery_action_in
from ._core.operate import register_in, remove_in
from ._core.topics import Routing, check_topics, register_routed_in, subscribe_in
from ._observe import PRODUCER, operator_action
from ._retention import DEFAULT_PRUNE_BATCH, prune_older_than
from ._store import OutboxStore
from ._topics import Topic, check_topic_names
from .errors import InvalidEnvelope
from .records import ConsumerEntry, OperatorAction, PruneResult
from .statuses import ActionTarget

__all__ = ["ProducerAdmin"]


class Owner(Protocol):
    """What the admin object reads of its producer (public members only)."""

    @property
    def store(self) -> OutboxStore: ...

    @property
    def topics(self) -> tuple[Topic, ...]: ...


def _name(value: object) -> str:
    check_text("name", value)
    try:
        return envelope.check_name("name", value)
    except InvalidEnvelope as exc:
        raise ValueError(f"name {exc.problem}") from None


def _registry_action(name: str, action: str, actor: str, reason: str,
                     topics: tuple[str, ...] | None = None) -> OperatorAction:
    return OperatorAction(at=time.time(), target=ActionTarget.REGISTRY, consumer=name, action=action,
                          actor=check_text("actor", actor), reason=check_text("reason", reason), topics=topics)


class ProducerAdmin:
    """A producer's operator actions, as ``producer.admin``: put a delivery
    back in line (:meth:`redeliver`) or give it up (:meth:`skip`), the
    consumer registry (:meth:`consumers`, :meth:`register_consumer`,
    :meth:`remove_consumer`) and retention (:meth:`prune`).  Every action
    is recorded (:meth:`operator_actions`, :meth:`registry_actions`); none
    is ever taken automatically."""

    def __init__(self, producer: Owner) -> None:
        self._producer = producer

    @property
    def _store(self) -> OutboxStore:
        return self._producer.store

    # -- deliveries ----------------------------------------------------------------

    def redeliver(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Put a set-aside (or backing-off) event back in line for ``consumer``, now.

        For use after the consumer's data was fixed.  Recorded with actor,
        time and reason; never done automatically.  The next relay sends it;
        if the conflict persists it is set aside again.
        """
        return self._delivery_action("redeliver", event_id, consumer, actor, reason)

    def skip(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Decide that ``consumer`` will never get this event; recorded, never automatic.

        The consumer's flow then waits at a gap for this seq for ever: only
        do this when the business has decided the step may be left out.
        """
        return self._delivery_action("skip", event_id, consumer, actor, reason)

    def _delivery_action(self, action: str, event_id: str, consumer: str, actor: str, reason: str) -> OperatorAction:
        for name, value in (("event_id", event_id), ("consumer", consumer), ("actor", actor), ("reason", reason)):
            check_text(name, value)
        now = time.time()
        with self._store.write() as unit:
            record = delivery_action_in(unit, action, event_id, consumer, actor, reason, now, self._store.location)
        operator_action(PRODUCER, record, previous_state=str(record.previous_state))
        return record

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Every recorded redeliver and skip (for one event if given), oldest
        first: target ``delivery``, ``previous_state`` None (not stored)."""
        return self._store.latest.operator_actions(event_id)

    # -- the consumer registry --------------------------------------------------------

    def consumers(self) -> list[ConsumerEntry]:
        """Every registered consumer, by name: its file's ``uid`` (None until
        its first relay binds one), when it was registered, whether it gets
        only events committed from then on, its ``backlog`` (deliveries still
        pending) and how many deliveries are set aside."""
        return self._store.latest.consumers()

    def register_consumer(
        self, name: str, from_now: bool = False, *, topics: Sequence[str] | None = None, actor: str, reason: str
    ) -> OperatorAction:
        """Register a consumer name, so ``relay`` delivers to it; recorded.

        Without ``from_now`` every event already committed becomes pending for
        it (a new consumer catches up from the first event); with
        ``from_now=True`` it gets only events committed from now on.  Its
        first relay binds the name to that consumer's file.  A name already
        registered raises :class:`NotResolvable`.

        ``topics``: topic names of this producer (see docs/topics.md); the
        name then gets only the events of those topics (of the stored ones,
        or from now on), each delivery carrying the seq of the flow's
        previous event for it.  None: every event.  An unknown topic, or a
        command topic another name subscribes to, raises
        :class:`~reliable_flow.errors.TopicError`; nothing is stored.
        """
        name = _name(name)
        wanted = None if topics is None else check_topic_names("topics", topics)
        record = _registry_action(name, "register", actor, reason, wanted)
        from_now = check_flag("from_now", from_now)
        location = self._store.location
        if wanted is not None:
            check_topics(self._routing(), wanted, location)  # before anything is opened
        with self._store.write() as unit:
            register_in(unit, name, from_now, record, location, every_event=wanted is None)
            if wanted is not None:
                register_routed_in(unit, self._routing(), name, wanted, from_now, location)
        return record

    def subscribe(self, name: str, topics: Sequence[str], *, actor: str, reason: str) -> OperatorAction:
        """Change what a registered consumer name gets: the events of
        ``topics`` (topic names of this producer), committed from now on;
        recorded (action ``subscribe``), with the outbox position it holds
        after (``consumers()``: ``topics_from``).  Events committed before
        keep the deliveries they have, so no event is half-seen; each new
        one carries the seq of the flow's previous event for the name.
        An unknown topic, a command topic another name subscribes to, or a
        producer without topics raises :class:`~reliable_flow.errors.TopicError`,
        a name not registered :class:`UnknownConsumer`; nothing is stored.
        """
        name = _name(name)
        wanted = check_topic_names("topics", topics)
        record = _registry_action(name, "subscribe", actor, reason, wanted)
        check_topics(self._routing(), wanted, self._store.location)  # before anything is opened
        with self._store.write() as unit:
            subscribe_in(unit, self._routing(), name, wanted, record, self._store.location)
        return record

    def _routing(self) -> Routing | None:
        topics = self._producer.topics
        return Routing(topics) if topics else None

    def remove_consumer(self, name: str, *, actor: str, reason: str) -> OperatorAction:
        """Remove a consumer name and every delivery to it; recorded.

        New events are no longer kept for it and ``relay`` to it raises
        :class:`UnknownConsumer` (unless registered again).  Its consumer
        file is not touched.  A name that is not registered raises
        :class:`UnknownConsumer`.  Objects of other processes remember a
        binding until reopened: stop the relays to the name first.
        """
        name = _name(name)
        record = _registry_action(name, "remove", actor, reason)
        with self._store.write() as unit:
            remove_in(unit, name, record, self._store.location)
        self._store.forget_binding(name)
        return record

    def registry_actions(self, name: str | None = None) -> list[OperatorAction]:
        """Every recorded registration and removal (of one name if given),
        oldest first: target ``registry``."""
        return self._store.latest.registry_actions(name)

    # -- retention ------------------------------------------------------------------

    def prune(
        self, older_than: float, *, actor: str, reason: str, now: float | None = None,
        batch_size: int = DEFAULT_PRUNE_BATCH, limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Remove outbox events committed more than ``older_than`` seconds
        before ``now`` (default: the time) that every registered consumer
        accepted or was skipped past, with their delivery rows.

        Each leaves a tombstone (id, flow, seq, SHA-256 of the body), so
        re-sending it still answers ``existing`` (same body, with its seq) or
        ``conflict``.  ``forget_after`` (seconds, >= ``older_than``; default
        never) removes tombstones pruned longer ago than that, so the file
        stops growing: an advance re-sent with a forgotten id is then
        answered ``stale`` (the flow moved past its seq), never committed
        twice.  Never removes an event still
        pending or set aside for any consumer, nor a flow row; removes
        nothing while no consumer is registered.  Works in transactions of
        at most ``batch_size`` events, up to ``limit`` events in all (None:
        until done); each transaction is recorded.  With topics, an event
        is also kept while a topic carrying its kind keeps it (``Topic(...,
        retention=)`` seconds, when longer than ``older_than``).  Events committed before
        the upgrade that added commit times count as old.  A consumer
        registered later "from the first event" gets only the events still
        stored.

        Recorded with ``actor`` and ``reason`` (non-blank) as an operator
        action of target ``retention`` (:meth:`retention_actions`), in the
        same transaction as the first step: nothing is removed unrecorded.
        Bad arguments raise ``ValueError`` / ``TypeError`` before anything
        is opened.
        """
        at = time.time()
        result, record = prune_older_than(
            self._store.write, older_than, at if now is None else now, batch_size, limit, forget_after,
            actor=actor, reason=reason, at=at, routing=self._routing(),
        )
        operator_action(PRODUCER, record, horizon=record.horizon, events=result.events)
        return replace(result, action=record)

    def retention_actions(self) -> list[OperatorAction]:
        """Every recorded prune of this store, oldest first: target
        ``retention``, with its ``horizon`` and ``forget_before``."""
        return self._store.latest.retention_actions()

    def __repr__(self) -> str:
        return f"{self._producer!r}.admin"
