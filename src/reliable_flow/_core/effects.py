"""The effect outbox's decisions: scheduling an effect, what an executor does
with one it picked up, and what each outcome leaves behind.

Everything an effect goes through is decided here and nowhere else; the
executor only calls functions and hands the answers back.  Backoff and
leases come from :mod:`reliable_flow.delivery`, as for deliveries.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import _envelope as envelope
from .._effects import EffectRegistry, EffectSpec, Happened, NotHappened, check_json_value
from .._store.effects import EffectReads, EffectUnit, NewEffect
from ..delivery import DeliveryPolicy, claim_until, error_text, retry_after
from ..errors import EffectKeyConflict, InvalidEnvelope, NotResolvable, UnknownEffect
from ..records import AdvanceResult, EffectTransition, ScheduledEffect
from ..statuses import AdvanceStatus, EffectState, Transition

__all__ = [
    "FAILED",
    "FEEDBACK_REFUSED",
    "HANDLER_CANCELS_FROM",
    "ORDER_BLOCKING",
    "Claim",
    "Outcome",
    "Plan",
    "after_reconcile",
    "after_run",
    "after_timeout",
    "cancel_in",
    "claim_changes",
    "claim_in",
    "default_key",
    "ended_words",
    "failure_event_id",
    "failure_of",
    "fed_back_in",
    "feedback_event_id",
    "feedback_refusal",
    "holds",
    "lease_held",
    "note",
    "owe_failure",
    "plan",
    "record_outcome_in",
    "release_in",
    "renew_in",
    "schedule_in",
    "time_out_in",
    "waiting_behind",
    "with_waits",
]

Changes = dict[str, Any]
_S = EffectState


class Plan(enum.Enum):
    """What an executor does with an effect it picked up."""

    RUN = "run"              # call the function (a first attempt, a retry, or a re-run by key)
    RECONCILE = "reconcile"  # ask the effect's reconcile whether the last attempt happened
    EXPIRE = "expire"        # its deadline passed before it ran: never run it
    SUPERSEDE = "supersede"  # its flow moved past the version it was for: never run it
    PARK = "park"            # in doubt, and nothing can settle it: unknown, for an operator


def _late(effect: ScheduledEffect, now: float, last_seq: int) -> tuple[Plan, str] | None:
    if effect.deadline is not None and now > effect.deadline:
        return Plan.EXPIRE, f"its deadline {effect.deadline:.3f} passed (now {now:.3f})"
    if effect.version is not None and last_seq > effect.version:
        return Plan.SUPERSEDE, (
            f"flow {effect.flow_id!r} was applied up to seq {last_seq}, past version {effect.version}"
        )
    return None


def plan(effect: ScheduledEffect, spec: EffectSpec, now: float, last_seq: int) -> tuple[Plan, str | None]:
    """Decide, before any call, what happens to an effect an executor picked up.

    An effect that may already have taken effect (``in_doubt``, or
    ``running`` with its lease run out) is never simply run again: it is
    reconciled, or re-run with the same key when the target deduplicates by
    key, or parked.  Only an effect that certainly never took effect can
    expire or be superseded.
    """
    in_doubt = effect.state in (_S.IN_DOUBT, _S.RUNNING)
    if not in_doubt:
        return _late(effect, now, last_seq) or (Plan.RUN, None)
    if spec.reconcile is not None:
        return Plan.RECONCILE, None
    if spec.idempotent:
        late = _late(effect, now, last_seq)
        if late is not None:
            return Plan.PARK, f"in doubt, and {late[1]}: not re-run even by key"
        if effect.attempts >= spec.max_attempts:
            return Plan.PARK, f"re-run by key {effect.attempts} times (max_attempts), outcome still unknown"
        return Plan.RUN, None
    return Plan.PARK, (
        f"attempt {effect.attempts} may or may not have taken effect, and {effect.name!r} has "
        f"neither reconcile nor idempotent=True: never re-run blindly"
    )


def claim_changes(effect: ScheduledEffect, chosen: Plan, reason: str | None, policy: DeliveryPolicy,
                  now: float) -> Changes:
    """What the claim transaction writes for ``chosen`` (before any call)."""
    if chosen is Plan.EXPIRE:
        return {"state": _S.EXPIRED, "reason": reason, "lease_owner": None}
    if chosen is Plan.SUPERSEDE:
        return {"state": _S.SUPERSEDED, "reason": reason, "lease_owner": None}
    if chosen is Plan.PARK:
        return {"state": _S.UNKNOWN, "reason": reason, "lease_owner": None}
    lease: Changes = {"state": _S.RUNNING, "due_at": claim_until(policy, now), "lease_owner": policy.owner}
    if effect.reason is not None and effect.reason.startswith(RATE_WAIT):
        lease["reason"] = None  # its wait for a start is over
    if chosen is Plan.RUN:
        lease["attempts"] = effect.attempts + 1
    elif effect.state is _S.RUNNING:
        lease["failures"] = 1  # its runner died mid-call: a new episode of doubt starts here
    return lease


@dataclass(frozen=True, slots=True)
class Claim:
    """An effect an executor took up: as claimed (``running`` for a call or
    a reconcile, or already final), what was chosen, and why (a final plan)."""

    effect: ScheduledEffect
    chosen: Plan
    reason: str | None


_CLAIMED = {Plan.RUN: Transition.CLAIMED, Plan.RECONCILE: Transition.RECONCILING, Plan.EXPIRE: Transition.EXPIRED,
            Plan.SUPERSEDE: Transition.SUPERSEDED, Plan.PARK: Transition.PARKED}


#: The ``reason`` of a pending effect while it waits for a start under its
#: name's ``rate_limit``: the mark that it already has its ``rate_limited``
#: history row for this wait (cleared when it is claimed).
RATE_WAIT = "rate_limited: "

Starts = tuple[int, float | None, float | None]  # in the window: how many, the first, the last


def rate_window(rate_limit: tuple[int, float]) -> float:
    """The window a name's starts are counted in: ``period`` and half the
    spacing more, so that any ``count + 1`` starts span more than ``period``
    by a margin that absorbs the jitter between a start and its arrival at
    the provider (see docs/effects.md, "Rate limits that spread")."""
    count, period = rate_limit
    return period + period / count / 2


def rate_free_at(rate_limit: tuple[int, float], starts: Starts) -> float | None:
    """When the next start of a name with ``rate_limit = (count, period)`` may
    be, given its starts in the last :func:`rate_window` (None: now).  Starts
    are at least ``period / count`` apart, and at most ``count`` fall in any
    window of :func:`rate_window` (by start time): the next is due no sooner
    than the previous plus the spacing, nor, with ``count`` in the window,
    than the first of them plus the window."""
    count, period = rate_limit
    started, first, last = starts
    free_at = None if last is None else last + period / count
    if started >= count and first is not None:
        free_at = max(first + rate_window(rate_limit), free_at or first)
    return free_at


def claim_in(unit: EffectUnit, specs: Mapping[str, EffectSpec], policy: DeliveryPolicy, now: float,
             limit: int) -> tuple[list[Claim], int]:
    """Take up to ``limit`` due effects of these registered names in one
    transaction, oldest due first, each with its plan (:func:`plan`) and its
    history.  A name at its ``concurrency`` cap (claims still leased, across
    every executor) is left for later; a call a name's ``rate_limit`` has no
    start for yet (:func:`rate_free_at`, from the starts in the history) is
    put off: the effects so put off in one claim get the next free start
    times, one spacing apart, and an effect writes its ``rate_limited``
    history row once per wait, not on every claim that puts it off again.
    Returns the claims and how many effects began a wait."""
    throttled = sorted(n for n, s in specs.items() if s.concurrency is not None or s.rate_limit is not None)
    if throttled:
        unit.lock_effect_names(throttled)  # PostgreSQL: claimers of a throttled name one at a time
    capped = [n for n in throttled if specs[n].concurrency is not None]
    held = unit.held_effect_counts(capped, now) if capped else {}
    full = {n for n in capped if held.get(n, 0) >= (specs[n].concurrency or 0)}
    starts = {n: unit.effect_starts(n, now - rate_window(s.rate_limit)) for n, s in specs.items() if s.rate_limit}
    put_off: dict[str, int] = {}
    claims: list[Claim] = []
    notes: list[EffectTransition] = []
    for _ in range(len(specs) + limit):  # each round claims, puts off, or closes a name: bounded
        names = [n for n in specs if n not in full]
        wanted = limit - len(claims)
        due = unit.due_effects(now, names, wanted) if names and wanted > 0 else []
        for effect in due:
            name, spec = effect.name, specs[effect.name]
            if name in full:
                continue
            chosen, reason = plan(effect, spec, now, unit.last_seq(effect.flow_id))
            free_at = rate_free_at(spec.rate_limit, starts[name]) if spec.rate_limit and chosen is Plan.RUN else None
            if spec.rate_limit is not None and free_at is not None and free_at > now:
                _put_off(unit, effect, spec.rate_limit, starts[name], free_at, put_off, notes, policy, now)
                continue
            changes = owe_failure(effect, spec, claim_changes(effect, chosen, reason, policy, now), now)
            unit.update_effect(effect.key, changes, now)
            if effect.state is _S.RUNNING:  # its executor died, or stopped renewing
                notes.append(note(effect, Transition.LEASE_EXPIRED, now, effect.lease_owner,
                                  f"its lease ended at {effect.due_at:.3f}"))
            claimed = replace(effect, **changes)
            notes.append(note(claimed, _CLAIMED[chosen], now, policy.owner if changes.get("lease_owner") else None,
                              reason))
            claims.append(Claim(claimed, chosen, reason))
            if chosen not in (Plan.RUN, Plan.RECONCILE):
                continue
            if spec.concurrency is not None:
                held[name] = held.get(name, 0) + 1
                if held[name] >= spec.concurrency:
                    full.add(name)
            if chosen is Plan.RUN and name in starts:
                count, first, _last = starts[name]
                starts[name] = (count + 1, now if first is None else first, now)
        if len(due) < wanted or len(claims) >= limit:
            break
    unit.add_transitions(notes)
    return claims, sum(1 for n in notes if n.transition is Transition.RATE_LIMITED)


def _put_off(unit: EffectUnit, effect: ScheduledEffect, rate_limit: tuple[int, float], starts: Starts,
             free_at: float, put_off: dict[str, int], notes: list[EffectTransition], policy: DeliveryPolicy,
             now: float) -> None:
    """Put a call off to a free start time of its name: the n-th put off in
    this claim to the n-th free time, so they wake one at a time; its history
    row only when this wait begins (its reason is not yet the mark)."""
    count, period = rate_limit
    ahead = put_off.get(effect.name, 0)
    put_off[effect.name] = ahead + 1
    due_at = free_at + ahead * period / count
    if effect.reason is not None and effect.reason.startswith(RATE_WAIT):
        unit.update_effect(effect.key, {"due_at": due_at}, now)  # the same wait: no new row
        return
    reason = f"{RATE_WAIT}{effect.name!r} starts at most {count} per {period:g} s, {period / count:g} s apart"
    unit.update_effect(effect.key, {"due_at": due_at, "reason": reason}, now)
    notes.append(note(effect, Transition.RATE_LIMITED, now, policy.owner, (
        f"{starts[0]} starts of {effect.name!r} in the last {rate_window(rate_limit):g} s (rate_limit {count} per "
        f"{period:g} s, at least "
        f"{period / count:g} s apart): due at {due_at:.3f}"), due_at=due_at))


class Outcome(enum.Enum):
    """How a call of an effect's function ended."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"          # certainly nothing happened
    PERMANENT = "permanent"  # never going to work
    UNKNOWN = "unknown"      # may or may not have happened


