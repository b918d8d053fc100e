"""Crash injection on the SQS FIFO-requeue handler against moto server: nothing is ever lost."""

from __future__ import annotations

import pytest

from tests.reliability.sqslab import POINTS, process_kill_soak
from tests.reliability.sqssoak import in_process_soak

pytestmark = pytest.mark.moto


def test_handler_dying_at_fault_points_loses_nothing(moto_endpoint: str) -> None:
    # 3 endpoints with 8 messages on their way each, topped up until the 12th crash; delays 2-16 s (parks from 7 s)
    result = in_process_soak(moto_endpoint, messages=8, crashes=12, seed=11, probability=0.5, timeout=240, endpoints=3)
    assert result.injected_crashes == 12, result
    assert result.parks > 0, result.outcomes  # parking really happened (and packing: several plain records per send)
    assert set(result.crashes_by_point) <= set(POINTS)
    assert len(result.crashes_by_point) >= 3, result.crashes_by_point
    assert result.lost == 0, result.leftovers
    assert result.delivered == result.messages >= 20
    assert result.error_queue == 0
    # only a repeated final hand-over duplicates (FIFO drops a repeated hop): at most one batch of 10 per crash
    assert result.duplicates <= result.injected_crashes * 10


def test_sigkilled_poller_processes_lose_nothing(moto_endpoint: str) -> None:
    result = process_kill_soak(moto_endpoint, messages=30, kills=3, seed=5, timeout=240)
    assert result.process_kills == 3
    assert result.lost == 0, result.leftovers
    assert result.delivered == 30
    assert result.error_queue == 0


def test_handler_dying_in_the_middle_of_a_paced_release_loses_nothing(moto_endpoint: str) -> None:
    # every endpoint capped at 2/s with a 1 s native cap (delays 2-5 s: hops only, no parks): forwards take slots
    # from the shared calendar (DynamoDB), and deaths land after slots were taken and around the forwards using them
    result = in_process_soak(
        moto_endpoint,
        messages=5,
        crashes=5,
        seed=13,
        probability=0.5,
        timeout=240,
        endpoints=2,
        release_rate=2,
        delays=(2, 5),
    )
    assert result.injected_crashes == 5, result
    assert result.outcomes["release_slot"] >= result.delivered, result.outcomes  # every forward took a slot
    assert result.lost == 0, result.leftovers
    assert result.delivered == result.messages >= 10
    assert result.error_queue == 0
    assert result.release_overfull == 0, "a death only leaves a slot unused, never a second over its cap"
    assert result.duplicates <= result.injected_crashes * 10
