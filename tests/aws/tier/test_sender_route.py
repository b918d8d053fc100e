"""The sender's bucket route on moto: long delays go packed to the ingest queue, with every input check kept."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.sqs import message_size
from delayed_delivery.aws.tier import sender as bucket_sender
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE, decode_ingest
from delayed_delivery.clock import ManualClock
from delayed_delivery.cost import choose_long_delay_route
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.errors import ConfigurationError, DestinationNotFoundError, InvalidMessageError
from delayed_delivery.planning import SqsRoute
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import RequestCounter
from delayed_delivery.timebuckets.format import BucketMessage

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

NOW = datetime(2031, 2, 3, 4, 5, 6, 789_000, tzinfo=UTC)
DAY = 86_400


def _settings(route: str = "buckets") -> SqsSettings:
    return SqsSettings(max_native_delay=2, fifo_queue_delay=2, long_delay_route=route, bucket_ingest_queue="ingest")


def _queues(sqs: SQSClient, *names: str) -> dict[str, str]:
    fifo = {"FifoQueue": "true"}  # AWS refuses a name ending in .fifo without it
    return {
        name: sqs.create_queue(QueueName=name, Attributes=fifo if name.endswith(".fifo") else {})["QueueUrl"]
        for name in names
    }


def _sender(sqs: SQSClient, route: str = "buckets") -> SqsDelayedSender:
    settings = DelayedDeliverySettings(error_queue="errors")
    return SqsDelayedSender(sqs, settings, sqs_settings=_settings(route), clock=ManualClock(NOW))


def _ingested(sqs: SQSClient, url: str) -> tuple[list[dict[str, Any]], list[BucketMessage]]:
    raw: list[dict[str, Any]] = []
    while True:
        reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
        if not reply.get("Messages"):
            break
        raw += reply["Messages"]
        for m in reply["Messages"]:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    decoded: list[BucketMessage] = []
    for m in raw:
        assert m["MessageAttributes"][INGEST_ATTRIBUTE] == {"DataType": "String", "StringValue": "1"}
        items = decode_ingest(m["Body"])
        assert all(isinstance(i, BucketMessage) for i in items)
        decoded += [i for i in items if isinstance(i, BucketMessage)]
    return raw, decoded


def test_send_delayed_40d_goes_to_the_ingest_queue_due_40_days_later(sqs: SQSClient) -> None:
    urls = _queues(sqs, "orders", "ingest")
    attributes = {"kind": "order", "blob": b"\x00\xff", "n": 7}
    receipt = _sender(sqs).send_delayed("orders", "hello ✓", "40d", attributes=attributes, message_id="m-40d")
    assert (receipt.route, receipt.queue, receipt.destination) == (SqsRoute.BUCKETS, "ingest", "orders")
    assert (receipt.delay_seconds, receipt.fifo_cycles, receipt.envelope_id) == (40 * DAY, 0, None)
    assert receipt.sqs_message_id
    raw, [message] = _ingested(sqs, urls["ingest"])
    assert raw[0]["MessageId"] == receipt.sqs_message_id
    assert message.message_id == "m-40d" and message.destination == "orders" and message.body == "hello ✓".encode()
    assert message.due_at_ms == epoch_ms(NOW + timedelta(days=40)) and message.sent_at_ms == epoch_ms(NOW)
    assert dict(message.attributes) == {
        "kind": {"DataType": "String", "StringValue": "order"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        "n": {"DataType": "Number", "StringValue": "7"},
    }
    assert sqs.receive_message(QueueUrl=urls["orders"]).get("Messages") is None


def test_short_delays_stay_native_on_the_bucket_route(sqs: SQSClient) -> None:
    urls = _queues(sqs, "orders", "ingest")
    receipt = _sender(sqs).send_delayed("orders", "soon", 2)
    assert (receipt.route, receipt.queue) == (SqsRoute.NATIVE, "orders")
    assert _ingested(sqs, urls["ingest"]) == ([], [])


def test_a_batch_packs_mixed_destinations_into_envelopes_of_64_kib(sqs: SQSClient) -> None:
    urls = _queues(sqs, "orders", "payments", "ingest")
    counter = RequestCounter().attach(sqs)
    delays = ["40d", "2y", "3h", 5]
    batch = [
        DelayedSend("orders" if n % 2 else "payments", f"{n:04}" + "x" * 1_000, delays[n % 4], {"n": n}, f"id-{n:03}")
        for n in range(200)
    ]
    result = _sender(sqs).send_delayed_batch(batch)
    assert result.ok and [r.message_id for r in result.receipts] == [m.message_id for m in batch]
    assert {r.route for r in result.receipts} == {SqsRoute.BUCKETS}
    assert counter.requests["SendMessageBatch"] == 1  # 4 envelopes of ~60 KiB fit one batch call
    raw, messages = _ingested(sqs, urls["ingest"])
    assert len(raw) == 4 and len({r.sqs_message_id for r in result.receipts}) == 4
    assert all(message_size(m["Body"], m["MessageAttributes"]) <= 65_536 for m in raw)
    assert sorted(m.message_id for m in messages) == [m.message_id for m in batch]
    due = {m.message_id: m.due_at_ms - epoch_ms(NOW) for m in messages}
    assert due["id-000"] == 40 * DAY * 1000 and due["id-001"] == 2 * 36_525 * DAY * 10  # 2y: a year is 365.25 days
    assert due["id-002"] == 3 * 3600 * 1000 and due["id-003"] == 5_000
    assert {m.destination for m in messages} == {"orders", "payments"}


def test_many_envelopes_go_in_send_message_batch_calls_of_10(sqs: SQSClient) -> None:
    urls = _queues(sqs, "orders", "ingest")
    counter = RequestCounter().attach(sqs)
    batch = [DelayedSend("orders", "y" * 30_000, "40d", None, f"big-{n:02}") for n in range(24)]
    assert _sender(sqs).send_delayed_batch(batch).ok
    assert counter.requests["SendMessageBatch"] == 2  # 12 envelopes of two messages: 10 + 2
    raw, messages = _ingested(sqs, urls["ingest"])
    assert len(raw) == 12 and len(messages) == 24


def test_bad_input_is_refused_before_anything_is_sent(sqs: SQSClient) -> None:
    urls = _queues(sqs, "orders", "orders.fifo", "ingest")
    sender = _sender(sqs)
    with pytest.raises(DestinationNotFoundError):
        sender.send_delayed("missing", "x", "40d")
    with pytest.raises(InvalidMessageError, match="reserved"):
        sender.send_delayed("orders", "x", "40d", attributes={"DelayedDelivery.Ingest": "1"})
    with pytest.raises(InvalidMessageError, match="at most 9"):
        sender.send_delayed("orders", "x", "40d", attributes={f"a{n}": "v" for n in range(11)})
    with pytest.raises(InvalidMessageError, match="delivery header"):  # before #23 the timer left the header out
        sender.send_delayed("orders", "x", "40d", attributes={f"a{n}": "v" for n in range(10)})
    with pytest.raises(ConfigurationError, match="FIFO queue"):
        sender.send_delayed("orders.fifo", "x", "40d")
    with pytest.raises(InvalidMessageError, match="SQS refuses"):
        sender.send_delayed("orders", "\ud800", "40d")
    good = DelayedSend("orders", "fine", "40d", None, "good")
    with pytest.raises(InvalidMessageError, match="message 1"):
        sender.send_delayed_batch([good, DelayedSend("orders", "", "40d")])
    assert _ingested(sqs, urls["ingest"]) == ([], [])
    receipt = sender.send_delayed("orders", "x", "40d", attributes={f"a{n}": "v" for n in range(9)})
    assert receipt.route is SqsRoute.BUCKETS  # nine attributes and the delivery header the timer adds


def test_a_message_over_the_ingest_queue_limit_is_refused(sqs: SQSClient) -> None:
    sqs.create_queue(QueueName="orders")
    sqs.create_queue(QueueName="ingest", Attributes={"MaximumMessageSize": "1024"})
    with pytest.raises(InvalidMessageError, match="ingest queue 'ingest' accepts at most 1,024"):
        _sender(sqs).send_delayed("orders", "z" * 1_000, "40d")


def test_a_missing_ingest_queue_is_one_clear_error(sqs: SQSClient) -> None:
    _queues(sqs, "orders")
    with pytest.raises(ConfigurationError) as raised:
        _sender(sqs).send_delayed("orders", "x", "40d")
    text = str(raised.value)
    assert "'ingest'" in text and "bucket_ingest_queue" in text and "delayed-delivery aws create" in text
    assert "DELAYED_DELIVERY_BUCKET_INGEST_QUEUE" in text


def test_auto_is_the_default_and_fifo_one_setting_away(sqs: SQSClient) -> None:
    _queues(sqs, "orders", "ingest")
    sqs.create_queue(QueueName="orders-delay.fifo", Attributes={"FifoQueue": "true", "DelaySeconds": "2"})
    assert SqsSettings().long_delay_route == "auto"
    assert SqsSettings.from_env({"DELAYED_DELIVERY_LONG_DELAY_ROUTE": "fifo"}).long_delay_route == "fifo"
    receipt = _sender(sqs, "fifo").send_delayed("orders", "x", "40d")
    assert (receipt.route, receipt.queue) == (SqsRoute.FIFO, "orders-delay.fifo")


def test_auto_takes_the_fifo_route_while_the_tier_is_not_deployed(
    sqs: SQSClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    urls = _queues(sqs, "orders")
    sqs.create_queue(QueueName="orders-delay.fifo", Attributes={"FifoQueue": "true", "DelaySeconds": "2"})
    monkeypatch.setattr(bucket_sender, "choose_long_delay_route", lambda *_, **__: "buckets")  # the tier is cheaper
    clock = ManualClock(NOW)
    settings = DelayedDeliverySettings(error_queue="errors")
    sender = SqsDelayedSender(sqs, settings, sqs_settings=_settings("auto"), clock=clock)
    with caplog.at_level("WARNING", logger=bucket_sender.__name__):
        first = sender.send_delayed("orders", "x", "40d")
        second = sender.send_delayed("orders", "y", "40d")
    assert first.route is second.route is SqsRoute.FIFO  # no ingest queue: the FIFO route, nothing refused
    [line] = [r for r in caplog.records if r.name == bucket_sender.__name__]
    assert line.event == "route_fallback" and "ingest queue is not there" in line.getMessage()
    urls |= _queues(sqs, "ingest")  # the tier is deployed: auto finds it at its next look
    assert sender.send_delayed("orders", "z", "40d").route is SqsRoute.FIFO
    clock.advance(bucket_sender.TIER_RECHECK_SECONDS)
    assert sender.send_delayed("orders", "w", "40d").route is SqsRoute.BUCKETS
    assert len(_ingested(sqs, urls["ingest"])[1]) == 1
    sqs.delete_queue(QueueUrl=urls["ingest"])
    with pytest.raises(ConfigurationError, match="bucket_ingest_queue"):  # buckets asked for: no fallback
        _sender(sqs).send_delayed("orders", "v", "40d")


def test_auto_takes_the_fifo_route_when_the_sender_may_not_see_the_ingest_queue(
    sqs: SQSClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.exceptions import ClientError

    _queues(sqs, "orders", "ingest")
    sqs.create_queue(QueueName="orders-delay.fifo", Attributes={"FifoQueue": "true", "DelaySeconds": "2"})
    monkeypatch.setattr(bucket_sender, "choose_long_delay_route", lambda *_, **__: "buckets")  # the tier is cheaper

    def deny_the_ingest_queue(params: dict[str, Any], **_: Any) -> None:
        if params.get("QueueName") == "ingest":  # IAM scoped to the sender's own queues answers AccessDenied
            error = {
                "Error": {"Code": "AccessDenied", "Message": "not yours"},
                "ResponseMetadata": {"HTTPStatusCode": 403},
            }
            raise ClientError(error, "GetQueueUrl")  # type: ignore[arg-type]

    sqs.meta.events.register("provide-client-params.sqs.GetQueueUrl", deny_the_ingest_queue)
    try:
        sender = SqsDelayedSender(
            sqs, DelayedDeliverySettings(error_queue="errors"), sqs_settings=_settings("auto"), clock=ManualClock(NOW)
        )
        assert sender.send_delayed("orders", "x", "40d").route is SqsRoute.FIFO
    finally:
        sqs.meta.events.unregister("provide-client-params.sqs.GetQueueUrl", deny_the_ingest_queue)


def test_auto_follows_the_cost_model(sqs: SQSClient, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = _queues(sqs, "orders", "ingest")
    sqs.create_queue(QueueName="orders-delay.fifo", Attributes={"FifoQueue": "true", "DelaySeconds": "2"})
    expected = choose_long_delay_route(40 * DAY, max_native_delay=2)
    receipt = _sender(sqs, "auto").send_delayed("orders", "x", "40d")
    assert receipt.route.value == expected
    asked: list[float] = []

    def fifo_wins(delay: float, *_: Any, **__: Any) -> str:
        asked.append(delay)
        return "fifo"

    monkeypatch.setattr(bucket_sender, "choose_long_delay_route", fifo_wins)
    assert _sender(sqs, "auto").send_delayed("orders", "x", "3h").route is SqsRoute.FIFO
    assert asked == [3 * 3600]
    if expected == "buckets":
        assert len(_ingested(sqs, urls["ingest"])[1]) == 1


def test_auto_prices_the_tier_at_the_traffic_set(sqs: SQSClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from delayed_delivery.cost import load_measured_figures
    from delayed_delivery.timebuckets.cost import estimate_bucket_cost
    from tests.timebuckets.test_cost import MEASURED_AT

    _queues(sqs, "orders", "ingest")
    sqs.create_queue(QueueName="orders-delay.fifo", Attributes={"FifoQueue": "true", "DelaySeconds": "2"})
    figures = replace(load_measured_figures(), buckets=MEASURED_AT[1_000], buckets_by_traffic=MEASURED_AT)
    monkeypatch.setattr(bucket_sender, "load_measured_figures", lambda: figures)
    parked = figures.parked_estimate(3 * DAY).dollars
    assert estimate_bucket_cost(3 * DAY, counts=figures.bucket_counts(10)).dollars > parked  # 10 a minute: fifo
    assert estimate_bucket_cost(3 * DAY, counts=figures.bucket_counts(10_000)).dollars < parked  # 10,000: tier
    settings = DelayedDeliverySettings(error_queue="errors")
    for rate, route in ((10, SqsRoute.FIFO), (10_000, SqsRoute.BUCKETS)):
        routing = _settings("auto").with_(auto_traffic_per_minute=rate)
        sender = SqsDelayedSender(sqs, settings, sqs_settings=routing, clock=ManualClock(NOW))
        assert sender.send_delayed("orders", "x", "3d").route is route, rate
    assert SqsSettings.from_env({"DELAYED_DELIVERY_AUTO_TRAFFIC_PER_MINUTE": "250"}).auto_traffic_per_minute == 250
    with pytest.raises(ConfigurationError, match="AUTO_TRAFFIC_PER_MINUTE"):
        SqsSettings(auto_traffic_per_minute=0)


def test_a_refused_envelope_fails_every_message_inside(sqs: SQSClient) -> None:
    _queues(sqs, "orders", "ingest")
    sender = _sender(sqs)
    sender.buckets.ingest_queue()  # cached: the queue then disappears
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="ingest")["QueueUrl"])
    result = sender.send_delayed_batch([DelayedSend("orders", "x", "40d", None, f"m{n}") for n in range(3)])
    assert sorted(result.failures) == ["m0", "m1", "m2"] and not result.receipts
    assert json.dumps(sorted(type(e).__name__ for e in result.failures.values())) == json.dumps(
        ["DestinationNotFoundError"] * 3
    )
