"""An independent brute-force walker: every UTC minute of a window, converted to local time, matched against cron.

It shares nothing with the evaluator but the field parser (checked on its own against cronsim and croniter): dates
are matched day by day from the calendar module, slots are found by visiting instants, and the DST policy is applied
from the definitions in recurring-semantics.md:
- a slot visited once fires then; a slot visited twice (a fold) fires at the first, the last or both visits;
- a matching slot never visited is in a gap: skip, shift (the slot read with the UTC offset in force just before
  the jump over it) or clamp (the first instant after the jump).
"""

from __future__ import annotations

import calendar
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from delayed_delivery.schedules.cron import CronFields, parse_cron

MINUTE = timedelta(minutes=1)


def _cron_weekday(d: date) -> int:
    return d.isoweekday() % 7  # Sunday = 0


def _dom_matches(f: CronFields, d: date) -> bool:
    length = calendar.monthrange(d.year, d.month)[1]
    spec = f.days_of_month
    weekdays = [x for x in range(1, length + 1) if date(d.year, d.month, x).isoweekday() <= 5]
    if d.day in spec.days or (spec.last and d.day == length) or (spec.last_weekday and d.day == max(weekdays)):
        return True
    for n in spec.nearest_weekday:
        if n <= length:  # the weekday of the month closest to day n (ties cannot happen: weekends are 2 days)
            best = min(weekdays, key=lambda x: (abs(x - n), x))
            if best == d.day:
                return True
    return False


def _dow_matches(f: CronFields, d: date) -> bool:
    spec = f.days_of_week
    wd = _cron_weekday(d)
    if wd in spec.days:
        return True
    length = calendar.monthrange(d.year, d.month)[1]
    same = [x for x in range(1, length + 1) if _cron_weekday(date(d.year, d.month, x)) == wd]
    if wd in spec.last and d.day == same[-1]:
        return True
    return any(w == wd and len(same) >= k and same[k - 1] == d.day for w, k in spec.nth)


def date_matches(f: CronFields, d: date, day_match: str = "or") -> bool:
    """The day rule, written from recurring-semantics.md §1."""
    if d.month not in f.months:
        return False
    dom, dow = _dom_matches(f, d), _dow_matches(f, d)
    restricted = not f.starred[2] and not f.starred[4]
    if day_match == "or" and restricted:
        return dom or dow
    return dom and dow


class Walk:
    """Every UTC minute from two days before ``start`` to two days after ``end``: the visits and the gaps of a cron."""

    def __init__(self, expression: str, zone: str, start: datetime, end: datetime, day_match: str = "or") -> None:
        f = parse_cron(expression)
        z = ZoneInfo(zone)
        self.start, self.end = start, end
        first, last = start - timedelta(days=2), end + timedelta(days=2)
        walls: list[tuple[datetime, datetime]] = []  # (utc minute, local wall)
        t = first
        while t < last:
            walls.append((t, t.astimezone(z).replace(tzinfo=None)))
            t += MINUTE
        days: dict[date, bool] = {}

        def matches(wall: datetime) -> bool:
            if wall.minute not in f.minutes or wall.hour not in f.hours:
                return False
            d = wall.date()
            if d not in days:
                days[d] = date_matches(f, d, day_match)
            return days[d]

        self.visits: dict[datetime, list[datetime]] = defaultdict(list)
        for instant, wall in walls:
            if matches(wall):
                self.visits[wall].append(instant)
        # matching local minutes never visited are in gaps: (the offset just before the jump, the instant after it)
        self.gaps: list[tuple[datetime, timedelta, datetime]] = []
        wall = walls[0][1].replace(second=0) + timedelta(days=1)
        stop = walls[-1][1] - timedelta(days=1)
        while wall < stop:
            if wall not in self.visits and matches(wall):
                jump = next(i for i, (_, w) in enumerate(walls) if w > wall)
                offset_before = walls[jump - 1][0].astimezone(z).utcoffset()
                assert offset_before is not None
                self.gaps.append((wall, offset_before, walls[jump][0]))
            wall += MINUTE

    def instants(self, gap: str, fold: str) -> list[datetime]:
        """The instants in ``[start, end)`` under ``gap/fold``."""
        found: set[datetime] = set()
        for passes in self.visits.values():
            if len(passes) == 1 or fold == "both":
                found.update(passes)
            else:
                found.add(min(passes) if fold == "first" else max(passes))
        for wall, offset_before, after in self.gaps:
            if gap == "shift":
                found.add((wall - offset_before).replace(tzinfo=UTC))
            elif gap == "clamp":
                found.add(after)
        return sorted(t for t in found if self.start <= t < self.end)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)
