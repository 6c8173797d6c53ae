"""Retention on PostgreSQL: tombstones of pruned events, and the bounded
pruning transactions that leave them, for both store kinds.

Mixins of :class:`~reliable_flow.store.postgres.outbox.PgOutbox` and
:class:`~reliable_flow.store.postgres.inbox.PgInbox`.

Age is read as on SQLite: the rows before the first one stamped after the
horizon.  Concurrency: the candidate rows are locked (``FOR UPDATE ...
SKIP LOCKED``, so two pruners never bury one row twice), and on the producer
side their deliveries are locked and re-read before anything is removed, so
an operator's redelivery committed meanwhile keeps its event; a pruning
unit holds the registry lock in shared mode, so no name is registered (and
given every committed event) while events disappear.
"""

from __future__ import annotations

from ...envelope import body_hash
from ...statuses import DeliveryState
from ..records import PruneStep, Tombstone
from .base import PgView
from .registry import REGISTRY_LOCK

__all__ = ["EFFECTS_PRUNABLE", "INBOX_PRUNABLE", "OUTBOX_PRUNABLE", "PgInboxRetention", "PgOutboxRetention"]

_WAITING = [DeliveryState.PENDING.value, DeliveryState.SET_ASIDE.value]
_MAX_POS = 9223372036854775807

OUTBOX_PRUNABLE = (
    "SELECT o.pos, o.event_id, o.flow_id, o.seq, o.body FROM outbox o "
    "WHERE o.pos < coalesce((SELECT pos FROM outbox WHERE committed_at > %s ORDER BY pos LIMIT 1), %s) "
    "AND NOT EXISTS (SELECT 1 FROM delivery d JOIN consumer c ON c.name = d.consumer "
    "WHERE d.pos = o.pos AND d.state = ANY(%s)) ORDER BY o.pos LIMIT %s FOR UPDATE OF o SKIP LOCKED"
)
# The deliveries of the candidates, locked and read again after the lock.
_STILL_WAITING = (
    "SELECT DISTINCT d.pos FROM delivery d WHERE d.pos = ANY(%s) AND d.state = ANY(%s) "
    "AND d.consumer IN (SELECT name FROM consumer)"
)
_LOCK_DELIVERIES = "SELECT 1 FROM delivery WHERE pos = ANY(%s) ORDER BY consumer, pos FOR UPDATE"
INBOX_PRUNABLE = (
    "SELECT i.arrival, i.event_id, i.flow_id, i.seq, i.body FROM inbox i "
    "JOIN projection p ON p.flow_id = i.flow_id "
    "WHERE i.arrival < coalesce((SELECT arrival FROM inbox WHERE received_at > %s ORDER BY arrival LIMIT 1), %s) "
    "AND i.state IN ('applied','skipped','replaced') AND i.seq <= p.last_seq ORDER BY i.arrival LIMIT %s "
    "FOR UPDATE OF i SKIP LOCKED"
)
EFFECTS_PRUNABLE = (
    "SELECT id FROM effect_outbox "
    "WHERE state IN ('succeeded','expired','superseded','cancelled') AND updated_at <= %s "
    "AND (fed IS NULL OR fed = 1) ORDER BY state, id LIMIT %s FOR UPDATE SKIP LOCKED"
)

Candidate = tuple[int, str, str, int, str]


class _Tombstones(PgView):
    """Reading, writing and forgetting the tombstones of one table."""

    _TABLE: str

    def tombstone(self, event_id: str) -> Tombstone | None:
        row = self._one(f"SELECT flow_id, seq, body_hash FROM {self._TABLE} WHERE event_id = %s", (event_id,))
        return None if row is None else Tombstone(str(row[0]), int(row[1]), bytes(row[2]))

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        gone = self._run(
            f"DELETE FROM {self._TABLE} WHERE event_id IN "
            f"(SELECT event_id FROM {self._TABLE} WHERE pruned_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)",
            (before, limit),
        )
        self._record(now, before, PruneStep(0))  # every pruning transaction is recorded
        return gone

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        """Append one pruning transaction to ``prune_action``."""
        raise NotImplementedError

    def _bury(self, rows: list[Candidate], now: float) -> None:
        self._conn.cursor().executemany(
            f"INSERT INTO {self._TABLE}(event_id, flow_id, seq, body_hash, pruned_at) VALUES (%s, %s, %s, %s, %s)",
            [(event_id, flow_id, seq, body_hash(body), now) for _, event_id, flow_id, seq, body in rows],
        )


class PgOutboxRetention(_Tombstones):
    """The producer's tombstones and pruning."""

    _TABLE = "outbox_tombstone"

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        step = self._prune_outbox(horizon, now, limit)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._run(
            "INSERT INTO prune_action(at, horizon, events, deliveries) VALUES (%s, %s, %s, %s)",
            (now, horizon, step.events, step.deliveries),
        )

    def _prune_outbox(self, horizon: float, now: float, limit: int) -> PruneStep:
        self._lock(REGISTRY_LOCK, shared=True)
        if self._one("SELECT 1 FROM consumer LIMIT 1") is None:
            return PruneStep(0)  # no consumer yet: every event is still owed to the first one
        found = self._rows(OUTBOX_PRUNABLE, (horizon, _MAX_POS, _WAITING, limit))
        if not found:
            return PruneStep(0)
        positions = [int(r[0]) for r in found]
        self._rows(_LOCK_DELIVERIES, (positions,))
        waiting = {int(r[0]) for r in self._rows(_STILL_WAITING, (positions, _WAITING))}
        rows: list[Candidate] = [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4])) for r in found if int(r[0]) not in waiting
        ]
        if not rows:
            return PruneStep(0)
        kept = [r[0] for r in rows]
        self._bury(rows, now)
        deliveries = self._run(
            "DELETE FROM delivery WHERE pos = ANY(%s) AND consumer IN (SELECT name FROM consumer)", (kept,)
        )
        self._run("DELETE FROM outbox WHERE pos = ANY(%s)", (kept,))
        return PruneStep(len(rows), deliveries=deliveries)


class PgInboxRetention(_Tombstones):
    """The consumer's tombstones and pruning."""

    _TABLE = "inbox_tombstone"

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep:
        rows: list[Candidate] = [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]))
            for r in self._rows(INBOX_PRUNABLE, (horizon, _MAX_POS, limit))
        ]
        records = 0
        if rows:
            self._bury(rows, now)
            ids = [r[1] for r in rows]
            records = self._run("DELETE FROM effect WHERE event_id = ANY(%s)", (ids,))
            self._run("DELETE FROM inbox WHERE event_id = ANY(%s)", (ids,))
        finished = [int(r[0]) for r in self._rows(EFFECTS_PRUNABLE, (horizon, limit))]
        effect_rows = self._run("DELETE FROM effect_outbox WHERE id = ANY(%s)", (finished,)) if finished else 0
        step = PruneStep(len(rows), effect_records=records, effect_rows=effect_rows)
        self._record(now, horizon, step)  # also a pass that found nothing
        return step

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._run(
            "INSERT INTO prune_action(at, horizon, events, effect_records, effect_rows) "
            "VALUES (%s, %s, %s, %s, %s)",
            (now, horizon, step.events, step.effect_records, step.effect_rows),
        )
