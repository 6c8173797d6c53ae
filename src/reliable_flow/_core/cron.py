"""Cron expressions and the ticks of a recurring schedule (no I/O, standard library only).

A cron expression has five fields, ``minute hour day-of-month month
day-of-week``; each is ``*``, a number, a range ``a-b``, a step ``*/n``,
``a-b/n`` or ``a/n`` (from ``a`` to the field's end), or a comma list of
these.  Months may be named ``jan``..``dec`` and days ``sun``..``sat``
(any case); day-of-week 0 and 7 are both Sunday.  As in every cron, when
both day-of-month and day-of-week are restricted (neither starts with
``*``) a day matches if either does.  ``@hourly``, ``@daily`` (``@midnight``),
``@weekly``, ``@monthly`` and ``@yearly`` (``@annually``) stand for their
usual expressions.

The fields are matched on the wall clock of the schedule's time zone
(:mod:`zoneinfo`).  Daylight-saving changes:

* a wall time that does not exist (02:30 on a spring-forward day in
  Europe/Berlin) ticks at the first instant after the gap (03:00 local,
  the change itself); several ticks inside one gap are one tick there;
* a wall time that happens twice (02:30 on a fall-back day) ticks once, at
  its first occurrence (the earlier instant, still on summer time).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Cron", "CronError", "parse_cron", "zone"]

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, low, high, names: name -> value)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {n: i + 1 for i, n in enumerate(_MONTHS)}),
    ("day-of-week", 0, 7, {n: i for i, n in enumerate(_DAYS)}),
)
_MACROS = {
    "@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *",
}
#: How far ahead (or back) a tick is looked for: an expression with none in
#: this many days (``0 0 30 2 *``) is refused when it is parsed.
_HORIZON_DAYS = 366 * 28 + 7
_UTC = _dt.timezone.utc


class CronError(ValueError):
    """An invalid cron expression: the message names the field at fault."""


def zone(name: object) -> ZoneInfo:
    """The time zone named ``name`` (an IANA name, ``"UTC"``, ``"Europe/Berlin"``),
    or ``ValueError`` naming ``tz``."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"tz must be a time zone name such as 'Europe/Berlin', got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"tz: unknown time zone {name!r}") from None


def _value(field: str, text: str, low: int, high: int, names: dict[str, int]) -> int:
    word = text.lower()
    if word in names:
        return names[word]
    if not (text.isascii() and text.isdigit()):  # "²" or "٣" are digits to str.isdigit
        raise CronError(f"cron: {field} field: {text!r} is not a number" +
                        (f" or a name ({', '.join(names)})" if names else ""))
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"cron: {field} field: {value} is out of range {low}-{high}")
    return value


