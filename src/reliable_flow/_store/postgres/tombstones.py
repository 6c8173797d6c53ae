"""Tombstones of pruned events on PostgreSQL, once for both sides.

:class:`PgTombstones` is mixed into :class:`~.outbox.PgOutbox` and
:class:`~.inbox.PgInbox`; each names its own statement texts (from
:mod:`.outbox_sql` / :mod:`.inbox_sql`) as :class:`TombstoneSql`, and its
own ``_record`` of a pruning transaction.  Forgetting locks the rows it
removes, skipping those another unit holds (``FOR UPDATE SKIP LOCKED``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

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
    # The tombstone read by the same statement as an id's own row (the
    # outbox's find_event, the inbox's inbox_row), for the tombstone() call
    # that follows it when there was no row.
    _looked_up: tuple[str, Tombstone | None] | None = None

    def _keep_tombstone(self, event_id: str, found: Sequence[Sequence[Any]],
                        columns: tuple[int, int, int]) -> Sequence[Any] | None:
        """The id's own row among ``found`` (those whose first column is
        true), else None, keeping the tombstone among the others (its flow,
        seq and body hash at ``columns``) for :meth:`tombstone`."""
        held = [r for r in found if r[0]]
        if held:
            self._looked_up = None
            return held[0]
        tomb = [r for r in found if not r[0]]
        self._looked_up = (event_id, rows.tombstone(tuple(tomb[0][i] for i in columns)) if tomb else None)
        return None

    def tombstone(self, event_id: str) -> Tombstone | None:
        looked_up, self._looked_up = self._looked_up, None
        if looked_up is not None and looked_up[0] == event_id:
            return looked_up[1]  # read with the id's row, after the event's lock
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
