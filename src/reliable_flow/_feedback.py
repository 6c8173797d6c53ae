"""Feeding effects' results back into a producer (``Feedback``): one
producer transaction at the flow's current seq, then the effect marked fed.

The executor's thread does it, after an outcome is recorded, and at the
start of every pass for results still owed (a crash between the advance
and the mark re-advances the same event id, which answers ``existing``).
The decisions -- the event id, what counts as refused, what is written --
are in :mod:`reliable_flow._core.effects`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._core.effects import FEEDBACK_REFUSED, fed_back_in, feedback_event_id, feedback_refusal
from ._effects import EffectRegistry
from ._observe import WARNING
from .delivery import DeliveryPolicy, error_text
from .records import ScheduledEffect

if TYPE_CHECKING:
    from ._consumer import Consumer
    from ._executor import ExecutorStats
    from ._producer import Producer

__all__ = ["Feeder"]


class Feeder:
    """Feeds the results of one executor's succeeded effects into its producer."""

    def __init__(self, consumer: Consumer, effects: EffectRegistry, producer: Producer | None,
                 policy: DeliveryPolicy, stats: ExecutorStats, observe: Callable[..., None]) -> None:
        self.consumer, self.effects, self.producer = consumer, effects, producer
        self.policy, self.stats, self._observe = policy, stats, observe

    def owed(self, limit: int) -> None:
        """Feed the results still owed (at most ``limit``), oldest first."""
        if self.producer is None:
            return
        for effect in self.consumer.store.latest.unfed_effects(limit):
            if self.effects.get(effect.name) is not None:
                self.feed(effect)

    def feed(self, effect: ScheduledEffect) -> None:
        """Advance the result into the producer, then mark it fed.  A crash in
        between re-advances the same event id, which answers ``existing``."""
        spec = self.effects.get(effect.name)
        assert spec is not None, effect.name
        if spec.feedback is None:
            with self.consumer.store.write() as unit:
                unit.update_effect(effect.key, {"fed": None}, self.policy.clock())  # nothing is owed
            return
        if self.producer is None:
            return
        feedback = spec.feedback
        refused: str | None
        where = "flow"
        try:
            flow_id = feedback.flow(effect.flow_id) if feedback.flow else effect.flow_id
            where = "payload"
            payload = feedback.payload(effect.result) if feedback.payload else effect.result
        except Exception as exc:  # noqa: BLE001 - the application's function: refused feedback, not a stop
            refused = f"{FEEDBACK_REFUSED}refused: Feedback.{where} raised {error_text(exc)}"
        else:
            try:
                refused = self._advance(feedback_event_id(effect.key), flow_id, feedback.kind, payload, effect.meta)
            except (ValueError, TypeError) as exc:  # InvalidEnvelope: the result does not make a valid step
                refused = f"{FEEDBACK_REFUSED}refused: {error_text(exc)}"
        with self.consumer.store.write() as unit:
            fed_back_in(unit, effect, refused, self.policy.clock(), self.policy.owner)
        if refused is None:
            self.stats.fed += 1
            return
        self.stats.feedback_errors += 1
        self.stats.last_error = f"{effect.key}: {refused}"
        self._observe(effect, None, "feedback_refused", level=WARNING, error=refused)

    def _advance(self, event_id: str, flow_id: str, kind: str, payload: Any, meta: dict[str, str]) -> str | None:
        """Advance in one producer transaction at the flow's current seq; None
        when the step is in the flow (now or before), else why not."""
        assert self.producer is not None
        return feedback_refusal(self.producer._advance_at_current(
            event_id, flow_id, kind=kind, payload=payload, meta=meta or None))
