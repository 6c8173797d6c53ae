"""The console's actions: what each form asks, and doing it through the
same calls as the command line (:mod:`reliable_flow._tools.operator_actions`),
so each is checked, decided and recorded as ``reliable-flow effect retry``
and the others are.

A store an action writes to is opened writable for that request only (a
``Producer`` / ``Consumer`` of the protocol the store records) and closed
after; everything the console reads stays read only.  A bulk action selects
its rows by a filter (read only), shows how many, offers a dry run that
changes nothing, and acts only while the filter still selects as many rows
as the operator was shown.  A prune counts what it would remove now (read
only), and its form carries the time it counted from, so the prune acts
with the horizon the operator was shown.
"""

from __future__ import annotations

import json
import math
import time
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
    prune_action,
    registry_action,
    store_kind,
    would_prune,
)
from ..errors import NotResolvable, ReliableFlowError
from ..records import OperatorAction
from ..statuses import DeliveryState, EffectState
from ._data import BadRequest, Console, Target

__all__ = ["ACTIONS", "BULK", "RETRYABLE", "Action", "Field", "Outcome", "Preview", "Refused", "perform", "preview",
           "selected"]

#: The states a bulk retry selects by (the ones ``retry_effect`` takes).
RETRYABLE = (EffectState.DEAD.value, EffectState.UNKNOWN.value)
#: The keys a bulk dry run lists (the count is always whole).
LISTED = 50


@dataclass(frozen=True)
class Field:
    """One form field: ``kind`` text, area (a textarea), check (a checkbox),
    consumer (a consumer's name, chosen), state (a retryable state, chosen),
    store (``producer`` or a consumer's name, chosen)."""

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
_TOPICS = Field("topics", "topics (names, comma separated)")
_TOPICS_OPTIONAL = Field("topics", "only these topics (names, comma separated; blank: every event)", required=False)

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
    "register": Action("Register a consumer", "register a consumer name, so relays deliver to it (with topics: "
                       "only their events)",
                       (Field("name", "consumer name"),
                        Field("from_now", "only events committed from now on", "check", False), _TOPICS_OPTIONAL)),
    "subscribe": Action("Change a consumer's topics", "from now on, deliver to the consumer name only the events "
                        "of these topics (events committed before keep the deliveries they have)",
                        (Field("name", "consumer name"), _TOPICS)),
    "remove": Action("Remove a consumer", "remove a consumer name and every delivery to it",
                     (Field("name", "consumer name"),)),
}

BULK: dict[str, Action] = {
    "retry-all": Action("Retry every effect matching a filter", "retry each dead or unknown effect of the "
                        "consumer in this state (and of this name, if given)",
                        (_CONSUMER, Field("state", "state", "state"), Field("name", "effect name", required=False))),
    "redeliver-all": Action("Redeliver every set-aside event of a consumer", "put each event set aside for the "
                            "consumer back in line, due now", (_CONSUMER,)),
    "prune": Action("Prune old finished rows", "remove the producer's events every consumer has, or a consumer's "
                    "applied inbox rows and finished effects, older than this, each leaving a tombstone "
                    "(docs/operations.md, Retention)",
                    (Field("store", "store", "store"), Field("older_than", "older than (seconds)"),
                     Field("limit", "at most this many rows (blank: all)", required=False),
                     Field("forget_after", "also forget tombstones older than (seconds; blank: never)",
                           required=False))),
}
#: How far in the future a prune's ``now`` (the dry run's, carried by the form) may be.
_SKEW = 5.0


class Refused(Exception):
    """An action not done, with the sentence the operator is shown;
    ``conflict``: refused by the rules or the state moved on (the store's
    state, not the request, is why: a JSON answer's 409, else a 400)."""

    def __init__(self, sentence: str, *, conflict: bool = False) -> None:
        super().__init__(sentence)
        self.conflict = conflict


@dataclass(frozen=True)
class Outcome:
    """What an action did: its sentence; ``done``: whether anything changed;
    ``records``: the operator actions it recorded (``as_dict`` shapes)."""

    sentence: str
    done: bool
    records: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Preview:
    """What a bulk form shows before it acts: a sentence, the rows it lists,
    and the hidden fields its act button carries (the count shown, or the
    time the prune's horizon was counted from)."""

    sentence: str
    rows: list[str]
    hidden: dict[str, str]
    button: str


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


def _topics(form: dict[str, str], *, required: bool) -> list[str] | None:
    """``topics``: names, comma separated (checked by the producer: an unknown one is refused, naming it)."""
    text = _text(form, "topics", required=required)
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise Refused("topics: must name at least one topic")
    return names


@contextmanager
def refusals() -> Iterator[None]:
    """The library's refusals and errors as :class:`Refused`, each a sentence."""
    try:
        yield
    except NotResolvable as exc:
        raise Refused(f"refused: {exc}", conflict=True) from None
    except (ReliableFlowError, OptionError, FileNotFoundError, ImportError, ValueError, TypeError,
            LookupError) as exc:
        raise Refused(f"not done: {exc}") from None


