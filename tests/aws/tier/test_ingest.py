"""BucketIngest on moto: one object per bucket per invocation, same keys on a retry, poison to the error queue."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE, encode_ingest
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.headers import FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import lambda_sqs_record
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import COARSE, FINE, bucket_of

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

NOW = datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)
#: Real bucket sizes (fine: a minute, coarse: a day): 3 h is fine, 40 d and 2 y are coarse.
SETTINGS = DelayedDeliverySettings(error_queue="errors")
ROUTING = SqsSettings(long_delay_route="buckets", bucket_ingest_queue="ingest")
ARN = "arn:aws:sqs:us-east-1:123456789012:ingest"


def _queues(sqs: SQSClient) -> dict[str, str]:
    return {n: sqs.create_queue(QueueName=n)["QueueUrl"] for n in ("orders", "payments", "ingest", "errors")}


def _receive_all(sqs: SQSClient, url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
        )
        if not reply.get("Messages"):
            return found
        found += reply["Messages"]
        for m in reply["Messages"]:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def _records(sqs: SQSClient, url: str) -> list[dict[str, Any]]:
    return [lambda_sqs_record(m, ARN, "us-east-1") for m in _receive_all(sqs, url)]


def _record(body: str, record_id: str, *, marker: str | None = "1") -> dict[str, Any]:
    attributes = {} if marker is None else {INGEST_ATTRIBUTE: {"dataType": "String", "stringValue": marker}}
    return {"messageId": record_id, "body": body, "messageAttributes": attributes, "eventSourceARN": ARN}


def _keys(s3: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def _send_mixed(sqs: SQSClient) -> list[DelayedSend]:
    """40 messages to two destinations, 40 d / 2 y / 3 h, in four sends (four ingest records or more)."""
    sender = SqsDelayedSender(sqs, SETTINGS, sqs_settings=ROUTING, clock=ManualClock(NOW))
    delays = ["40d", "2y", "3h"]
    batch = [
        DelayedSend(("orders", "payments")[n % 2], f"body {n}", delays[n % 3], {"n": n}, f"m{n:02}") for n in range(40)
    ]
    for start in range(0, 40, 10):
        sender.send_delayed_batch(batch[start : start + 10]).raise_for_failures()
    return batch


def _ingest(s3: Any, sqs: SQSClient, bucket: str, now: datetime = NOW) -> BucketIngest:
    return BucketIngest(S3BucketStore(s3, bucket, levels=None), sqs, SETTINGS, ManualClock(now))


TWO_YEARS_S = 2 * 36_525 * 864  # "2y": a year is 365.25 days


def test_all_entries_of_an_invocation_go_to_one_object_per_bucket(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    urls = _queues(sqs)
    batch = _send_mixed(sqs)
    records = _records(sqs, urls["ingest"])
    assert len(records) == 4
    result = _ingest(s3, sqs, tier_bucket).process(records)
    assert (result.records, result.ingested, result.duplicates, result.failures, result.poison) == (4, 40, 0, {}, ())
    expected = {bucket_of(NOW + timedelta(seconds=s), NOW) for s in (40 * 86_400, TWO_YEARS_S, 3 * 3_600)}
    assert set(result.written) == expected and result.objects_written == 3
    assert {b.level for b in result.written} == {COARSE, FINE}
    store = S3BucketStore(s3, tier_bucket)
    counts = {o.bucket: o.count for level in (FINE, COARSE) for o in store.objects(level)}
    assert counts == {
        bucket_of(NOW + timedelta(seconds=s), NOW): c for s, c in ((3_456_000, 14), (TWO_YEARS_S, 13), (10_800, 13))
    }
    read = [m for keys in result.written.values() for k in keys for m in store.read(k).messages]
    assert sorted(m.message_id for m in read) == [m.message_id for m in batch]
    one = next(m for m in read if m.message_id == "m01")
    assert (one.destination, one.body, one.sent_at_ms) == ("payments", b"body 1", epoch_ms(NOW))
    assert one.due_at_ms == epoch_ms(NOW) + TWO_YEARS_S * 1_000
    assert dict(one.attributes) == {"n": {"DataType": "Number", "StringValue": "1"}}


def test_a_redelivered_batch_writes_the_same_keys(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    urls = _queues(sqs)
    _send_mixed(sqs)
    records = _records(sqs, urls["ingest"])
    first = _ingest(s3, sqs, tier_bucket).process(records)
    keys = _keys(s3, tier_bucket)
    again = _ingest(s3, sqs, tier_bucket, NOW + timedelta(seconds=20)).process(list(reversed(records)))
    assert again.written == first.written and _keys(s3, tier_bucket) == keys and len(keys) == 3
    doubled = _ingest(s3, sqs, tier_bucket).process(records + records[:2])
    assert doubled.duplicates == 20 and doubled.ingested == 40 and _keys(s3, tier_bucket) == keys


def test_crafted_records_go_to_the_error_queue_and_neighbours_are_written_once(
    s3: Any, sqs: SQSClient, tier_bucket: str
) -> None:
    urls = _queues(sqs)
    due = epoch_ms(NOW) + 3_600_000
    good = {"i": "good-1", "q": "orders", "b": "ok", "d": due}
    mixed = json.dumps({"v": 1, "m": [good, {**good, "i": "bad-1", "d": "soon"}, {**good, "i": "good-2"}]})
    records = [
        _record(mixed, "r-mixed"),
        _record(encode_ingest([BucketMessage("good-3", "orders", b"fine", due)]), "r-unmarked", marker=None),
        _record("{not json", "r-broken"),
        _record(encode_ingest([BucketMessage("good-4", "orders", b"v2?", due)]), "r-v2", marker="2"),
        _record(
            json.dumps({"v": 1, "m": [{**good, "i": "evil", "a": {"DelayedDelivery.Ingest": ["String", "s", "1"]}}]}),
            "r-evil",
        ),
        _record(json.dumps({"v": 1, "m": [{**good, "i": "surrogate", "b": "\ud800"}]}), "r-surrogate"),
    ]
    result = _ingest(s3, sqs, tier_bucket).process(records)
    assert result.failures == {} and result.ingested == 2 and result.objects_written == 1
    [key] = _keys(s3, tier_bucket)
    assert sorted(m.message_id for m in S3BucketStore(s3, tier_bucket).read(key).messages) == ["good-1", "good-2"]
    assert all(p.sent for p in result.poison) and len(result.poison) == 6
    errors = _receive_all(sqs, urls["errors"])
    reasons = {m["MessageAttributes"][FAILURE_REASON]["StringValue"]: m for m in errors}
    assert len(reasons) == 6
    bad = next(m for r, m in reasons.items() if r.startswith("bad-1: "))
    assert "due time" in bad["MessageAttributes"][FAILURE_REASON]["StringValue"] and bad["Body"] == "ok"
    assert bad["MessageAttributes"][ORIGINAL_DESTINATION]["StringValue"] == "orders"
    assert FAILED_AT in bad["MessageAttributes"]
    assert sum("not an ingest envelope" in r for r in reasons) == 2
    assert any("malformed ingest envelope" in r for r in reasons)
    assert any(r.startswith("evil: ") and "reserved" in r for r in reasons)
    assert any(r.startswith("surrogate: ") and "\\ud800" in reasons[r]["Body"] for r in reasons)
    assert _ingest(s3, sqs, tier_bucket).process(records[:1]).written == result.written  # written once


def test_messages_already_due_go_to_a_fine_bucket(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    _queues(sqs)
    past = BucketMessage("late", "orders", b"x", epoch_ms(NOW) - 3_600_000)
    result = _ingest(s3, sqs, tier_bucket).process([_record(encode_ingest([past]), "r1")])
    [bucket] = result.written
    assert bucket.level == FINE and bucket.start == NOW - timedelta(hours=1, seconds=6)


def test_a_failed_write_fails_only_the_records_holding_its_entries(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    urls = _queues(sqs)
    near = BucketMessage("near", "orders", b"x", epoch_ms(NOW) + 60_000)
    far = BucketMessage("far", "orders", b"y", epoch_ms(NOW) + 40 * 86_400_000)
    bad = json.dumps({"v": 1, "m": [{"i": "far-bad", "q": "orders.fifo", "b": "z", "d": 1}]})
    records = [
        _record(encode_ingest([near]), "r-near"),
        _record(encode_ingest([far, near]), "r-both"),
        _record(bad, "r-poison"),
    ]
    ingest = _ingest(s3, sqs, tier_bucket)
    real_write = ingest.store.write

    def failing_write(bucket: Any, messages: Any) -> list[str]:
        if bucket.level == COARSE:
            from delayed_delivery.errors import TransientError

            raise TransientError("SlowDown")
        return real_write(bucket, messages)

    ingest.store.write = failing_write  # type: ignore[method-assign]
    result = ingest.process(records)
    assert list(result.failures) == ["r-both"] and "SlowDown" in result.failures["r-both"]
    assert [b.level for b in result.written] == [FINE] and result.ingested == 1
    assert result.batch_item_failures() == [{"itemIdentifier": "r-both"}]
    assert [p.sent for p in result.poison] == [True] and len(_receive_all(sqs, urls["errors"])) == 1


def test_a_missing_error_queue_fails_the_poisoned_records_only(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    sqs.create_queue(QueueName="orders")
    due = epoch_ms(NOW) + 60_000
    records = [
        _record(encode_ingest([BucketMessage("ok", "orders", b"x", due)]), "r-ok"),
        _record("[]", "r-poison"),
    ]
    result = _ingest(s3, sqs, tier_bucket).process(records)
    assert list(result.failures) == ["r-poison"] and "errors" in result.failures["r-poison"]
    assert result.ingested == 1 and [p.sent for p in result.poison] == [False]


def test_two_messages_under_one_id_in_one_bucket_send_the_second_to_the_error_queue(
    s3: Any, sqs: SQSClient, tier_bucket: str
) -> None:
    urls = _queues(sqs)
    due = epoch_ms(NOW) + 60_000
    first = BucketMessage("same", "orders", b"first", due)
    second = BucketMessage("same", "orders", b"second", due)  # the same due time: another due time is another message
    result = _ingest(s3, sqs, tier_bucket).process(
        [_record(encode_ingest([first]), "r1"), _record(encode_ingest([second]), "r2")]
    )
    assert result.ingested == 1 and result.failures == {}
    [poison] = result.poison
    assert (poison.record_id, poison.message_id, poison.sent) == ("r2", "same", True)
    [error] = _receive_all(sqs, urls["errors"])
    assert (
        error["Body"] == "second"
        and "another message with id 'same'" in error["MessageAttributes"][FAILURE_REASON]["StringValue"]
    )


def test_a_big_unreadable_record_reaches_the_error_queue_cut_to_fit(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    urls = _queues(sqs)
    result = _ingest(s3, sqs, tier_bucket).process([_record("x" * 300_000, "r-big")])
    assert result.failures == {} and result.poison[0].sent
    [error] = _receive_all(sqs, urls["errors"])
    assert len(error["Body"]) == 204_800 and "cut" in error["MessageAttributes"][FAILURE_REASON]["StringValue"]
