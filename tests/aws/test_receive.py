"""Send through each SQS route and read what arrives with the receive helpers (#16): id, body, due, hops, route."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.receive import delivered_from_boto3, delivered_from_sqs_record, observe_lateness
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.transport import SqsTransport
from delayed_delivery.delivery import DELIVERY_HEADER, DeliveredMessage
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore
from delayed_delivery.testing.aws import LocalEventSourcePoller

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

Poller = Callable[..., LocalEventSourcePoller]


def _receive(sqs: SQSClient, url: str, *, expect: int, timeout: float) -> list[dict[str, Any]]:
    """Receive (and delete) raw boto3 messages with every attribute until ``expect`` arrived or ``timeout``."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        )
        for m in reply.get("Messages", []):
            got.append(dict(m))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return got


def _lambda_record(message: dict[str, Any]) -> dict[str, Any]:
    """The Lambda event record the SQS event source would build from a boto3 message."""
    attributes = {
        name: {"dataType": value["DataType"], "stringValue": value["StringValue"]}
        for name, value in message.get("MessageAttributes", {}).items()
    }
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message["Attributes"],
        "messageAttributes": attributes,
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
    }


def _check(d: DeliveredMessage, *, message_id: str, body: bytes, due: float, route: str, hops: int | None) -> None:
    assert d.message_id == message_id
    assert d.body == body
    assert d.due_at is not None and abs(d.due_at.timestamp() - due) <= 1.0, (d.due_at, due)
    assert d.route == route
    if hops is None:
        assert d.hops is not None and d.hops >= 1
    else:
        assert d.hops == hops
    assert d.lateness_s is not None and d.lateness_s >= 0, d.lateness_s
    assert DELIVERY_HEADER not in d.headers


