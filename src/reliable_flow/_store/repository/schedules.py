"""The recurring schedules' reads and writes, the same on every engine,
written once (part of :class:`~.inbox.InboxRepository`)."""

from __future__ import annotations

from typing import ClassVar

from ...records import EffectSchedule, OperatorAction
from .. import rows
from ..schedules import NewSchedule
from .dialect import Dialect
from .statements import InboxSql

__all__ = ["ScheduleRepository"]


class ScheduleRepository(Dialect):
    """Schedules: one row per name; ``advance_schedule`` moves one on only
    from the next tick it was read with, so two units never both do."""

    _SQL: ClassVar[type[InboxSql]]

    def schedules(self) -> list[EffectSchedule]:
        return [rows.schedule(r) for r in self._rows(self._SQL.SCHEDULES)]

    def schedule(self, schedule: str) -> EffectSchedule | None:
        row = self._one(self._SQL.SCHEDULE, (schedule,))
        return None if row is None else rows.schedule(row)

    def schedule_actions(self, schedule: str | None = None) -> list[OperatorAction]:
        found = (self._rows(self._SQL.SCHEDULE_ACTIONS) if schedule is None
                 else self._rows(self._SQL.SCHEDULE_ACTIONS_OF, (schedule,)))
        return [rows.schedule_action(r) for r in found]

    def due_schedules(self, now: float) -> list[EffectSchedule]:
        return [rows.schedule(r) for r in self._rows(self._SQL.DUE_SCHEDULES, (now,))]

    def add_schedule(self, new: NewSchedule) -> bool:
        return self._run(self._SQL.ADD_SCHEDULE, (*new, new[-1])) > 0

    def advance_schedule(self, schedule: str, was_next_at: float, next_at: float, last_tick: float | None,
                         skipped: int, now: float) -> bool:
        return self._run(self._SQL.ADVANCE_SCHEDULE, (next_at, last_tick, skipped, now, schedule, was_next_at)) > 0

    def set_schedule_paused(self, schedule: str, paused: bool, next_at: float, now: float) -> None:
        self._run(self._SQL.PAUSE_SCHEDULE, (int(paused), next_at, now, schedule))

    def remove_schedule(self, schedule: str) -> None:
        self._run(self._SQL.REMOVE_SCHEDULE, (schedule,))

    def _record_schedule_action(self, action: OperatorAction) -> None:
        self._run(self._SQL.RECORD_SCHEDULE_ACTION, (action.at, action.schedule, action.action, action.actor,
                                                     action.reason))
