"""What recurring effect schedules ask of the consumer's storage.

A schedule is one row of the consumer's store, by name: its definition,
its next tick and whether it is paused.  These methods are part of the
consumer side's units and reads (:class:`~reliable_flow._store.inbox.InboxUnit`).
"""

from __future__ import annotations

from typing import Protocol

from ..records import EffectSchedule, OperatorAction

__all__ = ["NewSchedule", "ScheduleReads", "ScheduleUnit"]

# (schedule, name, payload, interval, cron, tz, missed, next_at, created_at)
NewSchedule = tuple[str, str, str, "float | None", "str | None", str, str, float, float]


class ScheduleReads(Protocol):
    """Reads of the recurring schedules."""

    def schedules(self) -> list[EffectSchedule]:
        """Every stored schedule, by name."""

    def schedule(self, schedule: str) -> EffectSchedule | None:
        """The schedule of this name, or None."""

    def schedule_actions(self, schedule: str | None = None) -> list[OperatorAction]:
        """Recorded operator actions on schedules (target ``schedule``; for
        one name if given), in order."""


class ScheduleUnit(ScheduleReads, Protocol):
    """Writes of the recurring schedules, inside a consumer-side unit of work."""

    def due_schedules(self, now: float) -> list[EffectSchedule]:
        """Schedules not paused whose next tick is at or before ``now``, earliest first."""

    def add_schedule(self, new: NewSchedule) -> bool:
        """Store a schedule unless its name is taken; whether it was stored."""

    def advance_schedule(self, schedule: str, was_next_at: float, next_at: float, last_tick: float | None,
                         skipped: int, now: float) -> bool:
        """Move a schedule read with next tick ``was_next_at`` on to
        ``next_at`` (``last_tick`` if not None, ``skipped`` more skipped
        ticks); False, nothing written, when another unit moved it first or
        it was paused or removed meanwhile (on PostgreSQL the row lock
        waits for that unit: two units never both move it)."""

    def set_schedule_paused(self, schedule: str, paused: bool, next_at: float, now: float) -> None:
        """Pause or resume a schedule, with its next tick."""

    def remove_schedule(self, schedule: str) -> None:
        """Delete the schedule's row (its effects stay)."""
