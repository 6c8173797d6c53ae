"""The producer's store on PostgreSQL: advance, claims, marks and pruning, and the locks of every read.

:class:`PgOutboxStore` owns the connection; :class:`PgOutbox` is one view of
it, a unit of work inside :meth:`PgOutboxStore.write` or a snapshot inside
:meth:`PgOutboxStore.read`.

What a unit locks (READ COMMITTED holds nothing by itself), all until it ends:

* ``find_event``: the event id (advisory), so a retry racing its original
  waits and then finds it (``existing``), as on SQLite;
* ``flow_state``: the flow (advisory, which also covers a flow's first
  event, when there is no row yet) and its row (``FOR UPDATE``);
* ``find_event_and_flow`` (every advance): both of the above, in that
  order, also for an event id already used (whose answer needs no flow);
* ``backlog``: one advisory lock per schema, so two writers never both pass
  a ``max_backlog`` check that only one of them fits under;
* ``append_event``: the registry lock in shared mode (see below);
* ``next_due`` in a unit (a relay's claim): the deliveries it picks,
  ``FOR UPDATE SKIP LOCKED``, so two relays never claim the same one;
* ``pending_failures`` / ``delivery_state``: the delivery row.

Lock order is event, flow, backlog, registry, rows; a batch that takes them
for many events may still meet another batch in a cycle, which PostgreSQL
breaks by aborting one (:class:`DatabaseBusy`, nothing written).

The statement texts live in :mod:`.outbox_sql`.

The consumer registry (which names get deliveries, which consumer store
each is bound to, and the record of changes).  Registering (or removing) a name must not race with ``append_event``: an
event committed while a name is being registered would otherwise be
pending for nobody new (``append_event`` read the consumer table before the
name was there, and the registration's "every committed event" did not see
the event yet).  So a unit takes the schema's ``registry`` advisory lock:
``append_event`` and pruning in shared mode, registration, binding checks
and removal in exclusive mode.  A registration therefore waits for the
appends in flight and the appends after it see the new name.

Retention: tombstones of pruned events, and the bounded pruning
transactions that leave them.  Age is read as on SQLite: the rows before the first one stamped after the
horizon.  Concurrency: the candidate rows are locked (``FOR UPDATE ...
SKIP LOCKED``, so two pruners never bury one row twice), and on the producer
side their deliveries are locked and re-read before anything is removed, so
an operator's redelivery committed meanwhile keeps its event; a pruning
unit holds the registry lock in shared mode, so no name is registered (and
given every committed event) while events disappear.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..._envelope import Envelope
from .. import rows
from ..binding import BindingMemo
from ..records import FlowState, Keep, PruneStep, StoredEvent
from ..repository.outbox import REGISTRY_LOCK, OutboxRepository
from ..shared import identity_problem
from ..watch import channel
from .base import PgStore, PgView
from .connection import DEFAULT_LOCK_TIMEOUT, Conn, Database
from .location import Target, parse
from .outbox_sql import (
    APPEND,
    BACKLOG,
    CLAIM,
    FIND_EVENT,
    FLOW_FOR_UPDATE,
    LOCK_DELIVERIES,
    MAX_POS,
    OUTBOX_PRUNABLE,
    OUTBOX_PRUNABLE_READ,
    STILL_WAITING,
    UPSERT_FLOW,
    WAITING,
    Candidate,
    PgOutboxSql,
)
from .schema import PRODUCER
from .watch import PgSignal

__all__ = ["PgOutbox", "PgOutboxStore"]


class PgOutbox(PgView, OutboxRepository):
    """The producer's tables, seen through one connection: advance (its
    locks and pipelined reads), claims, marks and pruning here; the rest is
    :class:`~reliable_flow._store.repository.outbox.OutboxRepository`'s."""

    _SQL: ClassVar[type[PgOutboxSql]] = PgOutboxSql

    def find_event(self, event_id: str) -> StoredEvent | None:
        # The lock, then the read: two statements (the read's snapshot
        # follows the lock), sent together in a pipelined unit.
        self._lock("event", event_id)
        return self._found(event_id, self._rows(FIND_EVENT, (event_id, event_id)))

    def find_event_and_flow(self, event_id: str, flow_id: str) -> tuple[StoredEvent | None, FlowState | None]:
        """:meth:`find_event` then :meth:`flow_state`, each lock before its
        read and the event's before the flow's; in a pipelined unit the four
        statements go out together and are answered in one round trip (each
        read still a statement of its own, started once its lock is granted)."""
        if self._pipe is None:
            return self.find_event(event_id), self.flow_state(flow_id)
        self._lock("event", event_id)
        event = self._execute(FIND_EVENT, (event_id, event_id))
        self._lock("flow", flow_id)
        flow = self._execute(FLOW_FOR_UPDATE, (flow_id,))
        found = event.fetchall()  # waits for all four
        row = flow.fetchone()
        self._answered = True
        return self._found(event_id, found), None if row is None else rows.flow_state(row)

    def _found(self, event_id: str, found: list[tuple[Any, ...]]) -> StoredEvent | None:
        """The stored event among FIND_EVENT's rows; a tombstone among them is
        kept for the ``tombstone(event_id)`` call that follows."""
        stored = self._keep_tombstone(event_id, found, (4, 2, 5))
        return None if stored is None else rows.stored_event(stored[1:4])

    def flow_state(self, flow_id: str) -> FlowState | None:
        self._lock("flow", flow_id)
        row = self._one(self._guarded(self._SQL.FLOW, FLOW_FOR_UPDATE), (flow_id,))
        return None if row is None else rows.flow_state(row)

    def backlog(self, cap: int) -> int:
        """Pending deliveries summed over consumers, or events before any consumer; counts stop at ``cap``."""
        self._lock("backlog")
        row = self._one(BACKLOG, (cap, cap))
        return 0 if row is None else int(row[0])

    def put_flow(self, flow_id: str, seq: int, state: str, data: str) -> None:
        self._looked_up = None
        self._send(UPSERT_FLOW, (flow_id, seq, state, data, channel(self._schema)))

    def append_event(self, env: Envelope, committed_at: float | None = None) -> None:
        """The event, pending for every consumer registered when it commits.

        The registry lock and the insert stay two statements: the insert
        reads the consumer table, and must see a registration that held the
        lock exclusively while we waited (see the module's docstring)."""
        self._looked_up = None
        self._lock(REGISTRY_LOCK, shared=True)
        self._send(APPEND, (env.event_id, env.flow_id, env.seq, env.body, committed_at))

    def claim(self, consumer: str, positions: Sequence[int], until: float, owner: str, now: float) -> None:
        if positions:
            self._send(CLAIM, (until, owner, now, consumer, [int(p) for p in positions]))

    def mark(self, consumer: str, delivered: Sequence[tuple[int, str]],
             conflicts: Sequence[tuple[int, str]], now: float) -> None:
        """Record answers: ``delivered`` become accepted, ``conflicts`` set aside."""
        cur = self._cursor()
        if delivered:
            cur.executemany(self._SQL.MARK_DELIVERED, [(status, now, consumer, pos) for pos, status in delivered])
        if conflicts:
            cur.executemany(self._SQL.MARK_CONFLICT, [(status, now, consumer, pos) for pos, status in conflicts])

    def prunable(self, horizon: float, limit: int) -> PruneStep:
        """What a prune to ``horizon`` would remove now (events, counted up to ``limit``), read only;
        a topic's longer retention is not counted (the prune keeps those events)."""
        if self._one(self._SQL.ANY_CONSUMER) is None:
            return PruneStep(0)
        row = self._one(f"SELECT count(*) FROM ({OUTBOX_PRUNABLE_READ}) t", (horizon, MAX_POS, 0, WAITING, limit))
        return PruneStep(0 if row is None else int(row[0]))

    def prune_step(self, horizon: float, now: float, limit: int, keep: Keep | None = None,
                   after: int = 0) -> PruneStep:
        step = self._prune_outbox(horizon, now, limit, keep, after)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _prune_outbox(self, horizon: float, now: float, limit: int, keep: Keep | None, after: int) -> PruneStep:
        self._lock(REGISTRY_LOCK, shared=True)
        if self._one(self._SQL.ANY_CONSUMER) is None:
            return PruneStep(0)  # no consumer yet: every event is still owed to the first one
        found = self._rows(OUTBOX_PRUNABLE, (horizon, MAX_POS, after, WAITING, limit))
        looked = {"looked": len(found), "last_pos": int(found[-1][0]) if found else after}
        if keep is not None:
            found = [r for r in found if not keep(int(r[0]), str(r[4]))]
        if not found:
            return PruneStep(0, **looked)
        positions = [int(r[0]) for r in found]
        self._rows(LOCK_DELIVERIES, (positions,))
        waiting = {int(r[0]) for r in self._rows(STILL_WAITING, (positions, WAITING))}
        kept: list[Candidate] = [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4])) for r in found if int(r[0]) not in waiting
        ]
        if not kept:
            return PruneStep(0, **looked)
        gone = [r[0] for r in kept]
        self._bury(kept, now)
        deliveries = self._run(
            "DELETE FROM delivery WHERE pos = ANY(%s) AND consumer IN (SELECT name FROM consumer)", (gone,)
        )
        self._run("DELETE FROM outbox WHERE pos = ANY(%s)", (gone,))
        return PruneStep(len(kept), deliveries=deliveries, **looked)


