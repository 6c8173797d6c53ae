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
a call: each step (record what ended, renew, time out, claim and start) is
one short call on the consumer's thread, and between steps the loop waits
(in short ``asyncio.sleep`` slices) for a call to end or a heartbeat.

Feedback (``feedback=``) crosses threads as awaited steps, never as one
thread waiting on another: the results still owed are listed on the
consumer's thread, each is advanced on the producer's thread (after any
batch another task holds open there), then marked fed on the consumer's
thread.  The sync executor is given no producer, so it leaves every result
owed for these steps.  (A consumer's thread waiting on the producer's could
deadlock with a relay, whose producer thread waits on the consumer's.)  The
guarantee is the sync face's: advance, then mark; a crash in between
re-advances the same event id, which answers ``existing``.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

from .._checks import check_count, check_flag, check_optional_count
from .._core.effects import FEEDBACK_REFUSED, fed_back_in, feedback_event_id, feedback_refusal
from .._effects import EffectRegistry
from .._executor import EffectExecutor, ExecutorStats
from .._observe import WARNING
from ..delivery import DeliveryPolicy, check_seconds, error_text
from ..metrics import ExecutorMetrics
from ..records import ScheduledEffect
from ._consumer import AsyncConsumer
from ._producer import AsyncProducer

__all__ = ["AsyncEffectExecutor"]

_POLL = 0.005  # seconds: how often a wait on the loop looks whether a call ended


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
        policy: DeliveryPolicy | None = None, producer: AsyncProducer | None = None, concurrency: int = 1,
    ) -> None:
        if not isinstance(consumer, AsyncConsumer):
            raise TypeError(f"consumer must be a reliable_flow.aio AsyncConsumer, got {type(consumer).__name__}")
        if producer is not None and not isinstance(producer, AsyncProducer):
            raise TypeError(f"producer must be a reliable_flow.aio AsyncProducer or None, "
                            f"got {type(producer).__name__}")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("AsyncEffectExecutor must be created inside a running event loop "
                               "(its async def effect functions are awaited on it)") from None
        self.consumer = consumer
        self.producer = producer
        self._thread = consumer.thread
        self._sync: EffectExecutor = self._thread.call(
            EffectExecutor, consumer.sync, effects, policy=policy, concurrency=concurrency, loop=loop)
        self._stop = threading.Event()

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
        return len(self._sync._flights)

    @property
    def calls_ended(self) -> threading.Event:
        """Set when a call in flight ends, until the next step records it."""
        return self._sync.calls_ended

    async def metrics(self) -> ExecutorMetrics:
        """:meth:`EffectExecutor.metrics`, read on the consumer's thread."""
        return await self._thread.run(self._sync.metrics)

    # -- steps ---------------------------------------------------------------------------------

    async def run_once(self, limit: int = 100) -> int:
        """:meth:`EffectExecutor.run_once`, awaited: feed back the results
        still owed, take up to ``limit`` due effects (at most
        ``concurrency`` in flight) and return once each call taken up has
        ended and its outcome is recorded (a call past its ``timeout`` is
        recorded in doubt and not waited for); how many were taken up."""
        check_count("limit", limit)
        await self._feed_owed(limit)
        taken = 0
        while True:
            taken, done, wake = await self._thread.run(self._step, limit, taken)
            if wake is None:
                if done:
                    break
                continue
            await self._wait_woken(wake)
        self._sync.stats.passes += 1
        await self._feed_owed(limit)
        return taken

    def _step(self, limit: int, taken: int) -> tuple[int, bool, float | None]:
        """On the consumer's thread: record what ended, then claim and start
        due effects while there is room (inline ones run here); how many
        are taken up, whether the pass is done, and how long to wait for a
        call (None: nothing to wait for)."""
        sync, flights = self._sync, self._sync._flights
        sync._tend()
        more = True
        while taken < limit and flights.free > 0:
            most, claimed = sync._claim(min(limit - taken, flights.free))
            if most == 0:
                more = False
                break
            taken += most
            for effect, chosen in claimed:
                sync._begin(effect, chosen, inline=sync._inline(effect, chosen))
        wake = self._wake_in()
        return taken, wake is None and (not more or taken >= limit or flights.free <= 0), wake

    def _wake_in(self) -> float | None:
        """On the consumer's thread: seconds until the flights need tending,
        or None when no call is waited for (timed-out ones are not)."""
        if not any(not f.timed_out for f in self._sync._flights.by_key.values()):
            return None
        return self._sync._next_wake()

    async def pump(self, limit: int = 100) -> int:
        """:meth:`EffectExecutor.pump`, awaited (one short step on the
        consumer's thread, never waiting for a call), plus the feedback
        still owed; returns the calls started or recorded and the results
        fed back."""
        check_count("limit", limit)
        fed = await self._feed_owed(limit)
        work = await self._thread.run(self._sync.pump, limit)
        return work + fed + await self._feed_owed(limit)

    async def finish(self) -> int:
        """Wait for the calls in flight (but not those past their timeout,
        already recorded in doubt) and record them; start nothing new.
        Returns how many were recorded."""
        recorded = 0
        while True:
            recorded += await self._thread.run(self._sync._tend)
            wake = await self._thread.run(self._wake_in)
            if wake is None:
                break
            await self._wait_woken(wake)
        await self._feed_owed(100)
        return recorded

    async def close(self) -> None:
        """:meth:`finish`; the consumer and producer stay open (the
        caller's) and the event loop keeps running; may be used again."""
        await self.finish()

    def stop(self) -> None:
        """Ask :meth:`run` to return once the calls in flight are recorded (any thread)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was asked (or a signal came) during :meth:`run`."""
        return self._stop.is_set()

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
        with _Signals(handle_signals, self.stop):
            try:
                passes = 0
                while not self.stopping:
                    work = await self._pass(limit)
                    passes += 1
                    if max_passes is not None and passes >= max_passes:
                        break
                    if work:
                        continue
                    wait = await self._idle_for(until_idle, float(idle_sleep))
                    if wait is None:
                        break
                    await self._wait_woken(wait, stoppable=True)
            finally:
                await self.finish()
        return self._sync.stats

    async def _pass(self, limit: int) -> int:
        try:
            return await self.pump(limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            self._sync._failed(exc)
            return 0

    async def _idle_for(self, until_idle: bool, idle_sleep: float) -> float | None:
        wake = await self._thread.run(self._wake_in)
        if wake is not None:  # calls in flight: tend them when due
            return min(wake, idle_sleep) if idle_sleep > 0 else wake
        if not until_idle:
            return idle_sleep
        return await self._thread.run(self._sync._waiting, idle_sleep)

    async def _wait_woken(self, seconds: float, *, stoppable: bool = False) -> None:
        """Until a call ends or a heartbeat comes (or ``seconds`` pass, or a
        stop when ``stoppable``), looking every few ms: the loop stays free."""
        deadline = time.monotonic() + seconds
        woken = self._sync._flights.woken
        while not woken.is_set() and not (stoppable and self.stopping):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, _POLL))

    # -- feedback --------------------------------------------------------------------------------

    async def _feed_owed(self, limit: int) -> int:
        """Feed back the results still owed (at most ``limit``), oldest
        first, each in awaited steps (see the module); how many were fed."""
        if self.producer is None:
            return 0
        owed = await self._thread.run(self._unfed, limit)
        fed = 0
        for effect in owed:
            spec = self._sync.effects.get(effect.name)
            if spec is None:
                continue
            if spec.feedback is None:
                await self._thread.run(self._mark, effect, None, nothing_owed=True)
                continue
            feedback, refused, where = spec.feedback, None, "flow"
            try:
                flow_id = feedback.flow(effect.flow_id) if feedback.flow else effect.flow_id
                where = "payload"
                payload = feedback.payload(effect.result) if feedback.payload else effect.result
            except Exception as exc:  # noqa: BLE001 - the application's function: refused feedback
                refused = f"{FEEDBACK_REFUSED}refused: Feedback.{where} raised {error_text(exc)}"
            else:
                try:
                    answer = await self.producer._run(
                        self.producer.sync._advance_at_current, feedback_event_id(effect.key), flow_id,
                        kind=feedback.kind, payload=payload, meta=effect.meta or None)
                    refused = feedback_refusal(answer)
                except (ValueError, TypeError) as exc:  # InvalidEnvelope: not a valid step
                    refused = f"{FEEDBACK_REFUSED}refused: {error_text(exc)}"
            await self._thread.run(self._mark, effect, refused)
            fed += 1
        return fed

    def _unfed(self, limit: int) -> list[ScheduledEffect]:
        return self._sync.consumer.store.latest.unfed_effects(limit)

    def _mark(self, effect: ScheduledEffect, refused: str | None, nothing_owed: bool = False) -> None:
        """On the consumer's thread: the result fed back (or refused, or nothing owed)."""
        sync = self._sync
        with sync.consumer.store.write() as unit:
            if nothing_owed:
                unit.update_effect(effect.key, {"fed": None}, sync.policy.clock())
                return
            fed_back_in(unit, effect, refused, sync.policy.clock(), sync.policy.owner)
        if refused is None:
            sync.stats.fed += 1
            return
        sync.stats.feedback_errors += 1
        sync.stats.last_error = f"{effect.key}: {refused}"
        sync._observe(effect, None, "feedback_refused", level=WARNING, error=refused)

    def __repr__(self) -> str:
        return f"AsyncEffectExecutor({self.consumer!r}, owner={self.owner!r}, concurrency={self.concurrency})"


class _Signals:
    """SIGTERM / SIGINT ask ``stop`` through the running loop, while inside
    the block (main thread, a loop that supports it); put back on exit."""

    def __init__(self, enabled: bool, stop: Any) -> None:
        self.enabled, self.stop = enabled, stop
        self.previous: dict[signal.Signals, Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _Signals:  # noqa: PYI034 - Self needs Python 3.11
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return self
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError, ValueError):  # not supported here
                continue
            self.previous[sig] = previous
        self.loop = loop
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is None:
            return
        for sig, previous in self.previous.items():
            self.loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
