"""The time-bucket tier's cost: counts per path priced line by line, the fixed timer cost, and what auto picks."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from delayed_delivery.cost import (
    MEASURED_BUCKET_METRICS,
    MeasuredFigures,
    choose_long_delay_route,
    estimate_sqs_parked_cost,
    load_measured_figures,
)
from delayed_delivery.errors import ConfigurationError, InvalidMessageError
from delayed_delivery.timebuckets.cost import (
    ASSUMED_BUCKET_COUNTS,
    BucketCounts,
    BucketPath,
    estimate_bucket_cost,
    estimate_bucket_fixed_cost,
)

DAY = 86_400


@pytest.mark.parametrize(("delay", "floor"), [(DAY, 0.18), (30 * DAY, 0.20), (365 * DAY, 0.45)])
def test_the_assumed_counts_price_near_the_floor_and_below_parked_fifo(delay: int, floor: float) -> None:
    per_million = estimate_bucket_cost(delay).dollars * 1e6
    assert per_million == pytest.approx(floor, rel=0.1)
    f = load_measured_figures()
    parked = estimate_sqs_parked_cost(delay, f.requests_per_park.value, f.parked_requests_per_hop.value)
    assert per_million < parked.dollars * 1e6


def test_the_assumed_counts_are_marked_and_measured_ones_say_where_from() -> None:
    assert ASSUMED_BUCKET_COUNTS.measured is False and "assumed" in ASSUMED_BUCKET_COUNTS.source
    assert estimate_bucket_cost(DAY).measured is False
    counted = ASSUMED_BUCKET_COUNTS.updated({"near.s3_puts": 0.01, "far.s3_gets": 0.5}, "run X", "10 a minute")
    assert counted.measured and counted.source == "run X" and counted.volume == "10 a minute"
    assert counted.near.s3_puts == 0.01 and counted.far.s3_gets == 0.5 and counted.far.s3_puts == 0.002
    assert estimate_bucket_cost(DAY, counts=counted).measured is True


def test_lines_add_up_and_follow_the_path() -> None:
    e = estimate_bucket_cost(30 * DAY)
    assert e.writes_per_message == 2 and e.s3_puts == pytest.approx(0.002) and e.s3_gets == pytest.approx(0.002)
    assert e.sqs_requests == pytest.approx(0.4)  # send, receive, delete and dispatch, each in batches of 10
    parts = e.ingest_usd + e.s3_requests_usd + e.dispatch_usd + e.lambda_usd + e.storage_usd + e.dynamodb_usd
    assert e.dollars == pytest.approx(parts)
    assert estimate_bucket_cost(DAY).writes_per_message == 1  # due within a coarse bucket: written fine at once
    quiet = replace(ASSUMED_BUCKET_COUNTS, far=BucketPath(2, 0.3, 0.1, 2.0, 2.0, dynamodb_reads=1.0))
    q = estimate_bucket_cost(30 * DAY, counts=quiet)  # one message per object: each write is a PUT and a GET
    assert q.s3_requests_usd == pytest.approx(2 * (5e-6 + 4e-7)) and q.dynamodb_usd == pytest.approx(1.25e-7)
    assert estimate_bucket_cost(365 * DAY).storage_usd > estimate_bucket_cost(30 * DAY).storage_usd
    assert estimate_bucket_cost(DAY, 65_536).sqs_requests == pytest.approx(4 * 1.0)  # 10 × 64 KiB = 10 chunks
    with pytest.raises(InvalidMessageError):
        estimate_bucket_cost(DAY, 0)


def test_the_fixed_cost_is_a_timer_run_every_minute() -> None:
    fixed = estimate_bucket_fixed_cost(BucketCounts(timer_lists_per_run=2.0, timer_gb_seconds_per_run=0.0))
    assert fixed.runs == 43_200 and fixed.lists == 86_400
    assert fixed.usd == pytest.approx(43_200 * 2e-7 + 86_400 * 5e-6)


def test_auto_route_picks_native_then_the_cheaper_long_route() -> None:
    f = load_measured_figures()
    assert choose_long_delay_route(900) == "native"
    for delay in (901, DAY, 30 * DAY, 365 * DAY):
        cheaper = estimate_bucket_cost(delay, counts=f.bucket_counts()).dollars < f.parked_estimate(delay).dollars
        assert choose_long_delay_route(delay) == ("buckets" if cheaper else "fifo")
    cheap = ASSUMED_BUCKET_COUNTS
    assert choose_long_delay_route(365 * DAY, f, cheap) == "buckets"  # a year parked is hundreds of park returns
    costly = BucketPath(2, 0.3, 0.1, 1.0, 1.0, lambda_invocations=10)
    assert choose_long_delay_route(30 * DAY, f, replace(cheap, far=costly)) == "fifo"


def test_the_package_data_round_trips_and_older_files_still_read() -> None:
    f = load_measured_figures()
    again = MeasuredFigures.from_dict(json.loads(json.dumps(f.as_dict())))
    assert again == f
    old = {
        k: v
        for k, v in f.as_dict().items()
        if k in ("requests_per_hop", "packed_requests_per_hop", "requests_per_park", "parked_requests_per_hop")
    }
    read = MeasuredFigures.from_dict(old)
    assert read.buckets is None and read.bucket_counts() == ASSUMED_BUCKET_COUNTS
    assert read.parked_sends() == (0.0, 1.0)
    with pytest.raises(ConfigurationError):
        MeasuredFigures.from_dict(old | {"buckets": {"near": {}}})


def test_refreshing_fills_the_bucket_counts_from_benchmark_rows() -> None:
    f = MeasuredFigures.from_dict(load_measured_figures().as_dict())
    medians = {key: 0.5 for key in MEASURED_BUCKET_METRICS.values()}
    medians[("aws_costs", "parked_first_send_billed_requests_per_message")] = 0.02
    updated = f.updated(medians, "2031-01-01 run", "10,000 messages")
    counts = updated.bucket_counts()
    assert counts.measured and counts.near.s3_puts == 0.5 and counts.timer_lists_per_run == 0.5
    assert "benchmarks.aws_costs" in counts.source and counts.volume == "10,000 messages"
    assert updated.parked_sends()[0] == 0.02


def test_storage_prices_the_counted_bytes_per_message_scaled_by_size() -> None:
    raw = estimate_bucket_cost(365 * DAY)  # not counted: the message's raw 1 KiB
    assert raw.storage_usd == pytest.approx(1024 / 1024**3 * 0.023 * 365 / 30)
    counted = replace(ASSUMED_BUCKET_COUNTS, far=replace(ASSUMED_BUCKET_COUNTS.far, stored_bytes=256.0))
    e = estimate_bucket_cost(365 * DAY, counts=counted)
    assert e.storage_usd == pytest.approx(raw.storage_usd / 4)  # gzip took 1 KiB to 256 bytes
    big = estimate_bucket_cost(365 * DAY, 4096, counts=counted)
    assert big.storage_usd == pytest.approx(4 * e.storage_usd)  # larger bodies scale from the 1 KiB figure
    assert BucketCounts.from_dict(counted.as_dict()).far.stored_bytes == 256.0


def _per_object(rate: float) -> BucketCounts:
    """Counts that follow a + b / rate exactly: one object, lease, read and query per 100 messages at 100 a minute."""
    return replace(
        ASSUMED_BUCKET_COUNTS,
        near=BucketPath(1, 0.05, 0.1, 2 / rate, 1 / rate, 1 / rate, 0.2 / rate, 0.3 / rate + 0.0005, 200.0),
        far=BucketPath(2, 0.05, 0.1, 2.4 / rate, 1.2 / rate, 1.2 / rate, 0.2 / rate, 0.35 / rate + 0.0007, 200.0),
        measured=True,
        source="a test",
        volume=f"{rate:g} a minute",
    )


MEASURED_AT = {100: _per_object(100), 1_000: _per_object(1_000), 10_000: _per_object(10_000)}


def test_counts_at_a_traffic_follow_a_plus_b_over_the_rate_between_and_below_the_measured_levels() -> None:
    from delayed_delivery.timebuckets.cost import counts_at_traffic

    assert counts_at_traffic(MEASURED_AT, 1_000) == MEASURED_AT[1_000]  # measured: as measured
    for rate in (300, 3_000, 40, 5):  # between two levels, and below the lowest (extrapolated the same way)
        got, want = counts_at_traffic(MEASURED_AT, rate), _per_object(rate)
        for name in ("s3_puts", "s3_gets", "dynamodb_reads", "lambda_invocations", "lambda_gb_seconds"):
            assert getattr(got.near, name) == pytest.approx(getattr(want.near, name)), (rate, name)
            assert getattr(got.far, name) == pytest.approx(getattr(want.far, name)), (rate, name)
        assert got.near.writes == 1 and got.far.writes == 2 and got.measured
        assert f"{rate:,} a minute" in got.volume and ("interpolated" if rate > 100 else "extrapolated") in got.volume
    # below one a minute an object holds one message anyway: priced as at one a minute
    assert counts_at_traffic(MEASURED_AT, 0.2).near == counts_at_traffic(MEASURED_AT, 1).near
    # above the highest level the saving is not claimed further
    assert counts_at_traffic(MEASURED_AT, 50_000).near == MEASURED_AT[10_000].near
    # a noisy field that rose with the traffic is not extrapolated below what was measured
    noisy = {
        100: replace(MEASURED_AT[100], near=replace(MEASURED_AT[100].near, stored_bytes=190.0)),
        1_000: MEASURED_AT[1_000],
    }
    assert counts_at_traffic(noisy, 10).near.stored_bytes == 190.0
    with pytest.raises(InvalidMessageError):
        counts_at_traffic(MEASURED_AT, 0)
    with pytest.raises(ConfigurationError):
        counts_at_traffic({}, 100)


def test_auto_picks_per_delay_and_traffic() -> None:
    f = replace(load_measured_figures(), buckets=MEASURED_AT[1_000], buckets_by_traffic=MEASURED_AT)
    cheapest = {rate: choose_long_delay_route(3 * DAY, f, per_minute=rate) for rate in (10, 100, 1_000, 10_000)}
    tier = {rate: estimate_bucket_cost(3 * DAY, counts=f.bucket_counts(rate)).dollars for rate in cheapest}
    parked = f.parked_estimate(3 * DAY).dollars
    assert tier[10] > tier[100] > tier[1_000] > tier[10_000]  # objects fill with the traffic
    assert cheapest == {rate: "buckets" if tier[rate] < parked else "fifo" for rate in cheapest}
    assert cheapest[10] == "fifo" and cheapest[10_000] == "buckets"  # the same delay, two answers
    assert choose_long_delay_route(3 * DAY, f) == choose_long_delay_route(3 * DAY, f, per_minute=1_000)


def test_the_counts_by_traffic_round_trip_and_refresh_from_benchmark_rows() -> None:
    from delayed_delivery.cost import MEASURED_TRAFFIC, bucket_metrics_at

    f = replace(load_measured_figures(), buckets_by_traffic=MEASURED_AT)
    assert MeasuredFigures.from_dict(json.loads(json.dumps(f.as_dict()))) == f
    with pytest.raises(ConfigurationError):
        MeasuredFigures.from_dict(f.as_dict() | {"buckets_by_traffic": {"0": MEASURED_AT[100].as_dict()}})
    medians = {key: 0.25 for key in bucket_metrics_at(100).values()}
    medians[bucket_metrics_at(10_000)["near.s3_puts"]] = 0.0004
    updated = replace(f, buckets_by_traffic=None).updated(medians, "2031-01-01 run", "", {100: "100 a minute"})
    assert updated.buckets_by_traffic is not None and set(updated.buckets_by_traffic) == {100, 10_000}
    at_100 = updated.buckets_by_traffic[100]
    assert at_100.near.s3_puts == 0.25 and at_100.timer_lists_per_run == 0.25 and at_100.volume == "100 a minute"
    assert updated.buckets_by_traffic[10_000].near.s3_puts == 0.0004
    assert updated.buckets == f.buckets  # the default traffic's counts were not in the rows
    assert 1_000 in MEASURED_TRAFFIC and bucket_metrics_at(1_000) == MEASURED_BUCKET_METRICS