def test_native_send_reads_back_from_boto3_and_from_a_lambda_record(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    start = time.time()
    sender.send_delayed("orders", "native body", 1, message_id="n-1", attributes={"kind": "a"})
    [message] = _receive(sqs, endpoint.input_url, expect=1, timeout=8)
    from_boto3 = delivered_from_boto3(message, destination="orders")
    _check(from_boto3, message_id="n-1", body=b"native body", due=start + 1, route="native", hops=0)
    assert from_boto3.headers == {"kind": {"DataType": "String", "StringValue": "a"}}
    assert from_boto3.sent_at is not None and abs(from_boto3.sent_at.timestamp() - start) <= 1.0
    assert from_boto3.delay_s == pytest.approx(1.0, abs=0.01)
    assert from_boto3.broker_sent_at is not None and "broker_sent_at" in from_boto3.trusted
    record = _lambda_record(message)
    for form in (record, SQSRecord(record)):
        d = delivered_from_sqs_record(form)
        assert (d.message_id, d.due_at, d.route, d.headers) == (
            "n-1",
            from_boto3.due_at,
            "native",
            from_boto3.headers,
        )
        assert d.destination == "orders"


def test_fifo_forward_reads_back_with_its_hops(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    make_poller()
    start = time.time()
    sender.send_delayed("orders", "long body", 5, message_id="f-1", attributes={"kind": "b"})
    [message] = _receive(sqs, endpoint.input_url, expect=1, timeout=15)
    d = delivered_from_boto3(message, destination="orders")
    _check(d, message_id="f-1", body=b"long body", due=start + 5, route="fifo", hops=None)
    assert d.headers == {"kind": {"DataType": "String", "StringValue": "b"}}
    assert d.sent_at is not None and abs(d.sent_at.timestamp() - start) <= 1.0


def test_messages_unpacked_from_an_envelope_read_back_each_with_its_own_id(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    poller = make_poller()
    start = time.time()
    batch = [DelayedSend("orders", f"packed {i}", 4, {"i": str(i)}, f"p-{i}") for i in range(3)]
    result = sender.send_delayed_batch(batch)
    result.raise_for_failures()
    assert all(r.envelope_id is not None for r in result.receipts)  # they really travelled packed
    messages = _receive(sqs, endpoint.input_url, expect=3, timeout=15)
    got = {d.message_id: d for d in (delivered_from_boto3(m, destination="orders") for m in messages)}
    assert sorted(got) == ["p-0", "p-1", "p-2"]
    for i in range(3):
        _check(got[f"p-{i}"], message_id=f"p-{i}", body=f"packed {i}".encode(), due=start + 4, route="fifo", hops=None)
    assert poller.events


def test_store_route_reads_back_with_its_due_time(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    tmp_path: Path,
) -> None:
    store = SqliteDelayedMessageStore(tmp_path / "store.db")
    store.setup_infrastructure()
    message = DelayedMessage.create("orders", b"stored body", delay=0.5, headers={"t": "r"}, message_id="s-1")
    store.store(message)
    time.sleep(0.6)
    report = Dispatcher(store, SqsTransport(sqs, sqs_settings), settings=settings).dispatch_due(budget=5)
    assert report.dispatched == 1
    [received] = _receive(sqs, endpoint.input_url, expect=1, timeout=5)
    d = delivered_from_boto3(received, destination="orders")
    _check(d, message_id="s-1", body=b"stored body", due=message.due_at.timestamp(), route="store", hops=0)
    assert d.headers == {"t": {"DataType": "String", "StringValue": "r"}}
    assert d.sent_at is None and d.delay_s is None  # the store keeps no send time


def test_a_message_without_the_header_reads_with_unknown_fields_and_the_sqs_id(
    sqs: SQSClient, endpoint: EndpointQueues
) -> None:
    """Our senders refuse a tenth attribute (#23: the header needs it); a message sent to the queue directly, or a
    tier message written with ten before that, reads as it is: its own attributes, the SQS MessageId as id."""
    attributes = {f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(10)}
    sent = sqs.send_message(QueueUrl=endpoint.input_url, MessageBody="full", MessageAttributes=attributes)
    [message] = _receive(sqs, endpoint.input_url, expect=1, timeout=5)
    d = delivered_from_boto3(message)
    assert len(d.headers) == 10
    assert (d.due_at, d.sent_at, d.hops, d.route, d.lateness_s) == (None, None, None, None, None)
    assert d.message_id == sent["MessageId"] == message["MessageId"]  # the SQS id stands in


def test_a_forged_or_malformed_header_gives_unknown_fields_never_an_error() -> None:
    for value in ("v2;id=x;due=1", "v1;due=abc;hops=-1;route=teleport", "v1;id=%ff;due=" + "9" * 20, "x" * 600):
        message = {
            "MessageId": "sqs-1",
            "Body": "b",
            "Attributes": {"SentTimestamp": "1000", "ApproximateFirstReceiveTimestamp": "2000"},
            "MessageAttributes": {DELIVERY_HEADER: {"DataType": "String", "StringValue": value}},
        }
        d = delivered_from_boto3(message)
        assert d.due_at is None and d.route is None and d.hops is None, value
        assert d.message_id == "sqs-1"
        assert d.received_at == datetime.fromtimestamp(2, UTC)
    assert delivered_from_boto3({"MessageId": "bare", "Body": "b", "MessageAttributes": {"x": 3}}).headers == {}


def test_observe_lateness_adds_the_metric_and_logs_one_consumed_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    d = DeliveredMessage(
        message_id="m-1",
        body=b"x",
        headers={},
        due_at=datetime(2030, 1, 1, tzinfo=UTC),
        sent_at=datetime(2029, 12, 31, tzinfo=UTC),
        hops=3,
        route="fifo",
        received_at=datetime(2030, 1, 1, 0, 0, 2, 500_000, tzinfo=UTC),
        cloud="aws",
        destination="orders",
    )
    metrics = Metrics(namespace="ConsumerTest", service="consumer")
    with caplog.at_level(logging.INFO, logger="delayed_delivery.consumer"):
        assert observe_lateness(d, metrics) == 2.5
    metrics.flush_metrics()
    emf = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert emf["ConsumerLateness"] in (2.5, [2.5])
    assert emf["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "ConsumerLateness", "Unit": "Seconds"}]
    [line] = [r for r in caplog.records if r.getMessage() == "consumed"]
    fields = {k: getattr(line, k) for k in ("event", "cloud", "destination", "message_id", "due_at", "hop", "route")}
    assert fields == {
        "event": "consumed",
        "cloud": "aws",
        "destination": "orders",
        "message_id": "m-1",
        "due_at": "2030-01-01T00:00:00+00:00",
        "hop": 3,
        "route": "fifo",
    }
    assert (line.consumer_lateness_s, line.delay_s) == (2.5, 86_400.0)  # type: ignore[attr-defined]
