"""No record's content raises out of an invocation: crafted envelopes, refused error-queue sends, receive counts."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.handler import LambdaHandler, build_handler
from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.requeue import FifoRequeuer, RecordResult
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILURE_REASON
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext
from tests.aws.conftest import ERRORS, handler_env

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


def record(endpoint: EndpointQueues, rid: str, body: str, *, envelope: bool, count: int = 1) -> dict[str, Any]:
    """A Lambda SQS record as the event source would hand it over (delay 1 s, so entries forward)."""
    now = str(int(time.time() * 1000))
    name, value = (ENVELOPE_ATTRIBUTE, "1") if envelope else (DELAY_SECONDS_ATTRIBUTE, "1")
    return {
        "messageId": rid,
        "receiptHandle": f"rh-{rid}",
        "body": body,
        "attributes": {
            "SentTimestamp": now,
            "ApproximateFirstReceiveTimestamp": now,
            "ApproximateReceiveCount": str(count),
            "MessageGroupId": rid,
            "MessageDeduplicationId": f"{rid}:0",
        },
        "messageAttributes": {name: {"dataType": "String" if envelope else "Number", "stringValue": value}},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": endpoint.delay_arn,
        "awsRegion": "us-east-1",
    }


def envelope(entries: list[str]) -> str:
    """An envelope body from raw JSON entry texts (so it can hold what ``json.dumps`` would not write)."""
    return '{"v":1,"m":[' + ",".join(entries) + "]}"


def entry(mid: str, body: str, remaining: str = "0") -> str:
    return f'{{"i":"{mid}","h":1,"d":{remaining},"b":{json.dumps(body)}}}'


def drain(sqs: SQSClient, url: str, *, linger: float = 1.0) -> list[dict[str, Any]]:
    """Everything on ``url`` now (waits ``linger`` for stragglers)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + linger
    while True:
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageAttributeNames=["All"]
        )
        batch = reply.get("Messages", [])
        got += batch  # type: ignore[arg-type]
        for m in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if not batch and time.monotonic() > deadline:
            return got
        if not batch:
            time.sleep(0.1)


def reason_of(message: dict[str, Any]) -> str:
    return str(message["MessageAttributes"][FAILURE_REASON]["StringValue"])


def env_of(settings: DelayedDeliverySettings, **extra: str) -> dict[str, str]:
    """The handler's environment; a fresh service name, as Powertools binds its logger to the stdout of the moment."""
    return {**handler_env(settings), "POWERTOOLS_SERVICE_NAME": f"requeue-{uuid.uuid4().hex[:8]}", **extra}


@pytest.fixture
def handler(sqs: SQSClient, settings: DelayedDeliverySettings) -> tuple[LambdaHandler, list[RecordResult]]:
    results: list[RecordResult] = []
    return build_handler(env_of(settings), sqs_client=sqs, on_results=results.extend), results


def _error_url(sqs: SQSClient) -> str:
    return sqs.get_queue_url(QueueName=ERRORS)["QueueUrl"]


@pytest.mark.parametrize(
    ("label", "poison"),
    [
        ("huge delay", '{"i":"bad","h":1,"d":' + "1" + "0" * 400 + ',"b":"x"}'),
        ("lone surrogate", '{"i":"bad","h":1,"d":0,"b":"a\\ud800b"}'),
        ("NUL", '{"i":"bad","h":1,"d":0,"b":"a\\u0000b"}'),
    ],
)
def test_a_poison_entry_goes_to_the_error_queue_and_its_neighbours_are_forwarded_once(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    label: str,
    poison: str,
) -> None:
    handle, _ = handler
    body = envelope([entry("good-1", "one"), poison, entry("good-2", "two")])
    response = handle({"Records": [record(endpoint, "env-1", body, envelope=True)]}, LocalLambdaContext())
    assert response == {"batchItemFailures": []}, label
    delivered = sorted(m["Body"] for m in drain(sqs, endpoint.input_url))
    assert delivered == ["one", "two"]
    errors = drain(sqs, _error_url(sqs))
    assert len(errors) == 1
    assert "malformed envelope entry 1" in reason_of(errors[0])


def test_an_exception_in_one_records_processing_fails_only_that_record(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import delayed_delivery.aws.requeue as requeue_pkg

    real = requeue_pkg.parse_record

    def explode(raw: Any, now_ms: int) -> Any:
        if raw["messageId"] == "boom":
            raise RuntimeError("injected")
        return real(raw, now_ms)

    monkeypatch.setattr(requeue_pkg, "parse_record", explode)
    handle, _ = handler
    records = [record(endpoint, rid, rid, envelope=False) for rid in ("a", "boom", "b")]
    response = handle({"Records": records}, LocalLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "boom"}]}
    assert sorted(m["Body"] for m in drain(sqs, endpoint.input_url)) == ["a", "b"]


def test_the_handler_survives_process_raising_and_fails_the_whole_batch(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: FifoRequeuer, records: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(FifoRequeuer, "process", broken)
    handle, _ = handler
    records = [record(endpoint, rid, rid, envelope=False) for rid in ("a", "b")]
    response = handle({"Records": records}, LocalLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "a"}, {"itemIdentifier": "b"}]}
    assert "the batch could not be handled; every record will be retried" in caplog.text
    assert '"InvocationFailures":[1.0]' in capsys.readouterr().out
