"""``AsyncEffectExecutor``: :class:`~reliable_flow.EffectExecutor`, awaited.

The sync executor does the work and keeps every decision: claims, leases,
renewals, heartbeats, timeouts, rate limits, outcomes and their records.  It
is created on the consumer's thread (its store's thread; only that thread
touches the consumer store) with ``loop=`` the running event loop, so
``async def`` effect functions and reconcilers are awaited natively on the
application's loop, next to its own tasks; plain functions run on daemon
threads, as in the sync face (at ``concurrency=1``, a plain function without
``timeout=`` runs on the consumer's thread, as the sync executor runs it on
its own).

No step ever blocks the event loop or makes the consumer's thread wait for
a call: each step is the sync executor's one step
(:meth:`~reliable_flow._effects.step.Stepper.step`: record what ended,
renew, time out, claim and start), one short call on the consumer's
thread; between steps the loop awaits an event that an ending call or a
heartbeat sets (no polling).

Feedback (``feedback=``) crosses threads as awaited steps, never as one
thread waiting on another: the results still owed are listed on the
consumer's thread, each is advanced on the producer's thread
(:func:`~reliable_flow._effects.feedback.refusal`, after any batch another
task holds open there), then marked fed on the consumer's thread
(:meth:`~reliable_flow._effects.feedback.Feeder.mark`).  The sync executor is given no producer, so it leaves every result
owed for these steps.  (A consumer's thread waiting on the producer's could
deadlock with a relay, whose producer thread waits on the consumer's.)  The
guarantee is the sync face's: advance, then mark; a crash in between
re-advances the same event id, which answers ``existing``.
"""

from __future__ import annotations

import asyncio
import threading

from .._checks import check_count, check_flag, check_optional_count
from .._effects.executor import EffectExecutor, ExecutorStats
from .._effects.feedback import RemoteTarget, feedback_target, refusal, refusals
from .._effects.registry import EffectRegistry
from .._effects.step import Step
from .._loop import until_due
from ..delivery import DeliveryPolicy, check_seconds
from ..records import PassResult
from ._consumer import AsyncConsumer
from ._drive import Signals, Waker, run_passes
from ._face import awaited
from ._producer import AsyncProducer

__all__ = ["AsyncEffectExecutor"]


