"""The pure park rule of the SQS hop cycle (``planning.sqs_park_ms``) and the schedule it gives a delay."""

from __future__ import annotations

import pytest

from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.planning import (
    MAX_PARK_SECONDS,
    MAX_VISIBILITY_TIMEOUT,
    MIN_PARK_HOPS,
    PARK_RETENTION_HEADROOM,
    SqsParkPolicy,
    plan_sqs_delay,
    sqs_park_ms,
    sqs_park_schedule,
)

HOUR, DAY = 3600, 86_400
REAL = SqsParkPolicy()  # 900 s hops and cap, parks ≤ 11 h 50 min, 14-day retention, 180 s visibility


def test_the_real_policy_parks_at_least_four_hops_and_twice_the_return_threshold() -> None:
    assert REAL.return_threshold_ms == (180 + 900) * 1000
    assert REAL.shortest_park_ms == max(MIN_PARK_HOPS * 900_000, 2 * 1_080_000) == 3_600_000


@pytest.mark.parametrize(
    ("remaining_s", "expected_s"),
    [
        (900 + 450 + 3599, 0),  # the park would be under an hour: hops are as cheap
        (900 + 450 + 3600, 3600),  # exactly the shortest park, ending with one hop and the margin left
        (900 + 450 + MAX_PARK_SECONDS, MAX_PARK_SECONDS),  # one full park (12 h less 10 minutes)
        (900 + 450 + 13 * HOUR, 13 * HOUR // 2),  # two even parks of 6.5 h, not 12 h and then 1 h
        (900 + 450 + 60 * MAX_PARK_SECONDS, MAX_PARK_SECONDS),  # 60 parks of exactly the longest
        (30 * DAY, (30 * DAY - 1350) // 61),  # 61 even parks, each just under the longest
    ],
)
def test_a_park_ends_with_one_hop_and_the_margin_left_in_as_few_even_parks_as_allowed(
    remaining_s: int, expected_s: int
) -> None:
    assert sqs_park_ms(remaining_s * 1000, 900_000, REAL) == expected_s * 1000


def test_a_park_never_reaches_into_the_retention_headroom() -> None:
    room = (REAL.retention_seconds - PARK_RETENTION_HEADROOM) * 1000 - 900_000 - 450_000
    far = (1350 + 700 * MAX_PARK_SECONDS) * 1000  # 700 full parks away
    assert sqs_park_ms(far, room - MAX_PARK_SECONDS * 1000, REAL) == MAX_PARK_SECONDS * 1000
    assert sqs_park_ms(far, room - 2 * HOUR * 1000, REAL) == 2 * HOUR * 1000  # cut short
    assert sqs_park_ms(far, room - HOUR * 1000 + 1, REAL) == 0  # would be under the shortest
    # the seed's 4-day retention leaves nothing beyond the headroom: no parking at all
    assert sqs_park_ms(365 * DAY * 1000, 900_000, SqsParkPolicy(retention_seconds=4 * DAY)) == 0


def test_parking_off_or_a_long_visibility_timeout_means_no_park() -> None:
    assert sqs_park_ms(365 * DAY * 1000, 0, SqsParkPolicy(max_park_seconds=0)) == 0
    # parks must last twice (visibility + hop): a 6 h visibility timeout leaves no 12 h park that qualifies
    assert sqs_park_ms(365 * DAY * 1000, 0, SqsParkPolicy(visibility_timeout=6 * HOUR)) == 0


@pytest.mark.parametrize(
    ("delay", "parks", "hops"), [(HOUR, 0, 3), (DAY, 2, 2), (30 * DAY, 63, 7), (365 * DAY, 768, 38)]
)
def test_the_schedule_of_a_delay_counts_parks_and_the_few_hops_left(delay: int, parks: int, hops: int) -> None:
    schedule = sqs_park_schedule(delay, REAL)
    assert (schedule.parks, schedule.hops) == (parks, hops)
    if not parks:
        assert hops == plan_sqs_delay(delay).fifo_cycles  # nothing to park: exactly the hop plan
    else:
        assert hops < plan_sqs_delay(delay).fifo_cycles / 40


def test_a_year_re_sends_about_every_ten_days_to_stay_inside_the_retention() -> None:
    # 14 days of retention, 4 kept free: a parked message is re-sent (one hop) roughly every 10 days
    schedule = sqs_park_schedule(365 * DAY, REAL)
    assert 365 / 11 <= schedule.hops - 2 <= 365 / 9


def test_parks_stay_ten_minutes_inside_sqs_s_twelve_hours_from_the_receive() -> None:
    # SQS refuses a visibility change beyond 12 h after the receive, and the function acts up to a timeout later
    assert MAX_PARK_SECONDS == MAX_VISIBILITY_TIMEOUT - 600
    assert SqsSettings().max_park_seconds == MAX_PARK_SECONDS == SqsParkPolicy().max_park_seconds
    assert sqs_park_ms(365 * DAY * 1000, 0, SqsParkPolicy()) <= MAX_PARK_SECONDS * 1000
    with pytest.raises(ConfigurationError, match="12-hour"):
        SqsSettings(max_park_seconds=MAX_VISIBILITY_TIMEOUT)