def _succeeded(spec: EffectSpec, result: Any) -> Changes:
    try:
        text = check_json_value("result", result)
    except InvalidEnvelope as exc:
        # It ran, but what it returned cannot be kept: never run it again.
        return {"state": _S.UNKNOWN, "lease_owner": None, "last_error": str(exc)[:1000],
                "reason": "it ran, but its result is not JSON; resolve it by hand"}
    return {"state": _S.SUCCEEDED, "result": text, "failures": 0, "lease_owner": None, "last_error": None,
            "fed": False if spec.feedback is not None else None}


def after_run(effect: ScheduledEffect, spec: EffectSpec, policy: DeliveryPolicy, now: float, outcome: Outcome,
              value: Any) -> Changes:
    """What a finished call leaves (``effect`` as claimed; ``value`` the
    result or the exception), with its failure step owed when it failed
    for good (:func:`owe_failure`)."""
    return owe_failure(effect, spec, _after_run(effect, spec, policy, now, outcome, value), now)


def _after_run(effect: ScheduledEffect, spec: EffectSpec, policy: DeliveryPolicy, now: float, outcome: Outcome,
               value: Any) -> Changes:
    if outcome is Outcome.SUCCEEDED:
        return _succeeded(spec, value)
    if outcome is Outcome.PERMANENT:
        return {"state": _S.DEAD, "lease_owner": None, "last_error": error_text(value),
                "reason": "permanent failure"}
    if outcome is Outcome.UNKNOWN:
        # A new episode of doubt: its reconcile tries are counted from here
        # (failures = 1), whatever failed before.
        doubt = retry_after(policy, 0, now, value)
        return {"state": _S.IN_DOUBT, "failures": doubt.failures, "due_at": doubt.due_at,
                "lease_owner": None, "last_error": doubt.error}
    retry = retry_after(policy, effect.failures, now, value)
    if effect.attempts >= spec.max_attempts:
        return {"state": _S.DEAD, "failures": retry.failures, "lease_owner": None, "last_error": retry.error,
                "reason": f"failed {effect.attempts} of max_attempts={spec.max_attempts} times"}
    after = getattr(value, "after", None)  # RetryLater(after=...): the provider's Retry-After, not the backoff
    return {"state": _S.PENDING, "failures": retry.failures,
            "due_at": retry.due_at if after is None else now + after, "lease_owner": None,
            "last_error": retry.error}


