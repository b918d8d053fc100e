"""The ingest Lambda on moto: sender -> ingest queue -> handler (local event source) -> S3 objects, EMF metrics."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

import functions.aws.bucket_ingest as bucket_ingest
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.ingest import IngestResult
from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.clock import ManualClock
from delayed_delivery.headers import FAILURE_REASON
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller, LocalLambdaContext
from delayed_delivery.timebuckets.wheel import COARSE, FINE, bucket_of

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

NOW = datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)
SETTINGS = DelayedDeliverySettings(error_queue="errors")
ROUTING = SqsSettings(long_delay_route="buckets", bucket_ingest_queue="ingest")
DAY = 86_400


def _config(bucket: str) -> BucketTierConfig:
    return BucketTierConfig(
        bucket, settings=SETTINGS, sqs_settings=ROUTING, service=f"ingest-{uuid.uuid4().hex[:8]}", metrics_namespace="T"
    )


def _queues(sqs: SQSClient) -> dict[str, str]:
    return {n: sqs.create_queue(QueueName=n)["QueueUrl"] for n in ("orders", "payments", "ingest", "errors")}


def _poller(sqs: SQSClient, url: str, handler: Any) -> LocalEventSourcePoller:
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return LocalEventSourcePoller(sqs, url, arn, handler, wait_seconds=0)


def _keys(s3: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def _metrics(out: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("{") and "_aws" in line:
            document = json.loads(line)
            for metric in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
                value = document[metric["Name"]]
                found[metric["Name"]] = found.get(metric["Name"], 0) + (
                    sum(value) if isinstance(value, list) else value
                )
    return found


def test_sent_messages_land_in_s3_coarse_for_far_fine_for_near(
    s3: Any, sqs: SQSClient, tier_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = _queues(sqs)
    sender = SqsDelayedSender(sqs, SETTINGS, sqs_settings=ROUTING, clock=ManualClock(NOW))
    delays = {"40d": 40 * DAY, "2y": 73_050 * DAY // 100, "3h": 3 * 3_600}
    sends = [DelayedSend("orders", f"b{n}", list(delays)[n % 3], None, f"id-{n:02}") for n in range(30)]
    sender.send_delayed_batch(sends[:15]).raise_for_failures()
    for send in sends[15:]:
        sender.send_delayed(send.destination, send.body, send.delay, message_id=send.message_id)
    results: list[IngestResult] = []
    handler = build_ingest_handler(
        _config(tier_bucket), s3=s3, sqs=sqs, clock=ManualClock(NOW), on_result=results.append
    )
    poller = _poller(sqs, urls["ingest"], handler)
    capsys.readouterr()
    while poller.poll_once():
        pass
    assert poller.stats.records == 16 and poller.stats.deleted == 16 and poller.stats.failed == 0
    store = S3BucketStore(s3, tier_bucket)
    fine, coarse = list(store.objects(FINE)), list(store.objects(COARSE))
    assert {o.bucket for o in fine} == {bucket_of(NOW + timedelta(seconds=delays["3h"]), NOW)}
    assert {o.bucket for o in coarse} == {bucket_of(NOW + timedelta(seconds=delays[d]), NOW) for d in ("40d", "2y")}
    assert sum(o.count or 0 for o in fine + coarse) == 30
    assert len(fine + coarse) == sum(r.objects_written for r in results)  # one object per bucket per invocation
    assert all(r.objects_written <= 3 for r in results)
    metrics = _metrics(capsys.readouterr().out)
    assert metrics["BucketMessagesIngested"] == 30 and metrics["BucketIngestPoison"] == 0
    assert metrics["BucketObjectsWritten"] == len(fine + coarse)
    keys = _keys(s3, tier_bucket)
    for event in poller.events:  # SQS delivers again: the same keys, no new object
        assert handler(event, LocalLambdaContext()) == {"batchItemFailures": []}
    assert _keys(s3, tier_bucket) == keys


def test_crafted_records_go_to_the_error_queue_and_neighbours_are_written_once(
    s3: Any, sqs: SQSClient, tier_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = _queues(sqs)
    SqsDelayedSender(sqs, SETTINGS, sqs_settings=ROUTING, clock=ManualClock(NOW)).send_delayed(
        "orders", "good", "40d", message_id="good"
    )
    for body, attributes in (
        ('{"v":1,"m":[{"i":"bad id","q":"orders","b":"x","d":1}]}', {"DelayedDelivery.Ingest": "1"}),
        ('{"v":1,"m":[{"i":"huge","q":"orders","b":"x","d":' + "9" * 5000 + "}]}", {"DelayedDelivery.Ingest": "1"}),
        ("plain text", {}),
    ):
        values = {k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()}
        sqs.send_message(QueueUrl=urls["ingest"], MessageBody=body, MessageAttributes=values)  # type: ignore[arg-type]
    handler = build_ingest_handler(_config(tier_bucket), s3=s3, sqs=sqs, clock=ManualClock(NOW))
    poller = _poller(sqs, urls["ingest"], handler)
    capsys.readouterr()
    while poller.poll_once():
        pass
    assert poller.stats.records == 4 and poller.stats.failed == 0
    [key] = _keys(s3, tier_bucket)
    assert [m.message_id for m in S3BucketStore(s3, tier_bucket).read(key).messages] == ["good"]
    errors = sqs.receive_message(QueueUrl=urls["errors"], MaxNumberOfMessages=10, MessageAttributeNames=["All"])
    reasons = sorted(m["MessageAttributes"][FAILURE_REASON]["StringValue"] for m in errors["Messages"])
    assert len(reasons) == 3
    assert any("invalid message id" in r for r in reasons) and any("5000-character number" in r for r in reasons)
    assert any("not an ingest envelope" in r for r in reasons)
    out = capsys.readouterr().out
    assert _metrics(out)["BucketIngestPoison"] == 3
    logged = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"event"' in line]
    assert sum(line["event"] == "moved_to_error_queue" for line in logged) == 3


@pytest.mark.parametrize(
    "event",
    [
        {},
        {"Records": None},
        {"Records": "x"},
        {"Records": [None, 5, "x", {}]},
        {"Records": [{"messageId": "r1", "body": 7, "messageAttributes": []}]},
        {"Records": [{"messageId": "r2", "body": "{}", "messageAttributes": {"DelayedDelivery.Ingest": "1"}}]},
        {
            "Records": [
                {
                    "messageId": "r3",
                    "body": "\ud800",
                    "messageAttributes": {"DelayedDelivery.Ingest": {"stringValue": "1"}},
                }
            ]
        },
    ],
)
def test_a_crafted_event_never_raises(s3: Any, sqs: SQSClient, tier_bucket: str, event: Any) -> None:
    _queues(sqs)
    handler = build_ingest_handler(_config(tier_bucket), s3=s3, sqs=sqs, clock=ManualClock(NOW))
    response = handler(event, LocalLambdaContext())
    assert response == {"batchItemFailures": []}


def test_a_missing_s3_bucket_fails_the_records_for_a_retry(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    urls = _queues(sqs)
    SqsDelayedSender(sqs, SETTINGS, sqs_settings=ROUTING, clock=ManualClock(NOW)).send_delayed("orders", "x", "40d")
    handler = build_ingest_handler(_config("no-such-bucket"), s3=s3, sqs=sqs, clock=ManualClock(NOW))
    poller = _poller(sqs, urls["ingest"], handler)
    assert poller.poll_once() == 1
    assert poller.stats.failed == 1 and poller.stats.deleted == 0


@pytest.fixture
def lambda_env(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, tier_bucket: str) -> Iterator[None]:
    values = {
        "DELAYED_DELIVERY_BUCKET_NAME": tier_bucket,
        "DELAYED_DELIVERY_ERROR_QUEUE": "errors",
        "DELAYED_DELIVERY_BUCKET_INGEST_QUEUE": "ingest",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_SERVICE_NAME": f"ingest-{uuid.uuid4().hex[:8]}",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    bucket_ingest.reset()
    yield
    bucket_ingest.reset()


def test_the_thin_entry_point_builds_from_the_environment_on_first_call(
    s3: Any, sqs: SQSClient, tier_bucket: str, lambda_env: None
) -> None:
    urls = _queues(sqs)
    SqsDelayedSender(sqs, SETTINGS, sqs_settings=ROUTING).send_delayed("orders", "x", "40d", message_id="via-env")
    poller = _poller(sqs, urls["ingest"], bucket_ingest.handler)
    assert poller.poll_once() == 1 and poller.stats.deleted == 1
    [key] = _keys(s3, tier_bucket)
    assert key.startswith("delayed-delivery/buckets/coarse/")


def test_import_reads_no_environment_and_creates_no_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import boto3

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("client created at import time")

    monkeypatch.setattr(boto3, "client", refuse)
    monkeypatch.delenv("DELAYED_DELIVERY_BUCKET_NAME", raising=False)
    module = importlib.reload(bucket_ingest)
    assert not module.handler.built


def test_the_timer_dispatches_what_the_ingest_wrote(s3: Any, sqs: SQSClient, tier_bucket: str) -> None:
    from delayed_delivery.aws.tier.timer import BucketTimer
    from tests.fixtures.moto import queue_depth

    urls = _queues(sqs)
    clock = ManualClock(NOW)
    sender = SqsDelayedSender(sqs, SETTINGS, sqs_settings=ROUTING, clock=clock)
    delays = {"3h": 3 * 3_600, "40d": 40 * DAY, "2y": 73_050 * DAY // 100}
    for label in delays:
        sender.send_delayed("orders", f"due in {label}", label, message_id=f"m-{label}")
    poller = _poller(sqs, urls["ingest"], build_ingest_handler(_config(tier_bucket), s3=s3, sqs=sqs, clock=clock))
    while poller.poll_once():
        pass
    timer = BucketTimer(S3BucketStore(s3, tier_bucket), sqs, SETTINGS, clock, owner="test")
    for expected, seconds in enumerate(delays.values(), start=1):
        clock.set(NOW + timedelta(seconds=seconds - 300))
        timer.run()
        assert queue_depth(sqs, urls["orders"]) == expected
    assert _keys(s3, tier_bucket) == [] or all("/leases/" in k for k in _keys(s3, tier_bucket))
