"""The consumer: a persistent inbox, and strictly ordered apply per flow.

This is the public face: it checks arguments, opens the store and hands a
unit of work to :mod:`reliable_flow._core.receive` and
:mod:`reliable_flow._core.apply`, which decide.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from .. import _envelope as envelope
from .._checks import check_count, check_flag, check_optional_count, check_text
from .._core.apply import ApplyRules, Committed, Draining, Source, apply_in, drain_in
from .._core.conflicts import rerun_on_conflict
from .._core.effects import with_waits
from .._core.identity import PROTOCOL_PATH, other_path_note, protocol_path_in
from .._core.operate import why_waiting
from .._core.order import ORDER_META, STRICT, check_order, held_order_in
from .._effects import EffectRegistry
from .._handlers import AppSchema, Handler
from .._observe import CONSUMER, Observer
from .._store import InboxStore
from .._store.open import Location, open_inbox
from .._store.sqlite.connection import DEFAULT_BUSY_TIMEOUT
from ..crash import crash_point
from ..errors import InvalidEnvelope
from ..metrics import ConsumerMetrics, consumer_metrics
from ..protocol import Protocol
from ..records import (
    AppliedEvent,
    ApplyResult,
    DrainResult,
    EffectTransition,
    InboxEntry,
    ReceiveResult,
    ScheduledEffect,
    StuckFlow,
)
from ..statuses import ApplyStatus, EffectState
from ..tracing import traced
from .admin import ConsumerAdmin
from .receive import Applying, Receiving

__all__ = ["Applying", "Consumer", "ConsumerAdmin"]

DEFAULT_NAME = "default"


def _check_flow_id(flow_id: object) -> str:
    # Same rules as the envelope's flow_id, so a typo'd argument is an error
    # rather than a silent "idle".
    return envelope.check_name("flow_id", flow_id)



class Consumer:
    """Owns a consumer file: the inbox, the projection and the effect records.

    ``location`` is a file path, or a PostgreSQL location as for
    :class:`Producer` (the store is then a schema; see docs/postgres.md).

    ``schemas`` are the payload versions this consumer can decode (default:
    the protocol's ``consumer_schemas``); events in other versions are still
    accepted and stored unchanged, and block with ``unsupported_schema`` until
    a consumer that knows the version opens the same file.

    ``name`` identifies this consumer towards producers, which keep delivery
    state per name; it is fixed when the file is created (default
    ``"default"``).  One object per thread; after ``fork()`` call
    :meth:`reopen` in the child.

    ``max_inbox``: if set, ``receive`` answers ``refused`` (storing
    nothing) for a new event while that many rows are unapplied, unless the
    event is the next step of its flow (so a full inbox cannot deadlock).

    ``handlers`` run inside the apply transaction of every applied event
    (see :mod:`reliable_flow._handlers`); the effects they schedule must be
    registered in ``effects`` when one is given.  ``app_schema`` creates
    and migrates the application's own tables in this consumer's file.
    ``clock`` (seconds) stamps scheduled effects and tells their deadlines,
    and stamps when an inbox row arrived and became blocked (``stuck``).

    ``apply_on_receive`` (the receive-and-apply mode, off by default): an
    arriving event that is exactly its flow's next step and applies cleanly
    is applied in the receive transaction itself (projection, effect record,
    handlers), so one durable commit instead of two.  ``accepted`` then
    also carries ``applied=True``.  Anything else (a gap, a block, a
    duplicate, a conflict) takes the default path: the row is stored
    pending and ``apply_next`` / ``process_all`` decide, as without the
    mode.  See docs/guarantees.md, "Receive and apply in one commit".

    ``order``: this consumer's own order of applying a flow's events
    (docs/topics.md, "Each consumer's own order"), fixed when its inbox is
    first opened (a reopen with another order raises ``WrongFile`` naming
    both, nothing changed).  ``"strict"`` (the default): each event once,
    in the flow's order, a missing one reported as a gap.  ``"latest"``: an
    event applies only when its seq is newer than the flow's projection, as
    a snapshot (the steps between are not needed, nor the protocol's
    transition check); an older one is stored ``superseded`` ("superseded
    by seq N"), never applied, never waited for; no gaps.  ``"any"``: each
    event once, on arrival, in any order (the handlers' work must be
    commutative); ``last_seq`` is the highest seq applied; no gaps.

    Operator work (skip or replace an event, retry / resolve / cancel an
    effect, prune) is on :attr:`admin`, a :class:`~reliable_flow.ConsumerAdmin`.
    """

    def __init__(
        self,
        location: Location,
        protocol: Protocol,
        *,
        schemas: Collection[int] | None = None,
        name: str | None = None,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_inbox: int | None = None,
        handlers: Sequence[Handler] = (),
        effects: EffectRegistry | None = None,
        app_schema: AppSchema | None = None,
        clock: Callable[[], float] = time.time,
        apply_on_receive: bool = False,
        order: str = STRICT,
    ) -> None:
        if not isinstance(protocol, Protocol):
            raise TypeError(f"protocol must be a reliable_flow Protocol, got {type(protocol).__name__}")
        check_optional_count("max_inbox", max_inbox)
        check_flag("apply_on_receive", apply_on_receive)
        self.order: str = check_order(order)
        self.protocol = protocol
        self.max_inbox = max_inbox
        if schemas is None:
            chosen = frozenset(protocol.consumer_schemas or ())
        else:
            if isinstance(schemas, (str, bytes)) or not isinstance(schemas, Collection):
                raise ValueError(f"schemas must be a collection of ints, got {schemas!r}")
            if any(isinstance(v, bool) or not isinstance(v, int) for v in schemas):
                raise ValueError(f"schemas must hold int versions (not bools or floats), got {schemas!r}")
            chosen = frozenset(schemas)
            unknown = sorted(chosen - protocol.schemas.keys(), key=repr)
            if unknown or not chosen:
                raise ValueError(
                    f"schemas must be a non-empty subset of protocol {protocol.name!r}'s schemas "
                    f"{sorted(protocol.schemas)}; got {sorted(chosen, key=repr)}"
                )
        self.schemas: frozenset[int] = chosen
        if name is not None:
            try:
                _check_flow_id(name)
            except InvalidEnvelope as exc:
                raise ValueError(f"name {exc.problem}") from None
        self._store = open_inbox(
            location, protocol.name, name=name, default_name=DEFAULT_NAME, busy_timeout=busy_timeout
        )
        info = self._store.latest.meta()
        self._name: str = info["name"]
        self._uid: str = info["uid"]
        if isinstance(handlers, (str, bytes)) or not all(callable(h) for h in handlers):
            raise TypeError("handlers must be a sequence of functions of one ApplyContext")
        if effects is not None and not isinstance(effects, EffectRegistry):
            raise TypeError(f"effects must be an EffectRegistry or None, got {type(effects).__name__}")
        if not callable(clock):
            raise TypeError("clock must be a function returning seconds")
        self.effect_registry = effects
        self.clock = clock
        self._rules = ApplyRules(protocol, chosen, tuple(handlers), effects, self._name, clock, self.order)
        self.apply_on_receive = apply_on_receive
        self._on_arrival = self._rules if apply_on_receive else None
        self._observed = Observer()  # in-process counts (metrics) and logs
        self._receiving = Receiving(self._store, self._name, max_inbox, clock, self._observed, self.order)
        self._admin = ConsumerAdmin(self)
        try:
            if info.get(ORDER_META) != self.order:  # recorded once, or refused
                with self._store.write() as unit:
                    held_order_in(unit, self.order, self._store.location)
            self._record_protocol_path(info.get(PROTOCOL_PATH))
            if app_schema is not None:
                self._migrate_app(app_schema)
        except BaseException:
            self._store.close()  # the caller gets no consumer to close
            raise

    def _record_protocol_path(self, held: str | None) -> None:
        """The store records where its protocol is imported from, the first
        time it is opened with an importable one (see :mod:`.._core.identity`)."""
        path = self.protocol.import_path()
        if held is None and path is not None:
            with self._store.write() as unit:
                held = protocol_path_in(unit, path)
        note = other_path_note(self.location, held, path)
        if note is not None:
            CONSUMER.warning(note)

    def _migrate_app(self, app: AppSchema) -> None:
        if not isinstance(app, AppSchema):
            raise TypeError(f"app_schema must be an AppSchema, got {type(app).__name__}")
        for version in range(1, len(app.migrations) + 1):
            with self._store.write() as unit:
                # Re-read under the write lock: another process may have just done it.
                if unit.app_version(app.name) >= version:
                    continue
                for statement in app.statements(version, unit.engine):
                    unit.user_execute(statement)
                unit.set_app_version(app.name, version)

    @property
    def admin(self) -> ConsumerAdmin:
        """The operator's actions on this consumer (skip or replace an event,
        retry / resolve / cancel an effect, prune): see
        :class:`~reliable_flow.ConsumerAdmin`."""
        return self._admin

    @property
    def name(self) -> str:
        """The name producers keep this consumer's delivery state under."""
        return self._name

    @property
    def uid(self) -> str:
        """The identity of this consumer's file, fixed when it was created."""
        return self._uid

    @property
    def store(self) -> InboxStore:
        """The storage behind this consumer."""
        return self._store

    @property
    def location(self) -> str:
        """Where the store lives: the file's path, or the PostgreSQL location (password masked)."""
        return self._store.location

    # -- receive --------------------------------------------------------------------

    @traced("reliable_flow.receive")
    def receive(self, envelope_in: dict[str, Any] | str | bytes) -> ReceiveResult:
        """Store an event durably, once; the consumer owns it after ``accepted``.

        Guarantees: ``accepted`` is returned only after COMMIT, so the event
        survives any later crash.  The same event id with the same canonical
        body is ``duplicate`` (nothing written); with another body
        ``id_conflict``; a new id in a (flow, seq) slot already taken is
        ``sequence_conflict``.  A schema this consumer cannot decode is still
        accepted, unchanged.  Malformed input raises ``InvalidEnvelope``; a
        full inbox (``max_inbox``) answers ``refused``, storing nothing (the
        flow's very next step is always let in).  In the
        receive-and-apply mode ``applied=True`` says the same commit also
        applied the event.
        """
        return self._receiving.one(envelope_in, self._on_arrival)

    def receive_many(self, envelopes: Sequence[dict[str, Any] | str | bytes]) -> list[ReceiveResult]:
        """Receive several events in one transaction; one entry per event, in order.

        Same checks and statuses as :meth:`receive`.  Every envelope is
        validated before anything is stored: one malformed envelope raises
        ``InvalidEnvelope`` and stores none.  An event that a full inbox
        (``max_inbox``) refuses is answered ``refused`` and not stored; the others
        are still examined, exactly as separate ``receive`` calls would be
        (so a flow's next step still gets in).
        """
        return self._receiving.all(envelopes, self._on_arrival)

    def accept(self, body: str) -> ReceiveResult:
        """:meth:`receive`, as a :class:`~reliable_flow._receiver.Receiver` answers."""
        return self.receive(body)

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        """:meth:`receive_many`, as a :class:`~reliable_flow._receiver.Receiver` answers."""
        return self.receive_many(bodies)

    def applying(self) -> Applying:
        """This consumer as a :class:`Receiver` in the receive-and-apply mode,
        whatever ``apply_on_receive`` says: relaying to it applies each
        arriving event that is its flow's next step in the receive
        transaction (see :class:`~reliable_flow.Consumer`).  What
        :class:`~reliable_flow.Worker` relays to by default."""
        return Applying(self, self._receiving, self._rules)

    # -- apply ----------------------------------------------------------------------

    @traced("reliable_flow.apply", lambda self, flow_id: {"reliable_flow.flow_id": str(flow_id)})
    def apply_next(self, flow_id: str) -> ApplyResult:
        """Apply exactly the next step of ``flow_id`` (seq = last_seq + 1), or say why not.

        Guarantees: ``applied`` means projection, effect record and the
        inbox row's ``applied`` mark were committed in one transaction, so a
        step leaves at most one effect.  ``gap``: seq last_seq + 1 has not
        arrived but a later one has; ``idle``: nothing to do.  ``blocked``:
        the event cannot be applied (``reason`` says why); the row is marked
        blocked and is examined again on every call, so a consumer that
        knows more schemas applies it unchanged later.  SQL errors roll back
        and propagate.  Retrying after ``CommitOutcomeUnknown`` is safe: if
        the step had committed, the retry looks at the following seq.
        """
        flow_id = _check_flow_id(flow_id)

        def once() -> tuple[ApplyResult, Source]:
            with self._store.write() as unit:
                result, _, source = apply_in(unit, self._rules, flow_id)
                return result, source

        result, source = rerun_on_conflict(once)
        if result.status == ApplyStatus.APPLIED:
            crash_point("apply.after_commit")
            self._observed.applied += 1
        self._observed.applies(self._name, [(result, source)])
        return result

    @traced("reliable_flow.drain", lambda self, flow_id, *a, **k: {"reliable_flow.flow_id": str(flow_id)})
    def drain(self, flow_id: str, limit: int = 100, *, batch_size: int = 1) -> DrainResult:
        """Apply ``flow_id``'s next steps until a gap, a block, idle, or ``limit`` applies.

        ``batch_size`` applies share one transaction (default 1: each apply
        commits on its own); an interruption keeps every committed batch.
        ``stop`` is ``limit`` as soon as ``limit`` events were applied,
        without looking further; otherwise it says exactly where the
        single-step path would have stopped.
        """
        flow_id = _check_flow_id(flow_id)
        return self._drain_flows([flow_id], limit, batch_size)[flow_id]

    @traced("reliable_flow.process_all")
    def process_all(self, limit: int = 1000, *, batch_size: int = 1) -> dict[str, DrainResult]:
        """Drain every flow that has unapplied inbox rows; ``limit`` is per flow.

        A gap or a blocked event stops only its own flow; the others go on.
        ``batch_size`` applies share one transaction, across flows.
        """
        return self._drain_flows(self._store.latest.open_flows(), limit, batch_size)

    def _drain_flows(self, flows: list[str], limit: int, batch_size: int) -> dict[str, DrainResult]:
        limit = check_count("limit", limit)
        batch_size = check_count("batch_size", batch_size)
        results: dict[str, DrainResult] = {}
        reached = Draining()
        while reached.at < len(flows):

            def once(start: Draining = reached) -> Committed:
                with self._store.write() as unit:
                    return drain_in(unit, self._rules, flows, start, limit, batch_size)

            committed = rerun_on_conflict(once)
            if committed.applied:
                crash_point("apply.after_commit")
            reached = committed.reached
            results.update(committed.finished)
            self._observed.applied += committed.applied
            self._observed.applies(self._name, committed.outcomes)
        return results

    # -- reads ----------------------------------------------------------------------

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        """``{"state", "last_seq", **protocol.project(...)}`` as applied, or None.

        A dict, because its keys beyond ``state`` and ``last_seq`` are the
        protocol's own view fields."""
        return self._store.latest.projection(flow_id)

    def applied(self, flow_id: str) -> list[AppliedEvent]:
        """The flow's applied-event records (one per applied event) in the
        order they were applied."""
        return self._store.latest.effects(flow_id)

    def inbox(self, flow_id: str) -> list[InboxEntry]:
        """The flow's inbox rows by seq: ``event_id``, ``seq``, ``state``, ``reason``."""
        return [row.entry() for row in self._store.latest.inbox_rows(flow_id)]

    def flows(self) -> list[str]:
        """Ids of every flow with at least one inbox row, sorted."""
        return self._store.latest.flows()

    def open_flows(self) -> list[str]:
        """Ids of the flows with an inbox row not yet applied, sorted
        (what :meth:`process_all` works through)."""
        return self._store.latest.open_flows()

    def stuck(self, flow_id: str) -> StuckFlow:
        """What ``flow_id`` waits for, from one snapshot: its next seq, whether
        that step is ``ready``, ``blocked`` (with the reason and the stored
        detail), missing (a ``gap``) or there is nothing to do (``idle``),
        since when, and the flow's inbox rows from its next seq on."""
        flow_id = _check_flow_id(flow_id)
        with self._store.read() as reads:
            return why_waiting(reads, flow_id)

    def event(self, event_id: str) -> dict[str, Any] | None:
        """The stored envelope of one inbox event (in any state), or None.

        A dict, because it is the envelope exactly as it arrived."""
        row = self._store.latest.inbox_row(check_text("event_id", event_id))
        return None if row is None else dict(json.loads(row.body))

    def scheduled_effect(self, key: str) -> ScheduledEffect | None:
        """The scheduled effect (a row of the effect outbox) with this
        idempotency key, or None (``waiting_behind`` says which earlier
        ordered effect of its flow it waits for, if any)."""
        reads = self._store.latest
        found = reads.effect(key)
        return None if found is None else with_waits(reads, [found])[0]

    def scheduled_effects(
        self, *, state: EffectState | str | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[ScheduledEffect]:
        """Scheduled effects (rows of the effect outbox) in the order they were
        scheduled, optionally only one state / flow."""
        chosen = None if state is None else EffectState(state)
        reads = self._store.latest
        return with_waits(reads, reads.effect_list(chosen, flow_id, limit))

    def effect_history(self, key: str) -> list[EffectTransition]:
        """Every transition of the effect with idempotency key ``key``, in the
        order it happened: scheduled, claimed, called (how it ended),
        reconciled (the answer), retry planned (the due time), lease expired,
        timed out, rate limited, succeeded, dead, parked, expired,
        superseded, cancelled, an operator's action, fed back
        (:class:`~reliable_flow.statuses.Transition`), each with its time,
        attempt and executor.  Each row was written in the same transaction
        as the change it records, so the history and the effect's state
        never disagree.  Empty for an unknown key, or once the effect was
        pruned (its history goes with it)."""
        check_text("key", key)
        return self._store.latest.effect_history(key)

    def effect_counts(self) -> dict[str, int]:
        """How many effects are in each state; every state is listed (0 if none)."""
        counts = self._store.latest.effect_counts()
        return {s.value: counts.get(s.value, 0) for s in EffectState}

    def metrics(self) -> ConsumerMetrics:
        """Inbox rows per state, blocked per reason, flows at a gap, effects per
        state (one snapshot of the file), and this object's own counts since it
        was opened: duplicates received, events applied, applied per second
        (see :class:`~reliable_flow.metrics.ConsumerMetrics`)."""
        with self._store.read() as reads:
            return consumer_metrics(reads, self.clock(), self._observed)

    # -- lifecycle ---------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        self._store.close()

    def reopen(self) -> None:
        """Open a new connection in the current process (use after fork())."""
        self._store.reopen()

    def __enter__(self) -> Consumer:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self.location!r}, {self.protocol.name}, name={self.name!r})"


