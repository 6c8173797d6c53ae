"""``AsyncWorker``: :class:`~reliable_flow.Worker`, awaited, on one event loop.

The same arguments, passes, statuses, stats and guarantees as the sync
worker (its checks, its stats object and its error handling are reused: a
sync :class:`~reliable_flow.Worker` is built, on the producer's thread, to
hold them).  What differs is only who waits: each pass runs, concurrently on
the loop, one task per consumer that relays (``aio.relay``: the sync relay
on the producer's thread, the consumer's answer on the consumer's thread)
and then applies (each open flow drained on the consumer's thread), and one
task per executor that pumps it (:meth:`AsyncEffectExecutor.pump`); the
``async def`` effect functions run on the same loop meanwhile.  So a slow
consumer, a slow apply or a slow effect call holds up neither the others
nor the loop.  Every step is one transaction on its store's thread, so a
stop (or a SIGKILL) between two steps leaves what the sync worker leaves.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from .._loop import until_due
from .._worker import Worker, WorkerStats, _own_receiving
from ..delivery import DeliveryPolicy
from ..statuses import DrainStop, RelayStatus
from ._consumer import AsyncApplying, AsyncConsumer
from ._executor import _POLL, AsyncEffectExecutor, _Signals
from ._producer import AsyncProducer
from ._relay import relay

__all__ = ["AsyncWorker"]


class AsyncWorker:
    """Relays an :class:`AsyncProducer`'s events to its :class:`AsyncConsumer`\\ s,
    applies them and runs the ``executors``' effects, on one event loop, until stopped.

    Arguments as for :class:`~reliable_flow.Worker` (``policy``,
    ``relay_batch``, ``apply_limit``, ``idle_sleep``, ``on_pass``,
    ``register``, ``apply_on_receive``), with ``executors`` a sequence of
    :class:`AsyncEffectExecutor`.  The same checks (an unknown consumer name
    raises ``UnknownConsumer`` here unless ``register=True``), the same
    :class:`~reliable_flow.records.WorkerStats`, the same
    ``until_idle``, the same errors (a failed step is counted and retried;
    one retrying cannot heal is raised by :meth:`run` after recording it).

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
        consumers: Sequence[AsyncConsumer],
        *,
        policy: DeliveryPolicy | None = None,
        relay_batch: int = 100,
        apply_limit: int = 100,
        idle_sleep: float = 0.5,
        on_pass: Callable[[WorkerStats], None] | None = None,
        executors: Sequence[AsyncEffectExecutor] = (),
        register: bool = False,
        apply_on_receive: bool = True,
    ) -> None:
        if not isinstance(producer, AsyncProducer):
            raise TypeError(f"producer must be a reliable_flow.aio AsyncProducer, got {type(producer).__name__}")
        consumers = list(consumers)
        if not all(isinstance(c, AsyncConsumer) for c in consumers):
            raise TypeError("consumers must be reliable_flow.aio AsyncConsumer objects")
        if not all(isinstance(e, AsyncEffectExecutor) for e in executors):
            raise TypeError("executors must be AsyncEffectExecutor objects")
        self.producer = producer
        self.consumers = consumers
        self.executors = list(executors)
        # The sync worker holds the checks, the settings, the stats and the
        # error handling; its run_once is never called (its stores' calls
        # would all run on one thread).  Built on the producer's thread: its
        # checks read the producer's consumer registry.
        self._worker: Worker = producer.thread.call(
            Worker, producer.sync, [c.sync for c in consumers], policy=policy, relay_batch=relay_batch,
            apply_limit=apply_limit, idle_sleep=idle_sleep, executors=[e.sync for e in self.executors],
            register=register, apply_on_receive=apply_on_receive)
        self._receivers: list[AsyncConsumer | AsyncApplying] = [
            c.applying() if apply_on_receive and _own_receiving(c.sync) else c for c in consumers]
        self._on_pass = on_pass
        self._stop = threading.Event()

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

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was asked (or a signal came)."""
        return self._stop.is_set()

    # -- passes --------------------------------------------------------------------------------

    async def run_once(self) -> int:
        """One pass: every consumer relayed to and applied, every executor
        pumped, at once; returns how many steps did work.  Raises, after
        recording it, an error retrying cannot heal (the pass's other tasks
        end first)."""
        tasks = [self._consumer_pass(c, r) for c, r in zip(self.consumers, self._receivers)]
        tasks += [self._executor_pass(e) for e in self.executors]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if self.stopping:
            return sum(r for r in results if isinstance(r, int))
        self.stats.passes += 1
        if self._on_pass is not None:
            self._on_pass(self.stats)
        return sum(r for r in results if isinstance(r, int))

    async def _consumer_pass(self, consumer: AsyncConsumer, receiver: AsyncConsumer | AsyncApplying) -> int:
        work = 0
        for _ in range(self.relay_batch):
            if self.stopping:
                return work
            try:
                result = await relay(self.producer, receiver, policy=self.policy, register=self.register)
            except Exception as exc:  # noqa: BLE001 - recorded by relay(), retried after backoff
                self._worker._failed(consumer.name, exc)
                break
            self.stats.relayed[result.status.value] += 1
            if result.applied:  # applied on arrival: a step too
                self.stats.applied += 1
                work += 1
            if result.status == RelayStatus.IDLE or result.status == RelayStatus.REFUSED:
                break
            work += 1
        if self.stopping:
            return work
        return work + await self._apply(consumer)

    async def _apply(self, consumer: AsyncConsumer) -> int:
        """Drain each open flow on its own (on the consumer's thread), so a flow
        whose apply raises is recorded and skipped and the others go on."""
        applied = 0
        try:
            flows = await consumer.open_flows()
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            self._worker._failed(consumer.name, exc)
            return 0
        for flow in flows:
            if self.stopping:
                break
            try:
                drained = await consumer.drain(flow, limit=self.apply_limit)
            except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
                self._worker._failed(f"{consumer.name} flow {flow!r}", exc)
                continue
            self.stats.applied += drained.applied
            applied += drained.applied
            if drained.stop != DrainStop.IDLE:
                self.stats.stops[drained.stop.value] += 1
        return applied

    async def _executor_pass(self, executor: AsyncEffectExecutor) -> int:
        if self.stopping:
            return 0
        before = Counter(executor.stats.outcomes)
        work = 0
        try:
            work = await executor.pump(limit=self.apply_limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            self._worker._failed(f"effects of {executor.consumer.name}", exc)
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
        from .._checks import check_flag, check_optional_count

        check_optional_count("max_passes", max_passes)
        check_flag("handle_signals", handle_signals)
        check_flag("until_idle", until_idle)
        with _Signals(handle_signals, self.stop):
            try:
                passes = 0
                while not self.stopping:
                    work = await self.run_once()
                    passes += 1
                    if max_passes is not None and passes >= max_passes:
                        break
                    if work == 0:
                        wait = await self._waiting() if until_idle else self.idle_sleep
                        if wait is None:
                            break
                        await self._idle(wait)
            finally:
                await self._finish_calls()
        return self.stats

    async def _finish_calls(self) -> None:
        for executor in self.executors:
            before = Counter(executor.stats.outcomes)
            try:
                await executor.finish()
            except Exception as exc:  # noqa: BLE001 - recorded; the lease runs out and another run takes over
                self.stats.errors += 1
                self.stats.last_error = f"effects of {executor.consumer.name}: {type(exc).__name__}: {exc}"
            self.stats.effects.update(executor.stats.outcomes - before)

    async def _waiting(self) -> float | None:
        """Seconds until the earliest pending delivery or open effect is due
        (bounded), or None when nothing waits."""
        try:
            now = self.policy.clock()
            sync = self.producer.sync
            due = [d - now for d in [await self.producer._run(lambda n: sync.store.latest.next_due_at(n), c.name)
                                     for c in self.consumers] if d is not None]
            for executor in self.executors:
                at = await executor.consumer.thread.run(_next_effect_due_at, executor)
                if at is not None:
                    due.append(at - executor.policy.clock())
        except Exception as exc:  # noqa: BLE001 - recorded; look again after the idle sleep
            self._worker._failed("until_idle", exc)
            return self.idle_sleep
        return until_due(due)

    async def _idle(self, seconds: float) -> None:
        """Sleep in short slices, woken by a stop or an executor's ended call or heartbeat."""
        deadline = time.monotonic() + seconds
        woken = [e.sync._flights.woken for e in self.executors]
        while not self.stopping and not any(event.is_set() for event in woken):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, _POLL))

    def __repr__(self) -> str:
        return f"AsyncWorker({self.producer!r}, {[c.name for c in self.consumers]!r})"


def _next_effect_due_at(executor: AsyncEffectExecutor) -> float | None:
    """On the executor's consumer thread."""
    return executor.sync.consumer.store.latest.next_effect_due_at(list(executor.effects))
