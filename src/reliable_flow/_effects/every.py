"""A recurring effect as the application declares it (``EffectRegistry.every``).

The declaration only checks and holds the definition; the consumer's store
records it when an executor opens (:func:`reliable_flow._core.schedules.declare_in`),
and each tick is made an ordinary effect by the executor that finds it due
(:func:`reliable_flow._core.schedules.fire_in`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import _envelope as envelope
from .._core.cron import parse_cron, zone

__all__ = ["MIN_INTERVAL", "MISSED", "ScheduleSpec", "declare"]

#: What happens to ticks whose time passed while no executor took them.
MISSED = ("one", "all", "skip")
#: The shortest interval (seconds): ticks are keyed to the millisecond.
MIN_INTERVAL = 0.001


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A declared recurring schedule: ``schedule`` (its name), the effect
    ``name`` each tick performs with ``payload`` (canonical JSON text),
    ``interval`` seconds or a ``cron`` expression in ``tz``, and what
    ``missed`` ticks get."""

    schedule: str
    name: str
    payload: str
    interval: float | None
    cron: str | None
    tz: str
    missed: str

    def definition(self) -> tuple[Any, ...]:
        """What must match a stored schedule of the same name."""
        return (self.name, self.payload, self.interval, self.cron, self.tz, self.missed)


def _interval(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"interval must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"interval must be finite, got {value!r}")
    if value < MIN_INTERVAL:
        raise ValueError(f"interval must be at least {MIN_INTERVAL} s, got {value!r}")
    return float(value)


def declare(name: str, payload_text: str, interval: object, cron: object, tz: object, missed: object,
            schedule: object) -> ScheduleSpec:
    """Check a declaration (every argument named in its error) and return it."""
    if schedule is None:
        schedule = name
    envelope.check_name("schedule", schedule)
    assert isinstance(schedule, str)
    if (interval is None) == (cron is None):
        raise ValueError("give exactly one of interval= (seconds) and cron= (an expression)")
    if not isinstance(missed, str) or missed not in MISSED:
        raise ValueError(f"missed must be one of {', '.join(MISSED)}, got {missed!r}")
    if cron is not None:
        parsed = parse_cron(cron, tz)
        return ScheduleSpec(schedule, name, payload_text, None, parsed.expression, parsed.tz.key, missed)
    seconds = _interval(interval)
    if tz != "UTC":
        zone(tz)  # checked all the same: an unknown zone is a mistake wherever it is given
        raise ValueError("tz is for cron= schedules; an interval counts seconds since the epoch")
    return ScheduleSpec(schedule, name, payload_text, seconds, None, "UTC", missed)
