"""The timer when things go wrong: poison lines, damaged objects, throttled sends, a crash before the delete, leases."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.sqs import EntryResult
from delayed_delivery.aws.tier import timer_sqs
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.lease import BucketLeases
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import TransientError
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.format import encode_bucket
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, bucket_of
from tests.aws.tier.timer_support import (
    PREFIX,
    START,
    Recorder,
    make_store,
    make_timer,
    message,
    queue_url,
    run_for,
    total,
)

REASON = "DelayedDelivery.FailureReason"


@pytest.fixture
def queues(sqs: Any) -> dict[str, str]:
    return {name: queue_url(sqs, name) for name in ("orders", "payments", "errors")}


def test_a_poison_line_and_a_damaged_object_reach_the_error_queue(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, queues: dict[str, str]
) -> None:
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    good = message(1, START + timedelta(seconds=2))
    bucket = bucket_of(good.due_at, START, store.levels)
    lines = gzip.decompress(encode_bucket(bucket, [good], store.levels)).decode().splitlines()
    header = {**json.loads(lines[0]), "count": 2}
    poison = json.dumps({"id": "bad-1", "destination": "orders", "body": "!!not base64"})
    data = gzip.compress("\n".join([json.dumps(header), lines[1], poison, ""]).encode(), mtime=0)
    s3.put_object(Bucket=tier_bucket, Key=f"{PREFIX}/fine/{bucket.iso}/{'a' * 64}-2.jsonl.gz", Body=data)
    damaged = f"{PREFIX}/fine/{bucket.iso}/{'b' * 64}-1.jsonl.gz"
    s3.put_object(Bucket=tier_bucket, Key=damaged, Body=b"not gzip at all")
    results = run_for(make_timer(store, sqs, tier_settings, clock), clock, 2)
    assert [s.message_id for s in recorder.to("orders")] == ["m-1"]
    assert total(results, "to_error_queue") == 2
    notices = {
        m["MessageAttributes"][REASON]["StringValue"]: json.loads(m["Body"]) for m in drain(sqs, queues["errors"])
    }
    [(line_reason, lines)] = [(r, b) for r, b in notices.items() if "line 2" in r]
    [line] = lines["lines"]
    assert line["id"] == "bad-1" and "missing" in line["reason"] and line["line"] == 2
    assert line_reason.startswith("1 line(s) of ") and "(first: line 2: " in line_reason
    [(object_reason, whole)] = [(r, b) for r, b in notices.items() if "damaged" in r]
    assert whole["object"] == damaged and "not a gzip object" in object_reason
    kept = s3.get_object(Bucket=tier_bucket, Key=whole["copy"])["Body"].read()
    assert kept == b"not gzip at all" and whole["copy"].startswith(f"{PREFIX}/problems/fine/")
    assert list(store.objects(FINE)) == []  # nothing left to read again


def _throttle(destination: str) -> Any:
    real = timer_sqs.send_batches

    def send(client: Any, url: str, entries: Sequence[Any], **kwargs: Any) -> dict[str, EntryResult]:
        if url.endswith("/" + destination):
            return {e["Id"]: EntryResult(e["Id"], error=TransientError("throttled")) for e in entries}
        return real(client, url, entries, **kwargs)

    return send


def test_a_throttled_destination_is_written_back_and_sent_by_a_later_run(
    s3: Any,
    sqs: Any,
    tier_bucket: str,
    tier_settings: TierSettings,
    queues: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    due = START + timedelta(seconds=2)
    batch = [message(1, due), message(2, due, destination="payments"), message(3, due, destination="payments")]
    [original] = store.write_due(batch, START)[bucket_of(due, START, store.levels)]
    timer = make_timer(store, sqs, tier_settings, clock)
    monkeypatch.setattr(timer_sqs, "send_batches", _throttle("payments"))
    clock.advance(1)
    first = timer.run()
    assert (first.dispatched, first.kept_for_retry) == (1, 2)
    keys = [o.key for o in store.objects(FINE)]
    assert original not in keys and len(keys) == 1 and keys[0].endswith("-2.jsonl.gz")  # the rest, rewritten
    again = timer.run()
    assert again.kept_for_retry == 2 and [o.key for o in store.objects(FINE)] == keys  # same rest: same key, kept
    monkeypatch.undo()
    clock.advance(1)
    assert timer.run().dispatched == 2
    assert sorted(s.message_id or "" for s in recorder.sent) == ["m-1", "m-2", "m-3"]
    assert list(store.objects(FINE)) == []


def test_a_crash_between_the_send_and_the_delete_duplicates_never_loses(
    s3: Any,
    sqs: Any,
    tier_bucket: str,
    tier_settings: TierSettings,
    queues: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    batch = [message(n, START + timedelta(seconds=2)) for n in range(5)]
    store.write_due(batch, START)
    real_delete = store.delete

    def crash(keys: Sequence[str]) -> None:
        raise TransientError("the function died before the delete")

    monkeypatch.setattr(store, "delete", crash)
    timer = make_timer(store, sqs, tier_settings, clock)
    clock.advance(1)
    crashed = timer.run()
    assert crashed.buckets_failed == 1 and len(recorder.sent) == 5
    monkeypatch.setattr(store, "delete", real_delete)
    clock.advance(1)
    assert timer.run().dispatched == 5  # sent again: a duplicate for the consumer, nothing lost
    assert sorted(s.message_id or "" for s in recorder.sent) == sorted([m.message_id for m in batch] * 2)
    assert list(store.objects(FINE)) == []
    assert len(drain(sqs, queues["orders"], expect=10)) == 10


def test_a_bucket_leased_by_another_timer_is_skipped_until_its_lease_expires(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, queues: dict[str, str]
) -> None:
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    due = START + timedelta(seconds=2)
    store.write_due([message(1, due)], START)
    other = BucketLeases(store, clock, "crashed-timer", seconds=5)
    assert other.acquire(BucketKey(FINE, due)) is not None
    timer = make_timer(store, sqs, tier_settings, clock)
    results = run_for(timer, clock, 4)
    assert total(results, "buckets_skipped_leased") == 4 and recorder.sent == []
    clock.advance(2)  # the crashed holder's lease has expired
    taken = timer.run()
    assert taken.dispatched == 1 and taken.oldest_overdue_seconds > 0


def test_no_bucket_is_started_when_the_deadline_is_near(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, queues: dict[str, str]
) -> None:
    clock = ManualClock(START)
    store = make_store(s3, tier_bucket, tier_settings)
    store.write_due([message(1, START + timedelta(seconds=1)), message(2, START + timedelta(seconds=30))], START)
    clock.advance(25)
    timer = make_timer(store, sqs, tier_settings, clock)
    stopped = timer.run(deadline=time.monotonic() + 5)  # within the 10 s margin
    assert stopped.buckets_left_for_deadline == 2 and stopped.dispatched == 0 and stopped.cascaded_objects == 0
    done = timer.run(deadline=time.monotonic() + 60)
    assert done.dispatched == 1 and done.cascaded_objects == 1


def test_without_an_error_queue_nothing_is_lost(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")  # no error queue
    store = make_store(s3, tier_bucket, tier_settings)
    due = START + timedelta(seconds=2)
    stray = message(1, due, destination="nowhere")
    store.write_due([stray], START)
    bucket = bucket_of(due, START, store.levels)
    poison = f"{PREFIX}/fine/{bucket.iso}/{'c' * 64}-1.jsonl.gz"
    header = json.dumps({"v": 1, "level": "fine", "bucket": bucket.iso, "count": 1})
    s3.put_object(Bucket=tier_bucket, Key=poison, Body=gzip.compress(f'{header}\n{{"id":"p-1"}}\n'.encode(), mtime=0))
    timer = make_timer(store, sqs, tier_settings, clock)
    clock.advance(1)
    result = timer.run()
    assert result.kept_for_retry == 1 and result.to_error_queue == 0
    [kept] = [o for o in store.objects(FINE)]
    assert [m.message_id for m in store.read(kept.key).messages] == ["m-1"]  # the message, written back
    copy = f"{PREFIX}/problems/fine/{bucket.iso}/{'c' * 64}-1.jsonl.gz"
    assert b'"id":"p-1"' in gzip.decompress(s3.get_object(Bucket=tier_bucket, Key=copy)["Body"].read())
    errors = queue_url(sqs, "errors")  # the error queue is back: the message goes there
    clock.advance(1)
    assert timer.run().to_error_queue == 1
    assert drain(sqs, errors)[0]["Body"] == "body-1"
    assert list(store.objects(FINE)) == []


def test_a_message_in_a_bucket_it_is_not_due_in_is_moved_not_sent_early(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, queues: dict[str, str]
) -> None:
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    far = message(1, START + timedelta(seconds=2_000))  # beyond SQS's 900 s from its bucket
    bucket = BucketKey(FINE, START + timedelta(seconds=1))
    lines = gzip.decompress(encode_bucket(bucket, [message(1, bucket.start)], store.levels)).decode()
    wrong = lines.replace(str(message(1, bucket.start).due_at_ms), str(far.due_at_ms))
    s3.put_object(
        Bucket=tier_bucket, Key=f"{PREFIX}/fine/{bucket.iso}/{'d' * 64}-1.jsonl.gz", Body=gzip.compress(wrong.encode())
    )
    timer = make_timer(store, sqs, tier_settings, clock)
    clock.advance(1)
    moved = timer.run()
    assert moved.kept_for_retry == 1 and moved.buckets_failed == 0 and recorder.sent == []
    [stored] = list(store.objects(COARSE))
    assert stored.bucket == bucket_of(far.due_at, clock.now(), store.levels)
    run_for(timer, clock, 2_010, step=5)
    [sent] = recorder.sent
    assert sent.arrives >= far.due_at and sent.message_id == "m-1"
