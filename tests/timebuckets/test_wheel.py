"""The timing wheel: every due time has one bucket, nothing is dispatched early, every coarse bucket is cascaded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.errors import ConfigurationError, InvalidMessageError
from delayed_delivery.timebuckets.wheel import (
    COARSE,
    FINE,
    MAX_DELAY_SECONDS,
    BucketKey,
    BucketLevel,
    bucket_of,
    cascade_window,
    content_hash,
    dispatch_window,
    object_key,
    parse_object_key,
    parse_object_key_count,
)

LEVELS = BucketLevel()
NOW = datetime(2031, 2, 3, 4, 5, 6, 789_000, tzinfo=UTC)

times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
levels = st.builds(
    lambda fine, factor, lead: BucketLevel(fine, fine * factor, min(lead, MAX_DELAY_SECONDS - fine)),
    st.sampled_from([1, 7, 30, 60, 120, 300, 900]),
    st.integers(2, 2000),
    st.integers(0, 900),
)


@given(times, times, levels)
def test_every_due_time_maps_to_exactly_one_bucket_that_holds_it(due: datetime, now: datetime, lv: BucketLevel) -> None:
    key = bucket_of(due, now, lv)
    assert key.holds(due, lv) and key.aligned(lv)
    assert key == bucket_of(due, now, lv)
    # the neighbours of that level do not hold it
    size = timedelta(seconds=lv.size(key.level))
    assert not BucketKey(key.level, key.start - size).holds(due, lv)
    assert not BucketKey(key.level, key.start + size).holds(due, lv)


@given(times, st.integers(0, 10 * 365 * 86_400), levels)
def test_a_coarse_bucket_is_never_the_one_being_cascaded_or_already_passed(
    now: datetime, delay: int, lv: BucketLevel
) -> None:
    key = bucket_of(now + timedelta(seconds=delay), now, lv)
    target = cascade_window(now, lv)
    if key.level == COARSE:
        assert key.start >= target.end(lv)  # a later timer run will cascade it
        assert delay >= lv.coarse_seconds
    else:
        assert now + timedelta(seconds=delay) < target.end(lv)  # within the coarse horizon


@given(times, levels)
def test_a_cascaded_bucket_splits_into_fine_buckets_none_ready_yet(now: datetime, lv: BucketLevel) -> None:
    target = cascade_window(now, lv)
    assert target.level == COARSE and target.aligned(lv)
    window = dispatch_window(now, levels=lv)
    first = BucketKey(FINE, target.start)
    assert not window.ready(first)  # the cascade finishes before its buckets are dispatched
    assert target.start > now + timedelta(seconds=lv.dispatch_lead_seconds)


@given(times, st.integers(1, 3 * 86_400), levels, st.integers(1, 900))
def test_a_long_delay_has_the_ingest_slack_before_its_bucket_is_first_dispatched(
    sent: datetime, extra: int, lv: BucketLevel, threshold: int
) -> None:
    """A message delayed over ``threshold`` that reaches S3 within ``ingest_slack`` of its send is in its bucket's
    first dispatch: no timer run up to that moment finds the bucket ready, whatever the run's phase (#24)."""
    due = sent + timedelta(seconds=threshold + extra)
    bucket = bucket_of(due, due, lv)  # its fine bucket (a coarse one is split into it before any dispatch)
    assert bucket.level == FINE
    latest_write = sent + timedelta(seconds=lv.ingest_slack(threshold))
    assert not dispatch_window(latest_write, levels=lv).ready(bucket)
    # and the slack is exact: a moment that late can be one too late
    worst = BucketKey(FINE, bucket.start)
    worst_due = worst.end(lv) - timedelta(microseconds=1)
    worst_sent = worst_due - timedelta(seconds=threshold, microseconds=-1)
    ready_at = worst.start - timedelta(seconds=lv.dispatch_lead_seconds)
    assert dispatch_window(ready_at, levels=lv).ready(worst)
    assert ready_at - worst_sent <= timedelta(seconds=lv.ingest_slack(threshold) + 1)


