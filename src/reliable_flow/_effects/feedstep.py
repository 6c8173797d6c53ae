"""The step an effect feeds back into a producer, built and checked.

An effect that succeeded feeds its result step (``<key>:result``, built
by its ``Feedback``); one that failed for good feeds its failure step
(``<key>:failure``, built by ``Feedback.on_failure`` from
:func:`~reliable_flow._core.effects.failure_of`).  :func:`feed_step` builds
it (the application's functions run here), :func:`checked` says whether a
producer would take it now without committing anything (what an
operator's ``resolve`` or ``amend`` asks before recording), and
:func:`check_feedback` is that check for an operator's result, before
anything is recorded.  Feeding it is :mod:`.feedback`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from .._core.admin import amended_reason
from .._core.advance import build
from .._core.effects import (
    FEEDBACK_REFUSED,
    failure_event_id,
    failure_of,
    feedback_event_id,
    feedback_refusal,
)
from .._producer import Producer, check_at_current
from ..delivery import error_text
from ..errors import NotResolvable
from ..records import AdvanceResult, ScheduledEffect
from ..statuses import EffectState
from .registry import EffectRegistry, Feedback, check_json_value

__all__ = ["FeedStep", "RemoteTarget", "check_feedback", "checked", "feed_step", "owes_nothing"]


@dataclass(frozen=True, slots=True)
class FeedStep:
    """One step to advance at the flow's current seq: its derived event id,
    flow, kind and payload; ``failure``: a failure step (fed once per effect)."""

    event_id: str
    flow_id: str
    kind: str
    payload: Any
    failure: bool


class RemoteTarget(Protocol):
    """A producer on another host, as feedback sees it (the transport's
    ``RemoteProducer``): it advances one step at the flow's current seq
    over there and answers the producer's result."""

    @property
    def location(self) -> str: ...

    def advance_at_current(self, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
                           meta: dict[str, str] | None = None) -> AdvanceResult: ...

    def check_at_current(self, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
                         meta: dict[str, str] | None = None) -> AdvanceResult: ...

    def advance_many(self, steps: Sequence[Mapping[str, Any]]) -> list[AdvanceResult | Exception]: ...

    def close(self) -> None: ...


def owes_nothing(effect: ScheduledEffect, feedback: Feedback | None) -> bool:
    """Whether ``effect`` has no step to feed as ``feedback`` says: no
    feedback at all, or a failure and no ``on_failure``."""
    if feedback is None:
        return True
    return effect.state is not EffectState.SUCCEEDED and feedback.failure_step is None


def feed_step(effect: ScheduledEffect, feedback: Feedback) -> FeedStep | str:
    """The step ``effect`` feeds as ``feedback`` says (call only when it owes
    one, :func:`owes_nothing`), or why it cannot be built: a ``Feedback``
    function that raised is refused feedback (the effect's ``last_error``)."""
    failure = effect.state is not EffectState.SUCCEEDED
    step = feedback.failure_step if failure else feedback
    assert step is not None, effect.key
    value = failure_of(effect) if failure else effect.result
    named, where = ("Feedback.on_failure" if failure else "Feedback"), "flow"
    try:
        flow_id = step.flow(effect.flow_id) if step.flow else effect.flow_id
        where = "payload"
        payload = step.payload(value) if step.payload else value
    except Exception as exc:  # noqa: BLE001 - the application's function: refused feedback, not a stop
        return f"{FEEDBACK_REFUSED}refused: {named}.{where} raised {error_text(exc)}"
    event_id = failure_event_id(effect.key) if failure else feedback_event_id(effect.key)
    return FeedStep(event_id, flow_id, step.kind, payload, failure)


def checked(effect: ScheduledEffect, feedback: Feedback, producer: Any) -> str | None:
    """None when ``effect``'s step would be taken: built, a valid envelope,
    and (given a ``producer``) accepted by its protocol at the flow's
    current seq, nothing committed; else why it would be refused."""
    step = feed_step(effect, feedback)
    if isinstance(step, str):
        return step
    meta = effect.meta or None
    try:
        if producer is None:
            build(step.event_id, step.flow_id, 0, step.kind, step.payload, 1, meta)
            return None
        check = partial(check_at_current, producer) if isinstance(producer, Producer) else producer.check_at_current
        return feedback_refusal(check(step.event_id, step.flow_id, kind=step.kind, payload=step.payload, meta=meta),
                                step.failure)
    except (ValueError, TypeError) as exc:  # InvalidEnvelope: the result does not make a valid step
        return f"{FEEDBACK_REFUSED}refused: {error_text(exc)}"


def check_feedback(effect: ScheduledEffect, effects: EffectRegistry | None, producer: Any, *,
                   result: Any = None, failure: bool = False, actor: str = "", reason: str = "") -> None:
    """Raise :class:`NotResolvable` when ``effect``, given ``result`` (or
    switched to its failure step, ``failure``) by an operator, would feed a
    step its ``Feedback`` cannot build or (given a ``producer``) the
    producer's protocol refuses now; nothing is written anywhere.  Without
    the registry (``effects``) or a ``Feedback`` for the effect's name there
    is nothing to check.  ``producer``: a sync :class:`Producer` (used on
    this thread), or a producer on another host (a ``RemoteProducer``: the
    check runs over there, nothing committed); ``actor`` and ``reason``: the operator's, as the failure
    step will say them."""
    if producer is not None and not isinstance(producer, Producer) and not callable(
            getattr(producer, "check_at_current", None)):
        raise TypeError(f"producer must be a Producer, a RemoteProducer or None, got {type(producer).__name__}")
    spec = None if effects is None else effects.get(effect.name)
    if spec is None or spec.feedback is None:
        return
    if failure:
        would = replace(effect, state=EffectState.CANCELLED, reason=amended_reason(actor, reason), last_error=None)
        if spec.feedback.failure_step is None:
            raise NotResolvable(f"effect {effect.key!r}: its Feedback has no on_failure, so it has no failure step")
    else:
        would = replace(effect, state=EffectState.SUCCEEDED, result=result, last_error=None)
    check_json_value("result", result)
    why = checked(would, spec.feedback, producer)
    if why is not None:
        what = "its failure step" if failure else f"result {result!r}"
        raise NotResolvable(f"effect {effect.key!r}: {what} would be refused as feedback "
                            f"({why.removeprefix(FEEDBACK_REFUSED)}); nothing recorded")
