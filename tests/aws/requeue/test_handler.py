"""The Lambda handler itself: lazy wiring from the environment, Powertools logs and EMF metrics, partial batches."""

from __future__ import annotations

import importlib
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

import functions.aws.requeue as requeue
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.errors import ConfigurationError, DelayedDeliveryDisabledError
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext, lambda_sqs_record
from delayed_delivery.testing.aws.sqs import fifo_record, sqs_event
from tests.aws.conftest import handler_env

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


def _event(sqs: SQSClient, endpoint: EndpointQueues, expect: int) -> dict[str, Any]:
    """Wait for ``expect`` records on the FIFO queue and shape them as Lambda would."""
    messages: list[Any] = []
    deadline = time.monotonic() + 10
    while len(messages) < expect and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=endpoint.delay_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages += reply.get("Messages", [])
    assert len(messages) == expect
    return sqs_event([lambda_sqs_record(m, endpoint.delay_arn, "us-east-1") for m in messages])


@pytest.fixture
def env(
    monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> dict[str, str]:
    values = {
        **handler_env(settings, sqs_settings),
        "AWS_ENDPOINT_URL_SQS": moto_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        # A fresh service name per test: Powertools binds its logger to the stdout of the moment (capsys).
        "POWERTOOLS_SERVICE_NAME": f"requeue-{uuid.uuid4().hex[:8]}",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    requeue.reset()
    yield values
    requeue.reset()


def test_import_reads_no_environment_and_creates_no_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("client created at import time")

    monkeypatch.setattr(boto3, "client", refuse)
    monkeypatch.setenv("DELAYED_DELIVERY_MAX_NATIVE_DELAY", "not a number")  # would fail if read at import
    module = importlib.reload(requeue)
    assert not module.handler.built


def test_handler_wires_itself_from_the_environment_logs_and_emits_metrics(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    sender.send_delayed("orders", "a", 5, message_id="req-1")
    sender.send_delayed("orders", "b", 3, message_id="fwd-1")
    event = _event(sqs, endpoint, 2)
    capsys.readouterr()
    response = requeue.handler(event, LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    logs = {line["message_id"]: line for line in lines if "message_id" in line}
    assert logs["req-1"]["event"] == "requeued" and logs["req-1"]["correlation_id"] == "req-1"
    assert logs["req-1"]["hop"] == 1 and logs["req-1"]["remaining_delay_s"] == 3
    assert logs["fwd-1"]["event"] == "forwarded" and logs["fwd-1"]["destination"] == "orders"
    metrics = next(line for line in lines if "_aws" in line and "Hops" in line)
    assert metrics["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "DelayedDeliveryTest"
    assert metrics["Requeued"] == [1.0] and metrics["Forwarded"] == [1.0] and metrics["Hops"] == [1.0, 1.0]
    assert sorted(metrics["RemainingDelay"]) == [1.0, 3.0]


def test_unreachable_error_queue_reports_only_that_record_as_failed(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_ERROR_QUEUE", "no-such-error-queue")
    sender.send_delayed("orders", "fine", 3, message_id="fine")
    sqs.send_message(QueueUrl=endpoint.delay_url, MessageBody="poison", MessageGroupId="p", MessageDeduplicationId="p")
    event = _event(sqs, endpoint, 2)
    poison_id = next(r["messageId"] for r in event["Records"] if r["body"] == "poison")
    response = requeue.handler(event, LocalLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": poison_id}]}


def test_disabled_receiver_fails_the_invocation_and_keeps_the_records(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_ENABLED", "false")
    sender.send_delayed("orders", "x", 5)
    event = _event(sqs, endpoint, 1)
    with pytest.raises(DelayedDeliveryDisabledError):
        requeue.handler(event, LocalLambdaContext())


def test_a_mapping_on_a_queue_that_is_not_a_delay_queue_is_refused(env: dict[str, str]) -> None:
    arn = "arn:aws:sqs:us-east-1:123456789012:payments"
    record = fifo_record("x", arn=arn, message_id="1", attributes={DELAY_SECONDS_ATTRIBUTE: ("Number", "5")})
    with pytest.raises(ConfigurationError, match=r"-delay\.fifo"):
        requeue.handler(sqs_event([record]), LocalLambdaContext())


def test_concurrent_invocations_of_one_handler_keep_their_batches_apart(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The local pollers may call one handler from several threads; batch state must not be shared."""
    from concurrent.futures import ThreadPoolExecutor

    from aws_lambda_powertools import Logger

    from delayed_delivery.aws.requeue.handler import build_handler
    from delayed_delivery.aws.sender import DelayedSend

    info = Logger.info

    def slow_info(self: Logger, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.002)  # widen the window in which two invocations overlap
        info(self, *args, **kwargs)

    monkeypatch.setattr(Logger, "info", slow_info)

    unpacked = SqsDelayedSender(
        sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0)
    )  # 20 records, not one envelope
    assert unpacked.send_delayed_batch([DelayedSend("orders", f"c{i}", 30, message_id=f"c{i}") for i in range(20)]).ok
    event = _event(sqs, endpoint, 20)
    halves = [{"Records": event["Records"][:10]}, {"Records": event["Records"][10:]}]
    handler = build_handler(handler_env(settings, sqs_settings), sqs_client=sqs)
    for _ in range(3):
        with ThreadPoolExecutor(2) as pool:
            responses = list(pool.map(lambda e: handler(e, LocalLambdaContext()), halves))
        assert responses == [{"batchItemFailures": []}, {"batchItemFailures": []}]


def test_startup_check_reports_a_misconfigured_delay_queue_once(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_FIFO_QUEUE_DELAY", "3")  # the queue was made with 2 s
    monkeypatch.setenv("DELAYED_DELIVERY_MAX_PARK_SECONDS", "0")  # a hop, not a park (test_parking.py parks)
    sender.send_delayed("orders", "x", 30, message_id="chk")
    event = _event(sqs, endpoint, 1)
    capsys.readouterr()
    assert requeue.handler(event, LocalLambdaContext()) == {"batchItemFailures": []}  # still works
    requeue.handler(event, LocalLambdaContext())  # the same queue again: not checked twice
    out = capsys.readouterr().out
    errors = [json.loads(line) for line in out.splitlines() if "does not meet" in line]
    assert len(errors) == 1
    assert "DelaySeconds is 2 s but must be 3 s" in errors[0]["reason"]
    assert '"DelayQueueMisconfigured"' in out
