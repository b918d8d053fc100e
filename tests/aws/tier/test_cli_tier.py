"""``delayed-delivery aws tier`` on moto server: the ingest and timer functions run locally over what
``aws create --buckets`` made; "40d" and "2y" messages (sent with a clock set back by their delay, bucket sizes
compressed through the environment) arrive, never early; SIGTERM stops it with the summary; errors are one line."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.clock import ManualClock
from delayed_delivery.durations import parse_duration
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto
runner = CliRunner()

#: Compressed time, as the functions read it: native up to 2 s, fine buckets 1 s, coarse 2 s, dispatch lead 2 s.
COMPRESSED = {
    "DELAYED_DELIVERY_MAX_NATIVE_DELAY": "2",
    "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": "2",
    "DELAYED_DELIVERY_BUCKET_FINE_SECONDS": "1",
    "DELAYED_DELIVERY_BUCKET_COARSE_SECONDS": "2",
    "DELAYED_DELIVERY_BUCKET_DISPATCH_LEAD_SECONDS": "2",
    "DELAYED_DELIVERY_LONG_DELAY_ROUTE": "buckets",
}


def _cli(moto_endpoint: str, *args: str) -> tuple[int, str]:
    env = {**COMPRESSED, "DELAYED_DELIVERY_BUCKET_NAME": "tier-run"}
    result = runner.invoke(app, ["aws", *args, "--endpoint-url", moto_endpoint, "--region", "us-east-1"], env=env)
    return result.exit_code, result.output


def _send_due_in(sqs: SQSClient, delay: str, seconds: int) -> float:
    """Send ``delay`` with the sender's clock set back so that it falls due ``seconds`` from now; its due epoch."""
    settings, routing = DelayedDeliverySettings.from_env(COMPRESSED), SqsSettings.from_env(COMPRESSED)
    length = math.ceil(parse_duration(delay).total_seconds())
    start = datetime.fromtimestamp(int(time.time()) + seconds - length, UTC)
    receipt = SqsDelayedSender(sqs, settings, sqs_settings=routing, clock=ManualClock(start)).send_delayed(
        "orders", f"after {delay}", delay, message_id=f"id-{delay}"
    )
    assert receipt.route.value == "buckets" and receipt.delay_seconds == length
    return start.timestamp() + length


def _arrivals(sqs: SQSClient, url: str, expected: set[str], timeout: float) -> dict[str, float]:
    """Body -> when it was first received, until every expected body arrived or ``timeout`` passed."""
    arrived: dict[str, float] = {}
    end = time.monotonic() + timeout
    while expected - arrived.keys() and time.monotonic() < end:
        reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in reply.get("Messages", []):
            arrived.setdefault(message["Body"], time.time())
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return arrived