def perform(console: Console, name: str, form: dict[str, str], effects: Any) -> Outcome:
    """Do the action ``name`` with the form's values; raises :class:`Refused`."""
    with refusals():
        actor, reason = check_text("actor", form.get("actor", "")), check_text("reason", form.get("reason", ""))
        who = {"actor": actor, "reason": reason}
        if name in ("register", "remove", "subscribe"):
            topics = _topics(form, required=name == "subscribe") if name != "remove" else None
            with opened_owner("producer", console.producer) as producer:
                done = registry_action(producer, name, str(_text(form, "name")), from_now="from_now" in form,
                                       topics=topics, actor=actor, reason=reason)
            return _one(done)
        if name == "prune":
            return _prune(console, form, who)
        target = _target(console, form)
        if name in ("redeliver", "skip-delivery"):
            with opened_owner("producer", console.producer) as producer:
                done = delivery_action(producer, name.split("-")[0], target.name, str(_text(form, "event_id")),
                                       **who)
            return _one(done)
        if name in ("skip-event", "replace-event"):
            with opened_owner("consumer", target.location) as consumer:
                done = inbox_action(consumer, name.split("-")[0], str(_text(form, "event_id")),
                                    envelope=_text(form, "envelope") if name == "replace-event" else None, **who)
            return _one(done)
        if name in ("retry", "resolve", "cancel", "amend"):
            return _one(_effect(console, target, name, form, effects, who))
        if name in BULK:
            return _bulk(console, target, name, form, who)
    raise Refused(f"no action {name!r}")


def _one(done: tuple[OperatorAction, str]) -> Outcome:
    return Outcome(done[1], True, (done[0].as_dict(),))


def _target(console: Console, form: dict[str, str]) -> Target:
    try:
        return console.consumer_named(_text(form, "consumer"))
    except BadRequest as exc:
        raise Refused(f"not done: {exc}") from None


def _effect(console: Console, target: Target, name: str, form: dict[str, str], effects: Any,
            who: dict[str, str]) -> tuple[OperatorAction, str]:
    key = str(_text(form, "key"))
    result = _json(form, "result")
    with opened_owner("consumer", target.location, effects=effects) as consumer:
        if name not in ("resolve", "amend"):
            return effect_action(consumer, name, key, actor=who["actor"], reason=who["reason"])
        # the step a result feeds is checked against the producer too, nothing committed (as --producer does)
        with opened_owner("producer", console.producer, consumer.protocol) as producer:
            return effect_action(consumer, name, key, result=result, failure="failure" in form,
                                 producer=producer, **who)


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
                      f"look again", conflict=True)
    done, refused, records = 0, [], []
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
                records.append(act(owner, row)[0].as_dict())
                done += 1
            except (NotResolvable, LookupError) as exc:
                refused.append(f"{row!r}: {exc}")
    tail = f"; {len(refused)} refused: " + "; ".join(refused[:10]) if refused else ""
    return Outcome(f"{verb} {done} of {len(rows)} for consumer {target.name!r}{tail}", done > 0, tuple(records))


def preview(console: Console, name: str, values: dict[str, str]) -> Preview:
    """What the bulk form ``name`` shows now for ``values``, read only."""
    if name == "prune":
        location, older_than, now, limit, forget_after = _prune_args(console, values, time.time())
        with refusals():
            said = would_prune(location, older_than, now, limit=limit, forget_after=forget_after)[1]
        return Preview(said.replace("dry run: the prune", "Now the prune", 1).replace("; nothing changed", ""),
                       [], {"now": repr(now)}, "Prune")
    rows = selected(console, name, values)[1]
    return Preview(f"The filter selects {len(rows)} now", rows, {"expected": str(len(rows))},
                   f"Act on {len(rows)}")


def _number(form: dict[str, str], field: str, whole: bool = False) -> Any:
    text = _text(form, field, required=field == "older_than")
    if text is None:
        return None
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        raise Refused(f"not done: {field}: must be a {'whole number' if whole else 'number of seconds'}, "
                      f"got {text!r}") from None
    if not math.isfinite(value):
        raise Refused(f"not done: {field}: must be finite, got {text!r}")
    return value


def _prune_args(console: Console, form: dict[str, str], now: float) -> tuple[str, float, float, Any, Any]:
    """The store's location and the prune's arguments from the form."""
    store = form.get("store") or "producer"
    location = console.producer if store == "producer" else console.consumer_named(store).location
    return (str(location), _number(form, "older_than"), now, _number(form, "limit", whole=True),
            _number(form, "forget_after"))


def _prune(console: Console, form: dict[str, str], who: dict[str, str]) -> Outcome:
    """A prune's dry run (nothing changed), or the prune, with the horizon the
    form was shown (its ``now``): both through the command line's calls."""
    given = form.get("now")
    now = time.time() if not given else _number(form, "now")
    if now > time.time() + _SKEW:
        raise Refused(f"not done: now: {given!r} is in the future")
    try:
        location, older_than, now, limit, forget_after = _prune_args(console, form, now)
    except BadRequest as exc:
        raise Refused(f"not done: {exc}") from None
    if form.get("mode") != "act":
        return Outcome(would_prune(location, older_than, now, limit=limit, forget_after=forget_after)[1], False)
    kind = store_kind(location)
    with opened_owner(kind, location) as owner:
        done = prune_action(owner, kind, older_than, now=now, limit=limit, forget_after=forget_after,
                            actor=who["actor"], reason=who["reason"])
    store = form.get("store") or "producer"
    return Outcome(f"{store}: {done[1]}", True, (done[0].as_dict(),))