def after_timeout(effect: ScheduledEffect, spec: EffectSpec, policy: DeliveryPolicy, now: float) -> Changes:
    """What a call that outlived its ``timeout`` leaves: in doubt, as any call
    that may have happened, but still held by its executor (``lease_owner``
    and a lease that it renews) until the call really returns, so nothing
    reconciles or re-runs it while it may still be running."""
    assert spec.timeout is not None
    doubt = retry_after(policy, 0, now, TimeoutError(f"timed out after {spec.timeout:g} s"))
    return {"state": _S.IN_DOUBT, "failures": doubt.failures, "due_at": claim_until(policy, now),
            "lease_owner": policy.owner, "last_error": doubt.error}


def holds(held: ScheduledEffect | None, owner: str) -> bool:
    """Whether ``owner`` holds the effect: a claim in progress (``running``),
    or a timed-out call that has not returned yet (``in_doubt``, still
    leased to it)."""
    return held is not None and held.lease_owner == owner and held.state in (_S.RUNNING, _S.IN_DOUBT)


def after_reconcile(effect: ScheduledEffect, spec: EffectSpec, policy: DeliveryPolicy, now: float,
                    answer: object) -> Changes:
    """What a reconcile answer leaves: ``Happened`` settles it, ``NotHappened``
    lets it run again (or makes it dead once ``max_attempts`` attempts are
    used up), anything else (an exception) keeps it in doubt, until
    ``max_attempts`` reconciles in a row could not tell: then it is parked as
    unknown.  A failure for good owes its failure step (:func:`owe_failure`)."""
    return owe_failure(effect, spec, _after_reconcile(effect, spec, policy, now, answer), now)


