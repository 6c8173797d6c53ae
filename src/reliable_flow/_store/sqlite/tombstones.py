"""Tombstones of pruned events on SQLite, once for both sides.

:class:`SqliteTombstones` is mixed into :class:`~.outbox.SqliteOutbox` and
:class:`~.inbox.SqliteInbox`; each names its own statement texts (from
:mod:`.outbox_sql` / :mod:`.inbox_sql`) as :class:`TombstoneSql`, and its
own ``_record`` of a pruning transaction.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from ..._envelope import body_hash
from .. import rows
from ..records import PruneStep, Tombstone
from .base import Statements

__all__ = ["Candidate", "SqliteTombstones", "TombstoneSql"]

# A pruned row: (position or rowid, event id, flow, seq, body).
Candidate = tuple[int, str, str, int, str]


class TombstoneSql(NamedTuple):
    """One side's tombstone statements: look one up (by event id), forget
    the old ones (stamped before ?, at most ?), bury a pruned row."""

    lookup: str
    forget: str
    bury: str


class SqliteTombstones:
    """What stays of a pruned event (flow, seq, body hash), and forgetting it."""

    _conn: Statements
    _TOMBSTONES: ClassVar[TombstoneSql]

    def tombstone(self, event_id: str) -> Tombstone | None:
        row = self._conn.execute(self._TOMBSTONES.lookup, (event_id,)).fetchone()
        return None if row is None else rows.tombstone(row)

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        # A scan, but of a table that forgetting keeps to the window's size.
        gone = int(self._conn.execute(self._TOMBSTONES.forget, (before, limit)).rowcount)
        self._record(now, before, PruneStep(0))  # every pruning transaction is recorded
        return gone

    def _bury(self, pruned: list[Candidate], now: float) -> None:
        self._conn.executemany(
            self._TOMBSTONES.bury,
            [(event_id, flow_id, seq, body_hash(body), now) for _, event_id, flow_id, seq, body in pruned],
        )

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        """Record a pruning transaction (each side's own prune_action columns)."""
        raise NotImplementedError
