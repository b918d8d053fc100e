"""The tier keeps the id policy (docs/identity.md, #23): a different message under a waiting id is never lost in
silence, an identical resend is a no-op on every path, no write overwrites a different message, and ``pending``
says what it may count twice. End to end on moto: the sender, the ingest function, the timer."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE, encode_ingest
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.headers import FAILURE_REASON
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.identity import content_digest
from delayed_delivery.timebuckets.wheel import FINE, bucket_of
from tests.aws.tier.timer_support import Recorder

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

START = datetime(2031, 1, 1, tzinfo=UTC)
SETTINGS = DelayedDeliverySettings(error_queue="errors")
SQS = SqsSettings(max_native_delay=2, fifo_queue_delay=2, long_delay_route="buckets", bucket_ingest_queue="ingest")
TIER = TierSettings(bucket_fine_seconds=1, bucket_coarse_seconds=10, bucket_dispatch_lead_seconds=2)
ARN = "arn:aws:sqs:us-east-1:123456789012:ingest"


class Tier:
    """The sender, the ingest step and the timer over one manual clock, on moto."""

    def __init__(self, s3: Any, sqs: SQSClient, bucket: str) -> None:
        self.sqs = sqs
        self.urls = {n: sqs.create_queue(QueueName=n)["QueueUrl"] for n in ("orders", "ingest", "errors")}
        self.clock = ManualClock(START)
        self.store = S3BucketStore(s3, bucket, "dd/buckets", TIER.levels)
        self.sender = SqsDelayedSender(sqs, SETTINGS, sqs_settings=SQS, clock=self.clock)
        self.ingest = BucketIngest(self.store, sqs, SETTINGS, self.clock)
        self.timer = BucketTimer(self.store, sqs, SETTINGS, self.clock, owner="t", lease_seconds=5)
        self.recorder = Recorder(self.clock).attach(sqs)

    def ingest_queue(self) -> Any:
        """One ingest invocation over what waits on the ingest queue (all of it in one batch)."""
        reply = self.sqs.receive_message(
            QueueUrl=self.urls["ingest"], MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        )
        records = [
            {
                "messageId": m["MessageId"],
                "body": m["Body"],
                "messageAttributes": {
                    k: {"dataType": v["DataType"], "stringValue": v["StringValue"]}
                    for k, v in m.get("MessageAttributes", {}).items()
                },
                "eventSourceARN": ARN,
            }
            for m in reply.get("Messages", [])
        ]
        for m in reply.get("Messages", []):
            self.sqs.delete_message(QueueUrl=self.urls["ingest"], ReceiptHandle=m["ReceiptHandle"])
        return self.ingest.process(records)

    def run_for(self, seconds: int) -> list[Any]:
        results = []
        for _ in range(seconds):
            self.clock.advance(1)
            results.append(self.timer.run())
        return results

    def fine_keys(self) -> list[str]:
        return [o.key for o in self.store.objects(FINE)]


def _record(messages: list[BucketMessage], record_id: str) -> dict[str, Any]:
    attributes = {INGEST_ATTRIBUTE: {"dataType": "String", "stringValue": "1"}}
    return {"messageId": record_id, "body": encode_ingest(messages), "messageAttributes": attributes}


def test_a_different_message_under_a_waiting_id_is_never_lost_in_silence(
    s3: Any, sqs: SQSClient, tier_bucket: str
) -> None:
    # #23: SECOND, sent after FIRST was ingested under the same id and due time, overwrote FIRST's object (keys
    # hashed only ids and due times): SECOND was delivered, FIRST was gone, the error queue empty
    tier = Tier(s3, sqs, tier_bucket)
    tier.sender.send_delayed("orders", "FIRST", 5, message_id="x")
    assert tier.ingest_queue().ingested == 1
    tier.clock.advance(1)
    tier.sender.send_delayed("orders", "SECOND", 4, message_id="x")  # the same due time, 1 s later
    assert tier.ingest_queue().ingested == 1
    assert len(tier.fine_keys()) == 2  # two objects: nothing overwrote the first
    results = tier.run_for(8)
    assert [s.body for s in tier.recorder.to("orders")] == ["FIRST"]  # the first sent is kept
    [held] = drain(sqs, tier.urls["errors"])
    assert held["Body"] == "SECOND"
    reason = held["MessageAttributes"][FAILURE_REASON]["StringValue"]
    due = epoch_ms(START + timedelta(seconds=5))
    first = content_digest(BucketMessage("x", "orders", b"FIRST", due))
    second = content_digest(BucketMessage("x", "orders", b"SECOND", due))
    assert f"digest {first}" in reason and f"digest {second}" in reason, reason
    assert sum(r.to_error_queue for r in results) == 1


def test_an_identical_resend_is_a_no_op_in_one_batch_and_across_batches(
    s3: Any, sqs: SQSClient, tier_bucket: str
) -> None:
    # #23: the same message again 1 s later, in one ingest batch, went to the error queue as "another message with
    # id ...": the ingest compared send times and hops, the timer does not
    tier = Tier(s3, sqs, tier_bucket)
    due = epoch_ms(START + timedelta(seconds=4))
    sent = epoch_ms(START - timedelta(seconds=30))
    first = BucketMessage("same", "orders", b"hello", due, {"k": {"DataType": "String", "StringValue": "v"}}, 0, sent)
    again = BucketMessage("same", "orders", b"hello", due, dict(first.attributes), 0, sent + 1_000)
    one_batch = tier.ingest.process([_record([again], "r2"), _record([first], "r1")])
    assert one_batch.poison == () and one_batch.duplicates == 1 and one_batch.ingested == 1
    [key] = tier.fine_keys()
    assert [m.sent_at_ms for m in tier.store.read(key).messages] == [sent]  # the first send is the one kept
    later = tier.ingest.process([_record([again], "r3")])  # and once more, in a batch of its own
    assert later.poison == () and later.ingested == 1
    results = tier.run_for(6)
    assert [s.body for s in tier.recorder.to("orders")] == ["hello"]  # delivered once
    assert drain(sqs, tier.urls["errors"]) == []
    assert sum(r.duplicates_skipped for r in results) == 1 and sum(r.to_error_queue for r in results) == 0


def test_writes_never_overwrite_a_different_message(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    tier = Tier(s3, sqs, tier_bucket)
    due = START + timedelta(seconds=4)
    sent = epoch_ms(START)
    base = BucketMessage("m", "orders", b"a", epoch_ms(due), {}, 0, sent)
    attribute = {"k": {"DataType": "String", "StringValue": "v"}}
    variants = [
        base,
        BucketMessage("m", "orders", b"b", epoch_ms(due), {}, 0, sent),  # body
        BucketMessage("m", "orders", b"a", epoch_ms(due), attribute, 0, sent),  # attributes
        BucketMessage("m", "ordersb", b"a", epoch_ms(due), {}, 0, sent),  # destination
        BucketMessage("m", "orders", b"a", epoch_ms(due), {}, 1, sent),  # hops: the same message, another copy
        BucketMessage("m", "orders", b"a", epoch_ms(due), {}, 0, sent + 1),  # send time: the same, another copy
    ]
    bucket = bucket_of(due, START, tier.store.levels)
    keys = [tier.store.write(bucket, [v]) for v in variants]
    assert len({tuple(k) for k in keys}) == len(variants)  # different bytes, different keys: never an overwrite
    for [key], variant in zip(keys, variants, strict=True):
        assert tier.store.read(key).messages == (variant,)
    assert tier.store.write(bucket, [base]) == keys[0]  # the very same message again: its own key (a retry)
    with pytest.raises(InvalidMessageError, match="two different messages"):
        tier.store.write(bucket, [base, variants[1]])
    [[key]] = [tier.store.write(bucket, [variants[5], base])]  # one message twice: the first sent kept
    assert tier.store.read(key).messages == (base,) and key == keys[0][0]


def test_pending_says_it_may_count_a_copy_twice(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    from delayed_delivery.aws.tier.operations import TierOperations

    tier = Tier(s3, sqs, tier_bucket)
    due = epoch_ms(START + timedelta(seconds=4))
    first = BucketMessage("same", "orders", b"hello", due, {}, 0, epoch_ms(START))
    tier.ingest.process([_record([first], "r1")])
    tier.ingest.process([_record([BucketMessage("same", "orders", b"hello", due, {}, 0, epoch_ms(START) + 1)], "r2")])
    census = TierOperations(tier.store, sqs, None, SETTINGS, clock=tier.clock).census()  # type: ignore[arg-type]
    assert census.messages == 2  # the same message twice, in two objects, until the timer keeps one
    assert "copies" in census.counts and "counted once per copy" in census.counts
    assert json.loads(json.dumps(census.as_dict()))["counts"] == census.counts