def _after_reconcile(effect: ScheduledEffect, spec: EffectSpec, policy: DeliveryPolicy, now: float,
                     answer: object) -> Changes:
    if isinstance(answer, Happened):
        return _succeeded(spec, answer.result)
    if isinstance(answer, NotHappened):
        if effect.attempts >= spec.max_attempts:
            return {"state": _S.DEAD, "lease_owner": None, "reason": (
                f"reconcile says attempt {effect.attempts} did not happen, and max_attempts="
                f"{spec.max_attempts} are used up"
            )}
        return {"state": _S.PENDING, "due_at": now, "lease_owner": None, "last_error": None}
    exc = answer if isinstance(answer, BaseException) else TypeError(
        f"reconcile must return Happened or NotHappened, got {type(answer).__name__}"
    )
    retry = retry_after(policy, effect.failures, now, exc)
    tries = retry.failures - 1  # the doubt itself counted as the first failure
    if tries >= spec.max_attempts:
        return {"state": _S.UNKNOWN, "failures": retry.failures, "lease_owner": None, "last_error": retry.error,
                "reason": f"reconcile could not tell in {tries} tries (max_attempts)"}
    return {"state": _S.IN_DOUBT, "failures": retry.failures, "due_at": retry.due_at, "lease_owner": None,
            "last_error": retry.error}


def feedback_event_id(key: str, suffix: str = "result") -> str:
    """The event id an effect's result is advanced under: ``<key>:result``,
    or a digest of the key when that would pass the 128-character limit."""
    event_id = f"{key}:{suffix}"
    if len(event_id) <= 128:
        return event_id
    return "effect-" + hashlib.sha256(key.encode("utf-8")).hexdigest() + f":{suffix}"


