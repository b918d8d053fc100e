"""Cancel and reschedule on the SQS hop cycle, end to end on moto server: sender → -delay.fifo → the real Lambda
handler behind the local event source (cap and hop 2 s) → destination, with the records in DynamoDB on moto."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.cancellations import (
    DynamoDbCancellationStore,
)
from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.cancellations import cancel_request, reschedule_request
from tests.aws.conftest import StartPoller, collect, queue_depth
from tests.aws.test_cancel_dynamodb import dynamodb_client

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

SLACK = 3.5
EPSILON = 0.25


def _now() -> datetime:
    return datetime.now(UTC)


def test_cancelled_message_never_arrives_and_its_record_is_deleted(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    sender.send_delayed("orders", "cancel me", 4, message_id="gone")
    sender.send_delayed("orders", "keep me", 4, message_id="kept")
    records.put(cancel_request("orders", "gone", now=_now(), max_native_delay=2, max_age=0))
    poller = start_poller()
    arrivals = collect(sqs, endpoint.input_url, expect=1, timeout=4 + SLACK + 2, linger=1.5)
    assert [a.body for a in arrivals] == ["keep me"]
    assert records.live("orders") == []  # applied, then deleted
    assert queue_depth(sqs, endpoint.delay_url) == 0 and queue_depth(sqs, endpoint.error_url) == 0
    seen = [r["attributes"]["MessageGroupId"] for e in poller.events for r in e["Records"]]
    assert seen.count("gone") == 1  # dropped at its first hop


def test_rescheduled_later_arrives_at_the_new_time_not_before(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    start = time.time()
    sender.send_delayed("orders", "later", 3, message_id="later")
    new_due = _now() + timedelta(seconds=7)
    records.put(reschedule_request("orders", "later", new_due, now=_now()))
    start_poller()
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=7 + SLACK + 2)
    assert new_due.timestamp() - EPSILON <= arrival.at <= new_due.timestamp() + SLACK, arrival.at - start
    assert records.live("orders") == []  # applied at the first hop; the message now carries the new delay


def test_rescheduled_earlier_arrives_at_the_new_time(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    sender.send_delayed("orders", "sooner", "1d", message_id="sooner")
    new_due = _now() + timedelta(seconds=5)
    records.put(reschedule_request("orders", "sooner", new_due, now=_now()))
    start_poller()
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=5 + SLACK + 2)
    assert new_due.timestamp() - EPSILON <= arrival.at <= new_due.timestamp() + SLACK


def test_a_message_inside_a_packed_envelope_is_cancelled_alone(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    ids = [f"p{i}" for i in range(4)]
    for message_id in ids:
        sender.send_delayed("orders", json.dumps({"id": message_id}), 9, message_id=message_id)
    poller = start_poller()
    deadline = time.monotonic() + 8
    while not _envelopes(poller.events) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _envelopes(poller.events), "the first hop did not pack the four messages"
    records.put(cancel_request("orders", "p1", now=_now(), max_native_delay=2, max_age=0))
    arrivals = collect(sqs, endpoint.input_url, expect=3, timeout=9 + SLACK + 2, linger=1)
    assert sorted(json.loads(a.body)["id"] for a in arrivals) == ["p0", "p2", "p3"]
    assert records.live("orders") == []


def _envelopes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for e in list(events) for r in e["Records"] if ENVELOPE_ATTRIBUTE in r["messageAttributes"]]


def test_an_unreachable_table_delays_nothing_and_is_reported(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    start_poller: StartPoller,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = time.time()
    sender.send_delayed("orders", "on time", 4, message_id="on-time")
    start_poller(dynamodb_client("http://127.0.0.1:9"))  # nothing listens there
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=4 + SLACK + 2)
    assert start + 4 - EPSILON <= arrival.at <= start + 4 + SLACK
    unavailable = [r for r in caplog.records if getattr(r, "event", None) == "cancellation_records_unavailable"]
    assert unavailable and "lookup failed" in unavailable[0].getMessage()
    assert "127.0.0.1:9" in str(getattr(unavailable[0], "reason", ""))


def test_an_unreadable_record_sends_its_one_message_to_the_error_queue(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    # #23: a naive requested_at raised TypeError in the lookup and failed every batch holding a message of the
    # endpoint, for as long as the record lived; a due time before 1970 or past 9000 is no time any reader can use
    expires = {"N": str(int(time.time()) + 3600)}
    requested = {"S": _now().isoformat()}
    bad = {
        "naive": {"kind": {"S": "cancel"}, "requested_at": {"S": "2030-01-01T00:00:00"}, "expires_at": expires},
        "old": {"kind": {"S": "reschedule"}, "requested_at": requested, "due_at": {"S": "1960-01-01T00:00:00Z"}},
        "odd": {"kind": {"S": "pause"}, "requested_at": requested, "expires_at": expires},
    }
    for message_id, fields in bad.items():
        sender.send_delayed("orders", f"held {message_id}", 4, message_id=message_id)
        item = {"endpoint": {"S": "orders"}, "message_id": {"S": message_id}, "expires_at": expires, **fields}
        records.client.put_item(TableName=records.table, Item=item)
    sender.send_delayed("orders", "on time", 4, message_id="neighbour")
    start_poller()
    arrivals = collect(sqs, endpoint.input_url, expect=1, timeout=4 + SLACK + 2, linger=1.5)
    assert [a.body for a in arrivals] == ["on time"]
    held = collect(sqs, endpoint.error_url, expect=3, timeout=5)
    reasons = {a.body: a.attributes["DelayedDelivery.FailureReason"]["StringValue"] for a in held}
    assert set(reasons) == {"held naive", "held old", "held odd"}
    assert "naive" in reasons["held naive"] and "1960-01-01" in reasons["held old"] and "pause" in reasons["held odd"]
    assert all("cannot be read" in reason for reason in reasons.values())
    assert records.live("orders") == []  # deleted once their messages were on the error queue