def _field(index: int, text: str) -> tuple[frozenset[int], bool]:
    """The values a field allows, and whether it is restricted (not ``*``...)."""
    field, low, high, names = _FIELDS[index]
    allowed: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"cron: {field} field: empty item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise CronError(f"cron: {field} field: step {step_text!r} must be a whole number >= 1")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _value(field, first, low, high, names), _value(field, last, low, high, names)
            if start > end:
                raise CronError(f"cron: {field} field: range {base!r} runs backwards")
        else:
            start = _value(field, base, low, high, names)
            end = high if slash else start
        allowed.update(range(start, end + 1, step))
    if index == 4 and 7 in allowed:
        allowed.discard(7)
        allowed.add(0)
    return frozenset(allowed), not text.startswith("*")


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression in a time zone: :meth:`next_after` and
    :meth:`last_at_or_before` give its tick instants (epoch seconds)."""

    expression: str
    tz: ZoneInfo
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    def _day_matches(self, day: _dt.date) -> bool:
        if day.month not in self.months:
            return False
        in_month, in_week = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def _instant(self, day: _dt.date, hour: int, minute: int) -> float:
        """The instant of a wall time on ``day`` (the first occurrence of a
        repeated one; the end of the gap for one that does not exist)."""
        wall = _dt.datetime(day.year, day.month, day.day, hour, minute)
        for _ in range(24 * 60):  # a gap is at most a day long
            at = wall.replace(tzinfo=self.tz, fold=0).timestamp()
            if _dt.datetime.fromtimestamp(at, self.tz).replace(tzinfo=None) == wall:
                return at
            wall += _dt.timedelta(minutes=1)
        raise CronError(f"cron: no instant for {day} {hour:02d}:{minute:02d} in {self.tz.key}")  # pragma: no cover

    def _ticks_of(self, day: _dt.date, reverse: bool) -> Iterator[float]:
        times = sorted((h, m) for h in self.hours for m in self.minutes)
        seen = None
        for hour, minute in (reversed(times) if reverse else times):
            at = self._instant(day, hour, minute)
            if at != seen:
                seen = at
                yield at

    def next_after(self, after: float) -> float:
        """The first tick strictly after ``after`` (epoch seconds)."""
        day = _dt.datetime.fromtimestamp(after, self.tz).date() - _dt.timedelta(days=1)
        for _ in range(_HORIZON_DAYS):
            if self._day_matches(day):
                for at in self._ticks_of(day, reverse=False):
                    if at > after:
                        return at
            day += _dt.timedelta(days=1)
        raise CronError(f"cron: {self.expression!r} has no tick in {_HORIZON_DAYS} days")

    def latest(self, first: float, last: float, most: int, cap: int) -> tuple[list[float], int]:
        """Up to ``most`` of the latest ticks in ``[first, last]``, oldest
        first, and how many older ones there are (counted up to ``cap``):
        read a day at a time, from ``last`` back."""
        found: list[float] = []
        older = 0
        day = _dt.datetime.fromtimestamp(last, self.tz).date() + _dt.timedelta(days=1)
        stop = _dt.datetime.fromtimestamp(first, self.tz).date() - _dt.timedelta(days=1)
        while day >= stop and older < cap:
            if self._day_matches(day):
                for at in self._ticks_of(day, reverse=True):
                    if at < first or older >= cap:
                        break
                    if at > last:
                        continue
                    if len(found) < most:
                        found.append(at)
                    else:
                        older += 1
            day -= _dt.timedelta(days=1)
        return found[::-1], older

    def last_at_or_before(self, at_or_before: float) -> float | None:
        """The latest tick at or before ``at_or_before`` (None if none in the horizon)."""
        day = _dt.datetime.fromtimestamp(at_or_before, self.tz).date() + _dt.timedelta(days=1)
        for _ in range(_HORIZON_DAYS):
            if self._day_matches(day):
                for at in self._ticks_of(day, reverse=True):
                    if at <= at_or_before:
                        return at
            day -= _dt.timedelta(days=1)
        return None


def parse_cron(expression: object, tz: object = "UTC") -> Cron:
    """Parse a five-field cron expression in the time zone named ``tz``.

    Raises :class:`CronError` (a ``ValueError``) naming ``cron`` and the
    field at fault, or ``ValueError`` naming ``tz`` for an unknown zone."""
    if not isinstance(expression, str):
        raise CronError(f"cron must be a string such as '0 8 * * 1-5', got {type(expression).__name__}")
    text = _MACROS.get(expression.strip().lower(), expression)
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"cron: {expression!r} has {len(parts)} fields; five are needed "
                        "(minute hour day-of-month month day-of-week)")
    fields = [_field(i, p) for i, p in enumerate(parts)]
    cron = Cron(" ".join(parts), zone(tz), fields[0][0], fields[1][0], fields[2][0], fields[3][0], fields[4][0],
                fields[2][1], fields[4][1])
    cron.next_after(_dt.datetime(2000, 1, 1, tzinfo=_UTC).timestamp())  # refuse one that never ticks
    return cron
