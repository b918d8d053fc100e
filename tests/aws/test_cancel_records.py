"""Cancel / reschedule records in the core: the too-late rule, the TTL, and the per-instance cache (no emulator)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery.cancellations import (
    FAILURE_BACKOFF_S,
    RECORD_TTL,
    Cancellation,
    CancellationCache,
    CancellationKind,
    InMemoryCancellationStore,
    cancel_request,
    reschedule_request,
)
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import DelayedDeliveryError, InvalidMessageError, TransientError

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_cancel_without_a_due_time_is_accepted_and_lives_past_the_fifo_retention() -> None:
    record = cancel_request("orders", "m1", now=NOW, max_native_delay=900, max_age=60)
    assert (record.kind, record.due_at, record.expires_at) == (CancellationKind.CANCEL, None, NOW + RECORD_TTL)
    assert timedelta(days=4) < RECORD_TTL  # a message waits at most the FIFO queue's 4-day retention for a hop


@pytest.mark.parametrize(("seconds", "needle"), [(-5, "was due"), (0, "was due"), (300, "is due in 5m"), (960, "16m")])
def test_cancel_with_a_due_time_inside_the_native_cap_plus_cache_is_refused(seconds: int, needle: str) -> None:
    with pytest.raises(InvalidMessageError, match="too late to cancel 'm1'") as refused:
        cancel_request("orders", "m1", now=NOW, max_native_delay=900, max_age=60, due=NOW + timedelta(seconds=seconds))
    assert needle in str(refused.value) and "drop it by id" in str(refused.value)


def test_cancel_with_a_due_time_beyond_the_reach_is_accepted() -> None:
    due = NOW + timedelta(seconds=961)
    assert cancel_request("orders", "m1", now=NOW, max_native_delay=900, max_age=60, due=due).kind == "cancel"


def test_reschedule_record_carries_the_new_due_time() -> None:
    due = NOW + timedelta(days=3)
    record = reschedule_request("orders", "m1", due, now=NOW)
    assert (record.kind, record.due_at, record.expires_at) == (CancellationKind.RESCHEDULE, due, NOW + RECORD_TTL)
    with pytest.raises(InvalidMessageError, match="100 years"):
        reschedule_request("orders", "m1", NOW + timedelta(days=40_000), now=NOW)
    with pytest.raises(InvalidMessageError, match="needs a due time"):
        Cancellation("orders", "m1", CancellationKind.RESCHEDULE, NOW, NOW + RECORD_TTL)


class _Ticker:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Broken(InMemoryCancellationStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def live(self, endpoint: str) -> list[Cancellation]:
        if self.down:
            self.lookups += 1
            raise TransientError("table unreachable")
        return list(super().live(endpoint))


def test_cache_reads_each_endpoint_once_per_max_age_and_skips_expired_records() -> None:
    store, tick, clock = InMemoryCancellationStore(), _Ticker(), ManualClock(NOW)
    cache = CancellationCache(store, 60, clock=clock, monotonic=tick)
    store.put(cancel_request("orders", "a", now=NOW, max_native_delay=900, max_age=60))
    store.put(Cancellation("orders", "old", CancellationKind.CANCEL, NOW - RECORD_TTL, NOW))  # expired
    store.put(cancel_request("billing", "b", now=NOW, max_native_delay=900, max_age=60))
    assert set(cache.lookup("orders")) == {"a"} and store.lookups == 1
    store.put(cancel_request("orders", "c", now=NOW, max_native_delay=900, max_age=60))
    tick.t = 59.9
    assert set(cache.lookup("orders")) == {"a"} and store.lookups == 1  # cached
    assert set(cache.lookup("billing")) == {"b"} and store.lookups == 2  # per endpoint
    tick.t = 60.0
    assert set(cache.lookup("orders")) == {"a", "c"} and store.lookups == 3


def test_a_failed_lookup_returns_nothing_reports_and_backs_off() -> None:
    store, tick = _Broken(), _Ticker()
    problems: list[tuple[str, DelayedDeliveryError]] = []
    cache = CancellationCache(store, 60, monotonic=tick, on_error=lambda op, exc: problems.append((op, exc)))
    assert cache.lookup("orders") == {} and [op for op, _ in problems] == ["lookup"]
    store.down = False
    store.put(cancel_request("orders", "a", now=datetime.now(UTC), max_native_delay=900, max_age=60))
    tick.t = FAILURE_BACKOFF_S - 0.1
    assert cache.lookup("orders") == {} and store.lookups == 1  # backing off
    tick.t = FAILURE_BACKOFF_S
    assert set(cache.lookup("orders")) == {"a"}


def test_applied_deletes_the_record_but_not_a_newer_request_for_the_same_id() -> None:
    store, tick = InMemoryCancellationStore(), _Ticker()
    cache = CancellationCache(store, 60, monotonic=tick)
    first = cancel_request("orders", "a", now=datetime.now(UTC), max_native_delay=900, max_age=60)
    store.put(first)
    store.put(cancel_request("orders", "b", now=datetime.now(UTC), max_native_delay=900, max_age=60))
    assert set(cache.lookup("orders")) == {"a", "b"}
    newer = reschedule_request("orders", "b", datetime.now(UTC) + timedelta(days=1), now=datetime.now(UTC))
    applied_b = cache.lookup("orders")["b"]
    store.put(newer)  # an operator changed their mind after the lookup
    cache.applied([first, applied_b])
    assert set(cache.lookup("orders")) == set()  # this instance forgets both
    tick.t = 61
    assert cache.lookup("orders") == {"b": newer}  # the store kept the newer request
