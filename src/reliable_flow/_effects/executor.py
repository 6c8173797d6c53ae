"""The effect executor: runs the side effects apply handlers scheduled, each
exactly once in effect, and feeds results back into a producer.

Each effect: a durable claim (the effect is ``running`` under a lease, so a
crash during the call is known to have maybe happened), the call with its
idempotency key, then the outcome recorded in one transaction.  This module
is the sync driver: ``run_once``, ``pump`` and ``finish`` drive the one step
of :mod:`reliable_flow._effects.step` and wait for calls between steps.  The
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

from .._checks import check_count, check_flag, check_optional_count
from .._consumer import Consumer
from .._loop import Loop, until_due
from .._producer import Producer
from ..delivery import DEFAULT_LEASE_SECONDS, DeliveryPolicy, check_seconds, own_claims
from ..metrics import ExecutorMetrics
from ..records import ExecutorStats, PassResult
from .feedback import RemoteTarget, Target, feedback_target
from .registry import EffectRegistry
from .step import Step, Stepper

__all__ = ["EffectExecutor", "ExecutorStats"]


class EffectExecutor:
    """Claims due effects of ``consumer``'s effect outbox and runs them.

    ``effects``: the registry (default: the consumer's); only registered
    names are claimed.  ``policy``: lease (default
    :data:`~reliable_flow.delivery.DEFAULT_LEASE_SECONDS`, 30 s), backoff,
    clock and random source, as for deliveries.  ``producer``: where effects
    registered with ``feedback=`` advance their results: a ``Producer``, or
    a producer on another host served by the worker that relays from it
    (``Worker(serve_as=NAME)``), given as its location
    ``redis://host:6379/0#NAME`` (the ``redis`` extra; opened here and
    closed by :meth:`close`) or as a
    :class:`~reliable_flow.transport.redis.RemoteProducer`.  ``loop``: the
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
        producer: Producer | RemoteTarget | str | None = None, concurrency: int = 1, loop: asyncio.AbstractEventLoop | None = None,
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
        target, self._opened = feedback_target(producer)
        check_count("concurrency", concurrency)
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop or None, got {type(loop).__name__}")
        self.concurrency = concurrency
        self.consumer = consumer
        self.effects = registry
        self.policy = own_claims(policy)
        self.producer: Target | None = target
        #: The step both faces drive (every decision's I/O of a step); only
        #: on the thread that owns the consumer's store.
        self.stepper = Stepper(consumer, registry, self.policy, target, concurrency, loop)
        # The registry's recurring schedules, recorded in the consumer's store
        # (ScheduleConflict: a name stored with another definition).
        try:
            self.stepper.declare_schedules()
        except BaseException:
            self.stepper.flights.close()
            raise
        self.stats: ExecutorStats = self.stepper.stats
        self._loop = Loop()
        self._running = False  # inside run(): a stop or signal ends run_once after the call in progress
        self._idle_sleep = 0.5  # run()'s: how long to wait after a failed read of the due times

    @property
    def owner(self) -> str:
        """The name this executor's claims are recorded under (``lease_owner``), its own."""
        return self.policy.owner

    def run_once(self, limit: int = 100) -> PassResult:
        """Feed back results still owed, then take up to ``limit`` due effects,
        at most ``concurrency`` calls in flight at once, and return once each
        call taken up has ended and its outcome is recorded (a call past its
        ``timeout`` is recorded in doubt and not waited for).  ``work``: how
        many were taken up (0: nothing due); ``wake_in`` after a pass with
        none: seconds until the earliest open effect is due, None when none
        waits (:class:`~reliable_flow.records.PassResult`)."""
        check_count("limit", limit)
        taken = self._drive(limit, inline=True)
        self.stats.passes += 1
        return PassResult(taken, 0.0 if taken else self._wake_in())

    def pump(self, limit: int = 100) -> int:
        """One step that never waits for a call: record the calls that ended,
        renew leases, time out calls past their ``timeout``, then start up
        to ``limit`` due effects off this thread (at most ``concurrency`` in
        flight).  What a ``Worker`` calls on each pass, so its relays and
        applies go on while effects are in flight; returns the calls started
        or recorded.  Call :meth:`finish` (or keep pumping) before letting go."""
        check_count("limit", limit)
        step = self.stepper.step(limit, stopping=self._stopping)
        self.stats.passes += 1
        return step.work

    def finish(self) -> int:
        """Wait for the calls in flight (but not those past their timeout,
        already recorded in doubt) and record them; start nothing new.
        Returns how many were recorded."""
        return self._drive(0, feed=False)

    def _drive(self, limit: int, *, inline: bool = False, feed: bool = True) -> int:
        """Steps until the pass is done, waiting for calls between them; the work done."""
        done = 0
        while True:
            step: Step = self.stepper.step(limit - done if limit else 0, inline=inline, feed=feed,
                                           stopping=self._stopping)
            done += step.taken if limit else step.work
            feed = False
            if step.done:
                return done
            if step.wake_in is not None:
                self.stepper.flights.wait(step.wake_in)

    def close(self) -> None:
        """Wait for the calls in flight and record them (:meth:`finish`), then
        stop the executor's own event loop thread (a loop it was given keeps
        running).  The consumer and producer stay open (they are the
        caller's; a remote producer opened from its location is closed);
        the executor may be used again."""
        try:
            self.finish()
        finally:
            self.stepper.flights.close()
            if self._opened and self.producer is not None:
                self.producer.close()

    def metrics(self) -> ExecutorMetrics:
        """This executor's calls, counted in this process (nothing of it is
        stored; the effects' states are in ``consumer.metrics()``)."""
        in_flight = Counter(f.effect.name for f in self.stepper.flights.by_key.values())
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
        return self.stepper.flights.ended

    @property
    def in_flight(self) -> int:
        """How many calls of this executor have not returned yet (timed-out ones included)."""
        return len(self.stepper.flights)

    def run_until_idle(self, max_passes: int = 1000) -> int:
        """``run_once`` until nothing is due now (at most ``max_passes``, an
        int >= 1); returns the effects taken up.  Never waits: an effect
        leased or backing off is left for later (:meth:`run` waits them out)."""
        check_count("max_passes", max_passes)
        total = 0
        for _ in range(max_passes):
            done = self.run_once().work
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
            self._idle_sleep = float(idle_sleep)
            self._loop.run(lambda: self._pass(limit), idle_sleep=self._idle_sleep,
                           max_passes=max_passes, handle_signals=handle_signals, until_idle=until_idle)
        finally:
            self._running = False
        return self.stats

    def _pass(self, limit: int) -> PassResult:
        try:
            return self.run_once(limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            self.stepper.failed(exc)
            return PassResult(0, self._idle_sleep)

    def _wake_in(self) -> float | None:
        """Seconds until the earliest open effect of this registry is due
        (bounded; :func:`~reliable_flow._loop.until_due`), or None when none
        waits; a failed read is recorded and answers the idle sleep."""
        try:
            due = self.stepper.next_due_in()
        except Exception as exc:  # noqa: BLE001 - recorded; look again after an idle sleep
            self.stepper.failed(exc)
            return self._idle_sleep
        return until_due([] if due is None else [due])

    def _stopping(self) -> bool:
        return self._running and self._loop.stopping
