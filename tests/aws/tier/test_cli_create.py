"""``delayed-delivery aws create|check`` with the time-bucket tier on moto server: ``--buckets`` (or the route
setting: ``auto``, the default, creates it and checks it when its ingest queue exists) creates and checks the bucket,
the ingest queue and its DLQ; errors are one line with exit 2."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.provision import check_bucket_tier
from tests.aws.tier.test_provision import bare_bucket

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto
runner = CliRunner()


def _run(moto_endpoint: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(app, ["aws", *args, "--endpoint-url", moto_endpoint, "--region", "us-east-1"], env=env or {})
    return result.exit_code, result.output


def _queues(sqs: SQSClient) -> set[str]:
    return {url.rsplit("/", 1)[-1] for url in sqs.list_queues().get("QueueUrls", [])}


def test_create_with_buckets_makes_the_tier_and_check_accepts_it(s3: Any, sqs: SQSClient, moto_endpoint: str) -> None:
    code, out = _run(moto_endpoint, "create", "--queue", "orders", "--buckets", "--bucket-name", "tier-cli")
    assert code == 0, out
    made = json.loads(out)
    assert made["bucket"] == "tier-cli" and made["bucket_prefix"] == "delayed-delivery/buckets"
    assert made["ingest"].endswith("/delayed-delivery-ingest")
    assert made["ingest_dlq"].endswith("/delayed-delivery-ingest-dlq")
    assert {"orders", "orders-delay.fifo", "delayed-delivery-ingest", "delayed-delivery-ingest-dlq"} <= _queues(sqs)
    assert "tier-cli" in {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert check_bucket_tier(s3, sqs, BucketTierConfig(bucket_name="tier-cli")) == []
    code, out = _run(moto_endpoint, "check", "--queue", "orders", "--buckets", "--bucket-name", "tier-cli")
    assert code == 0, out
    assert "time-bucket tier: s3://tier-cli/delayed-delivery/buckets" in out
    assert "ready for unrestricted delayed delivery" in out


def test_the_route_setting_turns_the_tier_on_and_no_buckets_off(s3: Any, sqs: SQSClient, moto_endpoint: str) -> None:
    env = {
        "DELAYED_DELIVERY_LONG_DELAY_ROUTE": "auto",
        "DELAYED_DELIVERY_BUCKET_NAME": "tier-env",
        "DELAYED_DELIVERY_BUCKET_PREFIX": "dd/x",
        "DELAYED_DELIVERY_BUCKET_INGEST_QUEUE": "slow-lane",
    }
    code, out = _run(moto_endpoint, "create", "--queue", "orders", "--no-buckets", env=env)
    assert code == 0, out
    assert "bucket" not in json.loads(out) and not s3.list_buckets()["Buckets"]
    code, out = _run(moto_endpoint, "create", "--queue", "orders", env=env)
    assert code == 0, out
    made = json.loads(out)
    assert (made["bucket"], made["bucket_prefix"]) == ("tier-env", "dd/x")
    assert {"slow-lane", "slow-lane-dlq"} <= _queues(sqs)
    rules = s3.get_bucket_lifecycle_configuration(Bucket="tier-env")["Rules"]
    assert any(r.get("Filter", {}).get("Prefix") == "dd/x/leases/" for r in rules)
    code, out = _run(moto_endpoint, "check", "--queue", "orders", env=env)
    assert code == 0, out
    assert "s3://tier-env/dd/x" in out


def test_check_fails_with_each_tier_problem(s3: Any, sqs: SQSClient, moto_endpoint: str) -> None:
    fifo = {"DELAYED_DELIVERY_LONG_DELAY_ROUTE": "fifo"}
    code, out = _run(moto_endpoint, "create", "--queue", "orders", env=fifo)  # no tier: the route is fifo
    assert code == 0 and "bucket" not in json.loads(out)
    code, out = _run(moto_endpoint, "check", "--queue", "orders", env=fifo)
    assert code == 0, out  # the fifo route asks nothing of the tier
    bare_bucket(s3, "bare")
    code, out = _run(moto_endpoint, "check", "--queue", "orders", "--buckets", "--bucket-name", "bare")
    assert code == 1, out
    assert "FAIL" in out and "public access is not fully blocked" in out
    assert "ingest queue 'delayed-delivery-ingest' does not exist" in out
    assert "problem(s)" in out


def test_bad_bucket_name_is_one_line_and_exit_2(moto_endpoint: str) -> None:
    for command in ("create", "check"):
        code, out = _run(moto_endpoint, command, "--queue", "orders", "--buckets", "--bucket-name", "Bad_Name")
        assert code == 2, out
        assert "not an S3 bucket name" in out and "Traceback" not in out
        assert len([line for line in out.splitlines() if line.strip()]) == 1, out


def test_help_lists_the_tier_options() -> None:
    for command in ("create", "check"):
        result = runner.invoke(app, ["aws", command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0
        for option in ("--buckets", "--no-buckets", "--bucket-name", "--bucket-prefix"):
            assert option in result.output, (command, option)


def test_the_ingest_function_writes_into_what_create_made(s3: Any, sqs: SQSClient, moto_endpoint: str) -> None:
    from datetime import UTC, datetime

    from delayed_delivery.aws.sender import SqsDelayedSender
    from delayed_delivery.aws.settings import SqsSettings
    from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler
    from delayed_delivery.aws.tier.store import S3BucketStore
    from delayed_delivery.clock import ManualClock
    from delayed_delivery.settings import DelayedDeliverySettings
    from delayed_delivery.testing.aws import LocalEventSourcePoller

    code, out = _run(moto_endpoint, "create", "--queue", "orders", "--buckets", "--bucket-name", "tier-e2e")
    assert code == 0, out
    ingest_url = json.loads(out)["ingest"]
    routing = SqsSettings(long_delay_route="buckets")
    clock = ManualClock(datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC))
    sender = SqsDelayedSender(sqs, DelayedDeliverySettings(), sqs_settings=routing, clock=clock)
    for n, delay in enumerate(("40d", "2y", "3h")):
        assert sender.send_delayed("orders", f"b{n}", delay, message_id=f"id-{n}").route.value == "buckets"
    config = BucketTierConfig(bucket_name="tier-e2e", sqs_settings=routing)
    handler = build_ingest_handler(config, s3=s3, sqs=sqs, clock=clock)
    arn = sqs.get_queue_attributes(QueueUrl=ingest_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    poller = LocalEventSourcePoller(sqs, ingest_url, arn, handler, wait_seconds=0)
    while poller.poll_once():
        pass
    assert (poller.stats.records, poller.stats.failed) == (3, 0)
    store = S3BucketStore.from_config(s3, config)
    assert sum(o.count or 0 for level in ("fine", "coarse") for o in store.objects(level)) == 3
    assert check_bucket_tier(s3, sqs, config) == []


def test_auto_the_default_creates_the_tier_and_check_asks_for_it_only_when_there(
    s3: Any, sqs: SQSClient, moto_endpoint: str
) -> None:
    code, out = _run(moto_endpoint, "create", "--queue", "orders", "--no-buckets")  # auto, the default
    assert code == 0 and "bucket" not in json.loads(out)
    code, out = _run(moto_endpoint, "check", "--queue", "orders")
    assert code == 0, out  # auto sends through the -delay.fifo queue while there is no tier
    assert "no time-bucket tier" in out and "ready for unrestricted delayed delivery" in out
    half = sqs.create_queue(QueueName="delayed-delivery-ingest")["QueueUrl"]  # a tier half there is checked: fails
    code, out = _run(moto_endpoint, "check", "--queue", "orders")
    assert code == 1 and "S3 bucket 'delayed-delivery-buckets' does not exist" in out, out
    sqs.delete_queue(QueueUrl=half)
    code, out = _run(moto_endpoint, "create", "--queue", "orders")  # the default deploys the tier
    assert code == 0, out
    assert json.loads(out)["bucket"] == "delayed-delivery-buckets"
    code, out = _run(moto_endpoint, "check", "--queue", "orders")
    assert code == 0 and "time-bucket tier: s3://delayed-delivery-buckets/delayed-delivery/buckets" in out, out
