"""``BrokerClock``: the broker's time from SQS's ``Date`` headers, never ahead of the broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from delayed_delivery.aws.brokerclock import BrokerClock
from delayed_delivery.clock import ManualClock

EPOCH = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_a_date_header_gives_a_lower_bound_that_cancels_the_local_clocks_offset() -> None:
    local = ManualClock(EPOCH + timedelta(minutes=5, milliseconds=400))  # 5 min fast
    clock = BrokerClock(local)
    assert clock.now_ms() is None  # nothing seen yet: the caller uses its own clock
    clock.observe("Mon, 23 Nov 2026 12:00:00 GMT")  # broker time is in [12:00:00, 12:00:01)
    broker = clock.now_ms()
    assert broker is not None
    assert _ms(EPOCH) - 1000 < broker <= _ms(EPOCH) + 400  # behind the broker by under a second, never ahead


def test_the_largest_recent_bound_wins_and_old_ones_expire() -> None:
    local = ManualClock(EPOCH - timedelta(minutes=5))  # 5 min slow
    clock = BrokerClock(local, window_s=60)
    clock.observe("Mon, 23 Nov 2026 12:00:00 GMT", local_ms=_ms(local.now()) + 900)  # a late response: loose
    clock.observe_broker_ms(_ms(EPOCH) + 100, local_ms=_ms(local.now()) + 120)  # a first receive stamp: tight
    assert clock.offset_ms(_ms(local.now()) + 120) == 5 * 60_000 - 20
    assert clock.offset_ms(_ms(local.now()) + 61_000) is None


def test_headers_that_are_missing_or_malformed_are_ignored() -> None:
    clock = BrokerClock(ManualClock(EPOCH))
    for header in (None, "", "yesterday", "Mon, 23 Nov 2026 12:00:00"):
        clock.observe(header)
    assert clock.offset_ms() is None