def failure_event_id(key: str) -> str:
    """The event id an effect's failure step is advanced under:
    ``<key>:failure`` (or a digest of the key, as :func:`feedback_event_id`):
    one per effect, so it is fed once whatever happens to the effect later."""
    return feedback_event_id(key, "failure")


#: The states an effect fails in for good (``unknown`` waits for an operator
#: first, ``Feedback.unknown_after``): each feeds the failure step, if any.
FAILED = (_S.DEAD, _S.UNKNOWN, _S.CANCELLED, _S.EXPIRED, _S.SUPERSEDED)


def owe_failure(effect: ScheduledEffect, spec: EffectSpec | None, changes: Changes, now: float) -> Changes:
    """``changes`` with the failure step owed (``fed`` False) when they leave
    the effect failed and its feedback has ``on_failure``; ``spec`` None (an
    operator, who has no registry) owes it always, and an executor whose
    registry asks nothing clears it.  Once fed (``fed`` True on an effect not
    succeeded) it is never owed again.  An ``unknown`` effect owes it only
    with ``unknown_after``, then due that many seconds from now (its
    ``due_at``, which nothing else reads while it is unknown)."""
    state = _S(changes.get("state", effect.state))
    if state not in FAILED or effect.fed is True:
        return changes
    feedback = None if spec is None else spec.feedback
    if spec is not None and (feedback is None or feedback.on_failure is None):
        return changes
    if state is _S.UNKNOWN:
        if feedback is None or feedback.unknown_after is None:
            return changes
        return {**changes, "fed": False, "due_at": now + feedback.unknown_after}
    return {**changes, "fed": False}


def failure_of(effect: ScheduledEffect) -> dict[str, Any]:
    """What a failure step says by default (and what ``on_failure``'s payload
    function is given): the effect's ``key``, the state it failed in
    (``effect_state``: ``state`` is a flow's own key), why (``reason``) and
    its last ``error``; each of the last two left out when there is none (a
    refused feedback's text is not the effect's error)."""
    error = effect.last_error
    if error is not None and error.startswith(FEEDBACK_REFUSED):
        error = None
    said = {"key": effect.key, "effect_state": effect.state.value, "reason": effect.reason, "error": error}
    return {name: value for name, value in said.items() if value is not None}


#: How every refused feedback's ``last_error`` begins: the executor writes
#: it, and ``core.operate.feedback_refused`` recognises it (no column says so).
FEEDBACK_REFUSED = "feedback "


def feedback_refusal(result: AdvanceResult, failure: bool = False) -> str | None:
    """None when a fed-back result is in the flow (committed now or before),
    else why it was refused (the effect's ``last_error``; tried again later).
    A failure step (``failure``) whose event id holds another body is in the
    flow too: it was fed once, when the effect first failed (an operator
    retried it since, and it failed again in other words)."""
    if result.status in (AdvanceStatus.COMMITTED, AdvanceStatus.EXISTING):
        return None
    if failure and result.status is AdvanceStatus.CONFLICT:
        return None
    return f"{FEEDBACK_REFUSED}{result.status}: {result.reason}"


def fed_back_in(unit: EffectUnit, effect: ScheduledEffect, refused: str | None, now: float, owner: str) -> None:
    """Record a feedback: fed (``refused`` None), or refused (why: the
    effect's ``last_error``, tried again later)."""
    if refused is None:
        unit.update_effect(effect.key, {"fed": True}, now)
        event_id = feedback_event_id(effect.key) if effect.state is _S.SUCCEEDED else failure_event_id(effect.key)
        unit.add_transitions([note(effect, Transition.FED_BACK, now, owner, f"advanced as {event_id}")])
    else:
        unit.update_effect(effect.key, {"last_error": refused[:1000]}, now)
        unit.add_transitions([note(effect, Transition.FEEDBACK_REFUSED, now, owner, refused)])


def lease_held(held: ScheduledEffect | None, owner: str) -> bool:
    """Whether an executor's claim on an effect is still its own: when the
    lease ran out during the call and another executor took the effect up,
    the outcome is not recorded (lease_seconds must exceed the function's
    own timeout)."""
    return held is not None and held.state is _S.RUNNING and held.lease_owner == owner


