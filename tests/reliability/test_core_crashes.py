"""Crash injection on the core dispatcher + SQLite store: nothing is ever lost."""

from __future__ import annotations

from tests.reliability.crashlab import in_process_soak, process_kill_soak


def test_in_process_fault_points_lose_nothing() -> None:
    result = in_process_soak(messages=300, crashes=150, seed=7)
    assert result.injected_crashes == 150
    assert set(result.crashes_by_point) == {"after_claim", "before_send", "after_send", "before_remove"}
    assert result.lost == 0
    assert result.delivered == result.messages >= 300
    # a crash after a send and before the removal is the only way to get a duplicate
    assert result.duplicates <= result.crashes_by_point["after_send"] * 8 + result.crashes_by_point["before_remove"] * 8


def test_sigkilled_dispatcher_processes_lose_nothing() -> None:
    result = process_kill_soak(messages=300, kills=12, seed=3)
    assert result.process_kills == 12
    assert result.lost == 0
    assert result.delivered == 300


def test_deaths_in_the_middle_of_a_paced_release_lose_nothing() -> None:
    # release control caps the destination at 4/s while 100 messages a round fall due over 60 s (simulated): many
    # wait for their slots, deferred to the store, so deaths also land just before and after those deferrals
    result = in_process_soak(messages=100, crashes=60, seed=5, release_rate=4)
    assert result.injected_crashes == 60
    assert {"before_defer", "after_defer"} <= set(result.crashes_by_point), result.crashes_by_point
    assert result.lost == 0
    assert result.delivered == result.messages >= 100
    # a death leaves at most the batch being sent unsettled (batches of 8), whether it was due or paced
    assert result.duplicates <= result.injected_crashes * 8
