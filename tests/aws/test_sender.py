"""The SQS sender against moto server: routes, exact attributes, the enablement matrix, bad input sends nothing."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.packing import content_fingerprint
from delayed_delivery.aws.queues import EndpointQueues, ensure_endpoint
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender, send_delayed
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, user_headers
from delayed_delivery.errors import (
    ConfigurationError,
    DelayedDeliveryDisabledError,
    DestinationNotFoundError,
    InvalidMessageError,
)
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from delayed_delivery.planning import SqsRoute
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import RequestCounter
from tests.aws.conftest import collect

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

ATTRIBUTES: dict[str, Any] = {
    "type": "Reminder",
    "count": 3,
    "ratio": 0.25,
    "blob": b"\x00\xffbinary",
    "custom": {"DataType": "String.json", "StringValue": '{"a": 1}'},
}
EXPECTED = {
    "type": {"DataType": "String", "StringValue": "Reminder"},
    "count": {"DataType": "Number", "StringValue": "3"},
    "ratio": {"DataType": "Number", "StringValue": "0.25"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xffbinary"},
    "custom": {"DataType": "String.json", "StringValue": '{"a": 1}'},
}


def _sends(counter: RequestCounter) -> int:
    return sum(n for op, n in counter.snapshot().items() if op.startswith("SendMessage"))


def test_short_delay_goes_native_with_exact_attributes(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    receipt = sender.send_delayed("orders", "hello", 1, attributes=ATTRIBUTES)
    assert receipt.route is SqsRoute.NATIVE and receipt.queue == "orders" and receipt.delay_seconds == 1
    delayed = sqs.get_queue_attributes(
        QueueUrl=endpoint.input_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )
    assert delayed["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=8)
    assert arrival.body == "hello"
    # Nothing lost, nothing added but the delivery header for the consumer (#16).
    assert user_headers(arrival.attributes) == EXPECTED
    assert decode_delivery(arrival.attributes[DELIVERY_HEADER]["StringValue"]).route == "native"


def test_long_delay_goes_to_the_delay_queue_with_control_attribute_and_ids(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    receipt = sender.send_delayed("orders", "later", timedelta(seconds=7), attributes={"k": "v"}, message_id="m-1")
    assert (receipt.route, receipt.queue, receipt.delay_seconds, receipt.fifo_cycles) == (
        SqsRoute.FIFO,
        "orders-delay.fifo",
        7,
        3,
    )
    reply = sqs.receive_message(
        QueueUrl=endpoint.delay_url,
        WaitTimeSeconds=5,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
    )
    [message] = reply["Messages"]
    assert message["Attributes"]["MessageGroupId"] == "m-1"
    fp = content_fingerprint("later", {"k": {"DataType": "String", "StringValue": "v"}})
    assert message["Attributes"]["MessageDeduplicationId"] == f"m-1:{fp}:0"
    assert message["MessageAttributes"][DELAY_SECONDS_ATTRIBUTE] == {"DataType": "Number", "StringValue": "7"}
    assert message["MessageAttributes"]["k"] == {"DataType": "String", "StringValue": "v"}
    assert sqs.receive_message(QueueUrl=endpoint.input_url).get("Messages", []) == []


def test_module_function_form(sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings) -> None:
    receipt = send_delayed(sqs, "orders", "x", "1h", settings=settings)
    assert receipt.route is SqsRoute.FIFO and receipt.delay_seconds == 3600


@pytest.mark.parametrize("delay", [0, 2])
def test_disabled_still_allows_native_delays(sqs: SQSClient, endpoint: EndpointQueues, delay: int) -> None:
    sender = SqsDelayedSender(
        sqs,
        DelayedDeliverySettings(enabled=False),
        sqs_settings=SqsSettings(max_native_delay=2, fifo_queue_delay=2, long_delay_route="fifo"),
    )
    assert sender.send_delayed("orders", "ok", delay).route is SqsRoute.NATIVE


def test_disabled_refuses_long_delays_before_sending(
    sqs: SQSClient, endpoint: EndpointQueues, counter: RequestCounter
) -> None:
    sender = SqsDelayedSender(
        sqs,
        DelayedDeliverySettings(enabled=False),
        sqs_settings=SqsSettings(max_native_delay=2, fifo_queue_delay=2, long_delay_route="fifo"),
    )
    counter.reset()
    with pytest.raises(DelayedDeliveryDisabledError, match="disabled"):
        sender.send_delayed("orders", "too long", 3)
    assert counter.total == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delay": -1}, InvalidMessageError, "negative"),
        ({"delay": math.nan}, InvalidMessageError, "NaN"),
        ({"delay": "soon"}, InvalidMessageError, "cannot read duration"),
        ({"delay": "200y"}, InvalidMessageError, "100-year"),
        ({"body": b"bytes"}, InvalidMessageError, "text"),
        ({"body": ""}, InvalidMessageError, "empty body"),
        ({"body": "x" * 2000}, InvalidMessageError, "MaximumMessageSize"),
        ({"body": "y" * 2000, "delay": 5}, InvalidMessageError, "MaximumMessageSize"),
        ({"destination": "nowhere"}, DestinationNotFoundError, "does not exist"),
        ({"destination": "no/such"}, ConfigurationError, "invalid SQS queue name"),
        ({"destination": "orders-delay.fifo"}, ConfigurationError, "FIFO"),
        ({"attributes": {f"a{i}": "v" for i in range(11)}}, InvalidMessageError, "at most 9"),
        ({"attributes": {f"a{i}": "v" for i in range(10)}}, InvalidMessageError, "delivery header"),  # #23
        ({"attributes": {f"a{i}": "v" for i in range(10)}, "delay": 5}, InvalidMessageError, "at most 9"),
        ({"body": "z" * 900, "attributes": {"a": "v" * 40}}, InvalidMessageError, "delivery header"),  # #23
        ({"attributes": {DELAY_SECONDS_ATTRIBUTE: "1"}}, InvalidMessageError, "reserved"),
        ({"attributes": {"AWS.trace": "1"}}, InvalidMessageError, "reserved"),
        ({"attributes": {"empty": ""}}, InvalidMessageError, "empty"),
        ({"attributes": {"flag": True}}, InvalidMessageError, "bool"),
        ({"message_id": "has space"}, InvalidMessageError, "printable"),
        ({"message_id": "x" * 129, "delay": 5}, InvalidMessageError, "1-128"),
    ],
)
def test_bad_input_raises_a_clear_error_and_sends_nothing(
    sqs: SQSClient,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    counter: RequestCounter,
    kwargs: dict[str, Any],
    error: type,
    match: str,
) -> None:
    ensure_endpoint(sqs, "orders", settings, sqs_settings=sqs_settings, max_message_size=1024)
    sender = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)
    call = {"destination": "orders", "body": "body", "delay": 1, **kwargs}
    destination, body, delay = call.pop("destination"), call.pop("body"), call.pop("delay")
    counter.reset()
    with pytest.raises(error, match=match):
        sender.send_delayed(destination, body, delay, **call)
    assert _sends(counter) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"body": "lone \ud800 surrogate"},
        {"body": "nul \x00 character", "delay": 5},
        {"attributes": {"a": "\udfff"}},
        {"attributes": {"a": {"DataType": "String", "StringValue": "\uffff"}}},
        {"attributes": {"a": {"DataType": "String.\ud800", "StringValue": "v"}}},
    ],
    ids=["body-surrogate", "body-nul-long-delay", "attribute-surrogate", "attribute-uffff", "datatype-surrogate"],
)
def test_text_sqs_refuses_is_invalid_before_anything_is_sent(
    sqs: SQSClient,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    counter: RequestCounter,
    kwargs: dict[str, Any],
) -> None:
    # found by tests/reliability/test_sender_fuzz.py: a lone surrogate leaked UnicodeEncodeError from the size check;
    # other characters SQS refuses were sent and refused by SQS (a single send) or listed in failures (a batch)
    ensure_endpoint(sqs, "orders", settings, sqs_settings=sqs_settings)
    sender = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)
    call = {"body": "body", "delay": 1, **kwargs}
    body, delay = call.pop("body"), call.pop("delay")
    counter.reset()
    with pytest.raises(InvalidMessageError, match="SQS refuses"):
        sender.send_delayed("orders", body, delay, **call)
    with pytest.raises(InvalidMessageError, match=r"message 1: .*SQS refuses"):
        sender.send_delayed_batch(
            [DelayedSend("orders", "fine", delay), DelayedSend("orders", body, delay, call.get("attributes"))]
        )
    assert _sends(counter) == 0


def test_max_message_size_is_read_from_the_queue(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    ensure_endpoint(sqs, "orders", settings, sqs_settings=sqs_settings, max_message_size=4096)
    sender = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)
    assert sender.send_delayed("orders", "z" * 3000, 1).route is SqsRoute.NATIVE  # over 1 KiB, under 4 KiB
    with pytest.raises(InvalidMessageError, match="4,096"):
        sender.send_delayed("orders", "z" * 4097, 1)


def test_batch_uses_one_request_per_ten_messages_per_queue(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    counter: RequestCounter,
) -> None:
    sender = SqsDelayedSender(
        sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0)
    )  # unpacked (packing: test_sender_packing.py)
    sender.directory.get("orders")
    sender.directory.get("orders-delay.fifo")
    counter.reset()
    messages = [DelayedSend("orders", f"n{i}", 1) for i in range(12)] + [
        DelayedSend("orders", f"f{i}", 30, message_id=f"fifo-{i}") for i in range(15)
    ]
    result = sender.send_delayed_batch(messages)
    assert result.ok and len(result.receipts) == 27
    assert counter.snapshot() == {"SendMessageBatch": 4}  # ceil(12/10) + ceil(15/10)
    assert {r.route for r in result.receipts if r.message_id.startswith("fifo-")} == {SqsRoute.FIFO}


def test_batch_respects_the_payload_limit(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings, counter: RequestCounter
) -> None:
    ensure_endpoint(sqs, "orders", settings, sqs_settings=sqs_settings)
    sender = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)
    sender.directory.get("orders")
    counter.reset()
    result = sender.send_delayed_batch([DelayedSend("orders", "p" * 300_000, 1) for _ in range(5)])
    assert result.ok
    assert counter.snapshot() == {"SendMessageBatch": 2}  # 3 × 300 kB fit under 1 MiB, then 2 more


def test_one_invalid_message_in_a_batch_sends_nothing(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, counter: RequestCounter
) -> None:
    counter.reset()
    with pytest.raises(InvalidMessageError, match="message 2: delay -5 is negative"):
        sender.send_delayed_batch(
            [DelayedSend("orders", "a", 1), DelayedSend("orders", "b", 30), DelayedSend("orders", "c", -5)]
        )
    assert _sends(counter) == 0
    with pytest.raises(InvalidMessageError, match="twice"):
        sender.send_delayed_batch(
            [DelayedSend("orders", "a", 1, message_id="d"), DelayedSend("orders", "b", 1, message_id="d")]
        )
    assert _sends(counter) == 0


class _WholeBatchRefusal:
    """SQS refusing a whole SendMessageBatch (400) that holds an oversized entry, as moto does (AWS and LocalStack
    fail that entry alone: tests/aws/test_sender_routes.py); single-entry batches go through."""

    def __init__(self, client: SQSClient) -> None:
        self.client = client
        self.batches: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def send_message_batch(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        self.batches.append(len(kwargs["Entries"]))
        if len(kwargs["Entries"]) > 1 and any(len(e["MessageBody"]) > 1024 for e in kwargs["Entries"]):
            error = {"Code": "InvalidParameterValue", "Message": "One or more parameters are invalid."}
            raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}, "SendMessageBatch")
        return self.client.send_message_batch(**kwargs)


def test_a_batch_rejected_as_a_whole_is_retried_entry_by_entry(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    from delayed_delivery.aws.sqs import send_batches
    from delayed_delivery.errors import PermanentError

    queues = ensure_endpoint(sqs, "orders", settings, sqs_settings=sqs_settings, max_message_size=1024)
    refusing = _WholeBatchRefusal(sqs)
    results = send_batches(
        refusing,  # type: ignore[arg-type]
        queues.input_url,
        [{"Id": "a", "MessageBody": "ok"}, {"Id": "b", "MessageBody": "x" * 2000}, {"Id": "c", "MessageBody": "ok"}],
        what="test",
    )
    assert results["a"].ok and results["c"].ok
    assert isinstance(results["b"].error, PermanentError) and not results["b"].error.retryable
    assert refusing.batches == [3, 1, 1, 1]  # the batch, then one per entry
    assert len(collect(sqs, queues.input_url, expect=2, timeout=5)) == 2


def test_a_sender_built_without_settings_honours_the_environment(
    sqs: SQSClient, endpoint: EndpointQueues, counter: RequestCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_ENABLED", "false")
    sender = SqsDelayedSender(sqs)
    assert sender.settings.enabled is False
    counter.reset()
    with pytest.raises(DelayedDeliveryDisabledError, match="disabled"):
        sender.send_delayed("orders", "forty days", "40d")
    with pytest.raises(DelayedDeliveryDisabledError, match="disabled"):
        send_delayed(sqs, "orders", "forty days", "40d")
    assert _sends(counter) == 0
    assert sender.send_delayed("orders", "native", 5).route is SqsRoute.NATIVE, "disabled still allows native delays"
    explicit = SqsDelayedSender(sqs, DelayedDeliverySettings())
    assert explicit.send_delayed("orders", "forty days", "40d").route is SqsRoute.FIFO, "explicit settings win"


def test_the_environment_is_read_when_the_sender_is_built_not_at_import(
    sqs: SQSClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_MAX_NATIVE_DELAY", "7")
    assert SqsDelayedSender(sqs).sqs_settings.max_native_delay == 7
    monkeypatch.setenv("DELAYED_DELIVERY_MAX_NATIVE_DELAY", "not a number")
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_MAX_NATIVE_DELAY"):
        SqsDelayedSender(sqs)


@pytest.mark.parametrize("name", ["DelayedDelivery.FailureReason", "DelayedDelivery.Envelope", "delayeddelivery.x"])
def test_reserved_attribute_names_are_refused_by_name(
    sqs: SQSClient,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    endpoint: EndpointQueues,
    counter: RequestCounter,
    name: str,
) -> None:
    counter.reset()
    with pytest.raises(InvalidMessageError, match=name.replace(".", r"\.") + ".*reserved"):
        SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings).send_delayed(
            "orders", "body", 5, attributes={name: "x"}
        )
    assert _sends(counter) == 0