class PgOutboxStore(PgStore[PgOutbox], BindingMemo):
    """A producer's store in a PostgreSQL schema: one connection, owned by
    the opening process and thread.

    ``location`` is a ``postgresql://`` string (schema as the fragment,
    default ``reliable_flow_producer``) or a connection factory; ``schema``
    overrides the fragment.  Creates the schema if absent (recording
    ``protocol``), and refuses one of another kind, product, version or
    protocol before writing anything.  ``busy_timeout`` is the session's
    ``lock_timeout`` in seconds.  ``readonly`` opens it for reads only.
    """

    def __init__(
        self, location: Target, protocol: str | None, *, busy_timeout: float = DEFAULT_LOCK_TIMEOUT,
        readonly: bool = False, schema: str | None = None,
    ) -> None:
        def on_create(conn: Conn) -> None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', %s)", (protocol,))

        def check_meta(meta: dict[str, str]) -> str | None:
            return identity_problem(meta, protocol)

        self._where = parse(location, PRODUCER.name, schema)
        super().__init__(Database(
            self._where, PRODUCER, lock_timeout=busy_timeout, on_create=on_create,
            check_meta=check_meta, readonly=readonly,
        ), PgOutbox)

    def watch(self) -> PgSignal:
        """A signal for ``wait``: ``LISTEN`` on the schema's channel, on a connection of its own."""
        return PgSignal(self._where, self.location)

