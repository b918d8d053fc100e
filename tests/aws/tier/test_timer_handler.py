"""The timer Lambda: lazy wiring from the environment, EMF metrics and a summary log line, bad events tolerated."""

from __future__ import annotations

import importlib
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import functions.aws.bucket_timer as bucket_timer
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import TimerResult
from delayed_delivery.aws.tier.timer_handler import METRICS, build_timer_handler
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext
from tests.aws.tier.timer_support import message, queue_url

pytestmark = pytest.mark.moto

SCHEDULED = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def _config(bucket: str, tier: TierSettings) -> BucketTierConfig:
    """The compressed tier (errors to ``errors``) under a fresh service name."""
    return BucketTierConfig(
        bucket,
        settings=DelayedDeliverySettings(error_queue="errors"),
        tier_settings=tier,
        service=f"timer-{uuid.uuid4().hex[:8]}",
        metrics_namespace="T",
    )


def test_a_run_emits_the_metrics_and_a_summary(
    s3: Any,
    sqs: Any,
    tier_bucket: str,
    tier_settings: TierSettings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start = datetime(2031, 1, 1, tzinfo=UTC)
    clock = ManualClock(start + timedelta(seconds=1))
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    config = _config(tier_bucket, tier_settings)
    seen: list[TimerResult] = []
    handler = build_timer_handler(config, s3=s3, sqs=sqs, clock=clock, on_result=seen.append)
    S3BucketStore.from_config(s3, config).write_due([message(1, start + timedelta(seconds=2))], start)
    capsys.readouterr()
    response = handler(SCHEDULED, LocalLambdaContext())
    assert response["ok"] is True and response["dispatched"] == 1 and seen[0].dispatched == 1
    lines = _lines(capsys)
    summary = next(line for line in lines if line.get("event") == "bucket_timer_run")
    assert summary["dispatched"] == 1 and summary["message"] == "timer run"
    emitted = next(line for line in lines if "_aws" in line and "BucketMessagesDispatched" in line)
    assert emitted["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "T"
    assert emitted["BucketMessagesDispatched"] in (1.0, [1.0]) and emitted["BucketOldestOverdueSeconds"] in (0.0, [0.0])
    assert {name for name, _ in METRICS.values()} <= set(emitted)


@pytest.mark.parametrize("event", [None, "x", [1], {"detail-type": "Something Else"}])
def test_a_bad_event_never_raises(s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, event: Any) -> None:
    handler = build_timer_handler(_config(tier_bucket, tier_settings), s3=s3, sqs=sqs, clock=ManualClock())
    assert handler(event, LocalLambdaContext())["ok"] is True


def test_an_unexpected_failure_is_logged_and_reported_not_raised(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayed_delivery.aws.tier import timer

    def boom(self: Any, deadline: float | None = None) -> TimerResult:
        raise RuntimeError("surprise")

    monkeypatch.setattr(timer.BucketTimer, "run", boom)
    handler = build_timer_handler(_config(tier_bucket, tier_settings), s3=s3, sqs=sqs, clock=ManualClock())
    assert handler(SCHEDULED, LocalLambdaContext()) == {"ok": False, "reason": "RuntimeError: surprise"}


def test_a_missing_bucket_fails_the_invocation_loudly(s3: Any, sqs: Any, tier_settings: TierSettings) -> None:
    handler = build_timer_handler(_config("no-such-bucket-here", tier_settings), s3=s3, sqs=sqs, clock=ManualClock())
    with pytest.raises(ConfigurationError, match="does not exist"):
        handler(SCHEDULED, LocalLambdaContext())


def test_the_entry_point_builds_lazily_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str
) -> None:
    import boto3

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("client created at import time")

    with monkeypatch.context() as patched:
        patched.setattr(boto3, "client", refuse)
        patched.setenv("DELAYED_DELIVERY_BUCKET_NAME", "")  # would fail if read at import
        module = importlib.reload(bucket_timer)
        assert not module.handler.built
    for key, value in {
        "DELAYED_DELIVERY_BUCKET_NAME": tier_bucket,
        "DELAYED_DELIVERY_ERROR_QUEUE": "errors",
        "AWS_ENDPOINT_URL_S3": moto_endpoint,
        "AWS_ENDPOINT_URL_SQS": moto_endpoint,
        "POWERTOOLS_SERVICE_NAME": f"timer-{uuid.uuid4().hex[:8]}",
    }.items():
        monkeypatch.setenv(key, value)
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    now = datetime.now(UTC)
    S3BucketStore(s3, tier_bucket).write_due([message(1, now + timedelta(seconds=1))], now)  # default levels
    s3.put_object(Bucket=tier_bucket, Key="readme", Body=b"not an object of the tier")
    bucket_timer.reset()
    try:
        response = bucket_timer.handler(SCHEDULED, LocalLambdaContext())
        assert response["ok"] is True and response["dispatched"] == 1
    finally:
        bucket_timer.reset()


def test_a_run_queries_the_records_of_a_destination_once_a_bucket_strongly_consistent(
    moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    import boto3

    from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
    from delayed_delivery.cancellations import cancel_request

    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    ensure_cancellation_table(dynamodb, "records")
    start = datetime(2031, 1, 1, tzinfo=UTC)
    clock = ManualClock(start + timedelta(seconds=3))
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    sent = start - timedelta(seconds=5)
    records = DynamoDbCancellationStore(dynamodb, "records")
    records.put(cancel_request("orders", "m-4", now=start, max_native_delay=2, max_age=0))
    queries: list[str] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.Query", lambda params, **_: queries.append(str(params.get("ConsistentRead")))
    )
    config = replace(_config(tier_bucket, tier_settings), cancellation_table="records", service="timer-q")
    handler = build_timer_handler(config, s3=s3, sqs=sqs, dynamodb=dynamodb, clock=clock)
    batch = [message(n, start + timedelta(milliseconds=250 * n + 100), sent=sent) for n in range(20)]  # 5 buckets
    S3BucketStore.from_config(s3, config).write_due(batch, start)
    response = handler(SCHEDULED, LocalLambdaContext())
    assert response["dispatched"] == 19 and response["cancelled"] == 1
    # 20 messages to one destination, in 5 buckets: a Query a bucket, strongly consistent (#31: one a run, eventually)
    assert queries == ["True"] * 5
    # the applied record is settled: it ends within an hour of the message's due time (#31: deleted)
    assert all(r.expires_at <= start + timedelta(hours=1, seconds=5) for r in records.live("orders"))