class AsyncEffectExecutor:
    """Claims due effects of ``consumer``'s effect outbox and runs them, awaited.

    The same arguments as :class:`~reliable_flow.EffectExecutor` (``effects``,
    ``policy``, ``producer``, ``concurrency``), with an
    :class:`~reliable_flow.aio.AsyncConsumer` and an
    :class:`~reliable_flow.aio.AsyncProducer`; the same statuses, stats and
    guarantees (the sync executor, :attr:`sync`, does the work).  Create it
    inside the running event loop: its ``async def`` effect functions are
    awaited on that loop.  From such a function, ``call.heartbeat()`` only
    asks for the renewal (it never blocks the loop; the executor's next
    step writes it); ``await call.aheartbeat()`` waits until it is written.
    Do not await the same consumer's store from an inline plain function
    (it runs on that store's thread).
    """

    def __init__(
        self, consumer: AsyncConsumer, effects: EffectRegistry | None = None, *,
        policy: DeliveryPolicy | None = None, producer: AsyncProducer | RemoteTarget | str | None = None,
        concurrency: int = 1,
    ) -> None:
        if not isinstance(consumer, AsyncConsumer):
            raise TypeError(f"consumer must be a reliable_flow.aio AsyncConsumer, got {type(consumer).__name__}")
        target, self._opened = feedback_target(producer, local=AsyncProducer)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("AsyncEffectExecutor must be created inside a running event loop "
                               "(its async def effect functions are awaited on it)") from None
        self.consumer = consumer
        self.producer: AsyncProducer | RemoteTarget | None = target
        self._thread = consumer.thread
        self._run = self._thread.run  # what an awaited method runs through
        # Given no producer: every result stays owed for the awaited feedback steps below.
        self._sync: EffectExecutor = self._thread.call(
            EffectExecutor, consumer.sync, effects, policy=policy, concurrency=concurrency, loop=loop)
        self._waker = Waker(loop)
        self._sync.stepper.flights.wakers.append(self._waker.set)
        self._stop = threading.Event()
        self._running = False  # inside run(): a stop or signal ends a step before its next claim

    # -- what the sync executor says --------------------------------------------------------

    @property
    def sync(self) -> EffectExecutor:
        """The sync executor doing the work; only on the consumer's thread."""
        return self._sync

    @property
    def effects(self) -> EffectRegistry:
        """The registry whose names it claims (as ``EffectExecutor.effects``)."""
        return self._sync.effects

    @property
    def policy(self) -> DeliveryPolicy:
        """Its lease, backoff and clock, with its own owner (as ``EffectExecutor.policy``)."""
        return self._sync.policy

    @property
    def concurrency(self) -> int:
        """Calls kept in flight at most (as ``EffectExecutor.concurrency``)."""
        return self._sync.concurrency

    @property
    def owner(self) -> str:
        """The name this executor's claims are recorded under (``lease_owner``), its own."""
        return self._sync.owner

    @property
    def stats(self) -> ExecutorStats:
        """Running totals, as for the sync executor (``fed`` / ``feedback_errors`` included)."""
        return self._sync.stats

    @property
    def in_flight(self) -> int:
        """How many calls have not returned yet (timed-out ones included)."""
        return self._sync.in_flight

    @property
    def calls_ended(self) -> threading.Event:
        """Set when a call in flight ends, until the next step records it."""
        return self._sync.calls_ended

    metrics = awaited(EffectExecutor.metrics)

    # -- steps ---------------------------------------------------------------------------------

    async def run_once(self, limit: int = 100) -> PassResult:
        """:meth:`EffectExecutor.run_once`, awaited: feed back the results
        still owed, take up to ``limit`` due effects (at most
        ``concurrency`` in flight) and return once each call taken up has
        ended and its outcome is recorded (a call past its ``timeout`` is
        recorded in doubt and not waited for); ``work``: how many were
        taken up, ``wake_in`` after a pass with none: when the earliest
        open effect is due (None: none waits)."""
        check_count("limit", limit)
        await self._feed_owed(limit)
        taken = await self._drive(limit, inline=True)
        self._sync.stats.passes += 1
        await self._feed_owed(limit)
        return PassResult(taken, 0.0 if taken else await self._wake_in(0.5))

    async def _wake_in(self, idle: float) -> float | None:
        """Seconds until the earliest open effect is due (bounded), None when
        none waits; a failed read is recorded and answers ``idle``."""
        try:
            due = await self._thread.run(self._sync.stepper.next_due_in)
        except Exception as exc:  # noqa: BLE001 - recorded; look again after the idle sleep
            self._sync.stepper.failed(exc)
            return idle
        return until_due([] if due is None else [due])

    async def run_until_idle(self, max_passes: int = 1000) -> int:
        """:meth:`EffectExecutor.run_until_idle`, awaited: :meth:`run_once`
        until nothing is due now (at most ``max_passes``); the effects taken
        up.  Never waits for a lease or a backoff (:meth:`run` does)."""
        check_count("max_passes", max_passes)
        total = 0
        for _ in range(max_passes):
            done = (await self.run_once()).work
            total += done
            if done == 0:
                break
        return total

    async def pump(self, limit: int = 100) -> int:
        """:meth:`EffectExecutor.pump`, awaited (one step on the consumer's
        thread, never waiting for a call), plus the feedback still owed;
        returns the calls started or recorded and the results fed back."""
        check_count("limit", limit)
        fed = await self._feed_owed(limit)
        step = await self._step(limit)
        self._sync.stats.passes += 1
        return fed + step.work + await self._feed_owed(limit)

    async def finish(self) -> int:
        """Wait for the calls in flight (but not those past their timeout,
        already recorded in doubt) and record them; start nothing new.
        Returns how many were recorded."""
        recorded = await self._drive(0)
        await self._feed_owed(100)
        return recorded

    async def _step(self, limit: int, *, inline: bool = False) -> Step:
        # feed=False: the sync executor has no producer; feedback is awaited here.
        return await self._thread.run(self._sync.stepper.step, limit, inline=inline, feed=False,
                                      stopping=self._stopping)

    async def _drive(self, limit: int, *, inline: bool = False) -> int:
        """Steps until the pass is done, awaiting the calls between them (as
        ``EffectExecutor.run_once`` / ``finish`` wait for them)."""
        done = 0
        while True:
            step = await self._step(limit - done if limit else 0, inline=inline)
            done += step.taken if limit else step.work
            if step.done:
                return done
            if step.wake_in is not None:
                await self._waker.wait(step.wake_in)

    async def close(self) -> None:
        """:meth:`finish`; the consumer and producer stay open (the
        caller's; a remote producer opened from its location is closed)
        and the event loop keeps running; may be used again."""
        try:
            await self.finish()
        finally:
            if self._opened and self.producer is not None:
                self.producer.close()

    def stop(self) -> None:
        """Ask :meth:`run` to return once the calls in flight are recorded (any thread)."""
        self._stop.set()
        self._waker.set()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was asked (or a signal came) during :meth:`run`."""
        return self._stop.is_set()

    def _stopping(self) -> bool:
        return self._running and self._stop.is_set()

    async def run(
        self, *, until_idle: bool = False, max_passes: int | None = None, idle_sleep: float = 0.5,
        limit: int = 100, handle_signals: bool = True,
    ) -> ExecutorStats:
        """:meth:`EffectExecutor.run`, awaited: passes until :meth:`stop`,
        SIGTERM / SIGINT, or ``max_passes``; returns the totals.

        Each pass is a :meth:`pump` (so many calls run at once and the loop
        stays free); between passes it waits, without blocking the loop,
        until a call ends, a heartbeat comes, a lease needs renewing, or
        ``idle_sleep`` passes.  On the way out it waits for the calls in
        flight and records them (:meth:`finish`).  ``until_idle``: return
        once a pass did nothing, no call is in flight and no effect of this
        registry is pending, running or in doubt (leases and backoffs are
        waited out), as for the sync executor.  With ``handle_signals``
        (main thread only) SIGTERM and SIGINT are handled by the loop
        (``loop.add_signal_handler``) and only ask it to stop; on return
        the handlers are removed and the previous Python-level handlers put
        back.  Failed passes: counted in ``stats.errors`` and tried again;
        an error retrying cannot heal is raised after counting it.
        """
        check_flag("until_idle", until_idle)
        check_flag("handle_signals", handle_signals)
        check_optional_count("max_passes", max_passes)
        check_seconds("idle_sleep", idle_sleep, allow_zero=True)
        check_count("limit", limit)
        idle = float(idle_sleep)

        async def one_pass() -> PassResult:
            try:
                work = await self.pump(limit)
            except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
                self._sync.stepper.failed(exc)
                return PassResult(0, idle)
            if work:
                return PassResult(work, 0.0)
            wake = await self._thread.run(self._sync.stepper.wake_in)  # calls in flight: tend them when due
            return PassResult(0, wake if wake is not None else await self._wake_in(idle))

        self._running = True
        with Signals(handle_signals, self.stop):
            try:
                await run_passes(one_pass, idle, until_idle, self._waker, lambda: self.stopping, max_passes)
            finally:
                self._running = False
                await self.finish()
        return self._sync.stats

    # -- feedback --------------------------------------------------------------------------------

    async def _feed_owed(self, limit: int) -> int:
        """Feed back the results still owed (at most ``limit``), oldest
        first, each in awaited steps (see the module); how many were fed."""
        if self.producer is None:
            return 0
        feeder = self._sync.stepper.feeder
        owed = await self._thread.run(feeder.owed, limit)
        if not isinstance(self.producer, AsyncProducer):
            # On another host: every step in one round trip, off the loop and off the stores' threads.
            batch = [(e, spec.feedback) for e in owed
                     if (spec := self._sync.effects.get(e.name)) is not None and spec.feedback is not None]
            answers = await asyncio.to_thread(refusals, self.producer, batch) if batch else []
            for (effect, _feedback), refused in zip(batch, answers):
                if not isinstance(refused, Exception):
                    await self._thread.run(feeder.mark, effect, refused)
            errors = [a for a in answers if isinstance(a, Exception)]
            if errors:
                raise errors[0]
            return len(answers) - len(errors)
        fed = 0
        for effect in owed:
            spec = self._sync.effects.get(effect.name)
            if spec is None or spec.feedback is None:
                await self._thread.run(feeder.nothing_owed, effect)
                continue
            refused = await self.producer.run_sync(refusal, self.producer.sync, effect, spec.feedback)
            await self._thread.run(feeder.mark, effect, refused)
            fed += 1
        return fed

    def __repr__(self) -> str:
        return f"AsyncEffectExecutor({self.consumer!r}, owner={self.owner!r}, concurrency={self.concurrency})"
