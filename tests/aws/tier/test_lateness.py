"""The timer's send waves at any phase of the clock (#31), on moto: never early, late by at most one step
(``bucket_send_phase_ms``), also when a run starts a few hundred microseconds before a whole second."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.timer_sqs import send_waves
from tests.aws.tier.plan_support import Tier, fine
from tests.aws.tier.timer_support import START, message

pytestmark = pytest.mark.moto


@pytest.mark.parametrize("phase_us", [999_600, 999_999, 1, 250_001, 0])
def test_a_bucket_is_late_by_at_most_one_step_whatever_the_clock_phase(
    s3: Any, sqs: Any, tier_bucket: str, phase_us: int
) -> None:
    # #31: send_waves floored the remainder to whole milliseconds: a run starting at hh:mm:ss.9996 sent a whole bucket
    # about 1 s late instead of at most 250 ms
    tier = Tier(s3, sqs, tier_bucket)
    due = START + timedelta(minutes=30)
    batch = [message(n, due + timedelta(seconds=n % 3)) for n in range(6)]  # on whole seconds
    tier.store.write(fine(due, tier.settings), batch)
    tier.clock.set(due - timedelta(seconds=419) + timedelta(microseconds=phase_us))
    tier.timer_results.append(tier.timer().run())
    sent = tier.recorder.to("orders")
    assert len(sent) == 6
    by_id = {m.message_id: m.due_at for m in batch}
    late = [(s.arrives - by_id[s.message_id or ""]).total_seconds() for s in sent]
    assert min(late) >= 0, "never early"
    assert max(late) <= 0.25, f"late by {max(late):.4f} s, more than the 250 ms step"


def test_send_waves_count_in_microseconds() -> None:
    start = START + timedelta(microseconds=999_600)
    [(offset, wave)] = send_waves([message(1, START + timedelta(seconds=6))], start, 250)
    assert offset == timedelta(milliseconds=250) and len(wave) == 1  # 5.0004 s away: the next step, not at once
