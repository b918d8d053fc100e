"""The time-bucket tier's backlog from an object listing alone: counts by due hour or day, next due, oldest overdue.

Pure and clock-free: ``take_census`` takes the listed objects and ``now``; no object body is read. How ``pending``
shows it: docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from ..clock import utc
from ..errors import InvalidMessageError
from .wheel import EARLIEST, FINE, BucketKey, BucketLevel

__all__ = ["CENSUS_PERIODS", "COUNTS", "BucketCensus", "CensusPeriod", "CensusRow", "ListedObject", "take_census"]

CensusPeriod = Literal["hour", "day"]
#: The length of a census row in seconds, by ``--by``.
CENSUS_PERIODS: dict[str, int] = {"hour": 3600, "day": 86_400}
#: What the census counts, as ``pending`` says it: stored copies, not distinct messages (keys carry counts, not ids).
COUNTS = (
    "copies, from the object keys: a message stored twice (a retried write or an identical resend that landed in "
    "another object, or the old copy an interrupted reschedule left) is counted once per copy until the timer keeps "
    "one and sends it once"
)


class ListedObject(Protocol):
    """What the census needs of a listed object (``aws.buckets.store.StoredObject`` has it)."""

    @property
    def bucket(self) -> BucketKey:
        """The bucket the object belongs to."""
        ...

    @property
    def count(self) -> int | None:
        """Messages inside, from the key (``None`` for a v1 key, which carries no count)."""
        ...

    @property
    def size(self) -> int:
        """Bytes, as listed."""
        ...


@dataclass(frozen=True, slots=True)
class CensusRow:
    """The objects of the buckets starting in one hour or day.

    ``coarse_messages`` are due anywhere in their coarse bucket, which may reach past this row.
    """

    start: datetime
    fine_messages: int
    coarse_messages: int
    objects: int
    uncounted_objects: int

    @property
    def messages(self) -> int:
        """Counted messages of the row (at least this many when ``uncounted_objects``)."""
        return self.fine_messages + self.coarse_messages

    def as_dict(self) -> dict[str, Any]:
        """The row in ``pending --json``."""
        return {
            "start": self.start.isoformat(),
            "messages": self.messages,
            "fine_messages": self.fine_messages,
            "coarse_messages": self.coarse_messages,
            "objects": self.objects,
            "uncounted_objects": self.uncounted_objects,
        }


@dataclass(frozen=True, slots=True)
class BucketCensus:
    """The tier's backlog at ``now``: exact when every key carries its count, else a lower bound."""

    now: datetime
    period: CensusPeriod
    messages: int
    objects: int
    uncounted_objects: int
    bytes: int
    rows: tuple[CensusRow, ...]
    #: The earliest bucket holding objects (its messages are due from its start on).
    next_due: BucketKey | None
    #: The oldest bucket past its end still holding objects, and how long past its end it is at ``now``.
    oldest_overdue: BucketKey | None
    oldest_overdue_seconds: float

    @property
    def exact(self) -> bool:
        """Whether ``messages`` is the exact count (no object without a count in its key)."""
        return self.uncounted_objects == 0

    @property
    def fine_messages(self) -> int:
        """Counted messages in fine buckets."""
        return sum(r.fine_messages for r in self.rows)

    @property
    def coarse_messages(self) -> int:
        """Counted messages in coarse buckets (not yet split into fine ones)."""
        return sum(r.coarse_messages for r in self.rows)

    @property
    def counts(self) -> str:
        """What ``messages`` counts: stored copies (``COUNTS``), so it may count a duplicate in flight twice."""
        return COUNTS

    def describe_total(self) -> str:
        """``"1,234"``, or ``"at least 1,234"`` when some objects carry no count."""
        return f"{self.messages:,}" if self.exact else f"at least {self.messages:,}"

    def as_dict(self) -> dict[str, Any]:
        """The census in ``pending --json``."""
        return {
            "messages": self.messages,
            "exact": self.exact,
            "counts": self.counts,
            "objects": self.objects,
            "uncounted_objects": self.uncounted_objects,
            "bytes": self.bytes,
            "fine_messages": self.fine_messages,
            "coarse_messages": self.coarse_messages,
            "by": self.period,
            "next_due_bucket": _bucket_dict(self.next_due),
            "oldest_overdue_bucket": _bucket_dict(self.oldest_overdue),
            "oldest_overdue_seconds": self.oldest_overdue_seconds,
            "rows": [r.as_dict() for r in self.rows],
        }


def _bucket_dict(bucket: BucketKey | None) -> dict[str, str] | None:
    return None if bucket is None else {"level": bucket.level, "start": bucket.start.isoformat()}


@dataclass(slots=True)
class _Tally:
    fine: int = 0
    coarse: int = 0
    objects: int = 0
    uncounted: int = 0


def take_census(
    objects: Iterable[ListedObject],
    now: datetime,
    *,
    period: CensusPeriod = "day",
    levels: BucketLevel | None = None,
) -> BucketCensus:
    """Count ``objects`` by the hour or day their bucket starts in; next due and oldest overdue bucket at ``now``."""
    if period not in CENSUS_PERIODS:
        raise InvalidMessageError(f"census period {period!r}: use hour or day")
    levels = levels or BucketLevel()
    now = utc(now)
    step = timedelta(seconds=CENSUS_PERIODS[period])
    tallies: dict[datetime, _Tally] = {}
    size = 0
    first: BucketKey | None = None
    overdue: BucketKey | None = None
    for listed in objects:
        bucket = listed.bucket
        tally = tallies.setdefault(EARLIEST + (bucket.start - EARLIEST) // step * step, _Tally())
        tally.objects += 1
        size += listed.size
        if listed.count is None:
            tally.uncounted += 1
        elif bucket.level == FINE:
            tally.fine += listed.count
        else:
            tally.coarse += listed.count
        if first is None or _earlier(bucket, first):
            first = bucket
        if bucket.end(levels) <= now and (overdue is None or bucket.end(levels) < overdue.end(levels)):
            overdue = bucket
    rows = tuple(CensusRow(s, t.fine, t.coarse, t.objects, t.uncounted) for s, t in sorted(tallies.items()))
    return BucketCensus(
        now=now,
        period=period,
        messages=sum(r.messages for r in rows),
        objects=sum(r.objects for r in rows),
        uncounted_objects=sum(r.uncounted_objects for r in rows),
        bytes=size,
        rows=rows,
        next_due=first,
        oldest_overdue=overdue,
        oldest_overdue_seconds=(now - overdue.end(levels)).total_seconds() if overdue is not None else 0.0,
    )


def _earlier(a: BucketKey, b: BucketKey) -> bool:
    """Whether ``a`` starts before ``b`` (a fine bucket first when both start together: its messages are due first)."""
    return (a.start, a.level != FINE) < (b.start, b.level != FINE)