def test_the_deployed_ingest_wait_fits_the_default_lead_and_refuses_what_does_not() -> None:
    from delayed_delivery.aws.tier.config import check_ingest_wait, ingest_wait_seconds

    assert ingest_wait_seconds() == 300 + 60 + 60 == LEVELS.ingest_slack(900)
    check_ingest_wait(LEVELS, 900)
    with pytest.raises(ConfigurationError, match="max_native_delay"):
        check_ingest_wait(LEVELS, 899)  # a lower route threshold leaves less time
    with pytest.raises(ConfigurationError, match="from 0 to 300"):
        check_ingest_wait(LEVELS, 900, window_seconds=301)
    check_ingest_wait(BucketLevel(60, 86_400, 600), 900, window_seconds=120)


@given(times, st.sampled_from([BucketLevel(), BucketLevel(60, 3600, 300), BucketLevel(1, 10, 0)]))
def test_timer_runs_every_minute_cascade_every_coarse_bucket_once_in_order(start: datetime, lv: BucketLevel) -> None:
    targets: list[BucketKey] = []
    step = timedelta(seconds=min(60, lv.fine_seconds))
    for i in range(3 * lv.coarse_seconds // int(step.total_seconds())):
        target = cascade_window(start + i * step, lv)
        if not targets or targets[-1] != target:
            targets.append(target)
    assert len(targets) >= 3
    for before, after in pairwise(targets):
        assert after.start - before.start == timedelta(seconds=lv.coarse_seconds)  # no gap, no repeat


@given(times, st.integers(0, 900), levels)
def test_a_ready_message_is_never_dispatched_early(now: datetime, lead: int, lv: BucketLevel) -> None:
    lead = min(lead, MAX_DELAY_SECONDS - lv.fine_seconds)
    window = dispatch_window(now, lead, lv)
    bucket = window.last
    assert window.ready(bucket) and not window.ready(BucketKey(FINE, bucket.start + timedelta(seconds=lv.fine_seconds)))
    for due in (bucket.start, bucket.end(lv) - timedelta(microseconds=1), now - timedelta(days=3), now):
        delay = window.delay_seconds(due)
        assert 0 <= delay <= MAX_DELAY_SECONDS
        assert now + timedelta(seconds=delay) >= due


def test_the_defaults_on_a_known_day() -> None:
    assert cascade_window(NOW) == BucketKey(COARSE, datetime(2031, 2, 4, tzinfo=UTC))
    assert bucket_of(NOW + timedelta(hours=30), NOW) == BucketKey(FINE, datetime(2031, 2, 4, 10, 5, tzinfo=UTC))
    assert bucket_of(NOW + timedelta(days=2), NOW) == BucketKey(COARSE, datetime(2031, 2, 5, tzinfo=UTC))
    assert bucket_of(NOW - timedelta(hours=1), NOW) == BucketKey(FINE, datetime(2031, 2, 3, 3, 5, tzinfo=UTC))
    # from 8 minutes (lead + one fine bucket) before midnight, the day after next is cascaded
    assert cascade_window(datetime(2031, 2, 3, 23, 51, 59, tzinfo=UTC)) == BucketKey(
        COARSE, datetime(2031, 2, 4, tzinfo=UTC)
    )
    assert cascade_window(datetime(2031, 2, 3, 23, 52, tzinfo=UTC)) == BucketKey(
        COARSE, datetime(2031, 2, 5, tzinfo=UTC)
    )
    window = dispatch_window(NOW)
    assert window.last == BucketKey(FINE, datetime(2031, 2, 3, 4, 12, tzinfo=UTC))
    assert window.delay_seconds(datetime(2031, 2, 3, 4, 12, 59, 999_000, tzinfo=UTC)) == 474
    assert window.delay_seconds(NOW + timedelta(microseconds=1)) == 1
    with pytest.raises(InvalidMessageError, match="not in a ready bucket"):
        window.delay_seconds(NOW + timedelta(seconds=901))


def test_fine_buckets_of_a_coarse_bucket() -> None:
    lv = BucketLevel(60, 3600, 300)
    fine = list(BucketKey(COARSE, datetime(2031, 1, 1, 5, tzinfo=UTC)).fine_buckets(lv))
    assert len(fine) == 60 and fine[0].start == datetime(2031, 1, 1, 5, tzinfo=UTC)
    assert fine[-1].end(lv) == datetime(2031, 1, 1, 6, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fine", "coarse", "lead", "needle"),
    [
        (0, 86_400, 600, "at least 1"),
        (60, 90, 600, "multiple"),
        (60, 60, 600, "multiple"),
        (60, 86_400, 841, "at most 900"),
        (60, 86_400, -1, "whole number"),
        (1.5, 86_400, 600, "whole number"),
    ],
)
def test_levels_are_validated(fine: int, coarse: int, lead: int, needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        BucketLevel(fine, coarse, lead)


def test_settings_carry_the_levels_and_the_route() -> None:
    env = {
        "DELAYED_DELIVERY_LONG_DELAY_ROUTE": "auto",
        "DELAYED_DELIVERY_BUCKET_FINE_SECONDS": "30",
        "DELAYED_DELIVERY_BUCKET_COARSE_SECONDS": "3600",
        "DELAYED_DELIVERY_BUCKET_DISPATCH_LEAD_SECONDS": "300",
    }
    assert SqsSettings.from_env(env).long_delay_route == "auto"
    assert TierSettings.from_env(env).levels == BucketLevel(30, 3600, 300)
    assert SqsSettings().long_delay_route == "auto"  # the cheaper route per delay; fifo is one setting away
    assert SqsSettings.from_env({"DELAYED_DELIVERY_LONG_DELAY_ROUTE": "fifo"}).long_delay_route == "fifo"
    assert TierSettings().levels == LEVELS
    with pytest.raises(ConfigurationError, match="long_delay_route"):
        SqsSettings(long_delay_route="s3")
    with pytest.raises(ConfigurationError, match="at most 900"):
        TierSettings(bucket_dispatch_lead_seconds=900)
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_BUCKET_SEND_PHASE_MS"):
        TierSettings.from_env({"DELAYED_DELIVERY_BUCKET_SEND_PHASE_MS": "1001"})


@pytest.mark.parametrize(
    "bad",
    [datetime(2031, 1, 1), datetime(1969, 12, 31, tzinfo=UTC), datetime(9500, 1, 1, tzinfo=UTC), "2031-01-01"],
)
def test_times_are_aware_utc_in_range(bad: object) -> None:
    with pytest.raises(InvalidMessageError):
        bucket_of(bad, NOW)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        cascade_window(bad)  # type: ignore[arg-type]


def test_a_bucket_start_is_a_whole_second_on_a_known_level() -> None:
    with pytest.raises(InvalidMessageError):
        BucketKey(FINE, NOW)
    with pytest.raises(InvalidMessageError):
        BucketKey("medium", datetime(2031, 1, 1, tzinfo=UTC))  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="of the form"):
        BucketKey.parse(FINE, "2031-01-01 00:00:00")
    with pytest.raises(ConfigurationError):
        dispatch_window(NOW, 850)


def test_object_key_is_derived_from_the_ids_and_due_times_only() -> None:
    bucket = BucketKey(FINE, datetime(2031, 2, 3, 4, 5, tzinfo=UTC))
    entries = [("b", 2), ("a", 1)]
    key = object_key("delayed/buckets", bucket, entries)
    assert key == f"delayed/buckets/fine/2031-02-03T04:05:00Z/{content_hash(entries)}-2.jsonl.gz"
    assert key == object_key("delayed/buckets", bucket, list(reversed(entries)))  # a retry overwrites itself
    assert key != object_key("delayed/buckets", bucket, [("a", 1), ("b", 3)])
    assert content_hash([("a", 1)]) != content_hash([("a", 1), ("b", 2)])
    assert parse_object_key(key) == ("delayed/buckets", bucket, content_hash(entries))
    assert parse_object_key_count(key).message_count == 2  # key v2 carries the count
    v1 = f"delayed/buckets/fine/2031-02-03T04:05:00Z/{content_hash(entries)}.jsonl.gz"
    assert parse_object_key_count(v1) == ("delayed/buckets", bucket, content_hash(entries), None)
    assert parse_object_key(v1) == parse_object_key(key)
    for prefix in ("", "/x", "x/", "a//b", "a b"):
        with pytest.raises(ConfigurationError):
            object_key(prefix, bucket, entries)
    with pytest.raises(InvalidMessageError):
        content_hash([])
    for bad in ("x/fine/2031-02-03T04:05:00Z/abc.jsonl.gz", "x/hot/2031-02-03T04:05:00Z/" + "0" * 64 + ".jsonl.gz"):
        with pytest.raises(InvalidMessageError):
            parse_object_key(bad)
