"""The schedule crash lab's CI cycle on moto server (the soak command is in schedulelab.py's docstring)."""

from __future__ import annotations

import pytest

from delayed_delivery.schedules.catchup import CatchUpPolicy
from tests.reliability.schedulelab import outage, race, soak

pytestmark = pytest.mark.moto


def test_deaths_at_every_step_lose_nothing_and_every_duplicate_is_a_death(moto_endpoint: str) -> None:
    result = soak(moto_endpoint, schedules=10, minutes=18, probability=0.6, seed=7)
    assert result.sound, result
    assert result.expected > 60 and result.lost == 0 and result.early == 0
    assert sum(result.crashes.values()) >= 5, result.crashes


def test_two_timers_racing_send_each_occurrence_once(moto_endpoint: str) -> None:
    result = race(moto_endpoint, schedules=8, minutes=6, timers=2)
    assert result.sound and result.duplicates == 0, result
    assert result.expected > 15


@pytest.mark.parametrize("policy", list(CatchUpPolicy))
def test_three_days_down_fires_or_records_every_occurrence_as_the_policy_says(
    moto_endpoint: str, policy: CatchUpPolicy
) -> None:
    result = outage(moto_endpoint, policy, days=3, schedules=2)
    assert result.sound and result.duplicates == 0, result
    assert result.missed_recorded == result.missed_expected > 0
    assert {CatchUpPolicy.ALL: 24 + 48, CatchUpPolicy.LATEST: 2, CatchUpPolicy.SKIP: 0}[policy] == (
        result.fired_late_expected
    )
