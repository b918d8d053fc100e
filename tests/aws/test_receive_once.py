"""Every SQS route writes the delivery header (#23; the tier: tests/aws/tier/test_receive_once.py).

A re-sent copy has a new SQS MessageId but the same delayed id, so a consumer using the receive helper and ``once``
acts once per id. Ten user attributes are refused at send time on every route (the header needs the tenth slot);
before #23 the native and tier routes left the header out, the helper fell back to the SQS MessageId and each
re-sent copy ran the effect again."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.receive import delivered_from_boto3
from delayed_delivery.aws.requeue import FifoRequeuer
from delayed_delivery.aws.requeue.records import HopOutcome
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.delivery import DELIVERY_HEADER
from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.idempotency import InMemoryProcessedLog, once
from delayed_delivery.planning import SqsRoute
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import RequestCounter, lambda_sqs_record

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

TEN = {f"a{i}": f"v{i}" for i in range(10)}
NINE = {f"a{i}": f"v{i}" for i in range(9)}


class Consumer:
    """A consumer that reads with the receive helper and acts through ``once``: counts its effects per id."""

    def __init__(self) -> None:
        self.log = InMemoryProcessedLog()
        self.effects: Counter[str] = Counter()
        self.seen: list[str] = []

    def consume(self, messages: Sequence[dict[str, Any]]) -> None:
        for message in messages:
            delivered = delivered_from_boto3(message, destination="orders")
            assert len(delivered.headers) == 9 and DELIVERY_HEADER in message["MessageAttributes"]
            self.seen.append(message["MessageId"])
            once(self.log, delivered, lambda d=delivered: self.effects.update([d.message_id]))


def receive(sqs: SQSClient, url: str, expect: int, timeout: float = 20) -> list[dict[str, Any]]:
    """Receive (and delete) until ``expect`` messages came, then one more empty poll (nothing else may come)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        )
        for m in reply.get("Messages", []):
            got.append(dict(m))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if len(got) >= expect and not reply.get("Messages"):
            break
    return got


def refused_before_sending(sqs: SQSClient, sender: SqsDelayedSender, delay: float) -> None:
    counter = RequestCounter().attach(sqs)
    with pytest.raises(InvalidMessageError, match=r"at most 9 fit.*delivery header") as refused:
        sender.send_delayed("orders", "ten", delay, attributes=TEN, message_id="ten-1")
    assert "DelayedDelivery.Delivery" in str(refused.value) and "docs/receiving.md" in str(refused.value)
    assert counter.requests.get("SendMessage", 0) == counter.requests.get("SendMessageBatch", 0) == 0


def test_native_route_refuses_a_tenth_attribute_and_a_resend_acts_once(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    refused_before_sending(sqs, sender, 0)
    first = sender.send_delayed("orders", "native", 0, attributes=NINE, message_id="n-1")
    again = sender.send_delayed("orders", "native", 0, attributes=NINE, message_id="n-1")  # a producer's retry
    assert first.route is SqsRoute.NATIVE and first.sqs_message_id != again.sqs_message_id
    consumer = Consumer()
    consumer.consume(receive(sqs, endpoint.input_url, expect=2))
    assert len(consumer.seen) == 2 and consumer.effects == Counter({"n-1": 1})


def test_fifo_route_refuses_a_tenth_attribute_and_a_repeated_forward_acts_once(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    refused_before_sending(sqs, sender, 3)
    receipt = sender.send_delayed("orders", "long", 3, attributes=NINE, message_id="f-1")
    assert receipt.route is SqsRoute.FIFO
    # The delay queue holds it 2 s (its DelaySeconds): first received then, 1 s or less is left: it is forwarded.
    [record] = [
        lambda_sqs_record(m, endpoint.delay_arn, "us-east-1") for m in receive(sqs, endpoint.delay_url, expect=1)
    ]
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings.with_(max_park_seconds=0))
    forwarded = requeuer.process([record]) + requeuer.process([record])  # it died before its delete: again
    assert [r.outcome for r in forwarded] == [HopOutcome.FORWARDED] * 2
    consumer = Consumer()
    consumer.consume(receive(sqs, endpoint.input_url, expect=2))
    assert len(consumer.seen) == 2 and consumer.effects == Counter({"f-1": 1})
