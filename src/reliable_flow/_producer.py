"""The producer: flow state and its outbox event, committed together.

This is the public face: it checks arguments, opens the store and hands a
unit of work to :mod:`reliable_flow._core.advance`, which decides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from ._checks import check_optional_count
from ._core.advance import advance_at_current_in, advance_in, build
from ._core.conflicts import rerun_on_conflict
from ._core.identity import PROTOCOL_PATH, STORE_UID, new_uid, other_path_note, protocol_path_in
from ._core.topics import TOPICS, Routing, declare_in
from ._envelope import Envelope
from ._observe import INFO, PRODUCER, WARNING, advanced
from ._producer_admin import ProducerAdmin
from ._store import OutboxStore, OutboxUnit
from ._store.open import Location, open_outbox
from ._store.records import as_flow_dict
from ._store.sqlite.connection import DEFAULT_BUSY_TIMEOUT
from ._topics import Topic, declaration, declared
from ._wait import check_wait, open_watch, wait_sync
from .crash import crash_point
from .errors import StorageError
from .metrics import ProducerMetrics, producer_metrics
from .protocol import Protocol
from .records import AdvanceResult, OutboxEntry
from .statuses import AdvanceStatus
from .tracing import traced

__all__ = ["Batch", "Producer", "advance_at_current", "check_at_current"]


def _advance_span(self: object, event_id: object, flow_id: object, **_: object) -> dict[str, str]:
    """The span attributes of one ``advance`` (of :class:`Producer` or :class:`Batch`)."""
    return {"reliable_flow.event_id": str(event_id), "reliable_flow.flow_id": str(flow_id)}


class Batch:
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

    @traced("reliable_flow.advance", _advance_span)
    def advance(
        self, event_id: str, flow_id: str, *, expected_seq: int, kind: str, payload: dict[str, Any],
        schema: int = 1, meta: dict[str, str] | None = None,
    ) -> AdvanceResult:
        """:meth:`Producer.advance` inside the batch's transaction: the same
        checks and statuses; it commits when the batch's block ends."""
        unit = self._ready()
        env = build(event_id, flow_id, expected_seq, kind, payload, schema, meta)
        # A nested step per advance: if one fails and the caller catches the
        # error, none of its half-done writes stay in the batch.
        with unit.step():
            result = advance_in(unit, self._producer.protocol, env, self._producer.max_backlog, time.time(),
                                self._producer._routing)
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


