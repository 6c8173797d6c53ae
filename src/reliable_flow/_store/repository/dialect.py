"""The engine seam: what an engine's view supplies to the repositories."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from ..._envelope import body_hash
from ...records import OperatorAction
from .. import rows as _rows
from ..records import PruneStep, Tombstone
from .statements import SideSql

__all__ = ["Dialect", "Row"]

Row = tuple[Any, ...]


class Dialect:
    """How one statement runs on an engine, and its lock syntax.

    A repository method picks the engine's statement text from its table and
    runs it through one of these; nothing else of the engine is seen.  The
    tombstone methods, the same on every engine, are written here once."""

    #: The engine's statement table for this side (its placeholder: ``_SQL.PARAM``).
    _SQL: ClassVar[type[SideSql]]
    # The tombstone read by the same statement as an id's own row, for the
    # tombstone() call that follows it when there was no row.
    _looked_up: tuple[str, Tombstone | None] | None = None

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run a read; all its rows."""
        raise NotImplementedError

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        """Run a read; its first row, or None."""
        raise NotImplementedError

    def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a write and wait for it (its error is raised here); the rows it touched."""
        raise NotImplementedError

    def _send(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run a write nobody reads the result of (an engine may only send it:
        its error then surfaces from the unit's next wait, and fails the unit)."""
        raise NotImplementedError

    def _many(self, sql: str, params: Iterable[Sequence[Any]]) -> int:
        """Run a write once per parameter set; the rows they touched."""
        raise NotImplementedError

    def _lock(self, what: str, name: str = "", *, shared: bool = False) -> None:
        """In a unit of work, hold the lock ``what``/``name`` until it ends
        (an engine whose unit already holds everything does nothing)."""
        raise NotImplementedError

    def _guarded(self, plain: str, locked: str) -> str:
        """``locked`` (the read that also locks its rows) in a unit of an
        engine that locks rows, else ``plain``."""
        raise NotImplementedError

    def _names(self, sql: str, names: Sequence[str]) -> tuple[str, list[Any]]:
        """``sql`` with its ``{names}`` slot filled for a list of names, and
        the parameters that list takes (one per name, or one list)."""
        raise NotImplementedError

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        """Record a pruning transaction (each side's own prune_action columns)."""
        raise NotImplementedError

    def meta_value(self, key: str) -> str | None:
        row = self._one(self._SQL.META_VALUE, (key,))
        return None if row is None else str(row[0])

    def add_meta(self, key: str, value: str) -> str:
        self._run(self._SQL.ADD_META, (key, value))
        held = self.meta_value(key)
        assert held is not None  # inserted, or there already: no unit deletes meta rows
        return held

    def tombstone(self, event_id: str) -> Tombstone | None:
        looked_up, self._looked_up = self._looked_up, None
        if looked_up is not None and looked_up[0] == event_id:
            return looked_up[1]  # read with the id's row (after its lock)
        row = self._one(self._SQL.TOMBSTONE, (event_id,))
        return None if row is None else _rows.tombstone(row)

    def tombstones_before(self, before: float, limit: int) -> int:
        """How many tombstones were stamped before ``before``, counted up to ``limit``."""
        row = self._one(self._SQL.TOMBSTONES_BEFORE, (before, limit))
        return 0 if row is None else int(row[0])

    def retention_actions(self) -> list[OperatorAction]:
        """Every recorded prune (target ``retention``), oldest first."""
        return [_rows.retention_action(r) for r in self._rows(self._SQL.RETENTION_ACTIONS)]

    def _record_retention(self, action: OperatorAction) -> None:
        self._run(self._SQL.RECORD_RETENTION_ACTION,
                  (action.at, action.action, action.horizon, action.forget_before, action.actor, action.reason))

    def forget_tombstones(self, before: float, now: float, limit: int) -> int:
        gone = self._run(self._SQL.TOMBSTONE_FORGET, (before, limit))
        self._record(now, before, PruneStep(0))  # every pruning transaction is recorded
        return gone

    def _bury(self, pruned: Sequence[tuple[int, str, str, int, str]], now: float) -> None:
        """Leave a tombstone stamped ``now`` for each pruned row (position, event id, flow, seq, body)."""
        self._many(self._SQL.TOMBSTONE_BURY, [
            (event_id, flow_id, seq, body_hash(body), now) for _, event_id, flow_id, seq, body in pruned
        ])
