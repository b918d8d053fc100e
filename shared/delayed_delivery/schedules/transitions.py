"""Daylight-saving decisions ahead: the zone's transitions in a span and the fires of a schedule they touch.

``schedule create`` warns with these when a gap or a fold falls on the schedule within the next year, and
``schedule describe`` lists them. Transitions are found by the UTC offset changing (sampled every 6 hours, then
bisected to the second), so no private ``zoneinfo`` data is read; each one's neighbourhood (a day either side) is
evaluated and the fires whose instant daylight saving decided are kept, with their notes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, tzinfo

from ..clock import utc
from .recurrence import Fire, Recurrence

__all__ = ["dst_decisions", "transitions"]

_STEP = timedelta(hours=6)
_AROUND = timedelta(hours=26)


def _offset(zone: tzinfo, at: datetime) -> timedelta | None:
    return at.astimezone(zone).utcoffset()


def transitions(zone: tzinfo, start: datetime, end: datetime) -> Iterator[datetime]:
    """The UTC instants in ``[start, end)`` where ``zone``'s offset changes, in order."""
    t, before = utc(start), _offset(zone, utc(start))
    end = utc(end)
    while t < end:
        n = min(t + _STEP, end)
        after = _offset(zone, n)
        if after != before:
            low, high = t, n  # offset(low) == before, offset(high) != before
            while high - low > timedelta(seconds=1):
                mid = low + (high - low) / 2
                if _offset(zone, mid) == before:
                    low = mid
                else:
                    high = mid
            yield high.replace(microsecond=0)
        t, before = n, after


def dst_decisions(recurrence: Recurrence, start: datetime, end: datetime) -> list[Fire]:
    """The fires in ``[start, end)`` whose instant a gap or a fold decided (each with its note), in order."""
    found: dict[datetime, Fire] = {}
    for at in transitions(recurrence.zone, start, end):
        for fire in recurrence.fires(max(utc(start), at - _AROUND), min(utc(end), at + _AROUND)):
            if fire.note is not None:
                found.setdefault(fire.nominal, fire)
    return [found[k] for k in sorted(found)]