def record_outcome_in(unit: EffectUnit, effect: ScheduledEffect, chosen: Plan, owner: str, changes: Changes,
                      now: float, ended: str) -> bool:
    """Write how a call (``chosen`` RUN) or a reconcile ended while the claim
    is still ``owner``'s, with its history (``ended``: how, in words); False
    when the lease was lost (only that is recorded: the outcome is discarded)."""
    called = Transition.RECONCILED if chosen is Plan.RECONCILE else Transition.CALLED
    if not lease_held(unit.effect(effect.key), owner):
        unit.add_transitions([note(effect, Transition.LEASE_LOST, now, owner,
                                   f"outcome discarded ({ended}): another executor holds the effect")])
        return False
    unit.update_effect(effect.key, changes, now)
    unit.add_transitions([note(effect, called, now, owner, ended), _left(effect, changes, now, owner)])
    return True


def time_out_in(unit: EffectUnit, effect: ScheduledEffect, spec: EffectSpec, policy: DeliveryPolicy,
                now: float) -> bool:
    """A call outlived its ``timeout``: record it in doubt, still held
    (:func:`after_timeout`); False (nothing written) when the claim was lost."""
    if not lease_held(unit.effect(effect.key), policy.owner):
        return False
    changes = after_timeout(effect, spec, policy, now)
    unit.update_effect(effect.key, changes, now)
    unit.add_transitions([note(effect, Transition.TIMED_OUT, now, policy.owner,
                               f"no answer after {spec.timeout:g} s: in doubt, held until the call returns")])
    return True


def renew_in(unit: EffectUnit, key: str, owner: str, until: float, now: float) -> bool:
    """Extend ``owner``'s lease on the effect to ``until``; False (nothing
    written) when the claim is no longer its own.  Not a transition: no
    history row."""
    if not holds(unit.effect(key), owner):
        return False
    unit.update_effect(key, {"due_at": until}, now)
    return True


def release_in(unit: EffectUnit, effect: ScheduledEffect, owner: str, now: float) -> bool:
    """A timed-out call returned: let go of the held doubt, due now for its
    reconcile or re-run.  Its outcome is not recorded."""
    held = unit.effect(effect.key)
    if not holds(held, owner) or held is None or held.state is not _S.IN_DOUBT:
        return False
    unit.update_effect(effect.key, {"lease_owner": None, "due_at": now}, now)
    unit.add_transitions([note(held, Transition.RELEASED, now, owner,
                               "the timed-out call returned; its outcome is discarded", due_at=now)])
    return True


def note(effect: ScheduledEffect, transition: Transition, at: float, owner: str | None = None,
         detail: str | None = None, attempt: int | None = None, due_at: float | None = None) -> EffectTransition:
    """A history row of ``effect`` (its attempts so far unless ``attempt``;
    ``due_at``: when the transition left it due again, if it did)."""
    return EffectTransition(effect.key, effect.name, at, transition,
                            effect.attempts if attempt is None else attempt, owner,
                            None if detail is None else detail[:1000], due_at)


_LEFT = {_S.SUCCEEDED: Transition.SUCCEEDED, _S.PENDING: Transition.RETRY_PLANNED, _S.IN_DOUBT: Transition.IN_DOUBT,
         _S.DEAD: Transition.DEAD, _S.UNKNOWN: Transition.PARKED}


def _left(effect: ScheduledEffect, changes: Changes, now: float, owner: str) -> EffectTransition:
    """The history row of what an outcome left."""
    state = _S(changes["state"])
    attempts = changes.get("attempts", effect.attempts)
    due_at: float | None = None
    if state is _S.PENDING or state is _S.IN_DOUBT:
        due_at = float(changes["due_at"])
        detail = f"due at {due_at:.3f}"
        if changes.get("last_error"):
            detail += f": {changes['last_error']}"
    else:
        detail = str(changes.get("reason") or changes.get("last_error") or "")
    return note(effect, _LEFT[state], now, owner, detail or None, attempts, due_at)


def ended_words(outcome: Outcome | None, value: Any) -> str:
    """How a call (``outcome``) or a reconcile (``outcome`` None: ``value``
    is its answer) ended, for the history."""
    if outcome is None:
        if isinstance(value, Happened):
            return "reconcile: it happened"
        if isinstance(value, NotHappened):
            return "reconcile: it did not happen"
        return f"reconcile: could not tell: {error_text(value) if isinstance(value, BaseException) else value!r}"
    if outcome is Outcome.SUCCEEDED:
        return "returned"
    return f"{outcome.value}: {error_text(value)}"


