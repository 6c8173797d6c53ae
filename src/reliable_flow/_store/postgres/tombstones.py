"""Tombstones of pruned events on PostgreSQL, once for both sides.

:class:`PgTombstones` is mixed into :class:`~.outbox.PgOutbox` and
:class:`~.inbox.PgInbox`; each names its own statement texts (from
:mod:`.outbox_sql` / :mod:`.inbox_sql`) as :class:`TombstoneSql`, and its
own ``_record`` of a pruning transaction.  Forgetting locks the rows it
removes, skipping those another unit holds (``FOR UPDATE SKIP LOCKED``).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from ..._envelope import body_hash
from .. import rows
from ..records import PruneStep, Tombstone
from .base import PgView

__all__ = ["Candidate", "PgTombstones", "TombstoneSql"]

# A pruned row: (position or arrival, event id, flow, seq, body).
Candidate = tuple[int, str, str, int, str]


class TombstoneSql(NamedTuple):
    """One side's tombstone statements: look one up (by event id), forget
    the old ones (stamped before %s, at most %s), bury a pruned row."""

    lookup: str
    forget: str
    bury: str


class PgTombstones(PgView):
    """What stays of a pruned event (flow, seq, body hash), and forgetting it."""

    _TOMBSTONES: ClassVar[TombstoneSql]

    def tombstone(self, event_id: str) -> Tombstone | None:
        row = self._one(self._TOMBSTONES.lookup, (event_id,))
        return None if row is None else rows.tombstone(row)

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        gone = self._run(self._TOMBSTONES.forget, (before, limit))
        self._record(now, before, PruneStep(0))  # every pruning transaction is recorded
        return gone

    def _bury(self, pruned: list[Candidate], now: float) -> None:
        self._cursor().executemany(
            self._TOMBSTONES.bury,
            [(event_id, flow_id, seq, body_hash(body), now) for _, event_id, flow_id, seq, body in pruned],
        )

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        """Record a pruning transaction (each side's own prune_action columns)."""
        raise NotImplementedError
