"""The tier writes the delivery header on every message it dispatches (#23): a bucket sent again after a crash
reaches the consumer as two SQS messages with one delayed id, and ``once`` acts once. Before #23 a message with ten
user attributes was accepted, the timer left the header out and the copy ran the effect again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.receive import delivered_from_boto3
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import TransientError
from delayed_delivery.planning import SqsRoute
from delayed_delivery.testing.aws import lambda_sqs_record
from delayed_delivery.timebuckets.format import BucketMessage
from tests.aws.test_receive_once import NINE, TEN, Consumer, receive, refused_before_sending
from tests.aws.tier.timer_support import SETTINGS, START, Recorder, make_store, make_timer

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


def test_tier_route_refuses_a_tenth_attribute_and_a_dispatch_repeated_after_a_crash_acts_once(
    s3: Any,
    sqs: SQSClient,
    tier_bucket: str,
    sqs_settings: SqsSettings,
    tier_settings: TierSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    urls = {name: sqs.create_queue(QueueName=name)["QueueUrl"] for name in ("orders", "ingest", "errors")}
    clock = ManualClock(START)
    sender = SqsDelayedSender(sqs, SETTINGS, sqs_settings=sqs_settings, clock=clock)
    refused_before_sending(sqs, sender, 5)
    receipt = sender.send_delayed("orders", "tiered", 5, attributes=NINE, message_id="t-1")
    assert receipt.route is SqsRoute.BUCKETS
    records = [
        lambda_sqs_record(m, "arn:aws:sqs:us-east-1:1:ingest", "us-east-1") for m in receive(sqs, urls["ingest"], 1)
    ]
    store = make_store(s3, tier_bucket, tier_settings)
    assert BucketIngest(store, sqs, SETTINGS, clock).process(records).ingested == 1
    real_delete = store.delete

    def crash(keys: Sequence[str]) -> None:
        raise TransientError("the function died after its send, before the delete")

    monkeypatch.setattr(store, "delete", crash)
    timer = make_timer(store, sqs, tier_settings, clock)
    recorder = Recorder(clock).attach(sqs)
    for _ in range(10):  # the tier's documented duplicate: the bucket is sent again by the next run
        clock.advance(1)
        timer.run()
        if recorder.to("orders"):
            monkeypatch.setattr(store, "delete", real_delete)
    assert [s.message_id for s in recorder.to("orders")] == ["t-1", "t-1"]  # read from the header sent
    consumer = Consumer()
    consumer.consume(receive(sqs, urls["orders"], expect=2))
    assert len(consumer.seen) == 2 and consumer.effects == Counter({"t-1": 1})


def test_a_tier_message_written_with_ten_attributes_before_the_change_is_still_delivered(
    s3: Any, sqs: SQSClient, tier_bucket: str, tier_settings: TierSettings
) -> None:
    """Old objects stay readable: delivered with their ten attributes, without the header (the helper then uses
    the SQS MessageId, as docs/receiving.md says)."""
    url = sqs.create_queue(QueueName="orders")["QueueUrl"]
    sqs.create_queue(QueueName="errors")
    store = make_store(s3, tier_bucket, tier_settings)
    attributes = {name: {"DataType": "String", "StringValue": value} for name, value in TEN.items()}
    due = START + timedelta(seconds=2)
    store.write_due([BucketMessage("old-1", "orders", b"old", int(due.timestamp() * 1000), attributes)], START)
    clock = ManualClock(START)
    timer = make_timer(store, sqs, tier_settings, clock)
    dispatched = 0
    for _ in range(5):
        clock.advance(1)
        dispatched += timer.run().dispatched
    assert dispatched == 1
    [message] = receive(sqs, url, expect=1)
    assert message["MessageAttributes"] == attributes
    assert delivered_from_boto3(message).message_id == message["MessageId"]