class Producer:
    """Owns a producer file: flows, and the outbox of events they committed.

    ``Producer(location, protocol)`` creates the file if it is absent,
    upgrades an older one in place, and refuses a file that is not a producer
    file or was created for another protocol.  ``location`` is a file path,
    or a PostgreSQL location (``postgresql://...#schema``, a connection
    factory or pool, or a :class:`PostgresLocation`; the ``postgres``
    extra): the same, for a schema instead of a file (see docs/postgres.md).  One object per thread;
    after ``fork()`` call :meth:`reopen` in the child.

    ``max_backlog``: if set, ``advance`` answers ``backlog_full`` (storing
    nothing) while that many deliveries are still pending, summed over the
    consumers (or that many events, before any consumer was relayed to).

    ``topics``: the producer's :class:`~reliable_flow.Topic` list (each
    kind of the protocol in at least one; see docs/topics.md): consumers
    subscribed to topics (``admin.register_consumer(name, topics=[...])``,
    ``admin.subscribe``) get only their topics' events.  The declaration is
    recorded in the store; None (the default) opens with the one recorded,
    or, with none, as a producer without topics (every consumer gets every
    event).  A declaration that drops or renames a topic consumers
    subscribe to, or makes a topic with two subscribers a command topic,
    raises :class:`~reliable_flow.errors.TopicError` naming it.

    Operator work (redeliver, skip, the consumer registry, prune) is on
    :attr:`admin`, a :class:`~reliable_flow.ProducerAdmin`.  Consumers are a
    registry (``admin.consumers()``): ``relay`` delivers only to registered
    names, so a typo'd name is refused rather than started from the first
    event.  The first consumer of a producer that has none is registered on
    its first relay; any other by ``admin.register_consumer`` or
    ``relay(..., register=True)``.
    """

    def __init__(
        self,
        location: Location,
        protocol: Protocol,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_backlog: int | None = None,
        topics: Sequence[Topic] | None = None,
    ) -> None:
        if not isinstance(protocol, Protocol):
            raise TypeError(f"protocol must be a reliable_flow Protocol, got {type(protocol).__name__}")
        check_optional_count("max_backlog", max_backlog)
        kinds = {k for ks in protocol.transitions.values() for k in ks}
        given = None if topics is None else Routing(declared(topics, kinds))
        self.protocol = protocol
        self.max_backlog = max_backlog
        self._store = open_outbox(location, protocol.name, busy_timeout=busy_timeout)
        self._admin = ProducerAdmin(self)
        try:
            self._record_protocol_path()
            self._routing = self._declare(given)
        except BaseException:
            self._store.close()  # the caller gets no producer to close
            raise

    def _record_protocol_path(self) -> None:
        """The store records where its protocol is imported from, the first
        time it is opened with an importable one (see :mod:`._core.identity`),
        and an identity of its own (:attr:`uid`), the first time it is opened."""
        path = self.protocol.import_path()
        reads = self._store.latest
        held, uid = reads.meta_value(PROTOCOL_PATH), reads.meta_value(STORE_UID)
        if (held is None and path is not None) or uid is None:
            with self._store.write() as unit:
                held = protocol_path_in(unit, path) if path is not None else held
                uid = unit.add_meta(STORE_UID, new_uid())
        self._uid: str = uid
        note = other_path_note(self.location, held, path)
        if note is not None:
            PRODUCER.warning(note)

    def _declare(self, given: Routing | None) -> Routing | None:
        """The topics this producer routes by: ``given`` checked against the
        store's subscriptions and recorded, or the ones recorded."""
        held = self._store.latest.meta_value(TOPICS)
        if given is None and held is None:
            return None
        if given is not None and held == declaration(given.topics):
            return given
        with self._store.write() as unit:
            return declare_in(unit, given, self.location)

    @property
    def topics(self) -> tuple[Topic, ...]:
        """The declared topics (recorded in the store), or () for a producer without topics."""
        return () if self._routing is None else self._routing.topics

    @property
    def admin(self) -> ProducerAdmin:
        """The operator's actions on this producer (redeliver, skip, the
        consumer registry, prune): see :class:`~reliable_flow.ProducerAdmin`."""
        return self._admin

    @property
    def location(self) -> str:
        """Where the store lives: the file's path, or the PostgreSQL location (password masked)."""
        return self._store.location

    @property
    def uid(self) -> str:
        """The store's identity (random hex, made the first time the store
        was opened): what a transport checks that a step sent to a producer
        by name reaches this store, as a consumer's ``uid`` does."""
        return self._uid

    @property
    def store(self) -> OutboxStore:
        """The storage behind this producer (what ``relay`` works on)."""
        return self._store

    @traced("reliable_flow.advance", _advance_span)
    def advance(
        self, event_id: str, flow_id: str, *, expected_seq: int, kind: str, payload: dict[str, Any],
        schema: int = 1, meta: dict[str, str] | None = None,
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
        :meth:`batch`, the same checks and statuses, inside the batch's
        transaction.
        """
        env = build(event_id, flow_id, expected_seq, kind, payload, schema, meta)

        def once() -> AdvanceResult:
            with self._store.write() as unit:
                return advance_in(unit, self.protocol, env, self.max_backlog, time.time(), self._routing)

        return self._advanced(rerun_on_conflict(once), env.meta)

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

    # -- reads --------------------------------------------------------------------

    def flow(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "seq", **data}`` of the flow as committed, or None if it has no event yet.

        A dict, because its keys beyond ``state`` and ``seq`` are the
        protocol's own data fields."""
        return as_flow_dict(self._store.latest.flow_state(flow_id))

    def wait(self, flow_id: str, *, after_seq: int, timeout: float | None) -> dict[str, Any] | None:
        """The flow (what :meth:`flow` returns) once its seq is past
        ``after_seq``, or None when ``timeout`` seconds passed first.

        Returns at once if the flow is already past ``after_seq`` (with
        ``after_seq=0``: once the flow has any event).  Otherwise it blocks
        until a commit -- from any process -- moves the flow: it hears of it
        on a connection of its own, opened for this wait and closed when it
        returns (PostgreSQL: ``LISTEN``, within a round trip of the commit;
        SQLite: ``PRAGMA data_version``, looked at every 50 ms), and reads the
        flow again.  ``timeout``: a finite number of seconds >= 0 (0: look
        once), or None to wait without limit.  ``flow_id`` must be a valid
        id (``InvalidEnvelope`` naming it), ``after_seq`` an int >= 0 and
        ``timeout`` as said (``ValueError`` naming the field; never a bool,
        NaN or an infinity).  Storage errors propagate.  See docs/concepts.md,
        "Waiting for a flow"."""
        check_wait(flow_id, after_seq, timeout)
        watch = open_watch(self._store, flow_id)
        try:
            return wait_sync(watch, lambda: self.flow(flow_id), after_seq, timeout)
        finally:
            watch.close()

    def flows(self) -> list[str]:
        """Ids of every flow with at least one committed event, sorted."""
        return self._store.latest.flows()

    def outbox(self, flow_id: str | None = None, *, consumer: str | None = None) -> list[OutboxEntry]:
        """The flow's events (every flow's if ``flow_id`` is None) in commit order.

        Each :class:`~reliable_flow.records.OutboxEntry` has ``event_id``, ``flow_id``,
        ``seq``, ``accepted`` (bool), ``state`` (pending / accepted /
        set_aside / skipped), ``last_status`` (the last relay answer, e.g.
        ``id_conflict`` for a set-aside event) and ``deliveries`` ({consumer
        name: :class:`~reliable_flow.records.DeliveryRecord`}).  With ``consumer=``
        the top-level fields describe that consumer; otherwise all consumers
        together: accepted only if every consumer accepted, set_aside if any
        set it aside.
        """
        with self._store.read() as reads:
            return reads.outbox(flow_id, consumer)

    def event(self, event_id: str) -> dict[str, Any] | None:
        """The stored envelope of one outbox event, or None.

        A dict, because it is the envelope exactly as it travels: a JSON object."""
        stored = self._store.latest.find_event(event_id)
        return None if stored is None else dict(json.loads(stored.body))

    def metrics(self, now: float | None = None) -> ProducerMetrics:
        """Events, flows, and per consumer the deliveries pending / accepted /
        set aside / skipped, retries, failing, leased, never sent and the
        oldest pending age (see :class:`~reliable_flow.metrics.ProducerMetrics`),
        counted in one snapshot; ``now`` (default: the time) judges leases and ages."""
        with self._store.read() as reads:
            return producer_metrics(reads, time.time() if now is None else now)

    # -- lifecycle ---------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        self._store.close()

    def reopen(self) -> None:
        """Open a new connection in the current process (use after fork())."""
        self._store.reopen()

    def __enter__(self) -> Producer:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Producer({self.location!r}, {self.protocol.name})"


@traced("reliable_flow.advance", lambda producer, event_id, flow_id, **_: _advance_span(producer, event_id, flow_id))
def advance_at_current(
    producer: Producer, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
    meta: dict[str, str] | None = None,
) -> AdvanceResult:
    """``producer.advance`` at the seq the flow is at now, read in the
    advance's own transaction (one transaction, never ``stale``): how an
    effect's result is fed back.  Every other check and status of
    :meth:`Producer.advance`; an event id already committed answers
    ``existing`` (same body at its seq) or ``conflict``."""

    def once() -> tuple[AdvanceResult, Envelope]:
        with producer._store.write() as unit:
            return advance_at_current_in(unit, producer.protocol, event_id, flow_id, kind, payload, schema, meta,
                                         producer.max_backlog, time.time(), producer._routing)

    result, env = rerun_on_conflict(once)
    return producer._advanced(result, env.meta)


class _Undone(Exception):
    """Carries a dry run's answer out of the transaction it rolls back."""

    def __init__(self, result: AdvanceResult) -> None:
        super().__init__(result.status)
        self.result = result


def check_at_current(
    producer: Producer, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
    meta: dict[str, str] | None = None,
) -> AdvanceResult:
    """What :func:`advance_at_current` would answer now, with nothing
    committed: the same transaction and checks, rolled back (how an
    operator's result is checked before it is recorded).  Malformed
    arguments raise ``InvalidEnvelope``; a storage error propagates."""
    try:
        with producer._store.write() as unit:
            result, _ = advance_at_current_in(unit, producer.protocol, event_id, flow_id, kind, payload, schema, meta,
                                              producer.max_backlog, time.time(), producer._routing)
            raise _Undone(result)
    except _Undone as undone:
        return undone.result
