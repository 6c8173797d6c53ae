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

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from ._checks import check_count, check_flag, check_optional_count
from ._consumer import Consumer
from ._core.effects import (
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
from ._effects import (
    EffectCall,
    EffectRegistry,
    EffectSpec,
    Lease,
)
from ._feedback import Feeder
from ._inflight import Flight, Flights, acall, areconciled, reconciled
from ._inflight import call as call_
from ._loop import CANNOT_HEAL, Loop, until_due
from ._observe import EXECUTOR, INFO, WARNING, fields, log
from ._producer import Producer
from .crash import crash_point
from .delivery import (
    DEFAULT_LEASE_SECONDS,
    DeliveryPolicy,
    check_seconds,
    claim_until,
    own_claims,
)
from .metrics import ExecutorMetrics
from .records import ExecutorStats, ScheduledEffect
from .statuses import EffectState
from .tracing import traced

__all__ = ["EffectExecutor", "ExecutorStats"]

_FINAL = {Plan.EXPIRE: EffectState.EXPIRED, Plan.SUPERSEDE: EffectState.SUPERSEDED, Plan.PARK: EffectState.UNKNOWN}
_ALARMING = (EffectState.DEAD, EffectState.UNKNOWN)
_MAX_WAKE = 0.1  # seconds: how long the executor's thread waits for a call before looking again
# A call that ended: the effect as claimed, the plan, its spec and call, the answer, when it started.
_Ended = tuple[ScheduledEffect, Plan, EffectSpec, EffectCall, Any, float]


class EffectExecutor:
    """Claims due effects of ``consumer``'s effect outbox and runs them.

    ``effects``: the registry (default: the consumer's); only registered
    names are claimed.  ``policy``: lease (default
    :data:`~reliable_flow.delivery.DEFAULT_LEASE_SECONDS`, 30 s), backoff,
    clock and random source, as for deliveries.  ``producer``: where effects
    registered with ``feedback=`` advance their results.  ``loop``: the
    event loop ``async def`` effect functions and reconcilers are awaited on
    (default: one the executor owns, in a thread of its own); a loop given
    here is never started, stopped or closed by the executor, and must be
    running while calls are in flight.  (From a function on that loop,
    ``call.heartbeat()`` only asks for the renewal, which the executor's
    next step writes; ``await call.aheartbeat()`` waits for it.)

    Each executor claims under an owner of its own (``owner``:
    ``<policy.owner>/<random hex>``, also in ``self.policy``), even when
    several are given one policy object: an executor records an outcome only
    while the claim is still its own, so one executor's late outcome never
    overwrites another's live claim.
    """

    def __init__(
        self, consumer: Consumer, effects: EffectRegistry | None = None, *, policy: DeliveryPolicy | None = None,
        producer: Producer | None = None, concurrency: int = 1, loop: asyncio.AbstractEventLoop | None = None,
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
        check_count("concurrency", concurrency)
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop or None, got {type(loop).__name__}")
        self.concurrency = concurrency
        self._flights = Flights(concurrency, loop)
        self.consumer = consumer
        self.effects = registry
        self.policy = own_claims(policy)
        self.producer = producer
        self.stats = ExecutorStats()
        self._feeder = Feeder(consumer, registry, producer, self.policy, self.stats, self._observe)
        self._loop = Loop()
        self._running = False  # inside run(): a stop or signal ends run_once after the call in progress

    @property
    def owner(self) -> str:
        """The name this executor's claims are recorded under (``lease_owner``), its own."""
        return self.policy.owner

    def run_once(self, limit: int = 100) -> int:
        """Feed back results still owed, then take up to ``limit`` due effects,
        at most ``concurrency`` calls in flight at once, and return once each
        call taken up has ended and its outcome is recorded (a call past its
        ``timeout`` is recorded in doubt and not waited for); returns how many
        were taken up (0: nothing due)."""
        check_count("limit", limit)
        self._feeder.owed(limit)
        taken = 0
        while True:
            self._tend()
            more = True
            while taken < limit and self._flights.free > 0 and not self._stopping:
                most, claimed = self._claim(min(limit - taken, self._flights.free))
                if most == 0:
                    more = False
                    break
                taken += most
                for effect, chosen in claimed:
                    self._begin(effect, chosen, inline=self._inline(effect, chosen))
            if not any(not f.timed_out for f in self._flights.by_key.values()):
                if not more or taken >= limit or self._stopping or self._flights.free <= 0:
                    break  # nothing to wait for (a call past its timeout is not waited for)
                continue
            self._flights.wait(self._next_wake())
        self.stats.passes += 1
        return taken

    def pump(self, limit: int = 100) -> int:
        """One step that never waits for a call: record the calls that ended,
        renew leases, time out calls past their ``timeout``, then start up
        to ``limit`` due effects off this thread (at most ``concurrency`` in
        flight).  What a ``Worker`` calls on each pass, so its relays and
        applies go on while effects are in flight; returns the calls started
        or recorded.  Call :meth:`finish` (or keep pumping) before letting go."""
        check_count("limit", limit)
        self._feeder.owed(limit)
        work = self._tend()
        started = 0
        while started < limit and self._flights.free > 0 and not self._stopping:
            most, claimed = self._claim(min(limit - started, self._flights.free))
            if most == 0:
                break
            started += most
            for effect, chosen in claimed:
                self._begin(effect, chosen, inline=False)
        self.stats.passes += 1
        return work + started

    def finish(self) -> int:
        """Wait for the calls in flight (but not those past their timeout,
        already recorded in doubt) and record them; start nothing new.
        Returns how many were recorded."""
        recorded = 0
        while True:
            recorded += self._tend()
            if not any(not f.timed_out for f in self._flights.by_key.values()):
                return recorded
            self._flights.wait(self._next_wake())

    def close(self) -> None:
        """Wait for the calls in flight and record them (:meth:`finish`), then
        stop the executor's own event loop thread (a loop it was given keeps
        running).  The consumer and producer stay open (they are the
        caller's); the executor may be used again."""
        try:
            self.finish()
        finally:
            self._flights.close()

    def metrics(self) -> ExecutorMetrics:
        """This executor's calls, counted in this process (nothing of it is
        stored; the effects' states are in ``consumer.metrics()``)."""
        in_flight = Counter(f.effect.name for f in self._flights.by_key.values())
        return ExecutorMetrics(
            at=time.time(), consumer=self.consumer.name, owner=self.owner, concurrency=self.concurrency,
            in_flight=dict(sorted(in_flight.items())), started=dict(sorted(self.stats.started_by_name.items())),
            rate_limited=self.stats.rate_limited, heartbeats=self.stats.heartbeats, renewals=self.stats.renewals,
            timeouts=self.stats.outcomes["timed_out"], lease_lost=self.stats.outcomes["lease_lost"],
            outcomes=dict(sorted(self.stats.outcomes.items())),
        )

    @property
    def calls_ended(self) -> threading.Event:
        """Set when a call in flight ends, until the next :meth:`pump`,
        :meth:`run_once` or :meth:`finish` records it: what a loop that
        pumps this executor waits on (``Worker.run`` does)."""
        return self._flights.ended

    @property
    def in_flight(self) -> int:
        """How many calls of this executor have not returned yet (timed-out ones included)."""
        return len(self._flights)

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

    def _claim(self, most: int) -> tuple[int, list[tuple[ScheduledEffect, Plan]]]:
        """Claim up to ``most`` due effects in one transaction (caps and rate
        limits decided by the core): how many were taken up, and those to
        call or reconcile, as claimed."""
        now = self.policy.clock()
        specs = {name: self._spec_of(name) for name in self.effects}
        with self.consumer.store.write() as unit:
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
            self._observe(claim.effect, _FINAL[claim.chosen], str(claim.chosen), reason=claim.reason)
        if taken:
            crash_point("executor.after_claim")
        return len(claims), taken

    @property
    def _stopping(self) -> bool:
        return self._running and self._loop.stopping

    def _inline(self, effect: ScheduledEffect, chosen: Plan) -> bool:
        """Today's way at concurrency 1: the call in this thread (an effect
        with a timeout or an ``async def`` function runs off it, always)."""
        spec = self._spec(effect)
        is_async = spec.is_async if chosen is Plan.RUN else spec.reconcile_is_async
        return self.concurrency == 1 and spec.timeout is None and not is_async

    def _begin(self, effect: ScheduledEffect, chosen: Plan, *, inline: bool) -> None:
        """Call (or reconcile) one claimed effect: here and now, recording the
        outcome, or off this thread as a flight recorded when it ends."""
        spec = self._spec(effect)
        lease = self._inline_lease(effect.key) if inline else self._flights.lease_for(effect.key)
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
        self._flights.start(lambda future: Flight(effect, chosen, spec, call, future, now, now),
                            lambda c: fn(spec, c), call, is_async)
        self.stats.started += 1

    def _tend(self) -> int:
        """Record the calls that ended, renew the leases that need it, time
        out the calls past their timeout; how many calls were recorded."""
        ended: list[_Ended] = []
        for flight in self._flights.finished():
            self._flights.forget(flight.call.key)
            if flight.timed_out:
                self._release(flight)
                continue
            answer = flight.future.result()  # a BaseException here ends the executor, as a death would
            ended.append((flight.effect, flight.chosen, flight.spec, flight.call, answer, flight.started))
        if ended:  # every call that ended meanwhile, recorded in one transaction
            self._record(ended)
        if self._flights.by_key:
            self._renew_due()
            self._time_out_due()
        return len(ended)

    def _renew_due(self) -> None:
        now = self.policy.clock()
        lease = float(self.policy.lease_seconds or DEFAULT_LEASE_SECONDS)
        due = [f for f in self._flights.by_key.values()
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
        late = [f for f in self._flights.by_key.values() if not f.timed_out and not f.lease.lost
                and f.spec.timeout is not None and now - f.started >= f.spec.timeout]
        for flight in late:
            with self.consumer.store.write() as unit:
                recorded = time_out_in(unit, flight.effect, flight.spec, self.policy, now)
            flight.timed_out = True
            if not recorded:
                flight.lease.lost = True
                continue
            self.stats.outcomes["timed_out"] += 1
            self._observe(flight.effect, EffectState.IN_DOUBT, "timed_out", error=f"timed out after "
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
        times = [f.renewed + lease / 3 - now for f in self._flights.by_key.values()]
        times += [f.started + f.spec.timeout - now for f in self._flights.by_key.values()
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
            self._observe(effect, None, "lease_lost", level=WARNING)
            return None
        state = EffectState(changes["state"])
        self.stats.outcomes[state.value if chosen is Plan.RUN else f"reconciled_{state.value}"] += 1
        if changes.get("last_error"):
            self.stats.last_error = f"{effect.key}: {changes['last_error']}"
        self._observe(effect, state, str(chosen), error=changes.get("last_error"), attempts=changes.get("attempts"))
        if state is EffectState.SUCCEEDED and changes.get("fed") is False:
            stored = self.consumer.store.latest.effect(effect.key)
            if stored is not None:
                self._feeder.feed(stored)
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

    def _spec(self, effect: ScheduledEffect) -> EffectSpec:
        return self._spec_of(effect.name)

    def _spec_of(self, name: str) -> EffectSpec:
        spec = self.effects.get(name)
        assert spec is not None, name  # only registered names are claimed
        return spec
