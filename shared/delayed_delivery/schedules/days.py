"""Which days of a month a cron expression names, by the day rule (``or``: Vixie, the default; ``and``).

A month's matching days depend only on its length and the weekday of its 1st, so each expression computes at most
7 x 4 day sets and remembers them: walking 400 years of months to prove an expression fires is 4,800 look-ups.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from datetime import date
from enum import StrEnum
from functools import lru_cache

from ..errors import InvalidScheduleError
from .cron import CronFields, DaysOfMonth, DaysOfWeek

__all__ = ["CYCLE_YEARS", "DayMatch", "MonthDays", "parse_day_match"]

#: The Gregorian calendar repeats its weekdays and leap years every 400 years.
CYCLE_YEARS = 400


class DayMatch(StrEnum):
    """How day-of-month and day-of-week combine."""

    #: Vixie: when both fields are restricted (neither begins with ``*`` or ``?``) either may match, else both.
    OR = "or"
    #: Both must always match (Temporal, Quartz, APScheduler).
    AND = "and"


def parse_day_match(text: str) -> DayMatch:
    """``or`` or ``and``; anything else is refused in one line."""
    try:
        return DayMatch(text.strip().lower())
    except ValueError:
        raise InvalidScheduleError(f"day match {text[:20]!r}: use or (Vixie, the default) or and") from None


class MonthDays:
    """The days of any month that an expression's day fields, month field and day rule name."""

    def __init__(self, fields: CronFields, day_match: DayMatch = DayMatch.OR) -> None:
        self.fields = fields
        dom_star, dow_star = fields.starred[2], fields.starred[4]
        self.either = day_match is DayMatch.OR and not dom_star and not dow_star
        self._days = lru_cache(maxsize=None)(self._compute)

    def days(self, year: int, month: int) -> tuple[int, ...]:
        """The matching days of ``month`` in ``year`` (none when the month field leaves the month out)."""
        if month not in self.fields.months:
            return ()
        first_weekday, length = calendar.monthrange(year, month)
        return self._days(first_weekday, length)

    def dates(self, start: date, last_year: int) -> Iterator[date]:
        """Every matching date from ``start`` on, in order, up to the end of ``last_year``."""
        year, month = start.year, start.month
        while year <= last_year:
            for day in self.days(year, month):
                if (year, month) != (start.year, start.month) or day >= start.day:
                    yield date(year, month, day)
            year, month = (year, month + 1) if month < 12 else (year + 1, 1)

    def ever(self) -> bool:
        """Whether some date of a 400-year Gregorian cycle matches (then every later cycle has one too)."""
        return any(self.days(year, month) for year in range(2000, 2000 + CYCLE_YEARS) for month in range(1, 13))

    def _compute(self, first_weekday: int, length: int) -> tuple[int, ...]:
        """The matching days of a month of ``length`` days whose 1st is ``first_weekday`` (Monday = 0)."""
        by_dom = _days_of_month(self.fields.days_of_month, first_weekday, length)
        by_dow = _days_of_week(self.fields.days_of_week, first_weekday, length)
        return tuple(sorted(by_dom | by_dow if self.either else by_dom & by_dow))


def _weekday(first_weekday: int, day: int) -> int:
    """Cron weekday (Sunday = 0) of ``day`` in a month whose 1st is Python weekday ``first_weekday``."""
    return (first_weekday + day - 1 + 1) % 7


def _days_of_month(spec: DaysOfMonth, first_weekday: int, length: int) -> set[int]:
    found = {d for d in spec.days if d <= length}
    if spec.last:
        found.add(length)
    if spec.last_weekday:
        day = length
        while _weekday(first_weekday, day) in (0, 6):
            day -= 1
        found.add(day)
    for n in spec.nearest_weekday:
        if n <= length:
            found.add(_nearest_weekday(first_weekday, length, n))
    return found


def _nearest_weekday(first_weekday: int, length: int, n: int) -> int:
    """The Monday-Friday nearest day ``n``, never leaving the month (Quartz's ``nW``)."""
    weekday = _weekday(first_weekday, n)
    if weekday == 6:  # Saturday: Friday before, or Monday after on the 1st
        return n - 1 if n > 1 else n + 2
    if weekday == 0:  # Sunday: Monday after, or Friday before on the last day
        return n + 1 if n < length else n - 2
    return n


def _days_of_week(spec: DaysOfWeek, first_weekday: int, length: int) -> set[int]:
    found = {d for d in range(1, length + 1) if _weekday(first_weekday, d) in spec.days}
    for weekday in spec.last:
        day = length
        while _weekday(first_weekday, day) != weekday:
            day -= 1
        found.add(day)
    for weekday, k in spec.nth:
        first = 1 + (weekday - _weekday(first_weekday, 1)) % 7
        day = first + 7 * (k - 1)
        if day <= length:
            found.add(day)
    return found