def _start_tier(moto_endpoint: str, *args: str) -> subprocess.Popen[str]:
    """``aws tier`` in its own process (signals go to it alone), once its banner is out on stderr: its clients are
    built."""
    env = {**os.environ, **COMPRESSED, "DELAYED_DELIVERY_BUCKET_NAME": "tier-run", "COLUMNS": "200"}
    env.update(AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    command = [str(Path(sys.executable).parent / "delayed-delivery"), "aws", "tier", "--endpoint-url", moto_endpoint]
    tier = subprocess.Popen(
        [*command, "--every", "0.5", "--for", "120", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert tier.stderr is not None
    banner = tier.stderr.readline()
    assert banner.startswith("tier s3://tier-run/delayed-delivery/buckets, ingest queue delayed-delivery-ingest"), (
        banner
    )
    return tier


def test_40d_and_2y_arrive_never_early_and_sigterm_stops_with_the_summary(sqs: SQSClient, moto_endpoint: str) -> None:
    code, out = _cli(moto_endpoint, "create", "--queue", "orders", "--buckets")
    assert code == 0, out
    tier = _start_tier(moto_endpoint, "--json")
    try:
        due = {"after 40d": _send_due_in(sqs, "40d", 4), "after 2y": _send_due_in(sqs, "2y", 12)}
        url = sqs.get_queue_url(QueueName="orders")["QueueUrl"]
        arrived = _arrivals(sqs, url, set(due), timeout=60)
        tier.send_signal(signal.SIGTERM)
        output, progress = tier.communicate(timeout=30)
    finally:
        tier.kill()
    assert arrived.keys() == due.keys(), arrived
    assert all(arrived[body] >= due[body] for body in due), (arrived, due)  # never early
    assert tier.returncode == 0, output + progress
    assert any(" s  run 1: ingested " in line for line in progress.splitlines()), progress
    summary = json.loads(output)  # --json: stdout holds the summary and nothing else (progress is on stderr)
    assert summary["stopped_by_signal"] is True and summary["timer_runs"] >= 2
    assert (summary["ingested"], summary["dispatched"], summary["error_queue"]) == (2, 2, 0), summary
    assert summary["cascaded"] >= 1, summary  # "2y" was written into a coarse bucket, then split into fine ones
    assert summary["objects"] >= 2 and summary["duplicates"] == summary["ingest_records_retried"] == 0, summary


def test_ctrl_c_stops_it_after_the_current_step_with_the_summary(sqs: SQSClient, moto_endpoint: str) -> None:
    code, out = _cli(moto_endpoint, "create", "--queue", "orders", "--buckets")
    assert code == 0, out
    tier = _start_tier(moto_endpoint)
    try:
        assert tier.stderr is not None
        assert " s  run 1: " in tier.stderr.readline()
        started = time.monotonic()
        tier.send_signal(signal.SIGINT)
        output, _ = tier.communicate(timeout=30)
    finally:
        tier.kill()
    assert tier.returncode == 0 and time.monotonic() - started < 10, output
    assert "done: " in output and "Traceback" not in output, output


def test_a_short_run_on_an_empty_tier_prints_progress_and_counts(sqs: SQSClient, moto_endpoint: str) -> None:
    code, out = _cli(moto_endpoint, "create", "--queue", "orders", "--buckets")
    assert code == 0, out
    code, out = _cli(moto_endpoint, "tier", "--for", "2.5", "--every", "0.5")
    assert code == 0, out
    runs = [line for line in out.splitlines() if " s  run " in line]
    assert len(runs) >= 2 and runs[0].strip().startswith("0.0 s  run 1: ingested 0 in 0 object(s)"), out
    assert "done: " in out and "ingested 0, objects 0, cascaded 0, dispatched 0, duplicates 0, error queue 0" in out


def test_a_missing_tier_is_one_line_naming_aws_create(s3: Any, moto_endpoint: str) -> None:
    code, out = _cli(moto_endpoint, "tier", "--for", "1")
    assert code == 2 and "the S3 bucket 'tier-run' does not exist" in out, out
    s3.create_bucket(Bucket="tier-run")
    code, out = _cli(moto_endpoint, "tier", "--for", "1")
    assert code == 2, out
    assert "ingest queue 'delayed-delivery-ingest'" in out and "aws create --buckets" in out, out
    assert len([line for line in out.splitlines() if line.strip()]) == 1 and "Traceback" not in out, out


@pytest.mark.parametrize("args", [["--for", "0"], ["--every", "-1"], ["--for", "nan"]])
def test_bad_durations_are_refused(args: list[str], moto_endpoint: str) -> None:
    code, out = _cli(moto_endpoint, "tier", *args)
    assert code == 2 and "give a positive number of seconds" in out, out


def test_without_an_endpoint_it_asks_for_one() -> None:
    result = runner.invoke(app, ["aws", "tier", "--for", "1"], env={"AWS_ENDPOINT_URL_SQS": ""})
    assert result.exit_code == 2 and "give --local" in result.output, result.output


def test_help_names_the_options() -> None:
    result = runner.invoke(app, ["aws", "tier", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--local", "--endpoint-url", "--for", "--every", "--bucket-name", "--json", "SIGTERM"):
        assert option in result.output, option
