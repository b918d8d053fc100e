"""``delayed-delivery aws check|create|send`` against moto server, and the seed's manual-queue rules."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.aws.queues import MIN_RETENTION_SECONDS, check_endpoint, ensure_endpoint
from delayed_delivery.aws.settings import SqsSettings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto
runner = CliRunner()


def _run(moto_endpoint: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["aws", *args, "--endpoint-url", moto_endpoint, "--region", "us-east-1"])
    return result.exit_code, result.output


def test_check_accepts_a_queue_made_as_the_seed_requires(sqs: SQSClient, moto_endpoint: str) -> None:
    ensure_endpoint(sqs, "billing")
    code, out = _run(moto_endpoint, "check", "--queue", "billing")
    assert code == 0, out
    assert "ready for unrestricted delayed delivery" in out
    code, _ = _run(moto_endpoint, "check", "--queue", "billing-delay.fifo")  # the FIFO name works too
    assert code == 0


def test_check_explains_every_mismatch(sqs: SQSClient, moto_endpoint: str) -> None:
    sqs.create_queue(QueueName="billing")
    dlq = sqs.create_queue(QueueName="dlq.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.create_queue(
        QueueName="billing-delay.fifo",
        Attributes={
            "FifoQueue": "true",
            "DelaySeconds": "60",
            "MessageRetentionPeriod": "3600",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
        },
    )
    code, out = _run(moto_endpoint, "check", "--queue", "billing")
    assert code == 1
    assert "DelaySeconds is 60 s but must be 900 s" in out
    assert f"must be at least {MIN_RETENTION_SECONDS} s" in out
    assert "RedrivePolicy" in out and "3 problem(s)" in out


def test_check_warns_without_failing_when_the_retention_leaves_parking_little_or_no_room(
    sqs: SQSClient, moto_endpoint: str
) -> None:
    ensure_endpoint(sqs, "roomy")  # 14 days: parks fit between the 4 days kept free and the end
    roomy = check_endpoint(sqs, "roomy", SqsSettings())
    assert roomy.ok and not roomy.warnings
    sqs.create_queue(QueueName="seed")
    seed_attributes = {"FifoQueue": "true", "DelaySeconds": "900", "MessageRetentionPeriod": str(MIN_RETENTION_SECONDS)}
    sqs.create_queue(QueueName="seed-delay.fifo", Attributes=seed_attributes)
    code, out = _run(moto_endpoint, "check", "--queue", "seed")
    assert code == 0, out  # the seed's 4 days are valid, just no room to park
    assert "warn" in out and "parking never happens" in out and "MessageRetentionPeriod=1209600" in out
    sqs.create_queue(QueueName="week")
    week = {**seed_attributes, "MessageRetentionPeriod": str(7 * 86_400)}
    sqs.create_queue(QueueName="week-delay.fifo", Attributes=week)
    result = check_endpoint(sqs, "week", SqsSettings())
    assert result.ok and len(result.warnings) == 1 and "re-sent every 259,200 s" in result.warnings[0]
    assert not check_endpoint(sqs, "week", SqsSettings(max_park_seconds=0)).warnings  # parking off


def test_check_reports_missing_queues(sqs: SQSClient) -> None:
    result = check_endpoint(sqs, "ghost", SqsSettings())
    assert not result.ok
    assert any("input queue 'ghost' does not exist" in p for p in result.problems)
    assert any("'ghost-delay.fifo' does not exist" in p for p in result.problems)


def test_check_uses_the_configured_hop_length(sqs: SQSClient) -> None:
    ensure_endpoint(sqs, "fast", sqs_settings=SqsSettings(max_native_delay=2, fifo_queue_delay=2))
    assert check_endpoint(sqs, "fast", SqsSettings(max_native_delay=2, fifo_queue_delay=2)).ok
    assert not check_endpoint(sqs, "fast", SqsSettings()).ok


def test_bad_queue_name_is_one_line_and_exit_2(moto_endpoint: str) -> None:
    code, out = _run(moto_endpoint, "check", "--queue", "no/such")
    assert code == 2 and "invalid SQS queue name" in out


def test_create_then_send_long_and_short(sqs: SQSClient, moto_endpoint: str) -> None:
    code, out = _run(moto_endpoint, "create", "--queue", "cli")
    assert code == 0, out
    code, out = _run(moto_endpoint, "send", "--queue", "cli", "--delay", "2h", "--body", "hi", "-a", "k=v")
    assert code == 0, out
    sent = json.loads(out)
    assert (sent["route"], sent["queue"], sent["delay_seconds"], sent["fifo_cycles"]) == (
        "fifo",
        "cli-delay.fifo",
        7200,
        7,
    )
    code, out = _run(moto_endpoint, "send", "--queue", "cli", "--delay", "10m", "--body", "hi")
    assert code == 0 and json.loads(out)["route"] == "native"
    code, out = _run(moto_endpoint, "send", "--queue", "cli", "--delay", "-3", "--body", "hi")
    assert code == 2 and "negative durations are not allowed" in out


def test_cost_shows_packed_beside_unpacked_and_only_for_the_measured_size() -> None:
    result = runner.invoke(app, ["cost", "--delay", "365d", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert 0 < data["our_packed_requests_per_hop"] < data["our_measured_requests_per_hop"]
    assert data["our_packed_usd_total"] < data["our_measured_usd_total"] < data["seed_formula_usd_total"]
    big = json.loads(runner.invoke(app, ["cost", "--delay", "365d", "--size", "4096", "--json"]).output)
    assert big["our_packed_usd_total"] is None and big["our_packed_requests_per_hop"] is None
