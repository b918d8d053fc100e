"""The copy-this consumer (functions/aws/consumer.py): a message sent with a delay, received from its queue and
handed to the Lambda handler as an event, gives one ``consumed`` line with its lateness and the EMF metric."""

from __future__ import annotations

import importlib
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

import functions.aws.consumer as consumer
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.testing.aws import LocalLambdaContext, lambda_sqs_record

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Any:
    # A fresh service name per test: Powertools binds its logger to the stdout of the moment (capsys).
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"consumer-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "DelayedDeliveryTest")
    consumer._tools.cache_clear()
    yield consumer
    consumer._tools.cache_clear()


def test_import_builds_nothing() -> None:
    module = importlib.reload(consumer)
    assert module._tools.cache_info().currsize == 0


def test_a_delivered_message_is_logged_with_its_lateness_and_measured(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    fresh: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sent = sender.send_delayed("orders", "hello", 1, message_id="order-17")
    messages: list[Any] = []
    deadline = time.monotonic() + 10
    while not messages and time.monotonic() < deadline:
        messages = sqs.receive_message(
            QueueUrl=endpoint.input_url,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
    assert len(messages) == 1, sent
    arn = endpoint.delay_arn.replace("-delay.fifo", "")
    event = {"Records": [lambda_sqs_record(messages[0], arn, "us-east-1")]}
    capsys.readouterr()
    assert fresh.handler(event, LocalLambdaContext()) == {"batchItemFailures": []}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    [consumed] = [line for line in lines if line.get("event") == "consumed"]
    assert consumed["message_id"] == "order-17"
    assert 0 <= consumed["consumer_lateness_s"] < 10
    emf = next(line for line in lines if "_aws" in line and "ConsumerLateness" in line)
    assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "DelayedDeliveryTest"
    assert emf["ConsumerLateness"] == [pytest.approx(consumed["consumer_lateness_s"], abs=0.01)]
