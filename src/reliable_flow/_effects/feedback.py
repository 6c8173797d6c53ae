"""Feeding effects' results (and failures, ``Feedback.on_failure``) back
into a producer: one producer transaction at the flow's current seq, then
the effect marked fed.

Written once for both faces, in two halves that each touch one store:
:func:`refusal` advances on the producer (its thread, in the asyncio face)
and :meth:`Feeder.mark` records the answer on the consumer.  A crash in
between (crash point ``feedback.after_advance``) re-advances the same
event id, which answers ``existing``.  The
decisions -- the event id, what counts as refused, what is written -- are
in :mod:`reliable_flow._core.effects`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from .._core.effects import FEEDBACK_REFUSED, fed_back_in, feedback_refusal
from .._observe import WARNING
from .._producer import Producer, advance_at_current
from ..crash import crash_point
from ..delivery import DeliveryPolicy, error_text
from ..records import ExecutorStats, ScheduledEffect
from .feedstep import FeedStep, RemoteTarget, feed_step, owes_nothing
from .registry import EffectRegistry, Feedback

if TYPE_CHECKING:
    from .._consumer import Consumer

__all__ = ["Feeder", "RemoteTarget", "Target", "feedback_target", "refusal", "refusals"]


#: What results are fed back into: a local producer, or one on another host.
Target = Producer | RemoteTarget
_REMOTE_SCHEMES = ("redis://", "rediss://", "unix://")


def feedback_target(producer: object, *, local: type = Producer) -> tuple[Any, bool]:
    """``producer`` as a feedback target, and whether it was opened here (a
    location ``redis://host:6379#NAME``: the transport's ``RemoteProducer``,
    imported only then); a ``local`` object or a remote target is used as
    it is.  A TypeError / ValueError naming ``producer`` otherwise."""
    if producer is None or isinstance(producer, local):
        return producer, False
    if isinstance(producer, str):
        if not producer.startswith(_REMOTE_SCHEMES):
            raise ValueError(f"producer: a remote producer is redis://host:port/db#NAME, got {producer!r}")
        try:
            transport = importlib.import_module("reliable_flow.transport.redis")
        except ImportError as exc:
            raise ValueError(f"producer: {exc}") from None
        return transport.RemoteProducer.at(producer), True
    if callable(getattr(producer, "advance_at_current", None)):
        return producer, False
    raise TypeError(f"producer must be a {local.__name__}, a remote producer's location "
                    f"(redis://host:port/db#NAME) or None, got {type(producer).__name__}")


def refusal(producer: Target, effect: ScheduledEffect, feedback: Feedback) -> str | None:
    """Advance ``effect``'s step (its result, or its failure step when it
    failed for good: :func:`~reliable_flow._effects.feedstep.feed_step`) into
    ``producer`` as ``feedback`` says, in one producer transaction at the
    flow's current seq; None when the step is in the flow (now or before),
    else why not (the effect's ``last_error``).  A ``Feedback`` function
    that raises, or a step that is not valid, is a refusal; a storage error
    propagates."""
    step = feed_step(effect, feedback)
    if isinstance(step, str):
        return step
    advance = partial(advance_at_current, producer) if isinstance(producer, Producer) else producer.advance_at_current
    try:
        refused = feedback_refusal(advance(step.event_id, step.flow_id, kind=step.kind, payload=step.payload,
                                           meta=effect.meta or None), step.failure)
    except (ValueError, TypeError) as exc:  # InvalidEnvelope: the result does not make a valid step
        return f"{FEEDBACK_REFUSED}refused: {error_text(exc)}"
    if refused is None:
        crash_point("feedback.after_advance")  # in the producer, not yet marked fed: re-fed as `existing`
    return refused


def refusals(target: RemoteTarget,
             effects: Sequence[tuple[ScheduledEffect, Feedback]]) -> list[str | None | Exception]:
    """:func:`refusal` for several effects at once into a producer on
    another host: every step sent at once (one round trip, each its own
    producer transaction over there); in order, each refusal (None: fed),
    or the error of a step that got no answer or whose producer's storage
    failed (not fed: tried again later)."""
    steps: list[FeedStep | str] = [feed_step(effect, feedback) for effect, feedback in effects]
    built = [(i, step) for i, step in enumerate(steps) if not isinstance(step, str)]
    answers = target.advance_many([{"event_id": step.event_id, "flow_id": step.flow_id, "kind": step.kind,
                                    "payload": step.payload, "meta": effects[i][0].meta or None}
                                   for i, step in built])
    if built:
        crash_point("feedback.after_advance")  # in the producer, not yet marked fed: re-fed as `existing`
    out: list[str | None | Exception] = [step if isinstance(step, str) else None for step in steps]
    for (i, step), answer in zip(built, answers):
        if isinstance(answer, (ValueError, TypeError)):  # InvalidEnvelope: not a valid step
            out[i] = f"{FEEDBACK_REFUSED}refused: {error_text(answer)}"
        elif isinstance(answer, Exception):
            out[i] = answer
        else:
            out[i] = feedback_refusal(answer, step.failure)
    return out


class Feeder:
    """The consumer's half of one executor's feedback (and, for the sync
    face, the whole of it through :meth:`feed`)."""

    def __init__(self, consumer: Consumer, effects: EffectRegistry, producer: Target | None,
                 policy: DeliveryPolicy, stats: ExecutorStats, observe: Callable[..., None]) -> None:
        self.consumer, self.effects, self.producer = consumer, effects, producer
        self.policy, self.stats, self._observe = policy, stats, observe

    def owed(self, limit: int) -> list[ScheduledEffect]:
        """The steps still owed of this registry's effects (at most ``limit``),
        oldest first: results, and failure steps (an unknown effect's once
        its ``unknown_after`` passed).  Those whose spec asks for no step
        (any more) are marked as owing nothing here, and left out."""
        owed = []
        for effect in self.consumer.store.latest.unfed_effects(limit, self.policy.clock()):
            spec = self.effects.get(effect.name)
            if spec is None:
                continue
            if owes_nothing(effect, spec.feedback):
                self.nothing_owed(effect)
            else:
                owed.append(effect)
        return owed

    def nothing_owed(self, effect: ScheduledEffect) -> None:
        """Mark an effect whose spec has no ``feedback=`` (or, failed, no
        ``on_failure``) as owing nothing."""
        with self.consumer.store.write() as unit:
            unit.update_effect(effect.key, {"fed": None}, self.policy.clock())

    def feed_owed(self, limit: int) -> None:
        """Feed the results still owed (at most ``limit``), oldest first
        (into a producer on another host: all sent at once, :func:`refusals`)."""
        if self.producer is None:
            return
        owed = self.owed(limit)
        if isinstance(self.producer, Producer) or len(owed) < 2:
            for effect in owed:
                self.feed(effect)
            return
        self.mark_all(owed, self.producer)

    def mark_all(self, owed: list[ScheduledEffect], target: RemoteTarget) -> None:
        """Feed ``owed`` into ``target`` at once and mark each answered one;
        then raise the error of the first step that was not answered."""
        batch = []
        for effect in owed:
            spec = self.effects.get(effect.name)
            if spec is not None and spec.feedback is not None:
                batch.append((effect, spec.feedback))
        answers = refusals(target, batch)
        for (effect, _feedback), refused in zip(batch, answers):
            if not isinstance(refused, Exception):
                self.mark(effect, refused)
        errors = [a for a in answers if isinstance(a, Exception)]
        if errors:
            raise errors[0]

    def feed(self, effect: ScheduledEffect) -> None:
        """Advance the result into the producer, then mark it fed."""
        spec = self.effects.get(effect.name)
        assert spec is not None, effect.name
        if spec.feedback is None or owes_nothing(effect, spec.feedback):
            self.nothing_owed(effect)
        elif self.producer is not None:
            self.mark(effect, refusal(self.producer, effect, spec.feedback))

    def mark(self, effect: ScheduledEffect, refused: str | None) -> None:
        """Record the producer's answer: fed (``refused`` None), or refused
        (counted, logged, tried again on a later pass)."""
        with self.consumer.store.write() as unit:
            fed_back_in(unit, effect, refused, self.policy.clock(), self.policy.owner)
        crash_point("feedback.after_mark")
        if refused is None:
            self.stats.fed += 1
            return
        self.stats.feedback_errors += 1
        self.stats.last_error = f"{effect.key}: {refused}"
        self._observe(effect, None, "feedback_refused", level=WARNING, error=refused)
