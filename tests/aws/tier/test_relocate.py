"""Moving one message on the tier now (``Relocator``) on moto S3 + SQS over simulated time: a reschedule arrives at its
new due time, never early, exactly once; the crash after the first write; not found; a leased bucket; the scan."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.lease import BucketLeases
from delayed_delivery.aws.tier.relocate import Relocator, ScanLimitError, ScanProgress, candidate_buckets
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.cancellations import (
    Cancellation,
    CancellationCache,
    InMemoryCancellationStore,
    reschedule_request,
)
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import MessageInFlightError
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey
from tests.aws.tier.timer_support import (
    SETTINGS,
    START,
    Recorder,
    make_store,
    make_timer,
    message,
    queue_url,
    run_for,
    total,
)

pytestmark = pytest.mark.moto

SENT = START - timedelta(seconds=5)


def _keys(store: S3BucketStore) -> list[str]:
    return sorted(o.key for level in (FINE, COARSE) for o in store.objects(level))


def _setup(s3: Any, sqs: Any, bucket: str, tier: TierSettings) -> tuple[ManualClock, Recorder, Any]:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    return clock, Recorder(clock).attach(sqs), make_store(s3, bucket, tier)


def _record(records: InMemoryCancellationStore, message_id: str, seconds: float) -> Cancellation:
    record = reschedule_request("orders", message_id, START + timedelta(seconds=seconds), now=START)
    records.put(record)
    return record


def test_a_40_day_message_rescheduled_to_5_seconds_arrives_at_5_seconds_once(
    s3: Any, sqs: Any, tier_bucket: str
) -> None:
    real = TierSettings()  # a day, a minute, 600 s
    clock, recorder, store = _setup(s3, sqs, tier_bucket, real)
    far, neighbour = (
        message(1, START + timedelta(days=40), sent=SENT),
        message(2, START + timedelta(days=40), sent=SENT),
    )
    assert list(store.write_due([far, neighbour], START)) == [candidate_buckets(far.due_at, store.levels)[1]]
    records = InMemoryCancellationStore()
    record = _record(records, far.message_id, 5)

    moved = Relocator(store, sqs, SETTINGS, clock).relocate(record)  # no --due: the tier is scanned

    assert moved.found and moved.sent_now and moved.old_due == far.due_at and moved.objects_read == 1
    assert len(moved.rewritten) == 1 and len(moved.deleted) == 1  # the neighbour stays, in a new object
    [sent] = recorder.to("orders")
    assert (sent.message_id, sent.delay_seconds, sent.arrives) == ("m-1", 5, START + timedelta(seconds=5))
    timer = make_timer(store, sqs, real, clock, CancellationCache(records, 0, clock=clock))
    for _ in range(41):  # a timer run every simulated day, past the old due time
        clock.advance(days=1)
        timer.run()
    assert [s.message_id for s in recorder.to("orders")] == ["m-1", "m-2"]  # once each; the neighbour on time
    assert recorder.to("orders")[1].arrives == neighbour.due_at
    orders = sqs.get_queue_url(QueueName="orders")["QueueUrl"]
    assert sorted(m["Body"] for m in drain(sqs, orders, expect=2)) == [  # held the real DelaySeconds (5 s)
        "body-1",
        "body-2",
    ]


@pytest.mark.parametrize("direct_seconds", [0, 900])
def test_a_message_in_a_fine_bucket_moves_earlier_exactly(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, direct_seconds: int
) -> None:
    clock, recorder, store = _setup(s3, sqs, tier_bucket, tier_settings)
    a, b = message(1, START + timedelta(seconds=8), sent=SENT), message(2, START + timedelta(seconds=8), sent=SENT)
    fine = BucketKey(FINE, START + timedelta(seconds=8))
    store.write(fine, [a, b])
    records = InMemoryCancellationStore()
    record = _record(records, a.message_id, 3.5)

    moved = Relocator(store, sqs, SETTINGS, clock, direct_seconds=direct_seconds).relocate(record, due=a.due_at)

    assert moved.sent_now == (direct_seconds > 0)
    assert moved.bucket == (None if direct_seconds else BucketKey(FINE, START + timedelta(seconds=3)))
    results = run_for(
        make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock)), clock, 12
    )
    arrivals = {s.message_id: s.arrives for s in recorder.to("orders")}
    assert len(recorder.to("orders")) == 2 and set(arrivals) == {"m-1", "m-2"}
    assert START + timedelta(seconds=3.5) <= arrivals["m-1"] < START + timedelta(seconds=4.5)  # never early
    assert arrivals["m-2"] >= b.due_at
    assert total(results, "duplicates_skipped") == 0 and _keys(store) == []


def test_with_the_due_time_only_its_buckets_are_read(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock, _, store = _setup(s3, sqs, tier_bucket, tier_settings)
    target = message(1, START + timedelta(seconds=45), sent=SENT)
    store.write_due([target, *(message(10 + n, START + timedelta(seconds=15 * n + 1)) for n in range(6))], START)
    gets: list[str] = []
    s3.meta.events.register("before-send.s3.GetObject", lambda **kw: gets.append(kw["request"].url))
    record = _record(InMemoryCancellationStore(), target.message_id, 100)
    moved = Relocator(store, sqs, SETTINGS, clock, direct_seconds=0).relocate(record, due=target.due_at)
    assert moved.found and moved.objects_read == 1 and moved.bucket == BucketKey(COARSE, START + timedelta(seconds=100))
    assert len([u for u in gets if "/leases/" not in u]) == 2  # the find, then the read under the lease


@pytest.mark.parametrize("rerun", [False, True])
def test_a_crash_after_the_first_write_to_an_earlier_time(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, rerun: bool
) -> None:
    """Stopped after the new copy is written: the timer sends the new copy at its time and the old copy, which the
    record (kept, #31) still moves, when it meets it: a duplicate, never before the new time; running the same
    reschedule again first removes the old copy."""
    clock, recorder, store = _setup(s3, sqs, tier_bucket, tier_settings)
    old = message(1, START + timedelta(seconds=40), sent=SENT)
    store.write_due([old, message(2, START + timedelta(seconds=41), sent=SENT)], START)
    records = InMemoryCancellationStore()
    record = _record(records, old.message_id, 5)
    crashing = make_store(s3, tier_bucket, tier_settings)
    writes: list[str] = []

    def write_once(bucket: BucketKey, messages: Any) -> list[str]:
        if writes:
            raise KeyboardInterrupt("killed after the first write")
        writes.extend(S3BucketStore.write(crashing, bucket, messages))
        return writes

    crashing.write = write_once  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        Relocator(crashing, sqs, SETTINGS, clock, direct_seconds=0).relocate(record)
    assert len(writes) == 1 and len(_keys(store)) == 2  # the new copy beside the untouched old object
    if rerun:
        again = Relocator(store, sqs, SETTINGS, clock, direct_seconds=0).relocate(record)
        assert again.found and again.written == () and len(again.deleted) == 1  # resumed: nothing sent twice
    run_for(make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock)), clock, 50)
    sent = [(s.message_id, s.arrives) for s in recorder.to("orders") if s.message_id == "m-1"]
    first = START + timedelta(seconds=5)
    assert sent[0][1] >= first and sent[0][1] < first + timedelta(seconds=1)
    assert len(sent) == (1 if rerun else 2)
    if not rerun:
        assert sent[1][1] >= first  # the duplicate comes later, never before the new time
    assert len([s for s in recorder.to("orders") if s.message_id == "m-2"]) == 1


def test_a_crash_after_the_first_write_to_a_later_time_is_deduped(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    """The timer meets the old copy first: the record moves it onto the same due time, into the same object."""
    clock, recorder, store = _setup(s3, sqs, tier_bucket, tier_settings)
    old = message(1, START + timedelta(seconds=6), sent=SENT)
    store.write_due([old], START)
    records = InMemoryCancellationStore()
    record = _record(records, old.message_id, 34)
    crashing = make_store(s3, tier_bucket, tier_settings)
    crashing.delete = lambda keys: (_ for _ in ()).throw(KeyboardInterrupt())  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):  # the object left empty is not written: the next step is the delete
        Relocator(crashing, sqs, SETTINGS, clock, direct_seconds=0).relocate(record)
    assert len(_keys(store)) == 2
    results = run_for(
        make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock)), clock, 40
    )
    [sent] = recorder.to("orders")
    assert START + timedelta(seconds=34) <= sent.arrives < START + timedelta(seconds=35)
    assert total(results, "rescheduled") == 1 and total(results, "dispatched") == 1


def test_not_found(s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings) -> None:
    clock, recorder, store = _setup(s3, sqs, tier_bucket, tier_settings)
    store.write_due([message(1, START + timedelta(seconds=30), sent=SENT)], START)
    store.write_due([message(2, START + timedelta(seconds=30), sent=START + timedelta(seconds=10))], START)
    relocator = Relocator(store, sqs, SETTINGS, clock)
    before = _keys(store)
    gone = relocator.relocate(_record(InMemoryCancellationStore(), "m-9", 3))
    assert not gone.found and gone.objects_read == 2 and _keys(store) == before
    later = relocator.relocate(_record(InMemoryCancellationStore(), "m-2", 3))  # sent after the request: not bound
    assert not later.found and _keys(store) == before and recorder.sent == []


def test_a_leased_bucket_waits_then_gives_up(s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings) -> None:
    clock, recorder, store = _setup(s3, sqs, tier_bucket, tier_settings)
    target = message(1, START + timedelta(seconds=30), sent=SENT)
    [bucket] = store.write_due([target], START)
    timer_lease = BucketLeases(store, clock, "timer-1", 60).acquire(bucket)
    assert timer_lease is not None
    record = _record(InMemoryCancellationStore(), target.message_id, 3)
    ticks = iter(range(100))
    blocked = Relocator(store, sqs, SETTINGS, clock, lease_wait_seconds=3, monotonic=lambda: next(ticks) * 1.0)
    slept: list[float] = []
    blocked.sleep = slept.append
    before = _keys(store)
    with pytest.raises(MessageInFlightError, match="being dispatched right now"):
        blocked.relocate(record, due=target.due_at)
    assert slept and _keys(store) == before and recorder.sent == []

    def release(_: float) -> None:
        BucketLeases(store, clock, "timer-1").release(timer_lease)

    waiting = Relocator(store, sqs, SETTINGS, clock, lease_wait_seconds=30, sleep=release)
    assert waiting.relocate(record, due=target.due_at).sent_now and len(recorder.sent) == 1


def test_the_scan_is_bounded_and_reports_progress(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock, _, store = _setup(s3, sqs, tier_bucket, tier_settings)
    for n in range(4):
        store.write_due([message(n, START + timedelta(seconds=5 + 12 * n), sent=SENT)], START)
    record = _record(InMemoryCancellationStore(), "m-3", 60)
    with pytest.raises(ScanLimitError, match="more than 3 objects"):
        Relocator(store, sqs, SETTINGS, clock).relocate(record, scan_limit=3)
    seen: list[ScanProgress] = []
    ticks = iter(range(0, 1000, 4))
    relocator = Relocator(
        store, sqs, SETTINGS, clock, direct_seconds=0, progress=seen.append, monotonic=lambda: float(next(ticks))
    )
    moved = relocator.relocate(record, scan_limit=4)
    assert moved.found and moved.objects_read == 4  # its own buckets hold no other object
    assert seen and seen[-1].listed == 4 and seen[-1].read < 4
