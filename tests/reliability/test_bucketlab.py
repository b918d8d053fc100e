"""Crash injection on the S3 time-bucket tier against moto server: nothing lost, nothing early, duplicates counted."""

from __future__ import annotations

import pytest

from tests.reliability.bucketlab import POINTS, REPEATING_POINTS, BucketLab, soak

pytestmark = pytest.mark.moto


def test_the_tier_dying_at_every_step_loses_nothing_and_sends_nothing_early(moto_endpoint: str) -> None:
    # 54 crashes = three shuffled cycles over the 18 points (9 steps, before and after the request)
    result = soak(moto_endpoint, crashes=54, seed=7, window=30, timeout=240)
    assert result.injected_crashes == 54, result
    assert set(result.crashes_by_point) == set(POINTS), result.crashes_by_point
    assert result.lost == 0, result.leftovers
    assert result.delivered == result.messages >= 100
    assert result.early == 0
    assert result.error_queue == 0
    assert sum(result.duplicates_by_point.values()) >= result.duplicates
    # a crash repeats at most one bucket's sends; the lab's buckets hold far fewer than 10 messages
    assert result.duplicates <= 10 * sum(result.crashes_by_point.get(p, 0) for p in POINTS)


def test_the_lab_sees_an_early_dispatch_and_a_repeat(moto_endpoint: str) -> None:
    lab = BucketLab(moto_endpoint, seed=1)
    now_ms = int(lab.clock.now().timestamp() * 1000)
    lab.due_ms.update({"a": now_ms + 5_000, "b": now_ms + 5_000})
    lab.send_mark.update({"a": 0, "b": 0})
    request = {"Entries": [{"Id": "0", "MessageBody": "a", "DelaySeconds": 4}, {"Id": "1", "MessageBody": "b"}]}
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})  # "b" was refused: not a dispatch
    assert lab.result.early == 1 and lab.sent_ok["b"] == 0
    lab.crash_log.append(REPEATING_POINTS[0])
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})
    assert lab.result.duplicates_by_point == {REPEATING_POINTS[0]: 1}
