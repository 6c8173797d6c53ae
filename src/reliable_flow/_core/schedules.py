"""Recurring effect schedules: recording a declaration, making each due tick
an ordinary effect exactly once, and the operator's pause, resume and removal.

A tick becomes an effect keyed ``schedule:<schedule>:<tick>`` in the same
transaction that moves the schedule's ``next_at`` on, and the move is made
only from the ``next_at`` it was read with (:meth:`ScheduleUnit.advance_schedule`):
two executors racing for one tick never both make it, and a crash before the
commit leaves neither.  From there the effect machinery (claims, leases,
retries, history) performs it exactly once in effect.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from .. import _envelope as envelope
from .._effects.every import ScheduleSpec
from .._store.effects import NewEffect
from .._store.inbox import InboxUnit
from ..errors import NotResolvable, ScheduleConflict, UnknownSchedule
from ..records import EffectSchedule, EffectTransition, OperatorAction, tick_key
from ..statuses import ActionTarget, Transition
from .cron import parse_cron

__all__ = ["MAX_CATCH_UP", "ON_TIME", "Ticks", "declare_in", "fire_in", "schedule_action_in", "ticks_of"]

#: ``missed="all"`` performs at most this many missed ticks, the latest ones;
#: older ones are counted in ``skipped``.
MAX_CATCH_UP = 100
#: ``missed="skip"``: a tick found at most this long after its time (and
#: before half the way to the next tick) is on time, not missed (seconds).
ON_TIME = 60.0
#: Missed ticks are counted in ``skipped`` up to this many per catch-up.
_COUNT_CAP = 10_000


class Ticks(Protocol):
    """The tick instants of a schedule (epoch seconds)."""

    def next_after(self, after: float) -> float: ...

    def last_at_or_before(self, at_or_before: float) -> float | None: ...

    def latest(self, first: float, last: float, most: int, cap: int) -> tuple[list[float], int]: ...


@dataclass(frozen=True)
class _Every:
    """Ticks at the multiples of ``interval`` since the epoch, to the millisecond."""

    interval: float

    def _at(self, k: int) -> float:
        return round(k * self.interval, 3)

    def _index_at_or_before(self, t: float) -> int:
        k = math.floor(t / self.interval) + 1
        while self._at(k) > t:
            k -= 1
        return k

    def next_after(self, after: float) -> float:
        return self._at(self._index_at_or_before(after) + 1)

    def last_at_or_before(self, at_or_before: float) -> float | None:
        return self._at(self._index_at_or_before(at_or_before))

    def latest(self, first: float, last: float, most: int, cap: int) -> tuple[list[float], int]:
        top = self._index_at_or_before(last)
        bottom = self._index_at_or_before(first)
        if self._at(bottom) < first:
            bottom += 1
        if top < bottom:
            return [], 0
        taken = max(bottom, top - most + 1)
        return [self._at(k) for k in range(taken, top + 1)], min(taken - bottom, cap)


def ticks_of(interval: float | None, cron: str | None, tz: str) -> Ticks:
    """The ticks of an interval or a cron schedule."""
    if interval is not None:
        return _Every(interval)
    assert cron is not None
    return parse_cron(cron, tz)


def _definition_changes(stored: EffectSchedule, spec: ScheduleSpec) -> list[str]:
    pairs = {"name": (stored.name, spec.name), "payload": (envelope.canonical(stored.payload), spec.payload),
             "interval": (stored.interval, spec.interval), "cron": (stored.cron, spec.cron),
             "tz": (stored.tz, spec.tz), "missed": (stored.missed, spec.missed)}
    return [f"{field} {old!r} -> {new!r}" for field, (old, new) in pairs.items() if old != new]


def declare_in(unit: InboxUnit, specs: Mapping[str, ScheduleSpec], now: float) -> list[str]:
    """Record each declared schedule not stored yet, its first tick the first
    after ``now``; the names newly recorded.  A name stored with another
    definition raises :class:`ScheduleConflict` (the unit rolls back: nothing
    is recorded) until an operator removes it."""
    added = []
    for name in sorted(specs):
        spec = specs[name]
        stored = unit.schedule(name)
        if stored is None:
            first = ticks_of(spec.interval, spec.cron, spec.tz).next_after(now)
            if unit.add_schedule((name, spec.name, spec.payload, spec.interval, spec.cron, spec.tz, spec.missed,
                                  first, now)):
                added.append(name)
                continue
            stored = unit.schedule(name)  # another executor recorded it meanwhile
            assert stored is not None
        changed = _definition_changes(stored, spec)
        if changed:
            raise ScheduleConflict(
                f"schedule {name!r} is stored with another definition ({'; '.join(changed)}); an operator's "
                f"remove_schedule lets the new one be recorded (reliable-flow schedule remove CONSUMER {name} ...)")
    return added


def _chosen(schedule: EffectSchedule, ticks: Ticks, now: float, next_at: float) -> tuple[list[float], int]:
    """The due ticks a catch-up performs, oldest first, and how many it skips."""
    most = MAX_CATCH_UP if schedule.missed == "all" else 1
    due, skipped = ticks.latest(schedule.next_at, now, most, _COUNT_CAP)
    if schedule.missed == "skip" and due and now - due[-1] > min(ON_TIME, (next_at - due[-1]) / 2):
        return [], skipped + len(due)  # found late: missed, and skip performs none
    return due, skipped


def fire_in(unit: InboxUnit, names: Collection[str], now: float) -> list[str]:
    """Make the due ticks of every schedule not paused whose effect is one of
    ``names`` (the executor's registered effects) effects, and move each
    schedule on to its first tick after ``now``, all in this unit; the keys
    of the effects made.  A schedule another unit moved first is left alone."""
    made: list[str] = []
    for schedule in unit.due_schedules(now):
        if schedule.name not in names:
            continue
        ticks = ticks_of(schedule.interval, schedule.cron, schedule.tz)
        next_at = ticks.next_after(now)
        due, skipped = _chosen(schedule, ticks, now, next_at)
        last = due[-1] if due else None
        if not unit.advance_schedule(schedule.schedule, schedule.next_at, next_at, last, skipped, now):
            continue
        payload = envelope.canonical(schedule.payload)
        flow = f"schedule:{schedule.schedule}"
        notes = []
        for tick in due:
            key = tick_key(schedule.schedule, tick)
            meta = envelope.canonical({"schedule": schedule.schedule, "tick": key.rsplit(":", 1)[1]})
            new = NewEffect(key, schedule.name, payload, key, flow, 0, meta, False, None, None, None, now, tick)
            if unit.add_effect(new) is not None:
                continue  # performed before (the schedule was removed and declared again)
            made.append(key)
            notes.append(EffectTransition(key, schedule.name, now, Transition.SCHEDULED, 0,
                                          detail=f"tick of schedule {schedule.schedule!r}", due_at=tick))
        unit.add_transitions(notes)
    return made


def schedule_action_in(unit: InboxUnit, action: str, schedule: str, actor: str, reason: str,
                       now: float) -> OperatorAction:
    """An operator's ``pause``, ``resume`` or ``remove`` of a schedule, recorded.

    A pause keeps the schedule's row; no tick is made while paused, and the
    ticks whose time passes meanwhile are not performed (they were paused,
    not missed): a resume moves ``next_at`` to the first tick after ``now``.
    A removal deletes the row (the effects its ticks made stay); an executor
    whose registry declares the schedule records it again when it opens."""
    stored = unit.schedule(schedule)
    if stored is None:
        raise UnknownSchedule(f"no schedule named {schedule!r}")
    if action == "pause":
        if stored.paused:
            raise NotResolvable(f"schedule {schedule!r} is already paused")
        unit.set_schedule_paused(schedule, True, stored.next_at, now)
    elif action == "resume":
        if not stored.paused:
            raise NotResolvable(f"schedule {schedule!r} is not paused")
        unit.set_schedule_paused(schedule, False, ticks_of(stored.interval, stored.cron, stored.tz).next_after(now),
                                 now)
    elif action == "remove":
        unit.remove_schedule(schedule)
    else:
        raise ValueError(f"action must be pause, resume or remove, got {action!r}")
    record = OperatorAction(at=now, target=ActionTarget.SCHEDULE, action=action, actor=actor, reason=reason,
                            schedule=schedule)
    unit.record_action(record)
    return record
