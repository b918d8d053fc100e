"""The dispatcher under a manual clock: order, wake-up, retries, error queue, breakers, recovery."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery import (
    CircuitBreakerTrippedError,
    DelayedDeliverySettings,
    DelayedMessage,
    DestinationNotFoundError,
    Dispatcher,
    InMemoryDelayedMessageStore,
    InMemoryTransport,
    ManualClock,
    SystemClock,
    TransientError,
)
from delayed_delivery import headers as hdr
from delayed_delivery import logfields as lf
from delayed_delivery.outcomes import CLAIM_MARGIN
from delayed_delivery.ports import ClaimedMessage, claim_of, claimed_until

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def msg(i: int, due_s: float, destination: str = "orders") -> DelayedMessage:
    return DelayedMessage(f"m-{i}", destination, f"{i}".encode(), T0 + timedelta(seconds=due_s))


class FlakyStore(InMemoryDelayedMessageStore):
    """An in-memory store whose fetch/store can be switched to fail."""

    def __init__(self) -> None:
        super().__init__(claim_timeout=60)
        self.fail_fetch = False
        self.fail_store = False

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        if self.fail_fetch:
            raise TransientError("database down")
        return super().fetch_due(at, limit)

    def next_due(self) -> datetime | None:
        if self.fail_fetch:
            raise TransientError("database down")
        return super().next_due()

    def store(self, message: DelayedMessage) -> None:
        if self.fail_store:
            raise TransientError("database down")
        super().store(message)


class Harness:
    def __init__(self, **settings: object) -> None:
        self.clock = ManualClock(T0)
        self.store = FlakyStore()
        self.transport = InMemoryTransport(self.clock)
        self.critical: list[CircuitBreakerTrippedError] = []
        self.dispatcher = Dispatcher(
            self.store,
            self.transport,
            DelayedDeliverySettings(**settings),  # type: ignore[arg-type]
            clock=self.clock,
            on_critical_error=self.critical.append,
        )


def test_dispatches_in_due_order_and_only_when_due() -> None:
    h = Harness()
    for i, due in enumerate([30, 10, 20, 0]):
        h.dispatcher.store(msg(i, due))
    report = h.dispatcher.dispatch_due()
    assert [m.message_id for m in h.transport.to("orders")] == ["m-3"]
    assert report.dispatched == 1
    h.clock.advance(30)
    h.dispatcher.dispatch_due()
    assert [m.message_id for m in h.transport.to("orders")] == ["m-3", "m-1", "m-2", "m-0"]
    assert len(h.store) == 0


def test_wait_for_due_sleeps_until_each_message_and_is_never_late() -> None:
    h = Harness()
    for i, due in enumerate([10, 25, 40]):
        h.dispatcher.store(msg(i, due))
    report = h.dispatcher.dispatch_due(budget=60, wait_for_due=True)
    assert report.dispatched == 3
    assert report.lateness_seconds == [0.0, 0.0, 0.0]
    assert [s.sent_at for s in h.transport.sent] == [T0 + timedelta(seconds=d) for d in (10, 25, 40)]
    assert h.clock.now() == T0 + timedelta(seconds=60), "the budget bounds the run"


def test_idle_sleep_is_capped() -> None:
    h = Harness(max_idle_sleep=5)
    h.dispatcher.store(msg(1, 3600))
    h.dispatcher.dispatch_due(budget=12, wait_for_due=True)
    assert h.clock.slept[:2] == [5, 5]


def test_store_of_an_earlier_message_wakes_the_loop() -> None:
    clock = SystemClock()
    store = InMemoryDelayedMessageStore()
    transport = InMemoryTransport(clock)
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(max_idle_sleep=60), clock=clock)
    now = clock.now()
    dispatcher.store(DelayedMessage("later", "q", b"", now + timedelta(seconds=3600)))
    stop = threading.Event()
    loop = threading.Thread(target=dispatcher.run, args=(stop,))
    loop.start()
    time.sleep(0.2)  # the loop is now asleep until the 1-hour message
    dispatcher.store(DelayedMessage("soon", "q", b"", clock.now()))
    deadline = time.monotonic() + 5
    while not transport.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    dispatcher.notify(clock.now())
    loop.join(5)
    assert [s.message.message_id for s in transport.sent] == ["soon"]
    assert not loop.is_alive()


def test_retries_then_error_queue_with_reason() -> None:
    h = Harness(number_of_retries=2, retry_backoff=1, error_queue="errors")
    h.transport.fail("orders", times=3)
    h.dispatcher.store(msg(1, 0))
    report = h.dispatcher.dispatch_due(budget=30, wait_for_due=True)
    assert report.failed_attempts == 3
    assert report.moved_to_error_queue == 1
    assert h.transport.to("orders") == []
    [failed] = h.transport.to("errors")
    assert failed.body == b"1"
    assert failed.headers[hdr.ORIGINAL_DESTINATION] == "orders"
    assert failed.headers[hdr.FAILURE_COUNT] == "3"
    assert "injected failure" in failed.headers[hdr.FAILURE_REASON]
    assert len(h.store) == 0


def test_default_zero_retries_means_the_first_failure_goes_to_the_error_queue() -> None:
    h = Harness()
    h.transport.fail("orders", times=1)
    h.dispatcher.store(msg(1, 0))
    h.dispatcher.dispatch_due()
    assert [m.message_id for m in h.transport.to("error")] == ["m-1"]


def test_a_transient_failure_within_the_retry_budget_is_delivered_later() -> None:
    h = Harness(number_of_retries=3, retry_backoff=2)
    h.transport.fail("orders", times=2)
    h.dispatcher.store(msg(1, 0))
    h.dispatcher.dispatch_due(budget=60, wait_for_due=True)
    [sent] = h.transport.sent
    assert sent.message.destination == "orders"
    assert sent.sent_at == T0 + timedelta(seconds=2 + 4), "backoff doubles: 2 s then 4 s"


def test_a_failing_message_does_not_block_the_ones_behind_it() -> None:
    h = Harness(number_of_retries=5, retry_backoff=10, batch_size=1)
    h.transport.fail("broken", times=1)
    h.dispatcher.store(msg(1, 0, destination="broken"))
    h.dispatcher.store(msg(2, 1))
    h.clock.advance(1)
    h.dispatcher.dispatch_due()
    assert [s.message.message_id for s in h.transport.sent] == ["m-2"]


def test_missing_destination_goes_to_the_error_queue_at_once() -> None:
    h = Harness(number_of_retries=5)
    h.transport.destinations = {"orders", "error"}
    h.dispatcher.store(msg(1, 0, destination="nowhere"))
    report = h.dispatcher.dispatch_due()
    assert report.moved_to_error_queue == 1
    [failed] = h.transport.to("error")
    assert DestinationNotFoundError.__name__ in failed.headers[hdr.FAILURE_REASON]
    assert h.critical == [], "a permanent error is not an outage"


def test_when_the_error_queue_also_fails_the_message_stays() -> None:
    h = Harness(retry_backoff=5)
    h.transport.fail("orders", times=2)
    h.transport.fail("error", times=1)
    h.dispatcher.store(msg(1, 0))
    h.dispatcher.dispatch_due(budget=4, wait_for_due=True)
    kept = h.store.get("m-1")
    assert kept is not None and kept.failure_count == 1, "kept, not lost"
    assert kept.due_at == T0 + timedelta(seconds=5), "backed off instead of spinning"
    assert h.transport.sent == []
    h.dispatcher.dispatch_due(budget=10, wait_for_due=True)
    assert [m.message_id for m in h.transport.to("error")] == ["m-1"]
    assert len(h.store) == 0


def test_remove_returning_false_is_counted_as_a_possible_duplicate() -> None:
    h = Harness()
    h.dispatcher.store(msg(1, 0))
    [claimed] = h.store.fetch_due(T0, 10)
    [other] = h.store.fetch_due(T0 + timedelta(seconds=61), 10)  # the claim expired: another dispatcher took it
    assert h.store.remove("m-1", claim_of(other))  # and finished it first
    report = h.dispatcher.dispatch_batch([claimed], T0)
    assert report.dispatched == 1 and report.already_removed == 1


def test_a_superseded_claim_never_removes_the_row_stored_since(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.dispatcher.store(msg(1, 0))
    [claimed] = h.store.fetch_due(T0, 10)
    [other] = h.store.fetch_due(T0 + timedelta(seconds=61), 10)
    assert h.store.remove("m-1", claim_of(other))
    h.store.store(DelayedMessage("m-1", "orders", b"new", T0 + timedelta(seconds=300)))  # the id, sent again
    with caplog.at_level(logging.WARNING, logger="delayed_delivery.dispatcher"):
        report = h.dispatcher.dispatch_batch([claimed], T0)
    assert report.dispatched == 1 and report.already_removed == 1
    assert [r.event for r in caplog.records if hasattr(r, "event")] == [lf.EVENT_SUPERSEDED]  # type: ignore[attr-defined]
    kept = h.store.get("m-1")
    assert kept is not None and kept.body == b"new", "the message stored since is still there"


def test_a_failed_send_under_a_superseded_claim_neither_counts_nor_moves_the_row() -> None:
    h = Harness(retry_backoff=5)
    h.dispatcher.store(msg(1, 0, destination="flaky"))
    [claimed] = h.store.fetch_due(T0, 10)
    h.store.fetch_due(T0 + timedelta(seconds=61), 10)  # the claim expired: another dispatcher holds it now
    h.transport.fail("flaky", times=1)
    report = h.dispatcher.dispatch_batch([claimed], T0)
    assert report.failed_attempts == 1
    kept = h.store.get("m-1")
    assert kept is not None and kept.failure_count == 0 and kept.due_at == T0, "the new holder's row is untouched"


def test_fetch_breaker_trips_after_its_time_and_recovers() -> None:
    h = Harness(time_to_trigger_fetch_circuit_breaker=30, failure_delay=1)
    h.store.fail_fetch = True
    h.dispatcher.dispatch_due(budget=29.5)
    assert h.critical == [] and h.dispatcher.fetch_breaker.armed
    h.dispatcher.dispatch_due(budget=5)
    assert [e.breaker for e in h.critical] == ["fetch"]
    assert h.dispatcher.fetch_breaker.tripped
    assert h.dispatcher.fetch_breaker.failure_delay == 10, "NServiceBus slows to 10 s once tripped"
    h.dispatcher.dispatch_due(budget=60)
    assert len(h.critical) == 1, "the callback fires once per outage"
    h.store.fail_fetch = False
    h.dispatcher.store(msg(1, 0))
    h.dispatcher.dispatch_due()
    assert not h.dispatcher.fetch_breaker.armed and h.transport.sent
    h.store.fail_fetch = True
    h.dispatcher.dispatch_due(budget=31)
    assert [e.breaker for e in h.critical] == ["fetch", "fetch"], "a new outage trips again"


def test_dispatch_breaker_trips_when_sends_keep_failing() -> None:
    h = Harness(
        time_to_trigger_dispatch_circuit_breaker=20,
        number_of_retries=1000,
        retry_backoff=1,
        max_retry_backoff=1,
        maximum_recovery_failures_per_second=100,
    )
    h.transport.fail("orders", times=10_000)
    h.dispatcher.store(msg(1, 0))
    h.dispatcher.dispatch_due(budget=19, wait_for_due=True)
    assert h.critical == []
    h.dispatcher.dispatch_due(budget=3, wait_for_due=True)
    assert [e.breaker for e in h.critical] == ["dispatch"]
    assert isinstance(h.critical[0].last_error, TransientError)


def test_store_breaker_trips_when_storing_keeps_failing() -> None:
    h = Harness(time_to_trigger_store_circuit_breaker=10)
    h.store.fail_store = True
    for _ in range(11):
        with pytest.raises(TransientError):
            h.dispatcher.store(msg(1, 0))
        h.clock.advance(1)
    assert [e.breaker for e in h.critical] == ["store"]
    h.store.fail_store = False
    h.dispatcher.store(msg(1, 0))
    assert not h.dispatcher.store_breaker.armed


def test_recovery_breaker_trips_above_the_failure_rate() -> None:
    h = Harness(
        maximum_recovery_failures_per_second=1,
        time_to_trigger_dispatch_circuit_breaker=30,
        number_of_retries=5,
        batch_size=100,
    )
    h.transport.fail("orders", times=31)
    for i in range(31):
        h.dispatcher.store(msg(i, 0))
    h.dispatcher.dispatch_due()
    assert "recovery" in [e.breaker for e in h.critical]


def test_recovery_breaker_stays_quiet_under_the_rate() -> None:
    h = Harness(maximum_recovery_failures_per_second=1, number_of_retries=5)
    h.transport.fail("orders", times=30)
    for i in range(30):
        h.dispatcher.store(msg(i, 0))
    h.dispatcher.dispatch_due()
    assert "recovery" not in [e.breaker for e in h.critical]


def test_disabled_dispatcher_does_nothing() -> None:
    h = Harness(enabled=False)
    h.dispatcher.store(msg(1, 0))
    assert h.dispatcher.dispatch_due().dispatched == 0
    assert h.transport.sent == []


def test_concurrent_sends_deliver_every_message_once() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = InMemoryTransport(clock)
    d = Dispatcher(store, transport, DelayedDeliverySettings(max_concurrency=8, batch_size=50), clock=clock)
    for i in range(500):
        store.store(msg(i, i % 5))
    clock.advance(10)
    report = d.dispatch_due()
    d.close()
    ids = [s.message.message_id for s in transport.sent]
    assert report.dispatched == 500 and len(set(ids)) == 500


class BatchRemovingStore(InMemoryDelayedMessageStore):
    def __init__(self) -> None:
        super().__init__()
        self.remove_calls: list[list[str]] = []

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> list[bool]:
        self.remove_calls.append(list(message_ids))
        held = list(claims) if claims is not None else [None] * len(message_ids)
        return [self.remove(m, c) for m, c in zip(message_ids, held, strict=True)]


def test_batch_removing_stores_get_one_removal_per_batch() -> None:
    clock = ManualClock(T0)
    store = BatchRemovingStore()
    transport = InMemoryTransport(clock)
    d = Dispatcher(store, transport, DelayedDeliverySettings(batch_size=10, max_concurrency=4), clock=clock)
    for i in range(25):
        store.store(msg(i, 0))
    store.store(msg(99, 0, destination="flaky"))
    transport.fail("flaky", times=1)
    report = d.dispatch_due()
    d.close()
    assert report.dispatched == 25 and report.moved_to_error_queue == 1
    assert len(store) == 0
    assert [len(c) for c in store.remove_calls] == [10, 10, 5]


def test_keep_going_false_stops_before_the_next_send() -> None:
    h = Harness(batch_size=10)
    for i in range(10):
        h.dispatcher.store(msg(i, 0))
    budget = iter([True, True, True, False])
    report = h.dispatcher.dispatch_due(keep_going=lambda: next(budget, False))
    assert report.dispatched == 2, "one check before the fetch, then one before each send"
    assert len(h.store) == 8, "unsent messages stay in the store"


class SlowRemovingStore(BatchRemovingStore):
    """Removes in batches slowly, noting which thread removed and what was fetched meanwhile."""

    def __init__(self, fail_once: bool = False) -> None:
        super().__init__()
        self.removing = threading.Event()
        self.fetched_while_removing: list[str] = []
        self.removal_threads: set[str] = set()
        self.fail_once = fail_once

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        batch = super().fetch_due(at, limit)
        if self.removing.is_set():
            self.fetched_while_removing.extend(m.message_id for m in batch)
        return batch

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> list[bool]:
        self.removing.set()
        try:
            self.removal_threads.add(threading.current_thread().name)
            time.sleep(0.05)
            if self.fail_once:
                self.fail_once = False
                raise TransientError("table down while settling")
            return super().remove_many(message_ids, claims)
        finally:
            self.removing.clear()


def test_overlapped_removal_runs_beside_the_next_batch_and_finishes_before_returning() -> None:
    clock = ManualClock(T0)
    store = SlowRemovingStore()
    transport = InMemoryTransport(clock)
    settings = DelayedDeliverySettings(batch_size=10, max_concurrency=4)
    d = Dispatcher(store, transport, settings, clock=clock, overlap_removal=True)
    for i in range(35):
        store.store(msg(i, 0))
    report = d.dispatch_due()
    assert len(store) == 0, "every removal finished before dispatch_due returned"
    d.close()
    ids = [s.message.message_id for s in transport.sent]
    assert report.dispatched == 35 and sorted(ids) == sorted(set(ids)), "each message sent once"
    assert [len(c) for c in store.remove_calls] == [10, 10, 10, 5]
    assert store.removal_threads and all(name.startswith("settle") for name in store.removal_threads)
    assert store.fetched_while_removing, "the next batch was fetched while the previous one was being removed"


def test_overlapped_removal_failure_counts_on_the_store_breaker_and_loses_nothing() -> None:
    clock = ManualClock(T0)
    store = SlowRemovingStore(fail_once=True)
    transport = InMemoryTransport(clock)
    settings = DelayedDeliverySettings(batch_size=5, max_concurrency=2)
    d = Dispatcher(store, transport, settings, clock=clock, overlap_removal=True)
    for i in range(10):
        store.store(msg(i, 0))
    d.dispatch_due()
    assert len(store) == 5, "the batch whose removal failed stays (claimed) in the store"
    clock.advance(120)  # its claims expire
    d.dispatch_due()
    d.close()
    assert len(store) == 0
    assert sorted({s.message.message_id for s in transport.sent}) == sorted(f"m-{i}" for i in range(10))


class LaggingStore(InMemoryDelayedMessageStore):
    """A store that decides "due" on its own clock, ``lag`` behind the dispatcher's (PostgreSQL's database clock)."""

    def __init__(self, lag: timedelta, clock: ManualClock) -> None:
        super().__init__(claim_timeout=60)
        self.lag = lag
        self.clock = clock
        self.fetches = 0

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        self.fetches += 1
        self.clock.advance(0.001)  # a round trip takes time, so a spinning dispatcher still ends
        return super().fetch_due(at - self.lag, limit)


def test_a_store_whose_clock_lags_is_polled_with_backoff_not_spun_on() -> None:
    clock = ManualClock(T0)
    store = LaggingStore(timedelta(minutes=5), clock)
    transport = InMemoryTransport(clock)
    for i in range(3):
        store.store(msg(i, 10 + i * 20))  # due on the store's clock at T0 + 10 s, 30 s, 50 s
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(max_idle_sleep=60), clock=clock)
    while len(transport.sent) < 3 and clock.now() < T0 + timedelta(minutes=7):
        dispatcher.dispatch_due(budget=1.0, wait_for_due=True)
    sent_at = {s.message.message_id: s.sent_at for s in transport.sent}
    assert set(sent_at) == {"m-0", "m-1", "m-2"}
    for i in range(3):  # never early on the store's clock, and at most the 1 s backoff cap late
        store_due = T0 + timedelta(minutes=5, seconds=10 + i * 20)
        assert store_due <= sent_at[f"m-{i}"] <= store_due + timedelta(seconds=2.1)
    # 5 minutes of "due but not handed out" at 1 s once backed off, not thousands of fetches
    assert store.fetches < 400, store.fetches
    assert max(clock.slept) <= 1.0


class SlowTransport(InMemoryTransport):
    """Each send takes ``seconds`` of the manual clock (a slow destination)."""

    def __init__(self, clock: ManualClock, seconds: float) -> None:
        super().__init__(clock)
        self.seconds = seconds

    def send(self, message: DelayedMessage) -> None:
        self.clock.advance(self.seconds)  # type: ignore[attr-defined]
        super().send(message)


class SayingStore(InMemoryDelayedMessageStore):
    """Says when each claim runs out, as the Azure table does (the fetch's time plus the claim timeout)."""

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        until = at + self.claim_timeout
        return [ClaimedMessage.of(m, claim_of(m) or "", None, until) for m in super().fetch_due(at, limit)]


def test_a_message_whose_claim_runs_out_before_its_turn_is_not_sent_but_fetched_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    store = SayingStore(claim_timeout=6)
    for i in range(10):
        store.store(msg(i, 0))
    transport = SlowTransport(clock, 1.0)
    settings = DelayedDeliverySettings(max_concurrency=1, batch_size=10)
    with caplog.at_level(logging.WARNING, logger="delayed_delivery.dispatcher"):
        report = Dispatcher(store, transport, settings, clock=clock).dispatch_due(60, wait_for_due=True)
    # claims of 6 s, sends of 1 s: 4 go out, the rest would have been sent within 2 s of their claims running out
    assert report.claims_ran_out == 6 + 2 and report.dispatched == 10 and len(store) == 0
    assert sorted(m.message_id for m in transport.to("orders")) == sorted(f"m-{i}" for i in range(10)), "once each"
    assert {r.event for r in caplog.records if hasattr(r, "event")} == {lf.EVENT_CLAIM_RAN_OUT}  # type: ignore[attr-defined]


class BoundedSlowTransport(SlowTransport):
    """A slow transport that says each send ends within ``send_timeout`` seconds, and records when each began."""

    send_timeout = 3.0

    def __init__(self, clock: ManualClock, seconds: float) -> None:
        super().__init__(clock, seconds)
        self.starts: list[tuple[datetime, datetime | None]] = []

    def send(self, message: DelayedMessage) -> None:
        self.starts.append((self.clock.now(), claimed_until(message)))  # type: ignore[attr-defined]
        super().send(message)


def test_a_send_starts_only_while_its_claim_outlasts_the_transports_bound_on_a_send() -> None:
    clock = ManualClock(T0)
    store = SayingStore(claim_timeout=10)
    for i in range(10):
        store.store(msg(i, 0))
    transport = BoundedSlowTransport(clock, 1.0)
    settings = DelayedDeliverySettings(max_concurrency=1, batch_size=10)
    report = Dispatcher(store, transport, settings, clock=clock).dispatch_due(300, wait_for_due=True)
    assert report.dispatched == 10 and len(store) == 0
    assert sorted(m.message_id for m in transport.to("orders")) == sorted(f"m-{i}" for i in range(10)), "once each"
    needed = timedelta(seconds=transport.send_timeout + CLAIM_MARGIN)
    left = [until - started for started, until in transport.starts if until is not None]
    assert len(left) == 10 and min(left) > needed, f"a send began with only {min(left)} of its claim left"
    # claims of 10 s, sends of 1 s and a bound of 3 s (+2 s margin): 5 start per claim, not the 8 without the bound
    assert report.claims_ran_out == 5


class OutcomeStore(SayingStore):
    """Records whether each failure was counted as a send that certainly put nothing."""

    def __init__(self) -> None:
        super().__init__(claim_timeout=60)
        self.unsent: list[str] = []
        self.unknown: list[str] = []

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        self.unknown.append(message_id)
        return super().increment_failure_count(message_id, claim)

    def count_unsent_failure(self, message_id: str, claim: str) -> bool:
        self.unsent.append(message_id)
        return super().increment_failure_count(message_id, claim)


def test_a_refused_or_throttled_send_is_counted_as_unsent_and_a_timeout_as_unknown() -> None:
    from delayed_delivery.errors import PermanentError, ThrottledError

    clock = ManualClock(T0)
    store = OutcomeStore()
    for i in range(3):
        store.store(msg(i, 0))
    errors = {"m-0": PermanentError("403"), "m-1": ThrottledError("503"), "m-2": TransientError("timed out")}

    class Failing(InMemoryTransport):
        def send(self, message: DelayedMessage) -> None:
            raise errors[message.message_id]

    settings = DelayedDeliverySettings(max_concurrency=1, number_of_retries=5)
    Dispatcher(store, Failing(clock), settings, clock=clock).dispatch_due(1)
    assert sorted(store.unsent) == ["m-0", "m-1"] and store.unknown == ["m-2"]
