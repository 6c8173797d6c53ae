"""The operator's actions on deliveries (the producer's ``redeliver`` /
``skip``) and on effects (the consumer's ``retry_effect`` /
``resolve_effect`` / ``cancel_effect`` / ``amend_effect``): from which
states each one is allowed, what it leaves, and its record.  Nothing here runs by itself: each
action is asked for by a person and recorded with who, when and why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._effects import EffectSpec
from .._store import OutboxUnit
from .._store.effects import EffectUnit
from ..errors import NotResolvable, UnknownEffect, UnknownEvent
from ..records import OperatorAction, ScheduledEffect
from ..statuses import ActionTarget, DeliveryState, EffectState, Transition
from .effects import note, owe_failure
from .operate import feedback_refused

__all__ = [
    "DELIVERY_ACTIONS", "EFFECT_ACTIONS", "amend_in", "amended_reason", "delivery_action_in", "effect_action_in", "effect_changes",
]

_D = DeliveryState
_S = EffectState

#: Each operator action on a delivery: the states it may leave from, and the
#: state it leaves.  An accepted or skipped delivery is final.
DELIVERY_ACTIONS: dict[str, tuple[tuple[DeliveryState, ...], DeliveryState]] = {
    "redeliver": ((_D.SET_ASIDE, _D.PENDING), _D.PENDING),
    "skip": ((_D.SET_ASIDE, _D.PENDING), _D.SKIPPED),
}

#: Each operator action on an effect: the states it may leave from, and the
#: state it leaves.  ``retry`` leaves ``in_doubt`` out: it is reconciled (or
#: re-run by key) automatically.
EFFECT_ACTIONS: dict[str, tuple[tuple[EffectState, ...], EffectState]] = {
    "retry": ((_S.DEAD, _S.UNKNOWN), _S.PENDING),
    "resolve": ((_S.DEAD, _S.UNKNOWN, _S.IN_DOUBT, _S.PENDING), _S.SUCCEEDED),
    "cancel": ((_S.PENDING, _S.DEAD, _S.UNKNOWN, _S.IN_DOUBT), _S.CANCELLED),
}


def delivery_action_in(unit: OutboxUnit, action: str, event_id: str, consumer: str, actor: str, reason: str,
                       now: float, location: str) -> OperatorAction:
    """Redeliver or skip one delivery inside ``unit``'s transaction; the
    recorded action, with the state it left (``previous_state``)."""
    allowed, target = DELIVERY_ACTIONS[action]
    found = unit.delivery_state(event_id, consumer)
    if found is None:
        raise UnknownEvent(f"no delivery of event {event_id!r} to consumer {consumer!r} in {location}")
    pos, state = found
    if state not in allowed:
        raise NotResolvable(f"event {event_id!r} is {state} for consumer {consumer!r}; cannot {action} it")
    unit.resolve(consumer, pos, target, now)
    record = OperatorAction(at=now, target=ActionTarget.DELIVERY, consumer=consumer, event_id=event_id,
                            action=action, actor=actor, reason=reason)
    unit.record_action(record)  # the previous state is not stored
    return dataclasses.replace(record, previous_state=state)


def effect_changes(action: str, reason: str, result: str | None = None) -> dict[str, Any]:
    """What an operator action writes on the effect (``result``: the JSON
    text a ``resolve`` records)."""
    state = EFFECT_ACTIONS[action][1]
    if action == "retry":  # now, with a fresh max_attempts budget
        return {"state": state, "due_at": 0.0, "failures": 0, "attempts": 0, "lease_owner": None, "reason": None}
    if action == "resolve":
        # fed=False: an executor whose registry feeds this effect back does so;
        # one that does not clears it.
        return {"state": state, "result": result, "fed": False, "lease_owner": None, "reason": None}
    return {"state": state, "lease_owner": None, "reason": reason}


def effect_action_in(unit: EffectUnit, action: str, key: str, actor: str, reason: str, now: float, location: str,
                     result: str | None = None, spec: EffectSpec | None = None) -> tuple[OperatorAction, ScheduledEffect]:
    """Retry, resolve or cancel one effect inside ``unit``'s transaction; the
    recorded action and the effect as it was before.  A cancel owes the
    effect's failure step (``spec``: its registered spec, if known;
    :func:`~reliable_flow._core.effects.owe_failure`)."""
    effect = unit.effect(key)
    if effect is None:
        raise UnknownEffect(f"no effect with key {key!r} in {location}")
    allowed = EFFECT_ACTIONS[action][0]
    if effect.state not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise NotResolvable(f"effect {key!r} is {effect.state}; {action} needs one of: {names}")
    changes = effect_changes(action, reason, result)
    if action == "cancel":
        changes = owe_failure(effect, spec, changes, now)
    unit.update_effect(key, changes, now)
    record = OperatorAction(at=now, target=ActionTarget.EFFECT, key=key, action=action, actor=actor, reason=reason)
    unit.record_action(record)
    unit.add_transitions([note(effect, Transition.OPERATOR, now, None,
                               f"{action} by {actor} ({effect.state} -> {changes['state']}): {reason}",
                               due_at=now if "due_at" in changes else None)])  # a retry: due at once
    return record, effect


def amended_reason(actor: str, reason: str) -> str:
    """The ``reason`` of an effect an operator switched to its failure step
    (what its failure step says)."""
    return f"amended to its failure step by {actor}: {reason}"


def amend_in(unit: EffectUnit, key: str, actor: str, reason: str, now: float, location: str, result: str | None,
             failure: bool) -> tuple[OperatorAction, ScheduledEffect]:
    """Amend an effect whose feedback was refused, inside ``unit``'s
    transaction: its result replaced by ``result`` (JSON text; it is
    ``succeeded``, its result step owed again), or (``failure``) a succeeded
    one switched to its failure step (``cancelled``, the step owed).  The
    refusal is cleared, so the next executor pass feeds it.  Recorded as a
    ``resolve`` / ``cancel`` whose reason begins ``amend:`` (the record's
    action names only those); the recorded action and the effect as it was
    before.  :class:`NotResolvable` for an effect whose feedback was not
    refused, and for ``failure`` on one that failed already (its failure
    step is what was refused)."""
    effect = unit.effect(key)
    if effect is None:
        raise UnknownEffect(f"no effect with key {key!r} in {location}")
    if not feedback_refused(effect):
        fed = {True: "was fed", None: "owes nothing", False: "is owed and was not refused"}[effect.fed]
        raise NotResolvable(f"effect {key!r} is {effect.state} and its feedback {fed}; amend is only for an "
                            f"effect whose feedback was refused (see its last_error)")
    if failure and effect.state is not _S.SUCCEEDED:
        raise NotResolvable(f"effect {key!r} is {effect.state}: its failure step is what was refused; amend it "
                            f"with a result instead, or fix the producer's protocol")
    changes: dict[str, Any]
    if failure:
        action = "cancel"
        changes = {"state": _S.CANCELLED, "reason": amended_reason(actor, reason),
                   "fed": False, "last_error": None, "lease_owner": None}
    else:
        action = "resolve"
        changes = {"state": _S.SUCCEEDED, "result": result, "fed": False, "last_error": None, "reason": None,
                   "lease_owner": None}
    unit.update_effect(key, changes, now)
    record = OperatorAction(at=now, target=ActionTarget.EFFECT, key=key, action=action, actor=actor,
                            reason=f"amend: {reason}")
    unit.record_action(record)
    what = "switched to its failure step" if failure else "result replaced"
    unit.add_transitions([note(effect, Transition.OPERATOR, now, None,
                               f"amend by {actor} ({effect.state} -> {changes['state']}, {what}): {reason}")])
    return record, effect
