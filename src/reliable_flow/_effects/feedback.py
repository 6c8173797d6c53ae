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
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from .._core.effects import FEEDBACK_REFUSED, fed_back_in, feedback_refusal
from .._observe import WARNING
from .._producer import Producer, advance_at_current
from ..crash import crash_point
from ..delivery import DeliveryPolicy, error_text
from ..records import AdvanceResult, ExecutorStats, ScheduledEffect
from .feedstep import feed_step, owes_nothing
from .registry import EffectRegistry, Feedback

if TYPE_CHECKING:
    from .._consumer import Consumer

__all__ = ["Feeder", "RemoteTarget", "Target", "feedback_target", "refusal"]


class RemoteTarget(Protocol):
    """A producer on another host, as feedback sees it (the transport's
    ``RemoteProducer``): it advances one step at the flow's current seq
    over there and answers the producer's result."""

    @property
    def location(self) -> str: ...

    def advance_at_current(self, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
                           meta: dict[str, str] | None = None) -> AdvanceResult: ...

    def close(self) -> None: ...


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
        """Feed the results still owed (at most ``limit``), oldest first."""
        if self.producer is not None:
            for effect in self.owed(limit):
                self.feed(effect)

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
