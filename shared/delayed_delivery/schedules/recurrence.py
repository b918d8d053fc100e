"""The evaluator: a schedule's occurrences as a sorted set of instants, in any window ``[start, end)``.

Cron walks the matching local dates (month by month, from remembered day sets, so a rare expression is found
without walking minutes or days), turns each date's (hour, minute) slots into instants through the DST policy and
merges them in time order: a slot can land on another date's instant (a shifted or clamped slot, Apia's removed
day), and two slots on one instant fire once, their notes joined. A skipped slot's note goes on the next fire.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

from ..clock import utc
from ..errors import InvalidScheduleError
from .days import DayMatch, MonthDays
from .dst import AUTO, DstPolicy, DstRule, Placed, parse_dst, place, wall
from .expressions import AtExpression, CronExpression, Expression, RateExpression, parse_expression
from .zones import load_zone

__all__ = ["EARLIEST", "Fire", "Recurrence"]

#: The earliest instant evaluated (zone rules before it are local mean times).
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
#: The last year evaluated (datetime ends in 9999).
LAST_YEAR = 9998
#: No instant of a date's slots comes before the date's local midnight less this (offsets stay within a day).
_DAY_SPREAD = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Fire:
    """One occurrence: its nominal instant (UTC), the local time it is, and a DST note when daylight saving acted."""

    nominal: datetime
    local: datetime
    note: str | None = None


class Recurrence:
    """A compiled expression in a zone with a DST rule and a day rule; ``anchor`` is where a rate starts."""

    def __init__(
        self,
        expression: str | Expression,
        zone: str = "UTC",
        *,
        dst: str | DstRule = AUTO,
        day_match: DayMatch = DayMatch.OR,
        anchor: datetime | None = None,
    ) -> None:
        self.expression = parse_expression(expression) if isinstance(expression, str) else expression
        self.zone_name = zone
        self.zone: tzinfo = load_zone(zone)
        self.dst = parse_dst(dst) if isinstance(dst, str) else dst
        self.day_match = day_match
        rate = isinstance(self.expression, RateExpression)
        self.anchor = _whole_second(utc(anchor), "a rate's anchor") if anchor is not None and rate else None
        self.policy: DstPolicy | None = None
        self._days: MonthDays | None = None
        expr = self.expression
        if isinstance(expr, CronExpression):
            f = expr.fields
            self.policy = self.dst.resolve(every_hour=f.every_hour, minute_or_hour_starred=f.starred[0] or f.starred[1])
            self._days = MonthDays(f, day_match)
            if not self._days.ever():
                raise InvalidScheduleError(
                    f"{f.text!r} never fires: no date in a 400-year Gregorian cycle matches its day-of-month, month "
                    f"and day-of-week (day match {day_match})"
                )
        elif isinstance(expr, AtExpression):
            self.policy = self.dst.resolve(every_hour=False, minute_or_hour_starred=False, cron=False)
        elif anchor is None:
            raise InvalidScheduleError(f"{expr} needs an anchor: the instant its first occurrence is at")

    # -- queries -----------------------------------------------------------

    def fires(self, start: datetime, end: datetime | None = None) -> Iterator[Fire]:
        """Occurrences ``t`` with ``start <= t < end`` (no end: until the calendar ends), in order."""
        start = max(utc(start), EARLIEST)
        stop = utc(end) if end is not None else None
        for fire in self._all_from(start):
            if stop is not None and fire.nominal >= stop:
                return
            yield fire

    def after(self, instant: datetime) -> Fire | None:
        """The first occurrence strictly after ``instant``, or None."""
        return next(self.fires(utc(instant) + timedelta(microseconds=1)), None)

    def between(self, after: datetime, until: datetime) -> Iterator[Fire]:
        """Occurrences in ``(after, until]``: what a cursor at ``after`` has not yet seen by ``until``."""
        return self.fires(utc(after) + timedelta(microseconds=1), utc(until) + timedelta(microseconds=1))

    def describe(self) -> str:
        """E.g. ``0 9 * * * in Europe/Berlin, DST shift/first (auto), day match or``."""
        if isinstance(self.expression, RateExpression):
            return f"{self.expression} from {self.anchor:%Y-%m-%dT%H:%M:%SZ}"
        chosen = f" ({self.dst})" if str(self.dst) != str(self.policy) else ""
        days = f", day match {self.day_match}" if isinstance(self.expression, CronExpression) else ""
        return f"{self.expression} in {self.zone_name}, DST {self.policy}{chosen}{days}"

    # -- per kind -----------------------------------------------------------

    def _all_from(self, start: datetime) -> Iterator[Fire]:
        expr = self.expression
        if isinstance(expr, RateExpression):
            return self._rate(expr, start)
        if isinstance(expr, AtExpression):
            return self._at(expr, start)
        return self._cron(expr, start)

    def _rate(self, expr: RateExpression, start: datetime) -> Iterator[Fire]:
        assert self.anchor is not None
        step = timedelta(seconds=expr.seconds)
        k = max(0, -((self.anchor - start) // step))  # ceil((start - anchor) / step), at least 0
        last = datetime(LAST_YEAR, 12, 31, tzinfo=UTC)
        t = self.anchor + k * step
        while t <= last:
            yield Fire(t, t.astimezone(self.zone))
            t += step

    def _at(self, expr: AtExpression, start: datetime) -> Iterator[Fire]:
        if expr.instant is not None:
            placed = [Placed(expr.instant)]
        else:
            assert expr.local is not None and self.policy is not None
            placed = place(expr.local, self.zone, self.policy)
        yield from _merged(iter([placed]), start, self.zone)

    def _cron(self, expr: CronExpression, start: datetime) -> Iterator[Fire]:
        assert self._days is not None and self.policy is not None
        first = wall(start, self.zone).date() - timedelta(days=2)  # a slot two days earlier can shift past start
        last_year = min(LAST_YEAR, first.year + 401)
        minutes, hours = expr.fields.minutes, expr.fields.hours
        zone, policy = self.zone, self.policy

        def by_date() -> Iterator[tuple[datetime, list[Placed]]]:
            for day in self._days.dates(first, last_year) if self._days else ():
                placed: list[Placed] = []
                offset = _steady_offset(day, zone)
                if offset is not None:  # no transition: each slot is one instant, and days before start are skipped
                    if datetime.combine(day, time(23, 59), tzinfo=UTC) - offset < start:
                        continue
                    for hour in hours:
                        at = [datetime.combine(day, time(hour, m), tzinfo=UTC) - offset for m in minutes]
                        placed.extend(Placed(t) for t in at)
                else:
                    for hour in hours:
                        for minute in minutes:
                            placed.extend(place(datetime.combine(day, time(hour, minute)), zone, policy))
                yield _earliest(day), placed

        yield from _merged_dates(by_date(), start, zone)


def _steady_offset(day: date, zone: tzinfo) -> timedelta | None:
    """The UTC offset of the whole of ``day`` when no transition falls in it, else None (place slot by slot)."""
    start, noon, end = (datetime.combine(day + timedelta(days=d), time(h)) for d, h in ((0, 0), (0, 12), (1, 0)))
    offsets = {t.replace(tzinfo=zone, fold=fold).utcoffset() for t in (start, noon, end) for fold in (0, 1)}
    return offsets.pop() if len(offsets) == 1 else None


def _earliest(day: date) -> datetime:
    """No instant a slot of ``day`` maps to is earlier than this."""
    return datetime.combine(day, time(), tzinfo=UTC) - _DAY_SPREAD


def _merged(groups: Iterator[list[Placed]], start: datetime, zone: tzinfo) -> Iterator[Fire]:
    """Placements (already in a safe order group by group) as fires from ``start``: one per instant, notes joined."""
    return _merged_dates(((EARLIEST, g) for g in groups), start, zone)


def _merged_dates(groups: Iterator[tuple[datetime, list[Placed]]], start: datetime, zone: tzinfo) -> Iterator[Fire]:
    """Fires from placements grouped by date; each group comes with a bound no later group's instants go below.

    Instants are emitted once every group that could still precede them has been read; equal instants merge, and
    a skipped slot's note waits for the next fire at or after the instant it stands at.
    """
    heap: list[tuple[datetime, int, int, str | None]] = []  # (instant, 0 fire / -1 note only, order, note)
    order = 0
    pending: tuple[datetime, list[str]] | None = None  # the fire being assembled (more slots may join it)
    carried: list[str] = []  # notes of skipped slots, for the next fire

    def emit(until: datetime | None) -> Iterator[Fire]:
        nonlocal pending
        while heap and (until is None or heap[0][0] < until):
            instant, kind, _, note = heapq.heappop(heap)
            if kind < 0:
                if instant >= start and note:
                    carried.append(note)
                continue
            if pending is not None and pending[0] == instant:
                if note and note not in pending[1]:
                    pending[1].append(note)
                continue
            if pending is not None:
                yield _fire(pending, zone)
            pending = (instant, carried[:] + ([note] if note else []))
            carried.clear()
            if instant < start:
                pending = None
        if pending is not None and (until is None or pending[0] < until):  # nothing later can join it
            yield _fire(pending, zone)
            pending = None

    for bound, placed in groups:
        yield from emit(bound)
        for p in placed:
            order += 1
            if p.instant is not None:
                heapq.heappush(heap, (p.instant, 0, order, p.note))
            elif p.at is not None:
                heapq.heappush(heap, (p.at, -1, order, p.note))
    yield from emit(None)


def _fire(pending: tuple[datetime, list[str]], zone: tzinfo) -> Fire:
    instant, notes = pending
    return Fire(instant, instant.astimezone(zone), "; ".join(notes) if notes else None)


def _whole_second(value: datetime, what: str) -> datetime:
    if value.microsecond:
        raise InvalidScheduleError(f"{what} must be a whole second, got {value.isoformat()}")
    return value
