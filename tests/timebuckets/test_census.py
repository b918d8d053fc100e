"""The tier's census from a listing: counts by hour or day, next due, oldest overdue, v1 keys as a lower bound."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.timebuckets.census import take_census
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, BucketLevel

NOW = datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Listed:
    """A listed object as the store yields it."""

    bucket: BucketKey
    count: int | None
    size: int = 100


def fine(minute: datetime) -> BucketKey:
    return BucketKey(FINE, minute.replace(second=0, microsecond=0))


def coarse(day: datetime) -> BucketKey:
    return BucketKey(COARSE, day.replace(hour=0, minute=0, second=0, microsecond=0))


def test_empty_listing_has_no_rows_and_nothing_due() -> None:
    census = take_census([], NOW)
    assert (census.messages, census.objects, census.rows, census.next_due, census.oldest_overdue) == (
        0,
        0,
        (),
        None,
        None,
    )
    assert census.exact and census.oldest_overdue_seconds == 0.0 and census.describe_total() == "0"


def test_counts_by_hour_split_fine_and_coarse() -> None:
    in_ten = fine(NOW + timedelta(minutes=10))
    in_two_hours = fine(NOW + timedelta(hours=2))
    day_after = coarse(NOW + timedelta(days=2))
    objects = [Listed(in_ten, 3), Listed(in_ten, 4), Listed(in_two_hours, 5), Listed(day_after, 1000, 5000)]
    census = take_census(objects, NOW, period="hour")
    assert census.messages == 1012 and census.objects == 4 and census.bytes == 5300
    assert census.fine_messages == 12 and census.coarse_messages == 1000
    assert [(r.start.isoformat(), r.fine_messages, r.coarse_messages, r.objects) for r in census.rows] == [
        ("2031-02-03T04:00:00+00:00", 7, 0, 2),
        ("2031-02-03T06:00:00+00:00", 5, 0, 1),
        ("2031-02-05T00:00:00+00:00", 0, 1000, 1),
    ]
    assert census.next_due == in_ten and census.oldest_overdue is None


def test_counts_by_day_merge_the_hours() -> None:
    objects = [Listed(fine(NOW + timedelta(hours=h)), 2) for h in (1, 5, 30)]
    census = take_census(objects, NOW, period="day")
    assert [(r.start.date().isoformat(), r.messages) for r in census.rows] == [("2031-02-03", 4), ("2031-02-04", 2)]


def test_oldest_overdue_is_the_earliest_ended_bucket_still_holding_objects() -> None:
    levels = BucketLevel()
    old = fine(NOW - timedelta(minutes=30))
    newer = fine(NOW - timedelta(minutes=5))
    current = fine(NOW)  # not past its end yet
    census = take_census([Listed(newer, 1), Listed(current, 1), Listed(old, 1)], NOW, levels=levels)
    assert census.oldest_overdue == old
    assert census.oldest_overdue_seconds == (NOW - old.end(levels)).total_seconds()
    assert census.next_due == old


def test_a_bucket_not_past_its_end_is_not_overdue() -> None:
    census = take_census([Listed(fine(NOW), 1), Listed(fine(NOW + timedelta(minutes=3)), 1)], NOW)
    assert census.oldest_overdue is None and census.oldest_overdue_seconds == 0.0


def test_v1_keys_make_the_total_a_lower_bound() -> None:
    census = take_census([Listed(fine(NOW + timedelta(minutes=2)), None), Listed(fine(NOW), 7)], NOW)
    assert not census.exact and census.uncounted_objects == 1 and census.messages == 7
    assert census.describe_total() == "at least 7"
    assert census.as_dict()["exact"] is False and census.as_dict()["rows"][0]["uncounted_objects"] == 1


def test_next_due_prefers_the_fine_bucket_when_a_coarse_one_starts_with_it() -> None:
    start = datetime(2031, 2, 5, tzinfo=UTC)
    census = take_census([Listed(BucketKey(COARSE, start), 1), Listed(BucketKey(FINE, start), 1)], NOW)
    assert census.next_due == BucketKey(FINE, start)


def test_compressed_levels_and_json() -> None:
    levels = BucketLevel(fine_seconds=1, coarse_seconds=10, dispatch_lead_seconds=2)
    overdue = BucketKey(FINE, NOW.replace(microsecond=0) - timedelta(seconds=4))
    census = take_census([Listed(overdue, 2)], NOW, levels=levels, period="hour")
    assert census.oldest_overdue_seconds == pytest.approx(3.0)
    doc = census.as_dict()
    assert doc["oldest_overdue_bucket"] == {"level": "fine", "start": overdue.start.isoformat()}
    assert doc["by"] == "hour" and doc["messages"] == 2 and doc["next_due_bucket"]["level"] == "fine"


def test_unknown_period_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match="hour or day"):
        take_census([], NOW, period="week")  # type: ignore[arg-type]
