"""The timer on moto S3 + SQS over simulated time: every message once, never early; cancel, reschedule, duplicates."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.timer import BucketTimer, TimerResult
from delayed_delivery.aws.tier.timer_sqs import TimerSqs, send_waves
from delayed_delivery.cancellations import (
    CancellationCache,
    InMemoryCancellationStore,
    cancel_request,
    reschedule_request,
)
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.errors import TransientError
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, DispatchWindow
from tests.aws.tier.timer_support import (
    SETTINGS,
    START,
    Recorder,
    make_store,
    make_timer,
    message,
    queue_url,
    run_for,
    settled,
    total,
)


def test_every_message_arrives_once_and_never_early(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    orders = queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    batch = [message(n, START + timedelta(milliseconds=1_700 * n + 300)) for n in range(30)]  # 0.3 s to 49.6 s
    written = store.write_due(batch, START)
    assert {b.level for b in written} == {FINE, COARSE}  # some wait coarse first, then are split
    results = run_for(make_timer(store, sqs, tier_settings, clock), clock, 55)
    sent = recorder.to("orders")
    assert sorted(s.message_id or "" for s in sent) == sorted(m.message_id for m in batch)  # each exactly once
    due = {m.message_id: m.due_at for m in batch}
    for s in sent:
        assert s.arrives >= due[s.message_id or ""], s  # never early
        assert s.arrives - due[s.message_id or ""] < timedelta(seconds=1)  # on time to the second
        assert 0 <= s.delay_seconds <= 3
    assert total(results, "dispatched") == 30 and total(results, "cascaded_messages") > 0
    assert total(results, "to_error_queue") == 0 and total(results, "kept_for_retry") == 0
    assert list(store.objects(FINE)) == [] and list(store.objects(COARSE)) == []
    arrived = drain(sqs, orders, expect=len(batch))  # the emulator holds the real DelaySeconds (up to 3 s)
    assert sorted(m["Body"] for m in arrived) == sorted(m.body.decode() for m in batch)
    first = next(m for m in arrived if m["Body"] == "body-0")
    assert first["MessageAttributes"]["kind"]["StringValue"] == "k0"
    info = decode_delivery(first["MessageAttributes"][DELIVERY_HEADER]["StringValue"])
    assert (info.message_id, info.route, info.due_ms) == ("m-0", "buckets", batch[0].due_at_ms)


def test_cancel_drops_one_and_reschedule_moves_one(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    sent_at = START - timedelta(seconds=5)
    a, b, c = (message(n, START + timedelta(seconds=25 + n), sent=sent_at) for n in range(3))  # coarse
    d = message(3, START + timedelta(seconds=5), sent=sent_at)  # fine: the record is checked at dispatch
    store.write_due([a, b, c, d], START)
    records = InMemoryCancellationStore()
    records.put(cancel_request("orders", a.message_id, now=START, max_native_delay=2, max_age=0))
    records.put(reschedule_request("orders", b.message_id, START + timedelta(seconds=42), now=START))
    records.put(cancel_request("orders", d.message_id, now=START, max_native_delay=2, max_age=0))
    late = message(9, START + timedelta(seconds=26), sent=START + timedelta(seconds=5))  # sent after: not bound
    store.write_due([late], START)
    records.put(cancel_request("orders", "m-9", now=START - timedelta(seconds=3), max_native_delay=2, max_age=0))
    timer = make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock))
    results = run_for(timer, clock, 50)
    sent = {s.message_id: s for s in recorder.to("orders")}
    assert set(sent) == {"m-1", "m-2", "m-9"}
    assert sent["m-1"].arrives >= START + timedelta(seconds=42)
    assert decode_delivery(sent["m-1"].attributes[DELIVERY_HEADER]["StringValue"]).due_ms == int(
        (START + timedelta(seconds=42)).timestamp() * 1000
    )
    assert total(results, "cancelled") == 2 and total(results, "rescheduled") == 1
    # applied records are settled (kept an hour past the due time they met, #31), others stay as they were
    assert sorted(r.message_id for r in records.live("orders")) == ["m-0", "m-1", "m-3", "m-9"]
    applied = [r for r in records.live("orders") if r.message_id != "m-9"]
    assert all(r.expires_at <= START + timedelta(seconds=42 + 3_601) for r in applied)


def test_duplicates_are_counted_and_a_conflict_goes_to_the_error_queue(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    errors = queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    due = START + timedelta(seconds=3)
    one, two = message(1, due), message(2, due)
    first = message(3, due, body="first", sent=START - timedelta(seconds=2))
    second = message(3, due, body="second", sent=START - timedelta(seconds=1))
    store.write_due([one, two, first], START)
    store.write_due([one, second], START)  # one again (a retried write), and another message under id m-3
    results = run_for(make_timer(store, sqs, tier_settings, clock), clock, 4)
    assert sorted(s.body for s in recorder.to("orders")) == ["body-1", "body-2", "first"]
    assert total(results, "duplicates_skipped") == 1 and total(results, "to_error_queue") == 1
    [rejected] = drain(sqs, errors)
    assert rejected["Body"] == "second"
    reason = rejected["MessageAttributes"]["DelayedDelivery.FailureReason"]["StringValue"]
    assert "another message with id 'm-3'" in reason


def test_a_missing_destination_goes_to_the_error_queue_with_a_reason(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    errors = queue_url(sqs, "errors")
    store = make_store(s3, tier_bucket, tier_settings)
    store.write_due([message(1, START + timedelta(seconds=2), destination="nowhere")], START)
    results = run_for(make_timer(store, sqs, tier_settings, clock), clock, 3)
    assert total(results, "to_error_queue") == 1 and total(results, "dispatched") == 0
    [rejected] = drain(sqs, errors)
    attributes = rejected["MessageAttributes"]
    assert "destination gone" in attributes["DelayedDelivery.FailureReason"]["StringValue"]
    assert attributes["DelayedDelivery.OriginalDestination"]["StringValue"] == "nowhere"
    assert attributes["kind"]["StringValue"] == "k1" and rejected["Body"] == "body-1"
    assert list(store.objects(FINE)) == []


def test_oldest_overdue_is_the_age_of_the_oldest_late_bucket(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START + timedelta(seconds=30))
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    store = make_store(s3, tier_bucket, tier_settings)
    store.write_due([message(1, START + timedelta(seconds=5, milliseconds=500))], START)
    timer = make_timer(store, sqs, tier_settings, clock)
    late = timer.run()
    assert late.oldest_overdue_seconds == 24.0 and late.dispatched == 1
    assert timer.run() == TimerResult()


def test_a_coarse_bucket_is_split_in_bounded_groups_and_a_repeat_is_harmless(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    coarse = BucketKey(COARSE, START + timedelta(seconds=20))
    batches = [[message(n * 2 + i, coarse.start + timedelta(seconds=n * 3 + i)) for i in range(2)] for n in range(3)]
    for batch in batches:
        store.write(coarse, batch)
    store.write(coarse, batches[0][:1])  # the same message once more, in its own object
    timer = BucketTimer(store, sqs, SETTINGS, clock, owner="t", lease_seconds=5)
    timer.cascade_group_bytes = 400
    clock.advance(8)  # cascade_window(now) is now the bucket at +20 s
    first = timer.run()
    assert first.cascaded_objects == 4 and first.cascaded_messages == 7  # groups of ~2 lines: the copy in another
    assert list(store.objects(COARSE)) == []
    results = run_for(timer, clock, 25)
    assert sorted(s.message_id or "" for s in recorder.to("orders")) == sorted(f"m-{n}" for n in range(6))
    assert total(results, "duplicates_skipped") == 0  # the copy wrote the very fine object its group wrote


def test_a_cascade_stops_before_its_lease_runs_out_and_the_next_run_goes_on(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: Any
) -> None:
    clock = ManualClock(START + timedelta(seconds=8))
    queue_url(sqs, "orders")
    store = make_store(s3, tier_bucket, tier_settings)
    coarse = BucketKey(COARSE, START + timedelta(seconds=20))
    for n in range(3):
        store.write(coarse, [message(n, coarse.start + timedelta(seconds=n))])
    timer = BucketTimer(store, sqs, SETTINGS, clock, owner="t", lease_seconds=30)
    timer.cascade_group_bytes = 1  # a group is not started in the last quarter of the lease
    real_write_due = store.write_due

    def slow(messages: Any, now: Any) -> Any:  # each group takes 15 s of the 30 s lease
        clock.advance(15)
        return real_write_due(messages, now)

    monkeypatch.setattr(store, "write_due", slow)
    first = timer.run()
    assert first.cascaded_objects == 2 and len(list(store.objects(COARSE))) == 1  # the third waits for the next run
    assert timer.run().cascaded_objects == 1 and list(store.objects(COARSE)) == []


def test_each_destination_records_are_read_fresh_for_every_bucket(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    sent_at = START - timedelta(seconds=5)
    ready = [message(n, START + timedelta(milliseconds=300 * n + 100), sent=sent_at) for n in range(8)]  # 3 buckets
    store.write_due(ready, START)
    records = InMemoryCancellationStore()
    records.put(cancel_request("orders", "m-2", now=START, max_native_delay=2, max_age=0))
    timer = make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock))
    first = timer.run()
    assert first.dispatched == 7 and first.cancelled == 1
    assert records.lookups == 3  # 8 messages in 3 buckets to one destination: one read a bucket (#31: one a run)
    assert settled(records, "orders", START + timedelta(seconds=3))  # the applied record is settled (#31)
    later = message(20, START + timedelta(seconds=3), sent=sent_at)
    store.write_due([later], START)
    records.put(cancel_request("orders", later.message_id, now=START, max_native_delay=2, max_age=0))
    lookups = records.lookups
    results = run_for(timer, clock, 4)
    assert records.lookups == lookups + 1  # read again in the run that met a message (runs with none read nothing)
    assert total(results, "cancelled") == 1 and total(results, "dispatched") == 0  # the new record is seen
    assert "m-20" not in {s.message_id for s in recorder.to("orders")}


def test_a_failed_read_leaves_the_bucket_for_a_later_run_and_reports_it(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    store = make_store(s3, tier_bucket, tier_settings)
    store.write_due([message(n, START + timedelta(milliseconds=300 * n + 100)) for n in range(8)], START)
    records = InMemoryCancellationStore()
    records.put(cancel_request("orders", "m-2", now=START, max_native_delay=2, max_age=0))
    problems: list[str] = []

    def unavailable(endpoint: str) -> Any:
        raise TransientError("table unavailable")

    records.live = unavailable  # type: ignore[method-assign]
    cache = CancellationCache(records, 0, clock=clock, on_error=lambda op, exc: problems.append(op))
    result = make_timer(store, sqs, tier_settings, clock, cache).run()
    # #31: sent as planned before, m-2 with it although cancelled; now the bucket waits for its records
    assert result.dispatched == 0 and result.buckets_failed == 3 and problems == ["lookup"] * 3  # 3 buckets


def test_send_waves_put_each_message_a_whole_number_of_seconds_from_due() -> None:
    due = [START + timedelta(milliseconds=ms) for ms in (30_370, 30_000, 5_999, -2_000, 450, 30_371)]
    messages = [message(n, d) for n, d in enumerate(due)]
    waves = send_waves(messages, START, 100)
    assert [(w // timedelta(milliseconds=1), [m.message_id for m in ms]) for w, ms in waves] == [
        (0, ["m-1", "m-3"]),  # on a whole second, or overdue: at once
        (400, ["m-0", "m-5"]),
        (500, ["m-4"]),  # due in 0.45 s: sent just after due, with DelaySeconds 0
        (1000, ["m-2"]),
    ]
    for offset, wave in waves:
        for m in wave:
            remaining = (m.due_at - START - offset).total_seconds()
            assert remaining <= 0 or -(-remaining // 1) - remaining < 0.1 + 1e-9  # rounded up adds < one step
    assert send_waves(messages, START, 0) == [(timedelta(0), messages)]


def test_sends_aligned_to_the_due_second_are_late_by_one_step_at_most(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    for phase_ms, worst in ((100, timedelta(milliseconds=100)), (0, timedelta(seconds=1))):
        clock = ManualClock(START)
        queue_url(sqs, "orders")
        recorder = Recorder(clock).attach(sqs)
        settings = tier_settings.with_(bucket_send_phase_ms=phase_ms)
        store = make_store(s3, tier_bucket, settings)
        batch = [message(n, START + timedelta(milliseconds=1_000 + 97 * n)) for n in range(20)]  # 1-2.9 s
        store.write_due(batch, START)
        make_timer(store, sqs, settings, clock).run()
        due = {m.message_id: m.due_at for m in batch}
        lateness = [s.arrives - due[s.message_id or ""] for s in recorder.to("orders")]
        assert len(lateness) == 20 and min(lateness) >= timedelta(0)
        assert max(lateness) <= worst and (phase_ms == 0) == (max(lateness) > timedelta(milliseconds=500))
        sqs.meta.events.unregister("provide-client-params.sqs.SendMessageBatch", recorder._record)


def test_a_slow_send_does_not_make_the_next_destinations_of_its_wave_late(sqs: Any) -> None:
    clock = ManualClock(START)
    names = [f"slow-wave-{n}" for n in range(3)]
    for name in names:
        queue_url(sqs, name)
    recorder = Recorder(clock).attach(sqs)

    def slow(**_: Any) -> None:  # each SendMessageBatch takes 3 s (a loaded SQS, or moto)
        clock.advance(3)

    sqs.meta.events.register("after-call.sqs.SendMessageBatch", slow)
    due = START + timedelta(seconds=100)  # a whole number of seconds away: one wave
    batch = [message(n, due, destination=names[n % 3]) for n in range(9)]
    try:
        outcome = TimerSqs(sqs, SETTINGS, clock).dispatch(batch, DispatchWindow(START, BucketKey(FINE, START)))
    finally:
        sqs.meta.events.unregister("after-call.sqs.SendMessageBatch", slow)
        sqs.meta.events.unregister("provide-client-params.sqs.SendMessageBatch", recorder._record)
    assert len(outcome.sent) == 9
    sent = [s for s in recorder.sent if s.queue in names]
    assert sorted({s.at for s in sent}) == [START + timedelta(seconds=3 * n) for n in range(3)]  # one at a time
    assert all(timedelta(0) <= s.arrives - due < timedelta(seconds=1) for s in sent)  # DelaySeconds read at the send