#: The states an apply handler may cancel an effect from (an operator may
#: cancel from more: :data:`reliable_flow._core.admin.EFFECT_ACTIONS`).
HANDLER_CANCELS_FROM = (_S.PENDING,)


def cancel_in(unit: EffectUnit, key: str, reason: str, now: float, effects: EffectRegistry | None = None) -> None:
    """An apply handler's cancel of an effect (in the apply transaction);
    its failure step owed as the consumer's registry ``effects`` says
    (:func:`owe_failure`; without a registry, nothing is owed)."""
    effect = unit.effect(key)
    if effect is None:
        raise UnknownEffect(f"no effect with key {key!r}")
    if effect.state not in HANDLER_CANCELS_FROM:
        raise NotResolvable(f"effect {key!r} is {effect.state}; only a pending effect can be cancelled here")
    changes: Changes = {"state": _S.CANCELLED, "reason": reason}
    if effects is not None:
        changes = owe_failure(effect, effects.get(effect.name), changes, now)
    unit.update_effect(key, changes, now)
    unit.add_transitions([note(effect, Transition.CANCELLED, now, detail=f"by its apply handler: {reason}")])


def default_key(consumer: str, event_id: str, name: str) -> str:
    """The idempotency key of an effect the handler did not name one for."""
    return f"{consumer}:{event_id}:{name}"


def schedule_in(unit: EffectUnit, new: NewEffect) -> ScheduledEffect | None:
    """Write a scheduled effect, once.  The same key with the same name and
    payload is a no-op (an apply retried after an unknown commit outcome);
    with anything else it raises :class:`EffectKeyConflict`, like an event id
    conflict, and the apply rolls back."""
    held = unit.add_effect(new)
    if held is None:
        # Due from its scheduling on (the outbox row's due_at 0 means "at once"), or from
        # the time a delayed effect asked for: no claim takes it up before (``due_effects``).
        due = new.created_at if new.due_at is None else new.due_at
        unit.add_transitions([EffectTransition(new.key, new.name, new.created_at, Transition.SCHEDULED, 0,
                                               due_at=due)])
        return None
    same = (held.name, envelope.canonical(held.payload), held.event_id, held.deadline, held.version, held.ordered) == (
        new.name, new.payload, new.event_id, new.deadline, new.version, new.ordered
    )
    if not same:
        raise EffectKeyConflict(
            f"effect key {new.key!r} is already held by {held.name!r} of event {held.event_id!r} "
            f"with a different name, payload, event, deadline, version or order; give each effect its own key"
        )
    return held


# -- an ordered effect waits for the earlier unresolved ones of its flow ---------------------------

#: An ordered effect waits while an earlier ordered effect of its flow is in one
#: of these states: never taken up by an executor (``EffectUnit.due_effects``,
#: whose SQL in each engine says the same) until that one is resolved.
ORDER_BLOCKING = (_S.PENDING, _S.RUNNING, _S.IN_DOUBT, _S.DEAD, _S.UNKNOWN)
_TAKEN_UP = (_S.PENDING, _S.RUNNING, _S.IN_DOUBT)  # the states an executor claims from


def waiting_behind(effect: ScheduledEffect, flow_effects: Sequence[ScheduledEffect]) -> ScheduledEffect | None:
    """The earliest ordered effect scheduled before ``effect`` in its flow that
    it waits behind (``flow_effects``: the flow's effects in scheduling
    order), or None when it does not wait (not ordered, already final, or
    nothing unresolved before it)."""
    if not effect.ordered or effect.state not in _TAKEN_UP:
        return None
    for earlier in flow_effects:
        if earlier.key == effect.key:
            return None
        if earlier.ordered and earlier.state in ORDER_BLOCKING:
            return earlier
    return None


def with_waits(reads: EffectReads, effects: Sequence[ScheduledEffect]) -> list[ScheduledEffect]:
    """``effects`` with ``waiting_behind`` / ``waiting_behind_state`` filled in
    (their flows' effects read from ``reads``; pass the reads the effects
    came from, for one picture)."""
    flows = {e.flow_id for e in effects if e.ordered and e.state in _TAKEN_UP}
    by_flow = {flow: reads.effect_list(flow_id=flow) for flow in sorted(flows)}
    out = []
    for effect in effects:
        blocker = waiting_behind(effect, by_flow.get(effect.flow_id, ()))
        out.append(effect if blocker is None else
                   replace(effect, waiting_behind=blocker.key, waiting_behind_state=blocker.state))
    return out
