"""``AsyncWorker``: :class:`~reliable_flow.Worker`, awaited, on one event loop.

A thin driver over the sync worker's steps: a sync
:class:`~reliable_flow.Worker` (built on the producer's thread) holds the
checks, the settings, the stats and every step of a pass; its
:meth:`~reliable_flow.Worker.relay_step` runs on the producer's thread
(the consumer's answer on the consumer's thread), its
:meth:`~reliable_flow.Worker.apply_step` on the consumer's thread.  What
differs is only who waits: each pass runs, concurrently on the loop, one
task per consumer (relay, then apply) and one per executor
(:meth:`AsyncEffectExecutor.pump`); the ``async def`` effect functions run
on the same loop meanwhile.  So a slow consumer, a slow apply or a slow
effect call holds up neither the others nor the loop.  Every step is one
transaction on its store's thread, so a stop (or a SIGKILL) between two
steps leaves what the sync worker leaves.  Between passes it awaits an
event that an ended call, a heartbeat or a stop sets (no polling).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Sequence

from .._checks import check_flag, check_optional_count
from .._consumer import Consumer
from .._loop import until_due
from .._receiver import Receiver, is_receiver
from .._worker import Worker, WorkerStats, add_counts, failed
from ..delivery import DeliveryPolicy
from ..records import PassResult
from ._consumer import AsyncConsumer
from ._drive import Signals, Waker, run_passes
from ._executor import AsyncEffectExecutor
from ._producer import AsyncProducer
from ._relay import OnItsThread

__all__ = ["AsyncWorker"]


class AsyncWorker:
    """Relays an :class:`AsyncProducer`'s events to its :class:`AsyncConsumer`\\ s,
    applies them and runs the ``executors``' effects, on one event loop, until stopped.

    Arguments as for :class:`~reliable_flow.Worker` (``policy``,
    ``relay_batch``, ``apply_limit``, ``idle_sleep``, ``on_pass``,
    ``register``, ``apply_on_receive``, ``serve_as``: its serve step runs
    on the producer's thread), with ``executors`` a sequence of
    :class:`AsyncEffectExecutor`.  A consumer in another process is given
    as its :class:`~reliable_flow.Receiver` (a
    :class:`~reliable_flow.transport.redis.RedisReceiver`), as for
    ``Worker``: relayed to only (its blocking calls on the producer's
    thread), applied where it is.  The same checks (an unknown consumer
    name raises ``UnknownConsumer`` here unless ``register=True``), the same
    :class:`~reliable_flow.records.WorkerStats`, the same ``until_idle``,
    the same errors (a failed step is counted and retried; one retrying
    cannot heal is raised by :meth:`run` after recording it).

    Stopping: :meth:`stop` (from any task or thread), or SIGTERM / SIGINT
    while :meth:`run` runs with ``handle_signals`` in the main thread
    (handled by the loop, ``loop.add_signal_handler``; removed on return).
    A stop lets each step in progress finish (a step is one transaction
    on its store's thread), then :meth:`run` waits for the effect calls in
    flight and records them before it returns.  Killing the process is also
    safe: every step is a transaction and is redone by the next run.

    Not kept from the sync worker: the order of steps within a pass across
    consumers (they run at once), so ``on_pass`` sees a pass's totals only
    once every task of the pass ended.
    """

    def __init__(
        self,
        producer: AsyncProducer,
        consumers: Sequence[AsyncConsumer | Receiver],
        *,
        policy: DeliveryPolicy | None = None,
        relay_batch: int = 100,
        apply_limit: int = 100,
        idle_sleep: float = 0.5,
        on_pass: Callable[[WorkerStats], None] | None = None,
        executors: Sequence[AsyncEffectExecutor] = (),
        register: bool = False,
        apply_on_receive: bool = True,
        serve_as: str | None = None,
    ) -> None:
        if not isinstance(producer, AsyncProducer):
            raise TypeError(f"producer must be a reliable_flow.aio AsyncProducer, got {type(producer).__name__}")
        consumers = list(consumers)
        for c in consumers:
            if not isinstance(c, AsyncConsumer) and (isinstance(c, Consumer) or not is_receiver(c)):
                raise TypeError("consumers must be reliable_flow.aio AsyncConsumer (or Receiver) objects, "
                                f"got {type(c).__name__}")
        if not all(isinstance(e, AsyncEffectExecutor) for e in executors):
            raise TypeError("executors must be AsyncEffectExecutor objects")
        self.producer = producer
        self.consumers = consumers
        self.executors = list(executors)
        # The sync worker holds the checks, the settings, the stats and the
        # steps; each step runs on its store's thread.  Built on the
        # producer's thread: its checks read the producer's consumer registry.
        self._worker: Worker = producer.thread.call(
            Worker, producer.sync, [c.sync if isinstance(c, AsyncConsumer) else c for c in consumers],
            policy=policy, relay_batch=relay_batch, apply_limit=apply_limit, idle_sleep=idle_sleep,
            on_pass=on_pass, register=register, apply_on_receive=apply_on_receive, serve_as=serve_as)
        self._worker.receivers = [
            OnItsThread(c.thread, r, c.name, c.uid, c.location) if isinstance(c, AsyncConsumer) else r
            for c, r in zip(consumers, self._worker.receivers)]
        self._stop = threading.Event()
        self._waker: Waker | None = None

    # -- settings and totals, as for Worker --------------------------------------------------

    @property
    def stats(self) -> WorkerStats:
        """The running totals (``WorkerStats``), as ``Worker.stats``."""
        return self._worker.stats

    @property
    def policy(self) -> DeliveryPolicy:
        """The relays' lease, backoff and clock (as ``Worker.policy``)."""
        return self._worker.policy

    @property
    def relay_batch(self) -> int:
        """Relays per consumer in one pass at most (as ``Worker.relay_batch``)."""
        return self._worker.relay_batch

    @property
    def apply_limit(self) -> int:
        """Applies per flow, and effects started per executor, in one pass (as ``Worker.apply_limit``)."""
        return self._worker.apply_limit

    @property
    def idle_sleep(self) -> float:
        """Seconds it sleeps after a pass that did nothing (as ``Worker.idle_sleep``)."""
        return self._worker.idle_sleep

    @property
    def register(self) -> bool:
        """Whether unknown consumer names are registered (as ``Worker.register``)."""
        return self._worker.register

    @property
    def apply_on_receive(self) -> bool:
        """Whether it relays to each consumer's receive-and-apply view (as ``Worker``)."""
        return self._worker.apply_on_receive

    def stop(self) -> None:
        """Ask :meth:`run` to return after the steps in progress (any thread)."""
        self._stop.set()
        self._worker.stop()
        if self._waker is not None:
            self._waker.set()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was asked (or a signal came)."""
        return self._stop.is_set()

    # -- passes --------------------------------------------------------------------------------

    async def run_once(self) -> PassResult:
        """One pass: every consumer relayed to and applied, every executor
        pumped, at once; returns the steps that did work and, after a pass
        with none, when something waits for its time
        (:meth:`Worker.run_once`).  Raises, after recording it, an error
        retrying cannot heal (the pass's other tasks end first)."""
        tasks = [self._serve_pass()] if self._worker.servers else []
        tasks += [self._consumer_pass(i) for i in range(len(self.consumers))]
        tasks += [self._executor_pass(e) for e in self.executors]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        for server in self._worker.servers:  # what was answered while a relay waited on its bridge
            self.stats.served.update(server.unreported())
        if not self.stopping:
            self._worker.passed()
        work = sum(r for r in results if isinstance(r, int))
        return PassResult(work, 0.0 if work or self.stopping else await self._wake_in())

    async def _serve_pass(self) -> int:
        """The worker's serve step (``serve_as``) on the producer's thread."""
        tally = WorkerStats()
        try:
            return await self.producer.run_sync(self._worker.serve_step, tally)
        finally:
            add_counts(self.stats, tally)

    async def _consumer_pass(self, index: int) -> int:
        """The worker's relay step on the producer's thread, one event per
        call (so the application's own producer calls take turns with the
        relays), then its apply step on the consumer's; the counts added
        once the steps ended."""
        worker, consumer = self._worker, self.consumers[index]
        tally = WorkerStats()
        work, more, left = 0, True, worker.relay_batch
        try:
            while more and left > 0 and not self.stopping:
                done, more = await self.producer.run_sync(worker.relay_step, index, tally, 1)
                work, left = work + done, left - 1
            if isinstance(consumer, AsyncConsumer) and not self.stopping:
                work += await consumer.run_sync(worker.apply_step, index, tally)
        finally:
            add_counts(self.stats, tally)
        return work

    async def _executor_pass(self, executor: AsyncEffectExecutor) -> int:
        if self.stopping:
            return 0
        before = Counter(executor.stats.outcomes)
        work = 0
        try:
            work = await executor.pump(limit=self.apply_limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            failed(self.stats, f"effects of {executor.consumer.name}", exc)
        self.stats.effects.update(executor.stats.outcomes - before)
        return work

    async def run(
        self, *, max_passes: int | None = None, handle_signals: bool = True, until_idle: bool = False,
    ) -> WorkerStats:
        """Passes until :meth:`stop`, a signal, or ``max_passes``; the totals.

        As :meth:`Worker.run`: after a pass that did no work, sleep
        ``idle_sleep`` (or, ``until_idle``, until the earliest pending
        delivery or open effect is due, returning when nothing waits),
        woken early by an ended effect call, a heartbeat or :meth:`stop`;
        the loop stays free meanwhile.  On the way out (a stop, a signal,
        an error, a cancelled task) the calls in flight are waited for and
        recorded.
        """
        check_optional_count("max_passes", max_passes)
        check_flag("handle_signals", handle_signals)
        check_flag("until_idle", until_idle)
        waker = self._waker = Waker(asyncio.get_running_loop())
        for executor in self.executors:
            executor.sync.stepper.flights.wakers.append(waker.set)

        watching = threading.Event()
        watcher = None
        if self._worker.servers:  # serving the producer: a request wakes the loop, not the idle sleep's end
            watcher = threading.Thread(target=self._watch_requests, args=(waker, watching), daemon=True,
                                       name="reliable-flow-serve-watch")
            watcher.start()
        with Signals(handle_signals, self.stop):
            try:
                await run_passes(self.run_once, self.idle_sleep, until_idle, waker, lambda: self.stopping,
                                 max_passes)
            finally:
                watching.set()
                for executor in self.executors:
                    executor.sync.stepper.flights.wakers.remove(waker.set)
                self._waker = None
                await self._finish_calls()
                if watcher is not None:
                    await asyncio.to_thread(watcher.join)
        return self.stats

    def _watch_requests(self, waker: Waker, done: threading.Event) -> None:
        """While :meth:`run` runs (until ``done``): wait on the first server's
        requests, off the loop, and wake the loop when one comes."""
        server = self._worker.servers[0]
        while not done.is_set():
            try:
                if server.wait(0.2):
                    waker.set()
                    done.wait(0.05)  # the pass answers it; do not take the next ones from under it
            except Exception:  # noqa: BLE001 - the pass records what fails; look again a little later
                done.wait(0.5)

    async def _finish_calls(self) -> None:
        for executor in self.executors:
            before = Counter(executor.stats.outcomes)
            try:
                await executor.finish()
            except Exception as exc:  # noqa: BLE001 - recorded; the lease runs out and another run takes over
                self.stats.errors += 1
                self.stats.last_error = f"effects of {executor.consumer.name}: {type(exc).__name__}: {exc}"
            self.stats.effects.update(executor.stats.outcomes - before)

    async def _wake_in(self) -> float | None:
        """Seconds until the earliest pending delivery or open effect is due
        (bounded), or None when nothing waits."""
        try:
            due = await self.producer.run_sync(self._worker.delivery_waits)
            for executor in self.executors:
                at = await executor.consumer.run_sync(executor.sync.stepper.next_due_in)
                if at is not None:
                    due.append(at)
        except Exception as exc:  # noqa: BLE001 - recorded; look again after the idle sleep
            failed(self.stats, "due times", exc)
            return self.idle_sleep
        return until_due(due)

    def __repr__(self) -> str:
        return f"AsyncWorker({self.producer!r}, {[c.name for c in self.consumers]!r})"
