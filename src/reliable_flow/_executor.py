"""The effect executor: runs the side effects apply handlers scheduled, each
exactly once in effect, and feeds results back into a producer.

One effect at a time: a durable claim (the effect is ``running`` under a
lease, so a crash during the call is known to have maybe happened), the call
with its idempotency key, then the outcome recorded in one transaction.  The
decisions -- run, reconcile, expire, supersede, park, and what each outcome
leaves -- are in :mod:`reliable_flow._core.effects`; leases and backoff come
from :mod:`reliable_flow.delivery`, as for deliveries.

Guaranteed: the function is called at least once for an effect that is not
cancelled, expired or superseded first; it is never called again after an
attempt that may have taken effect unless reconcile said it did not, or the
effect is idempotent by key (the target deduplicates).  Not guaranteed: that
the function is called at most once (a crash after the call and before the
record means a call in doubt), or anything about an effect function that
does not respect its own timeout.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ._checks import check_count, check_flag, check_optional_count
from ._consumer import Consumer
from ._core.effects import (
    FEEDBACK_REFUSED,
    Outcome,
    Plan,
    after_reconcile,
    after_run,
    claim_changes,
    feedback_event_id,
    feedback_refusal,
    plan,
    record_outcome_in,
)
from ._effects import (
    EffectCall,
    EffectRegistry,
    EffectSpec,
    OutcomeUnknown,
    PermanentFailure,
    RetryLater,
)
from ._loop import CANNOT_HEAL, Loop, until_due
from ._observe import EXECUTOR, INFO, WARNING, fields, log
from ._producer import Producer
from .crash import crash_point
from .delivery import DEFAULT_LEASE_SECONDS, DeliveryPolicy, check_seconds, error_text, own_claims
from .statuses import EffectState, ScheduledEffect
from .tracing import traced

__all__ = ["EffectExecutor", "ExecutorStats"]

_FINAL = {Plan.EXPIRE: EffectState.EXPIRED, Plan.SUPERSEDE: EffectState.SUPERSEDED, Plan.PARK: EffectState.UNKNOWN}
_ALARMING = (EffectState.DEAD, EffectState.UNKNOWN)


@dataclass
class ExecutorStats:
    """Running totals of one executor object (this process only)."""

    passes: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    fed: int = 0
    feedback_errors: int = 0
    errors: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "outcomes": dict(sorted(self.outcomes.items())), "fed": self.fed,
                "feedback_errors": self.feedback_errors, "errors": self.errors, "last_error": self.last_error}


class EffectExecutor:
    """Claims due effects of ``consumer``'s effect outbox and runs them.

    ``effects``: the registry (default: the consumer's); only registered
    names are claimed.  ``policy``: lease (default
    :data:`~reliable_flow.delivery.DEFAULT_LEASE_SECONDS`, 30 s), backoff,
    clock and random source, as for deliveries.  ``producer``: where effects
    registered with ``feedback=`` advance their results.

    Each executor claims under an owner of its own (``owner``:
    ``<policy.owner>/<random hex>``, also in ``self.policy``), even when
    several are given one policy object: an executor records an outcome only
    while the claim is still its own, so one executor's late outcome never
    overwrites another's live claim.
    """

    def __init__(
        self, consumer: Consumer, effects: EffectRegistry | None = None, *, policy: DeliveryPolicy | None = None,
        producer: Producer | None = None,
    ) -> None:
        if not isinstance(consumer, Consumer):
            raise TypeError(f"consumer must be a Consumer, got {type(consumer).__name__}")
        registry = effects if effects is not None else consumer.effect_registry
        if not isinstance(registry, EffectRegistry):
            raise TypeError("effects must be an EffectRegistry (or given to the Consumer)")
        if policy is None:
            policy = DeliveryPolicy(lease_seconds=DEFAULT_LEASE_SECONDS)
        if not isinstance(policy, DeliveryPolicy) or policy.lease_seconds is None:
            raise ValueError("policy must be a DeliveryPolicy with lease_seconds: an effect is always claimed")
        if producer is not None and not isinstance(producer, Producer):
            raise TypeError(f"producer must be a Producer or None, got {type(producer).__name__}")
        self.consumer = consumer
        self.effects = registry
        self.policy = own_claims(policy)
        self.producer = producer
        self.stats = ExecutorStats()
        self._loop = Loop()
        self._running = False  # inside run(): a stop or signal ends run_once after the call in progress

    @property
    def owner(self) -> str:
        """The name this executor's claims are recorded under (``lease_owner``), its own."""
        return self.policy.owner

    def run_once(self, limit: int = 100) -> int:
        """Feed back results still owed, then take up to ``limit`` due effects
        one by one; returns how many were taken up (0: nothing due)."""
        check_count("limit", limit)
        self._feed_owed(limit)
        done = 0
        while done < limit and not (self._running and self._loop.stopping):
            claimed = self._claim()
            if claimed is None:
                break
            done += 1
            effect, chosen = claimed
            if chosen in (Plan.RUN, Plan.RECONCILE):
                self._execute(effect, chosen)
        self.stats.passes += 1
        return done

    def run_until_idle(self, max_passes: int = 1000) -> int:
        """``run_once`` until nothing is due now (at most ``max_passes``, an
        int >= 1); returns the effects taken up.  Never waits: an effect
        leased or backing off is left for later (:meth:`run` waits them out)."""
        check_count("max_passes", max_passes)
        total = 0
        for _ in range(max_passes):
            done = self.run_once()
            total += done
            if done == 0:
                break
        return total

    def stop(self) -> None:
        """Ask :meth:`run` to return once the call in progress is recorded."""
        self._loop.stop()

    def run(
        self, *, until_idle: bool = False, max_passes: int | None = None, idle_sleep: float = 0.5,
        limit: int = 100, handle_signals: bool = True,
    ) -> ExecutorStats:
        """``run_once(limit)`` in a loop until :meth:`stop`, SIGTERM / SIGINT,
        or ``max_passes`` passes; returns the totals.

        Stopping works as for ``Worker.run`` (one mechanism,
        :mod:`reliable_flow._loop`): with ``handle_signals`` (main thread
        only) SIGTERM and SIGINT only set a flag, so the call in progress
        finishes and its outcome is recorded, no further effect is claimed,
        and ``run`` returns; the previous handlers are put back.  After a
        pass that took nothing up it sleeps ``idle_sleep`` seconds.

        ``until_idle``: return once a pass took nothing up and no effect of
        this registry is pending, running or in doubt; while one waits (a
        lease, a backoff) sleep until it is due, so those are waited out.
        What waits for a person (``unknown``, ``dead``) does not count, nor
        does a refused feedback (tried again on every pass while it runs).

        A failed pass (a storage error, the producer unreachable) is counted
        in ``stats.errors`` / ``stats.last_error`` and tried again after the
        idle sleep; an error retrying cannot heal
        (:data:`~reliable_flow._loop.CANNOT_HEAL`) is raised after counting it.
        """
        check_flag("until_idle", until_idle)
        check_flag("handle_signals", handle_signals)
        check_optional_count("max_passes", max_passes)
        check_seconds("idle_sleep", idle_sleep, allow_zero=True)
        check_count("limit", limit)
        self._running = True
        try:
            self._loop.run(lambda: self._pass(limit), lambda: self._waiting(float(idle_sleep)),
                           idle_sleep=float(idle_sleep), max_passes=max_passes, handle_signals=handle_signals,
                           until_idle=until_idle)
        finally:
            self._running = False
        return self.stats

    def _pass(self, limit: int) -> int:
        try:
            return self.run_once(limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            self._failed(exc)
            return 0

    def _waiting(self, idle_sleep: float) -> float | None:
        """Seconds until the earliest open effect is due (bounded), or None when none waits."""
        try:
            at = self.consumer.store.latest.next_effect_due_at(list(self.effects))
        except Exception as exc:  # noqa: BLE001 - recorded; look again after the idle sleep
            self._failed(exc)
            return idle_sleep
        return until_due([] if at is None else [at - self.policy.clock()])

    def _failed(self, exc: Exception) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        if EXECUTOR.isEnabledFor(WARNING):
            log(EXECUTOR, WARNING, "error in the effect executor, going on",
                fields(status="error", consumer=self.consumer.name, error=self.stats.last_error))
        if isinstance(exc, CANNOT_HEAL):
            raise exc

    # -- one effect ---------------------------------------------------------------------

    def _claim(self) -> tuple[ScheduledEffect, Plan] | None:
        now = self.policy.clock()
        with self.consumer.store.write() as unit:
            due = unit.due_effects(now, list(self.effects), 1)
            if not due:
                return None
            effect = due[0]
            spec = self._spec(effect)
            chosen, reason = plan(effect, spec, now, unit.last_seq(effect.flow_id))
            claimed = claim_changes(effect, chosen, reason, self.policy, now)
            unit.update_effect(effect.key, claimed, now)
        if chosen not in (Plan.RUN, Plan.RECONCILE):
            self.stats.outcomes[_FINAL[chosen].value] += 1
            self._observe(effect, _FINAL[chosen], str(chosen), reason=reason)
            return effect, chosen
        crash_point("executor.after_claim")
        return _with(effect, **claimed), chosen

    @traced("reliable_flow.effect", lambda self, effect, chosen: {
        "reliable_flow.effect_key": effect.key, "reliable_flow.event_id": effect.event_id,
        "reliable_flow.flow_id": effect.flow_id, "reliable_flow.seq": effect.seq, "reliable_flow.plan": str(chosen)})
    def _execute(self, effect: ScheduledEffect, chosen: Plan) -> EffectState | None:
        """Call (or reconcile) one claimed effect and record the outcome; the new state."""
        spec = self._spec(effect)
        call = EffectCall(effect.key, effect.name, effect.payload, effect.meta, effect.attempts,
                          effect.flow_id, effect.event_id)
        now_before = self.policy.clock()
        if chosen is Plan.RECONCILE:
            assert spec.reconcile is not None
            try:
                answer: object = spec.reconcile(call)
            except Exception as exc:  # noqa: BLE001 - "could not tell", recorded
                answer = exc
            crash_point("executor.after_call")
            now = max(now_before, self.policy.clock())
            changes = after_reconcile(effect, spec, self.policy, now, answer)
        else:
            outcome, value = _call(spec, call)
            crash_point("executor.after_call")
            now = max(now_before, self.policy.clock())
            changes = after_run(effect, spec, self.policy, now, outcome, value)
        with self.consumer.store.write() as unit:
            recorded = record_outcome_in(unit, effect.key, self.policy.owner, changes, now)
        if not recorded:  # another executor took the effect up: its record is kept
            self.stats.outcomes["lease_lost"] += 1
            self._observe(effect, None, "lease_lost", level=WARNING)
            return None
        crash_point("executor.after_commit")
        state = EffectState(changes["state"])
        self.stats.outcomes[state.value if chosen is Plan.RUN else f"reconciled_{state.value}"] += 1
        if changes.get("last_error"):
            self.stats.last_error = f"{effect.key}: {changes['last_error']}"
        self._observe(effect, state, str(chosen), error=changes.get("last_error"), attempts=changes.get("attempts"))
        if state is EffectState.SUCCEEDED and changes.get("fed") is False:
            stored = self.consumer.store.latest.effect(effect.key)
            if stored is not None:
                self._feed(stored)
        return state

    def _observe(self, effect: ScheduledEffect, state: EffectState | None, plan_name: str, level: int | None = None,
                 **more: Any) -> None:
        """Log an effect's outcome: INFO, or WARNING when it is dead or unknown (an operator's turn)."""
        if level is None:
            level = WARNING if state in _ALARMING else INFO
        if EXECUTOR.isEnabledFor(level):
            log(EXECUTOR, level, f"effect {effect.name}: {state or plan_name}",
                fields(effect.event_id, effect.flow_id, effect.seq, state or plan_name, self.consumer.name,
                       effect.meta, key=effect.key, effect=effect.name, plan=plan_name, **more))

    def _advance_result(self, event_id: str, flow_id: str, kind: str, payload: Any,
                        meta: dict[str, str]) -> str | None:
        """Advance in one producer transaction at the flow's current seq; None
        when the step is in the flow (now or before), else why not."""
        assert self.producer is not None
        return feedback_refusal(self.producer._advance_at_current(
            event_id, flow_id, kind=kind, payload=payload, meta=meta or None))

    def _spec(self, effect: ScheduledEffect) -> EffectSpec:
        spec = self.effects.get(effect.name)
        assert spec is not None, effect.name  # only registered names are claimed
        return spec

    # -- feedback -----------------------------------------------------------------------

    def _feed_owed(self, limit: int) -> None:
        if self.producer is None:
            return
        for effect in self.consumer.store.latest.unfed_effects(limit):
            if self.effects.get(effect.name) is not None:
                self._feed(effect)

    def _feed(self, effect: ScheduledEffect) -> None:
        """Advance the result into the producer, then mark it fed.  A crash in
        between re-advances the same event id, which answers ``existing``."""
        spec = self._spec(effect)
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
                refused = self._advance_result(feedback_event_id(effect.key), flow_id, feedback.kind, payload,
                                               effect.meta)
            except (ValueError, TypeError) as exc:  # InvalidEnvelope: the result does not make a valid step
                refused = f"{FEEDBACK_REFUSED}refused: {error_text(exc)}"
        now = self.policy.clock()
        with self.consumer.store.write() as unit:
            if refused is None:
                unit.update_effect(effect.key, {"fed": True}, now)
                self.stats.fed += 1
            else:
                unit.update_effect(effect.key, {"last_error": refused[:1000]}, now)
                self.stats.feedback_errors += 1
                self.stats.last_error = f"{effect.key}: {refused}"
        if refused is not None:
            self._observe(effect, None, "feedback_refused", level=WARNING, error=refused)


def _call(spec: EffectSpec, call: EffectCall) -> tuple[Outcome, Any]:
    """Call the function and classify how it ended.  Anything not known to
    have left nothing behind counts as "may have happened"."""
    try:
        return Outcome.SUCCEEDED, spec.run(call)
    except RetryLater as exc:
        return Outcome.RETRY, exc
    except PermanentFailure as exc:
        return Outcome.PERMANENT, exc
    except (OutcomeUnknown, TimeoutError) as exc:
        return Outcome.UNKNOWN, exc
    except Exception as exc:  # noqa: BLE001 - unclassified: it may have happened
        return Outcome.UNKNOWN, RuntimeError(f"unclassified failure, treated as unknown: {error_text(exc)}")


def _with(effect: ScheduledEffect, **changes: Any) -> ScheduledEffect:
    from dataclasses import replace

    return replace(effect, **changes)
