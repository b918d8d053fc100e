"""The copy-this consumer (functions/aws/consumer.py): a message sent with a delay, received from its queue and
handed to the Lambda handler as an event, gives one ``consumed`` line with its lateness and the EMF metric; with an
idempotency table, the same message delivered again is not processed again."""

from __future__ import annotations

import importlib
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import boto3
import pytest

import functions.aws.consumer as consumer
from delayed_delivery.aws.idempotency import ensure_idempotency_table
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.testing.aws import LocalLambdaContext, lambda_sqs_record
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Any:
    # A fresh service name per test: Powertools binds its logger to the stdout of the moment (capsys).
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"consumer-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "DelayedDeliveryTest")
    monkeypatch.delenv("IDEMPOTENCY_TABLE", raising=False)
    consumer._tools.cache_clear()
    yield consumer
    consumer._tools.cache_clear()


def test_import_builds_nothing() -> None:
    module = importlib.reload(consumer)
    assert module._tools.cache_info().currsize == 0


def _event(sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender) -> dict[str, Any]:
    """Send ``order-17`` with a 1 s delay, receive it from ``orders`` and shape it as Lambda would."""
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
    return {"Records": [lambda_sqs_record(messages[0], arn, REGION)]}


def test_a_delivered_message_is_logged_with_its_lateness_and_measured(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    fresh: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    event = _event(sqs, endpoint, sender)
    capsys.readouterr()
    assert fresh.handler(event, LocalLambdaContext()) == {"batchItemFailures": []}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    [consumed] = [line for line in lines if line.get("event") == "consumed"]
    assert consumed["message_id"] == "order-17"
    assert 0 <= consumed["consumer_lateness_s"] < 10
    emf = next(line for line in lines if "_aws" in line and "ConsumerLateness" in line)
    assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "DelayedDeliveryTest"
    assert emf["ConsumerLateness"] == [pytest.approx(consumed["consumer_lateness_s"], abs=0.01)]


def test_with_an_idempotency_table_a_duplicate_is_not_processed_again(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    fresh: Any,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    table = f"processed-{uuid.uuid4().hex[:8]}"
    ensure_idempotency_table(dynamodb, table)
    monkeypatch.setenv("IDEMPOTENCY_TABLE", table)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_endpoint)
    event = _event(sqs, endpoint, sender)
    capsys.readouterr()
    for _ in range(3):  # the same record delivered three times (at-least-once)
        assert fresh.handler(event, LocalLambdaContext()) == {"batchItemFailures": []}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [line["message_id"] for line in lines if line.get("event") == "consumed"] == ["order-17"] * 3
    assert [line["message_id"] for line in lines if line.get("event") == "processed"] == ["order-17"]
