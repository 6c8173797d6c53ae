"""One step of an effect executor's pass, written once for both faces.

:meth:`Stepper.step` makes every decision's store I/O of a step -- feed
back the results still owed, record the calls that ended, renew leases,
time out calls past their ``timeout``, claim due effects and start them --
and returns a :class:`Step`: what it did and when the calls in flight next
need it.  It never waits for a call: the sync executor waits on the
flights' queue between steps, the asyncio one on an event the flights set
(:attr:`~reliable_flow._effects.inflight.Flights.wakers`).  The decisions
-- run, reconcile, expire, supersede, park, and what each outcome leaves --
are in :mod:`reliable_flow._core.effects`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._consumer import Consumer
from .._core.effects import (
    Plan,
    after_reconcile,
    after_run,
    claim_in,
    ended_words,
    record_outcome_in,
    release_in,
    renew_in,
    time_out_in,
)
from .._core.schedules import declare_in, fire_in
from .._loop import CANNOT_HEAL
from .._observe import EXECUTOR, INFO, WARNING, fields, log
from ..crash import crash_point
from ..delivery import DEFAULT_LEASE_SECONDS, DeliveryPolicy, claim_until
from ..records import ExecutorStats, ScheduledEffect
from ..statuses import EffectState
from ..tracing import traced
from .feedback import Feeder, Target
from .inflight import Flight, Flights, acall, areconciled, reconciled
from .inflight import call as call_
from .registry import EffectCall, EffectRegistry, EffectSpec, Lease

__all__ = ["Step", "Stepper"]

_FINAL = {Plan.EXPIRE: EffectState.EXPIRED, Plan.SUPERSEDE: EffectState.SUPERSEDED, Plan.PARK: EffectState.UNKNOWN}
_ALARMING = (EffectState.DEAD, EffectState.UNKNOWN)
_MAX_WAKE = 0.1  # seconds: how long a driver waits for a call before tending the flights again
# A call that ended: the effect as claimed, the plan, its spec and call, the answer, when it started.
_Ended = tuple[ScheduledEffect, Plan, EffectSpec, EffectCall, Any, float]


@dataclass(frozen=True, slots=True)
class Step:
    """What one step did, and when the executor next has work.

    ``work``: calls recorded plus effects taken up; ``taken``: effects taken
    up (claimed); ``wake_in``: seconds until the calls in flight need
    tending (None: no call is waited for; one past its timeout is not);
    ``done``: nothing more for this pass (no call waited for, and nothing
    more due or no room or the limit reached)."""

    work: int
    taken: int
    wake_in: float | None
    done: bool


def _never() -> bool:
    return False


class Stepper:
    """The state and the step of one executor: its flights, its feedback,
    its totals.  Used only from the thread that owns the consumer's store."""

    def __init__(self, consumer: Consumer, effects: EffectRegistry, policy: DeliveryPolicy,
                 producer: Target | None, concurrency: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.consumer, self.effects, self.policy, self.concurrency = consumer, effects, policy, concurrency
        self.owner = policy.owner
        self.stats = ExecutorStats()
        self.flights = Flights(concurrency, loop)
        self.feeder = Feeder(consumer, effects, producer, policy, self.stats, self.observe)

    def step(self, limit: int, *, inline: bool = False, feed: bool = True,
             stopping: Callable[[], bool] = _never) -> Step:
        """Feed back what is owed (``feed``), record what ended, renew and time
        out, then claim and start up to ``limit`` due effects while there is
        room (``inline``: a plain function without timeout runs here and now
        at concurrency 1, as the sync ``run_once`` does); never waits."""
        if feed:
            self.feeder.feed_owed(max(limit, 1))
        recorded = self._tend()
        taken, more = 0, True
        while taken < limit and self.flights.free > 0 and not stopping():
            most, claimed = self._claim(min(limit - taken, self.flights.free))
            if most == 0:
                more = False
                break
            taken += most
            for effect, chosen in claimed:
                self._begin(effect, chosen, inline=inline and self._inline(effect, chosen))
        wake_in = self.wake_in()
        done = wake_in is None and (not more or taken >= limit or stopping() or self.flights.free <= 0)
        return Step(work=recorded + taken, taken=taken, wake_in=wake_in, done=done)

    def declare_schedules(self) -> list[str]:
        """Record the registry's recurring schedules not stored yet (one
        transaction; a name stored with another definition raises
        ``ScheduleConflict`` and nothing is recorded); the names recorded."""
        declared = self.effects.schedules
        if not declared:
            return []
        with self.consumer.store.write() as unit:
            return declare_in(unit, declared, self.policy.clock())

    def wake_in(self) -> float | None:
        """Seconds until the calls in flight need tending (a renewal, a
        timeout; looked at every 0.1 s at least), or None when no call is
        waited for (one past its timeout is not)."""
        if not any(not f.timed_out for f in self.flights.by_key.values()):
            return None
        return self._next_wake()

    def next_due_in(self) -> float | None:
        """Seconds until the earliest open effect of this registry is due (<= 0:
        due now), or None when none waits (what ``until_idle`` waits out)."""
        at = self.consumer.store.latest.next_effect_due_at(list(self.effects))
        return None if at is None else at - self.policy.clock()

    def failed(self, exc: Exception) -> None:
        """Count and log a failed step; raise it again when retrying cannot heal it."""
        self.stats.errors += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        if EXECUTOR.isEnabledFor(WARNING):
            log(EXECUTOR, WARNING, "error in the effect executor, going on",
                fields(status="error", consumer=self.consumer.name, error=self.stats.last_error))
        if isinstance(exc, CANNOT_HEAL):
            raise exc

    # -- one effect ---------------------------------------------------------------------

    def _claim(self, most: int) -> tuple[int, list[tuple[ScheduledEffect, Plan]]]:
        """Claim up to ``most`` due effects in one transaction (caps and rate
        limits decided by the core): how many were taken up, and those to
        call or reconcile, as claimed."""
        now = self.policy.clock()
        specs = {name: self._spec_of(name) for name in self.effects}
        with self.consumer.store.write() as unit:
            fire_in(unit, specs, now)  # the due ticks of the schedules made effects, claimable below
            claims, put_off = claim_in(unit, specs, self.policy, now, most)
        self.stats.rate_limited += put_off
        taken: list[tuple[ScheduledEffect, Plan]] = []
        for claim in claims:
            if claim.chosen in (Plan.RUN, Plan.RECONCILE):
                taken.append((claim.effect, claim.chosen))
                if claim.chosen is Plan.RUN:
                    self.stats.started_by_name[claim.effect.name] += 1
                continue
            self.stats.outcomes[_FINAL[claim.chosen].value] += 1
            self.observe(claim.effect, _FINAL[claim.chosen], str(claim.chosen), reason=claim.reason)
        if taken:
            crash_point("executor.after_claim")
        return len(claims), taken

    def _inline(self, effect: ScheduledEffect, chosen: Plan) -> bool:
        """Today's way at concurrency 1: the call in this thread (an effect
        with a timeout or an ``async def`` function runs off it, always)."""
        spec = self._spec_of(effect.name)
        is_async = spec.is_async if chosen is Plan.RUN else spec.reconcile_is_async
        return self.concurrency == 1 and spec.timeout is None and not is_async

    def _begin(self, effect: ScheduledEffect, chosen: Plan, *, inline: bool) -> None:
        """Call (or reconcile) one claimed effect: here and now, recording the
        outcome, or off this thread as a flight recorded when it ends."""
        spec = self._spec_of(effect.name)
        lease = self._inline_lease(effect.key) if inline else self.flights.lease_for(effect.key)
        call = EffectCall(effect.key, effect.name, effect.payload, effect.meta, effect.attempts,
                          effect.flow_id, effect.event_id, lease)
        now = self.policy.clock()
        if inline:
            answer = reconciled(spec, call) if chosen is Plan.RECONCILE else call_(spec, call)
            self._record([(effect, chosen, spec, call, answer, now)])
            return
        if chosen is Plan.RECONCILE:
            assert spec.reconcile is not None
            fn, is_async = (areconciled if spec.reconcile_is_async else reconciled), spec.reconcile_is_async
        else:
            fn, is_async = (acall if spec.is_async else call_), spec.is_async
        self.flights.start(lambda future: Flight(effect, chosen, spec, call, future, now, now),
                           lambda c: fn(spec, c), call, is_async)
        self.stats.started += 1

    def _tend(self) -> int:
        """Record the calls that ended, renew the leases that need it, time
        out the calls past their timeout; how many calls were recorded."""
        ended: list[_Ended] = []
        for flight in self.flights.finished():
            self.flights.forget(flight.call.key)
            if flight.timed_out:
                self._release(flight)
                continue
            answer = flight.future.result()  # a BaseException here ends the executor, as a death would
            ended.append((flight.effect, flight.chosen, flight.spec, flight.call, answer, flight.started))
        if ended:  # every call that ended meanwhile, recorded in one transaction
            self._record(ended)
        if self.flights.by_key:
            self._renew_due()
            self._time_out_due()
        return len(ended)

    def _renew_due(self) -> None:
        now = self.policy.clock()
        lease = float(self.policy.lease_seconds or DEFAULT_LEASE_SECONDS)
        due = [f for f in self.flights.by_key.values()
               if not f.lease.lost and (f.beat or now - f.renewed >= lease / 3)]
        if not due:
            return
        until = claim_until(self.policy, now)
        with self.consumer.store.write() as unit:
            held = [renew_in(unit, f.call.key, self.owner, until, now) for f in due]
        for flight, ok in zip(due, held):
            if ok and flight.beat:
                self.stats.heartbeats += 1
            flight.renewed, flight.beat = now, False
            if ok:
                self.stats.renewals += 1
            else:
                flight.lease.lost = True
            flight.beaten.set()

    def _inline_lease(self, key: str) -> Lease:
        """The lease of a call running in this thread: a heartbeat renews at once."""
        def renew() -> None:
            now = self.policy.clock()
            with self.consumer.store.write() as unit:
                ok = renew_in(unit, key, self.owner, claim_until(self.policy, now), now)
            if ok:
                self.stats.renewals += 1
                self.stats.heartbeats += 1
            else:
                lease.lost = True

        lease = Lease(renew)
        return lease

    def _time_out_due(self) -> None:
        now = self.policy.clock()
        late = [f for f in self.flights.by_key.values() if not f.timed_out and not f.lease.lost
                and f.spec.timeout is not None and now - f.started >= f.spec.timeout]
        for flight in late:
            with self.consumer.store.write() as unit:
                recorded = time_out_in(unit, flight.effect, flight.spec, self.policy, now)
            flight.timed_out = True
            if not recorded:
                flight.lease.lost = True
                continue
            self.stats.outcomes["timed_out"] += 1
            self.observe(flight.effect, EffectState.IN_DOUBT, "timed_out", error=f"timed out after "
                         f"{flight.spec.timeout:g} s")

    def _release(self, flight: Flight) -> None:
        """A timed-out call returned: its outcome is discarded; the doubt is
        now due for its reconcile or re-run."""
        now = self.policy.clock()
        with self.consumer.store.write() as unit:
            release_in(unit, flight.effect, self.owner, now)
        self.stats.outcomes["late_outcome_discarded"] += 1

    def _next_wake(self) -> float:
        """Seconds to wait for a call to end before tending the flights again:
        until the next lease renewal or timeout, looked at every 0.1 s at
        least (the policy clock may be a test's)."""
        now = self.policy.clock()
        lease = float(self.policy.lease_seconds or DEFAULT_LEASE_SECONDS)
        times = [f.renewed + lease / 3 - now for f in self.flights.by_key.values()]
        times += [f.started + f.spec.timeout - now for f in self.flights.by_key.values()
                  if f.spec.timeout is not None and not f.timed_out]
        return max(0.0, min([_MAX_WAKE, *times]))

    def _record(self, ended: list[_Ended]) -> None:
        """Record how calls (or reconciles) ended, all in one transaction:
        each only while its claim is still this executor's."""
        crash_point("executor.after_call")
        clock = self.policy.clock()
        outcomes = []
        for effect, chosen, spec, call, answer, before in ended:
            now = max(before, clock)
            if chosen is Plan.RECONCILE:
                changes, words = after_reconcile(effect, spec, self.policy, now, answer), ended_words(None, answer)
            else:
                outcome, value = answer
                changes = after_run(effect, spec, self.policy, now, outcome, value)
                words = ended_words(outcome, value)
            outcomes.append((effect, chosen, call, changes, words, now))
        with self.consumer.store.write() as unit:
            recorded = [record_outcome_in(unit, effect, chosen, self.owner, changes, now, words)
                        for effect, chosen, _, changes, words, now in outcomes]
        if any(recorded):
            crash_point("executor.after_commit")
        for (effect, chosen, call, changes, _, _), ok in zip(outcomes, recorded):
            self._recorded(effect, chosen, call, changes, ok)

    @traced("reliable_flow.effect", lambda self, effect, chosen, *a: {
        "reliable_flow.effect_key": effect.key, "reliable_flow.event_id": effect.event_id,
        "reliable_flow.flow_id": effect.flow_id, "reliable_flow.seq": effect.seq, "reliable_flow.plan": str(chosen)})
    def _recorded(self, effect: ScheduledEffect, chosen: Plan, call: EffectCall, changes: dict[str, Any],
                  recorded: bool) -> EffectState | None:
        """Count and log one recorded outcome, and feed its result back; the new state."""
        if not recorded:  # another executor took the effect up: its record is kept
            if call.lease is not None:
                call.lease.lost = True
            self.stats.outcomes["lease_lost"] += 1
            self.observe(effect, None, "lease_lost", level=WARNING)
            return None
        state = EffectState(changes["state"])
        self.stats.outcomes[state.value if chosen is Plan.RUN else f"reconciled_{state.value}"] += 1
        if changes.get("last_error"):
            self.stats.last_error = f"{effect.key}: {changes['last_error']}"
        self.observe(effect, state, str(chosen), error=changes.get("last_error"), attempts=changes.get("attempts"))
        if changes.get("fed") is False and state is not EffectState.UNKNOWN:  # a result or a failure step owed
            stored = self.consumer.store.latest.effect(effect.key)
            if stored is not None:
                self.feeder.feed(stored)
        return state

    def observe(self, effect: ScheduledEffect, state: EffectState | None, plan_name: str, level: int | None = None,
                **more: Any) -> None:
        """Log an effect's outcome: INFO, or WARNING when it is dead or unknown (an operator's turn)."""
        if level is None:
            level = WARNING if state in _ALARMING else INFO
        if EXECUTOR.isEnabledFor(level):
            log(EXECUTOR, level, f"effect {effect.name}: {state or plan_name}",
                fields(effect.event_id, effect.flow_id, effect.seq, state or plan_name, self.consumer.name,
                       effect.meta, key=effect.key, effect=effect.name, plan=plan_name, **more))

    def _spec_of(self, name: str) -> EffectSpec:
        spec = self.effects.get(name)
        assert spec is not None, name  # only registered names are claimed
        return spec
