"""The console's actions: what each form asks, and doing it through the
same calls as the command line (:mod:`reliable_flow._tools.operator_actions`),
so each is checked, decided and recorded as ``reliable-flow effect retry``
and the others are.

A store an action writes to is opened writable for that request only (a
``Producer`` / ``Consumer`` of the protocol the store records) and closed
after; everything the console reads stays read only.  A bulk action selects
its rows by a filter (read only), shows how many, offers a dry run that
changes nothing, and acts only while the filter still selects as many rows
as the operator was shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .._checks import check_text
from .._tools.drilldown import opened
from .._tools.loading import OptionError
from .._tools.operator_actions import (
    delivery_action,
    effect_action,
    inbox_action,
    opened_owner,
    registry_action,
)
from ..errors import NotResolvable, ReliableFlowError
from ..statuses import DeliveryState, EffectState
from ._data import BadRequest, Console, Target

__all__ = ["ACTIONS", "BULK", "RETRYABLE", "Action", "Field", "Outcome", "Refused", "perform", "selected"]

#: The states a bulk retry selects by (the ones ``retry_effect`` takes).
RETRYABLE = (EffectState.DEAD.value, EffectState.UNKNOWN.value)
#: The keys a bulk dry run lists (the count is always whole).
LISTED = 50


@dataclass(frozen=True)
class Field:
    """One form field: ``kind`` text, area (a textarea), check (a checkbox),
    consumer (a consumer's name, chosen), state (a retryable state, chosen)."""

    name: str
    label: str
    kind: str = "text"
    required: bool = True


@dataclass(frozen=True)
class Action:
    """One action's form: its title, what it says it does, its fields."""

    title: str
    does: str
    fields: tuple[Field, ...]


_CONSUMER = Field("consumer", "consumer", "consumer")
_EVENT = Field("event_id", "event id")
_KEY = Field("key", "effect key")
_RESULT = Field("result", "result (a JSON value)", "area", required=False)

ACTIONS: dict[str, Action] = {
    "redeliver": Action("Redeliver an event", "put a set-aside or pending event back in line for the consumer, "
                        "due now", (_CONSUMER, _EVENT)),
    "skip-delivery": Action("Skip a delivery", "decide that the consumer will never get this event",
                            (_CONSUMER, _EVENT)),
    "skip-event": Action("Skip an inbox event", "move the flow past its next step (pending or blocked) without "
                         "applying it", (_CONSUMER, _EVENT)),
    "replace-event": Action("Replace an inbox event", "put a corrected event (same flow and seq, a new event id) "
                            "in place of a pending or blocked one",
                            (_CONSUMER, _EVENT, Field("envelope", "corrected envelope (JSON)", "area"))),
    "retry": Action("Retry an effect", "run a dead or unknown effect again, now, with a fresh attempt budget",
                    (_CONSUMER, _KEY)),
    "resolve": Action("Resolve an effect", "record that the effect did take place (checked by hand)",
                      (_CONSUMER, _KEY, _RESULT)),
    "cancel": Action("Cancel an effect", "decide that the effect will never run", (_CONSUMER, _KEY)),
    "amend": Action("Amend an effect", "replace the result of an effect whose feedback was refused (or feed its "
                    "failure step); the executor then feeds it once",
                    (_CONSUMER, _KEY, _RESULT, Field("failure", "feed its failure step instead", "check", False))),
    "register": Action("Register a consumer", "register a consumer name, so relays deliver to it",
                       (Field("name", "consumer name"),
                        Field("from_now", "only events committed from now on", "check", False))),
    "remove": Action("Remove a consumer", "remove a consumer name and every delivery to it",
                     (Field("name", "consumer name"),)),
}

BULK: dict[str, Action] = {
    "retry-all": Action("Retry every effect matching a filter", "retry each dead or unknown effect of the "
                        "consumer in this state (and of this name, if given)",
                        (_CONSUMER, Field("state", "state", "state"), Field("name", "effect name", required=False))),
    "redeliver-all": Action("Redeliver every set-aside event of a consumer", "put each event set aside for the "
                            "consumer back in line, due now", (_CONSUMER,)),
}


class Refused(Exception):
    """An action not done, with the sentence the operator is shown."""


@dataclass(frozen=True)
class Outcome:
    """What an action did: its sentence; ``done``: whether anything changed."""

    sentence: str
    done: bool


def _text(form: dict[str, str], field: str, required: bool = True) -> str | None:
    value = form.get(field, "")
    if not value.strip():
        if required:
            raise Refused(f"{field}: must not be blank")
        return None
    return value


def _json(form: dict[str, str], field: str) -> Any:
    text = _text(form, field, required=False)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Refused(f"{field}: must be a JSON value (e.g. {{\"parcel\": \"P-7\"}}): {exc}") from None


@contextmanager
def refusals() -> Iterator[None]:
    """The library's refusals and errors as :class:`Refused`, each a sentence."""
    try:
        yield
    except NotResolvable as exc:
        raise Refused(f"refused: {exc}") from None
    except (ReliableFlowError, OptionError, FileNotFoundError, ImportError, ValueError, TypeError,
            LookupError) as exc:
        raise Refused(f"not done: {exc}") from None


def perform(console: Console, name: str, form: dict[str, str], effects: Any) -> Outcome:
    """Do the action ``name`` with the form's values; raises :class:`Refused`."""
    with refusals():
        actor, reason = check_text("actor", form.get("actor", "")), check_text("reason", form.get("reason", ""))
        who = {"actor": actor, "reason": reason}
        if name in ("register", "remove"):
            with opened_owner("producer", console.producer) as producer:
                _, said = registry_action(producer, name, str(_text(form, "name")), from_now="from_now" in form,
                                          actor=actor, reason=reason)
            return Outcome(said, True)
        target = _target(console, form)
        if name in ("redeliver", "skip-delivery"):
            with opened_owner("producer", console.producer) as producer:
                _, said = delivery_action(producer, name.split("-")[0], target.name, str(_text(form, "event_id")),
                                          **who)
            return Outcome(said, True)
        if name in ("skip-event", "replace-event"):
            with opened_owner("consumer", target.location) as consumer:
                _, said = inbox_action(consumer, name.split("-")[0], str(_text(form, "event_id")),
                                       envelope=_text(form, "envelope") if name == "replace-event" else None, **who)
            return Outcome(said, True)
        if name in ("retry", "resolve", "cancel", "amend"):
            return Outcome(_effect(console, target, name, form, effects, who), True)
        if name in BULK:
            return _bulk(console, target, name, form, who)
    raise Refused(f"no action {name!r}")


def _target(console: Console, form: dict[str, str]) -> Target:
    try:
        return console.consumer_named(_text(form, "consumer"))
    except BadRequest as exc:
        raise Refused(f"not done: {exc}") from None


def _effect(console: Console, target: Target, name: str, form: dict[str, str], effects: Any,
            who: dict[str, str]) -> str:
    key = str(_text(form, "key"))
    result = _json(form, "result")
    with opened_owner("consumer", target.location, effects=effects) as consumer:
        if name not in ("resolve", "amend"):
            return effect_action(consumer, name, key, actor=who["actor"], reason=who["reason"])[1]
        # the step a result feeds is checked against the producer too, nothing committed (as --producer does)
        with opened_owner("producer", console.producer, consumer.protocol) as producer:
            return effect_action(consumer, name, key, result=result, failure="failure" in form,
                                 producer=producer, **who)[1]


def selected(console: Console, name: str, form: dict[str, str]) -> tuple[Target, list[str]]:
    """The rows a bulk action's filter selects now, read only: effect keys
    (``retry-all``) or event ids (``redeliver-all``), in order."""
    target = _target(console, form)
    if name == "retry-all":
        state = form.get("state") or ""
        if state not in RETRYABLE:
            raise Refused(f"not done: state must be one of {list(RETRYABLE)}, got {state!r}")
        effect = _text(form, "name", required=False)
        with opened(console.producer, target.location) as (_, c):
            return target, [e.key for e in c.effect_list(state=EffectState(state))
                            if effect is None or e.name == effect]
    with opened(console.producer, target.location) as (p, _):
        return target, [e.event_id for e in p.outbox(consumer=target.name)
                        if (d := e.deliveries.get(target.name)) is not None and d.state is DeliveryState.SET_ASIDE]


def _bulk(console: Console, target: Target, name: str, form: dict[str, str], who: dict[str, str]) -> Outcome:
    _, rows = selected(console, name, form)
    listed = ", ".join(repr(r) for r in rows[:LISTED]) + (f" and {len(rows) - LISTED} more" if len(rows) > LISTED
                                                           else "")
    verb = "retried" if name == "retry-all" else "redelivered"
    if form.get("mode") != "act":
        return Outcome(f"dry run: {len(rows)} would be {verb} ({listed or 'none'}); nothing changed", False)
    expected = form.get("expected", "")
    if expected != str(len(rows)):
        raise Refused(f"not done: the filter now selects {len(rows)}, not the {expected or '?'} you were shown: "
                      f"look again")
    done, refused = 0, []
    act: Callable[[Any, str], Any]
    kind, location = ("consumer", target.location) if name == "retry-all" else ("producer", console.producer)
    with opened_owner(kind, location) as owner:
        if name == "retry-all":
            def act(o: Any, row: str) -> Any:
                return effect_action(o, "retry", row, actor=who["actor"], reason=who["reason"])
        else:
            def act(o: Any, row: str) -> Any:
                return delivery_action(o, "redeliver", target.name, row, **who)
        for row in rows:  # each one recorded on its own, as the command line records one
            try:
                act(owner, row)
                done += 1
            except (NotResolvable, LookupError) as exc:
                refused.append(f"{row!r}: {exc}")
    tail = f"; {len(refused)} refused: " + "; ".join(refused[:10]) if refused else ""
    return Outcome(f"{verb} {done} of {len(rows)} for consumer {target.name!r}{tail}", done > 0)
