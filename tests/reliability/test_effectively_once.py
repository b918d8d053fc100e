"""Duplicate injection: the SQS crash soak's deliveries, duplicates included, reach a consumer that acts once each."""

from __future__ import annotations

import pytest

from tests.reliability.oncelab import once_soak

pytestmark = pytest.mark.moto


def test_a_consumer_fed_the_crash_soak_performs_each_effect_exactly_once(moto_endpoint: str) -> None:
    result = once_soak(moto_endpoint, messages=8, crashes=12, seed=11, endpoints=3, timeout=240)
    soak = result.soak
    assert soak.injected_crashes == 12, soak
    assert soak.lost == 0, soak.leftovers
    assert soak.duplicates > 0, soak  # the soak really delivered duplicates to the consumer
    assert result.deliveries == soak.delivered + soak.duplicates
    assert result.duplicates_absorbed == soak.duplicates
    assert result.distinct == soak.messages
    assert result.effects == soak.messages
    assert result.repeated_effects == 0
    assert result.missing_effects == 0
