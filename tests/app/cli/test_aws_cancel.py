"""``cancel`` / ``reschedule --cloud aws`` end to end on moto server: the CLI sends a long delay and writes the record,
the real requeue handler runs behind the local event source with compressed settings (cap and hop 2 s).

What load cannot change is checked, not how late a hop is: the send took the hop cycle (a record can reach nothing
else), the handler applied the record (its results), and the broker never shows a message before its due time.
Arrivals are awaited with a deadline far beyond any hop."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from delayed_delivery.aws.cancellations import CACHE_SECONDS_ENV, TABLE_ENV
from delayed_delivery.aws.requeue import HopOutcome, RecordResult
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.cancellations import Cancellation
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller
from tests.app.cli.conftest import ok_json, one_line_error, run
from tests.aws.conftest import collect, handler_env
from tests.aws.test_cancel_dynamodb import dynamodb_client

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

TABLE = "cli-cancellations"
#: How long past a due time an arrival is awaited: a deadline against a hang, far beyond any hop, not a claim.
DEADLINE = 60.0
EPSILON = 0.25
SETTINGS = DelayedDeliverySettings(error_queue="error")
SQS_SETTINGS = SqsSettings(max_native_delay=2, fifo_queue_delay=2, long_delay_route="fifo")


@pytest.fixture
def aws(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Compressed settings in the environment (as the CLI reads them), queues and table made by `aws create`."""
    for name, value in {**handler_env(SETTINGS, SQS_SETTINGS), TABLE_ENV: TABLE, CACHE_SECONDS_ENV: "0"}.items():
        monkeypatch.setenv(name, value)
    created = run("aws", "create", "--queue", "orders", "--endpoint-url", moto_endpoint, "--region", "us-east-1")
    assert created.exit_code == 0, created.output
    assert '"cancellation_table": "cli-cancellations"' in created.stdout
    return ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]


def _orders(sqs: SQSClient) -> str:
    return sqs.get_queue_url(QueueName="orders")["QueueUrl"]


def test_cancel_a_long_delay_it_never_arrives(sqs: SQSClient, aws: list[str]) -> None:
    sent = ok_json("send", *aws, "--to", "orders", "--delay", "5s", "--body", "stop me", "--id", "c1")
    kept = ok_json("send", *aws, "--to", "orders", "--delay", "5s", "--body", "keep me")
    assert sent["route"] == kept["route"] == "sqs-fifo"
    data = ok_json("cancel", "c1", *aws, "--to", "orders")
    assert data == {**data, "message_id": "c1", "route": "aws", "requested": "cancel", "certain": False}
    assert "unless it is due within 2s" in data["note"] and data["table"] == TABLE
    assert "applies only to a message with this id sent before now" in data["note"]
    text = run("cancel", "c1", *aws, "--to", "orders")
    assert text.exit_code == 0 and "cancel of c1 accepted (route: aws)" in text.stdout
    results: list[RecordResult] = []
    with _requeue(sqs, aws, results):
        arrivals = collect(sqs, _orders(sqs), expect=1, timeout=_until(kept["due_at"]) + DEADLINE, linger=1.5)
    assert [a.body for a in arrivals] == ["keep me"]
    [dropped] = [m for m in _each(results) if m.message_id == "c1"]
    assert dropped.outcome is HopOutcome.CANCELLED, "dropped at its first hop: it can never arrive"


def test_reschedule_arrives_at_the_new_time_not_before(sqs: SQSClient, aws: list[str]) -> None:
    sent = ok_json("send", *aws, "--to", "orders", "--delay", "3s", "--body", "move me", "--id", "r1")
    # --delay counts from the write (42d4fb0): before, a send that took over 1 s to connect sent what was left, 2 s,
    # natively, where no record can reach it, and it arrived at its old time
    assert sent["route"] == "sqs-fifo", sent
    data = ok_json("reschedule", "r1", *aws, "--to", "orders", "--delay", "7s")
    new_due = datetime.fromisoformat(data["due_at"])
    assert data["requested"] == "reschedule" and "next hop" in data["note"]
    assert "never to one sent later" in data["note"]
    results: list[RecordResult] = []
    with _requeue(sqs, aws, results):
        [arrival] = collect(sqs, _orders(sqs), expect=1, timeout=_until(data["due_at"]) + DEADLINE)
    [moved] = [m for m in _each(results) if m.cancellation is not None]
    assert moved.message_id == "r1" and isinstance(moved.cancellation, Cancellation)
    assert moved.cancellation.due_at == new_due, "the record was applied at its first hop"
    header = decode_delivery(arrival.attributes[DELIVERY_HEADER]["StringValue"])
    assert header.route == "fifo" and header.due_ms is not None and header.due_ms >= epoch_ms(new_due), header
    assert new_due.timestamp() - EPSILON <= arrival.at, "never before the new due time"


