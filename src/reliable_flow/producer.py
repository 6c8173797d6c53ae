"""The producer: flow state and its outbox event, committed together.

This is the public face: it checks arguments, opens the store and hands a
unit of work to :mod:`reliable_flow.core.advance`, which decides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .checks import check_optional_count, check_text
from .core.admin import delivery_action_in
from .core.advance import advance_at_current_in, advance_in, build
from .core.conflicts import rerun_on_conflict
from .crash import crash_point
from .envelope import Envelope
from .errors import StorageError
from .metrics import ProducerMetrics, producer_metrics
from .observe import INFO, PRODUCER, WARNING, advanced, operator_action
from .operations import PruneResult
from .protocol import Protocol
from .registry import ConsumerRegistry
from .retention import DEFAULT_PRUNE_BATCH, prune_older_than
from .statuses import AdvanceResult, AdvanceStatus, OperatorAction, OutboxEntry
from .store import OutboxStore, OutboxUnit
from .store.open import Location, open_outbox
from .store.owner import StoreOwner
from .store.sqlite.connection import DEFAULT_BUSY_TIMEOUT
from .tracing import traced

__all__ = ["Batch", "Producer"]


class _Advancing:
    """``advance``, shared by :class:`Producer` (one commit per call) and
    :class:`Batch` (inside the batch's transaction)."""

    @traced("reliable_flow.advance", lambda self, event_id, flow_id, **_: {
        "reliable_flow.event_id": str(event_id), "reliable_flow.flow_id": str(flow_id)})
    def advance(
        self,
        event_id: str,
        flow_id: str,
        *,
        expected_seq: int,
        kind: str,
        payload: dict[str, Any],
        schema: int = 1,
        meta: dict[str, str] | None = None,
    ) -> AdvanceResult:
        """Move ``flow_id`` one step and record the event, in one transaction.

        Guarantees: either the flow row *and* its outbox event are committed
        together (``committed``), or nothing is written.  Re-sending the same
        call is safe: an identical event id and body returns ``existing``
        even after the flow has moved on; the same id with any other body
        returns ``conflict``.  A new id with the wrong ``expected_seq`` is
        ``stale``; an illegal step is ``invalid_transition`` or
        ``invalid_payload``; over ``max_backlog`` it is ``backlog_full``.
        Malformed arguments raise ``InvalidEnvelope``.
        SQL errors roll everything back and propagate.  In a
        :meth:`Producer.batch`, the same checks and statuses, inside the
        batch's transaction.
        """
        self._ready()
        return self._advance(build(event_id, flow_id, expected_seq, kind, payload, schema, meta))

    def _ready(self) -> object:
        """Refuse the call before its arguments are looked at (a closed batch)."""
        return None

    def _advance(self, env: Envelope) -> AdvanceResult:
        raise NotImplementedError


class Batch(_Advancing):
    """Advances that commit together; made by :meth:`Producer.batch`."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._unit: OutboxUnit | None = None
        self.results: list[AdvanceResult] = []
        self._metas: list[dict[str, str]] = []  # for the logs, written after the commit

    @property
    def committed(self) -> int:
        """How many advances of this batch will commit (status ``committed``)."""
        return sum(1 for r in self.results if r.status == AdvanceStatus.COMMITTED)

    def _advance(self, env: Envelope) -> AdvanceResult:
        unit = self._ready()
        # A nested step per advance: if one fails and the caller catches the
        # error, none of its half-done writes stay in the batch.
        with unit.step():
            result = advance_in(unit, self._producer.protocol, env, self._producer.max_backlog, time.time())
        self.results.append(result)
        self._metas.append(env.meta)
        return result

    def _ready(self) -> OutboxUnit:
        unit = self._unit
        if unit is None:
            raise RuntimeError("this batch is closed; use it inside its with-block")
        if unit.lost is not None:
            raise StorageError(
                "SQLite rolled this batch back after an earlier advance failed; nothing of it will commit"
            ) from unit.lost
        return unit


class Producer(_Advancing, ConsumerRegistry, StoreOwner[OutboxStore]):
    """Owns a producer file: flows, and the outbox of events they committed.

    ``Producer(path, protocol)`` creates the file if it is absent, upgrades an
    older one in place, and refuses a file that is not a producer file or was
    created for another protocol.  ``path`` may also be a PostgreSQL location
    (``postgresql://...#schema``, a connection factory or pool, or a
    :class:`PostgresLocation`; the ``postgres`` extra): the same, for a
    schema instead of a file (see docs/postgres.md).  One object per thread;
    after ``fork()`` call :meth:`reopen` in the child.

    ``max_backlog``: if set, ``advance`` answers ``backlog_full`` (storing
    nothing) while that many deliveries are still pending, summed over the
    consumers (or that many events, before any consumer was relayed to).

    Consumers are a registry (:meth:`consumers`): ``relay`` delivers only to
    registered names, so a typo'd name is refused rather than started from
    the first event.  The first consumer of a producer that has none is
    registered on its first relay; any other by :meth:`register_consumer`
    or ``relay(..., register=True)``.
    """

    def __init__(
        self,
        path: Location,
        protocol: Protocol,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_backlog: int | None = None,
    ) -> None:
        if not isinstance(protocol, Protocol):
            raise TypeError(f"protocol must be a reliable_flow Protocol, got {type(protocol).__name__}")
        check_optional_count("max_backlog", max_backlog)
        self.protocol = protocol
        self.max_backlog = max_backlog
        self._store = open_outbox(path, protocol.name, busy_timeout=busy_timeout)

    @property
    def store(self) -> OutboxStore:
        """The storage behind this producer (what ``relay`` works on)."""
        return self._store

    def _advance(self, env: Envelope) -> AdvanceResult:
        def once() -> AdvanceResult:
            with self._store.write() as unit:
                return advance_in(unit, self.protocol, env, self.max_backlog, time.time())

        return self._advanced(rerun_on_conflict(once), env.meta)

    @traced("reliable_flow.advance", lambda self, event_id, flow_id, **_: {
        "reliable_flow.event_id": str(event_id), "reliable_flow.flow_id": str(flow_id)})
    def _advance_at_current(
        self, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
        meta: dict[str, str] | None = None,
    ) -> AdvanceResult:
        """``advance`` at the seq the flow is at now, read in the advance's own
        transaction (one transaction, never ``stale``): how the effect
        executor feeds a result back.  Every other check and status of
        :meth:`advance`; an event id already committed answers ``existing``
        (same body at its seq) or ``conflict``."""

        def once() -> tuple[AdvanceResult, Envelope]:
            with self._store.write() as unit:
                return advance_at_current_in(unit, self.protocol, event_id, flow_id, kind, payload, schema, meta,
                                             self.max_backlog, time.time())

        result, env = rerun_on_conflict(once)
        return self._advanced(result, env.meta)

    def _advanced(self, result: AdvanceResult, meta: dict[str, str]) -> AdvanceResult:
        """After the commit: the crash point and the log record."""
        if result.status == AdvanceStatus.COMMITTED:
            crash_point("advance.after_commit")
        if result.status is AdvanceStatus.CONFLICT or PRODUCER.isEnabledFor(INFO):
            advanced(result, meta)
        return result

    def batch(self) -> AbstractContextManager[Batch]:
        """``with producer.batch() as b: b.advance(...)`` -- several advances, one commit.

        All advances in the block (also across flows) commit together when
        the block ends, or none of them if it raises.  Each ``b.advance``
        returns its own result, with the same checks and statuses as
        :meth:`advance`; later advances see earlier ones of the same batch
        (advance a flow twice with expected_seq 0 then 1).  Results say what
        *will* be committed: they hold only once the block exited normally.
        """
        return self._batch()

    @contextmanager
    def _batch(self) -> Iterator[Batch]:
        batch = Batch(self)
        with self._store.write() as unit:
            batch._unit = unit
            try:
                yield batch
                if unit.lost is not None:
                    raise StorageError(
                        "an advance of this batch failed and SQLite rolled the batch back; nothing committed"
                    ) from unit.lost
            finally:
                batch._unit = None
        if batch.committed:
            crash_point("advance.after_commit")
        if PRODUCER.isEnabledFor(WARNING):
            for result, meta in zip(batch.results, batch._metas):
                advanced(result, meta)

    # -- operator actions -----------------------------------------------------------

    def redeliver(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Put a set-aside (or backing-off) event back in line for ``consumer``, now.

        For use after the consumer's data was fixed.  Recorded with actor,
        time and reason; never done automatically.  The next relay sends it;
        if the conflict persists it is set aside again.
        """
        return self._operator_action("redeliver", event_id, consumer, actor, reason)

    def skip(self, event_id: str, *, consumer: str, actor: str, reason: str) -> OperatorAction:
        """Decide that ``consumer`` will never get this event; recorded, never automatic.

        The consumer's flow then waits at a gap for this seq for ever: only
        do this when the business has decided the step may be left out.
        """
        return self._operator_action("skip", event_id, consumer, actor, reason)

    def _operator_action(self, action: str, event_id: str, consumer: str, actor: str, reason: str) -> OperatorAction:
        for name, value in (("event_id", event_id), ("consumer", consumer), ("actor", actor), ("reason", reason)):
            check_text(name, value)
        now = time.time()
        with self._store.write() as unit:
            record = delivery_action_in(unit, action, event_id, consumer, actor, reason, now, self.path)
        operator_action(PRODUCER, record, previous_state=str(record.previous_state))
        return record

    def prune(
        self, older_than: float, *, now: float | None = None, batch_size: int = DEFAULT_PRUNE_BATCH,
        limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Remove outbox events committed more than ``older_than`` seconds
        before ``now`` (default: the time) that every registered consumer
        accepted or was skipped past, with their delivery rows.

        Each leaves a tombstone (id, flow, seq, SHA-256 of the body), so
        re-sending it still answers ``existing`` (same body, with its seq) or
        ``conflict``.  ``forget_after`` (seconds, >= ``older_than``; default
        never) removes tombstones pruned longer ago than that, so the file
        stops growing: an advance re-sent with a forgotten id is then
        answered ``stale`` (the flow moved past its seq), never committed
        twice.  Never removes an event still
        pending or set aside for any consumer, nor a flow row; removes
        nothing while no consumer is registered.  Works in transactions of
        at most ``batch_size`` events, up to ``limit`` events in all (None:
        until done); each transaction is recorded.  Events committed before
        the upgrade that added commit times count as old.  A consumer
        registered later "from the first event" gets only the events still
        stored.
        """
        return prune_older_than(
            self._store.write, older_than, time.time() if now is None else now, batch_size, limit, forget_after
        )

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Every recorded operator action (for one event if given), oldest first."""
        return self._store.latest.operator_actions(event_id)

    # -- reads --------------------------------------------------------------------

    def flow(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "seq", **data}`` of the flow as committed, or None if it has no event yet.

        A dict, because its keys beyond ``state`` and ``seq`` are the
        protocol's own data fields."""
        return self._store.latest.flow(flow_id)

    def flows(self) -> list[str]:
        """Ids of every flow with at least one committed event, sorted."""
        return self._store.latest.flows()

    def outbox(self, flow_id: str | None = None, *, consumer: str | None = None) -> list[OutboxEntry]:
        """The flow's events (every flow's if ``flow_id`` is None) in commit order.

        Each :class:`~reliable_flow.OutboxEntry` has ``event_id``, ``flow_id``,
        ``seq``, ``accepted`` (bool), ``state`` (pending / accepted /
        set_aside / skipped), ``last_status`` (the last relay answer, e.g.
        ``id_conflict`` for a set-aside event) and ``deliveries`` ({consumer
        name: :class:`~reliable_flow.DeliveryRecord`}).  With ``consumer=``
        the top-level fields describe that consumer; otherwise all consumers
        together: accepted only if every consumer accepted, set_aside if any
        set it aside.
        """
        with self._store.read() as reads:
            return reads.outbox(flow_id, consumer)

    def event(self, event_id: str) -> dict[str, Any] | None:
        """The stored envelope of one outbox event, or None.

        A dict, because it is the envelope exactly as it travels: a JSON object."""
        body = self._store.latest.event_body(event_id)
        return None if body is None else dict(json.loads(body))

    def metrics(self, now: float | None = None) -> ProducerMetrics:
        """Events, flows, and per consumer the deliveries pending / accepted /
        set aside / skipped, retries, failing, leased, never sent and the
        oldest pending age (see :class:`~reliable_flow.metrics.ProducerMetrics`),
        counted in one snapshot; ``now`` (default: the time) judges leases and ages."""
        with self._store.read() as reads:
            return producer_metrics(reads, time.time() if now is None else now)

    def __repr__(self) -> str:
        return f"Producer({self.path!r}, {self.protocol.name})"
