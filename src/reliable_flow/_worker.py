"""A worker loop: relay and apply continuously, stop cleanly on a signal."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ._checks import check_count, check_flag
from ._consumer import Consumer
from ._core.operate import refused_names, unknown_consumer
from ._effects.executor import EffectExecutor
from ._loop import CANNOT_HEAL, Loop, until_due
from ._observe import WARNING, WORKER, fields, log
from ._producer import Producer
from ._receiver import Receiver, is_receiver
from ._relay import DeliveryPolicy, relay, relay_batch
from .delivery import DEFAULT_LEASE_SECONDS, check_seconds
from .records import PassResult, WorkerStats
from .statuses import DrainStop, RelayStatus

__all__ = ["Worker", "WorkerStats", "add_counts", "apply_open_flows", "failed", "finish_executors", "own_receiving",
           "pump_executors"]


def add_counts(stats: WorkerStats, tally: WorkerStats) -> None:
    """Add to ``stats`` the counts of steps made apart (on a store's thread)."""
    stats.relayed.update(tally.relayed)
    stats.applied += tally.applied
    stats.stops.update(tally.stops)
    stats.errors += tally.errors
    stats.last_error = tally.last_error or stats.last_error
    stats.effects.update(tally.effects)
    stats.served.update(tally.served)


def failed(tally: WorkerStats, where: str, exc: Exception) -> None:
    """Count and log a failed step of a pass in ``tally``; raise it again
    when retrying cannot heal it (:data:`~reliable_flow._loop.CANNOT_HEAL`)."""
    tally.errors += 1
    tally.last_error = f"{where}: {type(exc).__name__}: {exc}"
    if WORKER.isEnabledFor(WARNING):
        log(WORKER, WARNING, f"error in {where}, going on",
            fields(status="error", where=where, error=f"{type(exc).__name__}: {exc}"))
    if isinstance(exc, CANNOT_HEAL):
        raise exc


_RECEIVING = ("receive", "receive_many", "accept", "accept_many", "applying")


def own_receiving(consumer: Consumer) -> bool:
    """True unless a subclass changed how the consumer takes events in (a
    transport in between, a test double): that path must stay in charge, so
    such a consumer is relayed to as itself."""
    return all(getattr(type(consumer), name) is getattr(Consumer, name) for name in _RECEIVING)


class Worker:
    """Relays a producer's events to its consumers and applies them, until stopped.

    One pass: for each consumer, relay up to ``relay_batch`` due events
    (stopping early at ``idle``), then drain each open flow on its own (up
    to ``apply_limit`` applies; a flow whose apply raises is recorded and
    skipped, the others go on);
    then each of ``executors`` records the effect calls that ended and
    starts up to ``apply_limit`` due ones off the worker's thread (at most
    its ``concurrency`` in flight, :meth:`EffectExecutor.pump`), so a slow
    call never delays a delivery or an apply; :meth:`run` waits for the
    calls in flight and records them before it returns.
    When a pass did nothing, the worker sleeps ``idle_sleep`` seconds (woken
    early by :meth:`stop`).  A full inbox (``max_inbox``) answers
    ``refused``: counted in ``stats.relayed["refused"]``, the event waits
    for its backoff and the worker moves on to applying, which makes room.
    A consumer that raises is recorded by the relay
    (attempts, error, backoff) and the worker goes on with the others; so is
    any failure of a pass (``stats.errors``, ``stats.last_error``), except
    one that retrying cannot heal (:data:`~reliable_flow._loop.CANNOT_HEAL`: ``ConsumerMismatch``,
    ``UnknownConsumer``, ``WrongFile`` / ``SchemaTooNew``, ``WrongProcess``, ``WrongThread``),
    which :meth:`run_once` and :meth:`run` raise after recording it.

    ``apply_on_receive`` (default True): relay to each consumer in the
    receive-and-apply mode (:meth:`Consumer.applying`), so an event that is
    its flow's next step is stored and applied in one durable commit; the
    apply pass then only finds what that mode leaves pending (an event
    after a gap, a blocked one).  This is safe here because the worker
    applies every consumer it relays to anyway, with the same handlers and
    effects; the end state is the same, with one commit fewer per event.
    A consumer whose class overrides how it takes events in (``receive``,
    ``receive_many``, ``accept``, ``accept_many`` or ``applying``: a
    transport in between, a test double) is relayed to as itself.

    A consumer in another process or on another host is given as its
    :class:`~reliable_flow.Receiver` (a
    :class:`~reliable_flow.transport.redis.RedisReceiver`): the worker only
    relays to it, one ``relay_batch`` of up to ``relay_batch`` events per
    pass, and leaves applying and its effects to the far side (the
    transport's bridge); a failed send is recorded by the relay and retried
    after its backoff, as for any consumer.

    ``serve_as``: also serve this worker's producer under that name to
    effect executors on other hosts, through the transport its remote
    consumers are reached by (each distinct Redis server of its
    ``RedisReceiver`` objects): every pass first advances the results and
    failure steps they sent (:class:`~reliable_flow.transport.redis.RemoteProducer`,
    ``producer="redis://host:6379#NAME"``), each at its flow's current seq
    in one producer transaction, counted in ``stats.served`` by status.

    Consumers must be registered in the producer (see
    ``producer.admin.register_consumer``; the first consumer of a producer that has
    none is registered on its first relay): an unknown name raises
    :class:`UnknownConsumer` here, unless ``register=True`` registers every
    one of them on its first relay.

    ``policy``: the relays' lease, backoff and clock; by default a lease of
    :data:`~reliable_flow.delivery.DEFAULT_LEASE_SECONDS` (30 s, the same as
    ``reliable-flow run``), so several workers on one producer never send
    one event at once.

    Stopping: :meth:`stop`, or SIGTERM / SIGINT when :meth:`run` installed
    its handlers.  The handler only sets a flag, so the transaction in
    progress finishes (or rolls back) normally before :meth:`run` returns.
    Killing the process instead is also safe: every step is a transaction
    and is redone by the next run.
    """

    def __init__(
        self,
        producer: Producer,
        consumers: Sequence[Consumer | Receiver],
        *,
        policy: DeliveryPolicy | None = None,
        relay_batch: int = 100,
        apply_limit: int = 100,
        idle_sleep: float = 0.5,
        on_pass: Callable[[WorkerStats], None] | None = None,
        executors: Sequence[EffectExecutor] = (),
        register: bool = False,
        apply_on_receive: bool = True,
        serve_as: str | None = None,
    ) -> None:
        if not consumers:
            raise ValueError("consumers must name at least one Consumer (or a Receiver)")
        for c in consumers:
            if not isinstance(c, Consumer) and not is_receiver(c):
                raise TypeError(f"consumers must be Consumer or Receiver objects, got {type(c).__name__}")
        names = [c.name for c in consumers]
        if len(set(names)) != len(names):
            raise ValueError(f"consumer names must be distinct, got {names}")
        for name, value in (("relay_batch", relay_batch), ("apply_limit", apply_limit)):
            check_count(name, value)
        check_seconds("idle_sleep", idle_sleep, allow_zero=True)
        if not register:  # refuse a typo'd name now, not on every pass
            refused = refused_names(producer.store.latest, names)
            if refused:
                raise unknown_consumer(producer.location, refused[0], producer.admin.consumers())
        self.register = check_flag("register", register)
        self.apply_on_receive = check_flag("apply_on_receive", apply_on_receive)
        self.producer = producer
        self.consumers = list(consumers)
        #: What each consumer is relayed to (its receive-and-apply view, or
        #: itself); the asyncio face hands each to its consumer's thread.
        self.receivers: list[Receiver] = [
            c.applying() if isinstance(c, Consumer) and apply_on_receive and own_receiving(c) else c
            for c in self.consumers
        ]
        self.policy = policy or DeliveryPolicy(lease_seconds=DEFAULT_LEASE_SECONDS)
        self.relay_batch = relay_batch
        self.apply_limit = apply_limit
        self.idle_sleep = float(idle_sleep)
        if not all(isinstance(e, EffectExecutor) for e in executors):
            raise TypeError("executors must be EffectExecutor objects")
        self.executors = list(executors)
        #: The producer served to other hosts (``serve_as``): one server per Redis server.
        self.servers = [] if serve_as is None else producer_servers(producer, self.receivers, serve_as)
        self.stats = WorkerStats()
        self._on_pass = on_pass
        self._loop = Loop()

    def stop(self) -> None:
        """Ask the loop to return after the current transaction."""
        self._loop.stop()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called or a stop signal arrived."""
        return self._loop.stopping

    def run_once(self) -> PassResult:
        """One pass over all consumers: relay to each and apply what waits,
        then pump the executors; returns the steps that did work and, after
        a pass with none, when something waits for its time (a delivery
        leased or backing off, an effect due later; :class:`~reliable_flow.records.PassResult`)."""
        work = self.serve_step(self.stats)
        for index in range(len(self.consumers)):
            if self.stopping:
                return PassResult(work, 0.0)
            work += self.relay_step(index, self.stats)[0]
            if self.stopping:
                return PassResult(work, 0.0)
            work += self.apply_step(index, self.stats)
        work += pump_executors(self.executors, self.apply_limit, self.stats, partial(failed, self.stats),
                               lambda: self.stopping)
        for server in self.servers:  # what was answered while a relay waited on its bridge
            self.stats.served.update(server.unreported())
        self.passed()
        return PassResult(work, 0.0 if work else self._wake_in())

    # -- the steps of a pass, each on one store (the asyncio face runs each on its store's thread) --

    def relay_step(self, index: int, tally: WorkerStats, most: int | None = None) -> tuple[int, bool]:
        """Relay to consumer ``index``: up to ``most`` (default
        ``relay_batch``) due events one by one, stopping early at ``idle``
        or ``refused``, or one ``relay_batch`` request to a consumer in
        another process; counted in ``tally``.  Uses the producer's store.
        Returns the work done and whether more may be due (it stopped only
        because it reached ``most``)."""
        receiver = self.receivers[index]
        if not isinstance(self.consumers[index], Consumer):  # remote: applied where it is (a transport's bridge)
            try:
                batch = relay_batch(self.producer, receiver, self.relay_batch, policy=self.policy,
                                    register=self.register)
            except Exception as exc:  # noqa: BLE001 - recorded by relay_batch(), retried after backoff
                failed(tally, receiver.name, exc)
                return 0, False
            for status, count in batch.counts.items():
                tally.relayed[status] += count
            applied = sum(1 for r in batch.results if r.applied)
            tally.applied += applied
            return len(batch.results) - batch.refused + applied, False
        work = 0
        for _ in range(self.relay_batch if most is None else most):
            if self.stopping:
                return work, False
            try:
                result = relay(self.producer, receiver, policy=self.policy, register=self.register)
            except Exception as exc:  # noqa: BLE001 - recorded by relay(), retried after backoff
                failed(tally, receiver.name, exc)
                return work, False
            tally.relayed[result.status.value] += 1
            if result.applied:  # applied on arrival: a step too
                tally.applied += 1
                work += 1
            if result.status == RelayStatus.IDLE or result.status == RelayStatus.REFUSED:
                return work, False  # nothing due, or a full inbox: it waits for its backoff
            work += 1
        return work, True

    def serve_step(self, tally: WorkerStats) -> int:
        """Answer what executors on other hosts fed back to this producer
        (``serve_as``), counted in ``tally.served``; a failure (Redis away)
        is recorded and the pass goes on.  Uses the producer's store."""
        work = 0
        for server in self.servers:
            try:
                work += server.serve_once()
            except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
                failed(tally, f"serving {server.name}", exc)
            tally.served.update(server.unreported())  # also what was served while a relay waited
        return work

    def apply_step(self, index: int, tally: WorkerStats) -> int:
        """Drain each open flow of consumer ``index`` (none for a consumer in
        another process), counted in ``tally``.  Uses the consumer's store."""
        consumer = self.consumers[index]
        if not isinstance(consumer, Consumer):
            return 0
        return apply_open_flows(consumer, self.apply_limit, tally, partial(failed, tally), lambda: self.stopping)

    def delivery_waits(self) -> list[float]:
        """Seconds until each consumer's earliest pending delivery is due
        (<= 0: due now); what ``until_idle`` waits out.  Uses the producer's store."""
        now = self.policy.clock()
        return [d - now for d in (self.producer.store.latest.next_due_at(c.name) for c in self.consumers)
                if d is not None]

    def passed(self) -> None:
        """Count a pass and tell ``on_pass``."""
        self.stats.passes += 1
        if self._on_pass is not None:
            self._on_pass(self.stats)

    def run(
        self, *, max_passes: int | None = None, handle_signals: bool = True, until_idle: bool = False
    ) -> WorkerStats:
        """Loop until :meth:`stop`, a signal, or ``max_passes`` passes; return the totals.

        ``until_idle``: also return once a pass did no work and nothing is
        merely waiting for its time: no delivery to these consumers still
        pending (leased by a relay, or backing off after a failure) and no
        effect of the ``executors`` pending, running or in doubt.  While
        something waits, sleep until the earliest due time (looking again at
        least every :data:`~reliable_flow._loop.UNTIL_IDLE_MAX_SLEEP` seconds), so leases and
        backoffs are waited out; a consumer that keeps failing keeps it
        running.  What waits for a person does not count: an event at a gap
        or blocked, a set-aside delivery, an effect parked as unknown.

        Raises, after recording it, an error retrying cannot heal
        (:data:`~reliable_flow._loop.CANNOT_HEAL`).
        """
        try:
            self._loop.run(self.run_once, idle_sleep=self.idle_sleep, max_passes=max_passes,
                           handle_signals=handle_signals, until_idle=until_idle,
                           woken=[e.calls_ended for e in self.executors],
                           idle=self._serving_idle if self.servers else None)
        finally:
            finish_executors(self.executors, self.stats)
        return self.stats

    def _serving_idle(self, seconds: float, woken: Sequence[threading.Event]) -> None:
        """Sleep ``seconds`` waiting on the first server's requests (in slices
        of 0.1 s, so a stop, a signal or an ended call is seen), so a result
        sent from another host is advanced at once, not after the sleep."""
        deadline = time.monotonic() + seconds
        while not self.stopping and not any(event.is_set() for event in woken):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                if self.servers[0].wait(min(left, 0.1)):
                    return
            except Exception as exc:  # noqa: BLE001 - recorded; the sleep goes on without the server
                failed(self.stats, f"serving {self.servers[0].name}", exc)
                self._loop.idle(left, woken)
                return

    def _wake_in(self) -> float | None:
        """Seconds until the earliest pending delivery or open effect is due
        (bounded; :func:`~reliable_flow._loop.until_due`), or None when
        nothing waits; a failed read is recorded and answers ``idle_sleep``."""
        try:
            due = self.delivery_waits()
            due += [d for d in (e.stepper.next_due_in() for e in self.executors) if d is not None]
        except Exception as exc:  # noqa: BLE001 - recorded; look again after the idle sleep
            failed(self.stats, "due times", exc)
            return self.idle_sleep
        return until_due(due)


# -- the steps a worker shares with the transport's bridge (reliable_flow.transport) ------------


def producer_servers(producer: Producer, receivers: Sequence[Receiver], name: object) -> list[Any]:
    """The servers of ``producer`` under ``name``, one per distinct server
    the transport ``receivers`` reach (a receiver offers ``producer_server``);
    a ValueError naming ``serve_as`` when none does."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"serve_as must be a producer name (a non-empty string), got {name!r}")
    servers: dict[str, Any] = {}
    for receiver in receivers:
        make = getattr(receiver, "producer_server", None)
        if callable(make):
            server = make(producer, name)
            kept = servers.setdefault(server.where, server)
            if kept is not server:
                server.close()
            meanwhile = getattr(receiver, "serve_meanwhile", None)
            if callable(meanwhile):  # its relays wait on a bridge that may wait on this producer
                meanwhile(kept)
    if not servers:
        raise ValueError("serve_as: none of the consumers is reached through a transport that can serve a "
                         "producer (give a RedisReceiver, or `reliable-flow run --to redis://...`)")
    return list(servers.values())


def apply_open_flows(consumer: Consumer, limit: int, stats: WorkerStats,
                     failed: Callable[[str, Exception], None], stopping: Callable[[], bool]) -> int:
    """Drain each open flow of ``consumer`` on its own (up to ``limit``
    applies each), so a flow whose apply raises (a handler's bug, a full
    disk) is recorded by ``failed`` and skipped, and the others go on; the
    failed flow is tried again next pass.  Returns the applies done."""
    applied = 0
    try:
        flows = consumer.open_flows()
    except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
        failed(consumer.name, exc)
        return 0
    for flow in flows:
        if stopping():
            break
        try:
            drained = consumer.drain(flow, limit=limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            failed(f"{consumer.name} flow {flow!r}", exc)
            continue
        stats.applied += drained.applied
        applied += drained.applied
        if drained.stop != DrainStop.IDLE:
            stats.stops[drained.stop.value] += 1
    return applied


def pump_executors(executors: Sequence[EffectExecutor], limit: int, stats: WorkerStats,
                   failed: Callable[[str, Exception], None], stopping: Callable[[], bool]) -> int:
    """Each executor records the calls that ended and starts up to ``limit``
    due ones off this thread (:meth:`EffectExecutor.pump`); returns the work done."""
    work = 0
    for executor in executors:
        if stopping():
            break
        before = Counter(executor.stats.outcomes)
        try:
            # Starts calls off this thread and records those that ended:
            # a slow call never holds up the relays and applies.
            work += executor.pump(limit=limit)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            failed(f"effects of {executor.consumer.name}", exc)
        stats.effects.update(executor.stats.outcomes - before)
    return work


def finish_executors(executors: Sequence[EffectExecutor], stats: WorkerStats) -> None:
    """Wait for the effect calls in flight and record them (on the way out of a run)."""
    for executor in executors:
        before = Counter(executor.stats.outcomes)
        try:
            executor.finish()
        except Exception as exc:  # noqa: BLE001 - recorded; the lease runs out and another run takes over
            stats.errors += 1
            stats.last_error = f"effects of {executor.consumer.name}: {type(exc).__name__}: {exc}"
        stats.effects.update(executor.stats.outcomes - before)