def test_cancel_with_a_due_time_says_for_sure_whether_it_is_too_late(aws: list[str]) -> None:
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    one_line_error(run("cancel", "x", *aws, "--to", "orders", "--due", soon), "too late to cancel 'x'", "drop it by id")
    later = (datetime.now(UTC) + timedelta(days=3)).isoformat()
    data = ok_json("cancel", "x", *aws, "--to", "orders", "--due", later)
    assert data["certain"] is True and "before its due time" in data["note"]


def test_aws_cancel_and_reschedule_bad_input(aws: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    one_line_error(run("cancel", "x", *aws), "give --to QUEUE")
    one_line_error(run("reschedule", "x", *aws, "--delay", "1h"), "give --to QUEUE")
    one_line_error(run("cancel", "x", *aws, "--to", "nope"), "unknown queue 'nope'", "nope-delay.fifo")
    one_line_error(run("reschedule", "x", *aws, "--to", "nope", "--delay", "1h"), "unknown queue 'nope'")
    one_line_error(run("reschedule", "x", *aws, "--to", "orders", "--delay", "soon"), "cannot read duration")
    one_line_error(run("cancel", "x", *aws, "--to", "orders", "--due", "tomorrow"), "--due", "ISO-8601")
    one_line_error(run("cancel", "x", *aws, "--to", "orders", "--due", "2030-01-01T00:00:00"), "naive (no time zone)")
    one_line_error(run("cancel", "x", *aws, "--to", "Bad/Name"), "invalid SQS queue name")
    monkeypatch.setenv(TABLE_ENV, "never-created")
    one_line_error(run("cancel", "x", *aws, "--to", "orders"), "'never-created' does not exist", "aws create")


def test_reschedule_into_the_past_writes_no_record(aws: list[str]) -> None:
    # #23: this exited 0 and wrote a record due in 1960, which the tier's timer could not build a message from
    result = run("reschedule", "m7", *aws, "--at", "1960-01-01T00:00:00Z", "--to", "orders")
    one_line_error(result, "new due time 1960-01-01T00:00:00+00:00 is in the past", "give a later --at or a --delay")
    one_line_error(run("reschedule", "m7", *aws, "--at", "9500-01-01T00:00:00Z", "--to", "orders"), "100-year")
    table = dynamodb_client(aws[aws.index("--endpoint-url") + 1])
    assert table.scan(TableName=TABLE)["Items"] == []


def _until(due_at: str) -> float:
    """Seconds from now until ``due_at`` (ISO-8601, as the CLI prints it), 0 when past."""
    return max(0.0, (datetime.fromisoformat(due_at) - datetime.now(UTC)).total_seconds())


def _each(results: list[RecordResult]) -> list[RecordResult]:
    """The handler's results per message (an envelope's inner ones)."""
    return [m for r in list(results) for m in r.per_message()]


@contextlib.contextmanager
def _requeue(sqs: SQSClient, aws: list[str], results: list[RecordResult] | None = None) -> Iterator[None]:
    """Run the requeue handler on ``orders-delay.fifo`` for the block (records written before it starts); its results
    are added to ``results``."""
    url = sqs.get_queue_url(QueueName="orders-delay.fifo")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    env = {**handler_env(SETTINGS, SQS_SETTINGS), TABLE_ENV: TABLE, CACHE_SECONDS_ENV: "0"}
    dynamodb = dynamodb_client(aws[aws.index("--endpoint-url") + 1])
    hook = results.extend if results is not None else None
    handler = build_handler(env, sqs_client=sqs, dynamodb_client=dynamodb, on_results=hook)
    poller = LocalEventSourcePoller(sqs, url, arn, handler)
    poller.start()
    try:
        yield
    finally:
        poller.stop()
    assert (poller.stats.handler_errors, poller.stats.poll_errors) == (0, 0), poller.stats
