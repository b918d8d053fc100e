"""The time-bucket tier's cost: assumed counts, priced line by line, below parked FIFO and near the design's floor."""

from __future__ import annotations

from dataclasses import replace

import pytest

from delayed_delivery.cost import (
    ASSUMED_BUCKET_COUNTS,
    BucketCounts,
    choose_long_delay_route,
    estimate_bucket_cost,
    estimate_sqs_parked_cost,
    load_measured_figures,
)
from delayed_delivery.errors import InvalidMessageError

DAY = 86_400


@pytest.mark.parametrize(("delay", "floor"), [(DAY, 0.18), (30 * DAY, 0.20), (365 * DAY, 0.45)])
def test_bucket_cost_is_near_the_floor_and_below_parked_fifo(delay: int, floor: float) -> None:
    per_million = estimate_bucket_cost(delay).dollars * 1e6
    assert per_million == pytest.approx(floor, rel=0.1)
    f = load_measured_figures()
    parked = estimate_sqs_parked_cost(delay, f.requests_per_park.value, f.parked_requests_per_hop.value)
    assert per_million < parked.dollars * 1e6


def test_the_counts_are_marked_as_assumptions() -> None:
    assert ASSUMED_BUCKET_COUNTS.measured is False and "assumed" in ASSUMED_BUCKET_COUNTS.source
    assert estimate_bucket_cost(DAY).measured is False
    assert estimate_bucket_cost(DAY, counts=replace(ASSUMED_BUCKET_COUNTS, measured=True)).measured is True


def test_lines_add_up_and_follow_the_counts() -> None:
    e = estimate_bucket_cost(30 * DAY)
    assert e.writes_per_message == 2 and e.s3_puts == pytest.approx(0.002) and e.s3_gets == pytest.approx(0.002)
    assert e.sqs_requests == pytest.approx(0.4)  # send, receive, delete and dispatch, each in batches of 10
    assert e.dollars == pytest.approx(e.ingest_usd + e.s3_requests_usd + e.dispatch_usd + e.lambda_usd + e.storage_usd)
    assert estimate_bucket_cost(DAY).writes_per_message == 1  # due within a coarse bucket: written fine at once
    # fewer messages per object (a quiet minute) costs more per message; storage grows with the delay and the size
    quiet = estimate_bucket_cost(30 * DAY, counts=BucketCounts(messages_per_object=1))
    assert quiet.s3_requests_usd == pytest.approx(2 * (5e-6 + 4e-7))
    assert estimate_bucket_cost(365 * DAY).storage_usd > estimate_bucket_cost(30 * DAY).storage_usd
    assert estimate_bucket_cost(DAY, 65_536).sqs_requests == pytest.approx(4 * 1.0)  # 10 × 64 KiB = 10 chunks
    with pytest.raises(InvalidMessageError):
        estimate_bucket_cost(DAY, 0)


def test_auto_route_picks_native_then_the_cheaper_long_route() -> None:
    assert choose_long_delay_route(900) == "native"
    assert choose_long_delay_route(901) == "buckets"  # under the assumed counts
    assert choose_long_delay_route(365 * DAY) == "buckets"
    costly = replace(ASSUMED_BUCKET_COUNTS, messages_per_object=1, lambda_invocations_per_message=10)
    assert choose_long_delay_route(DAY, counts=costly) == "fifo"
