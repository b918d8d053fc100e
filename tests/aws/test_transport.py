"""``SqsTransport`` implements the core ``Transport`` port: a core dispatcher delivers through it to moto."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from delayed_delivery import DelayedMessage, Dispatcher, InMemoryDelayedMessageStore, ManualClock, Transport
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.transport import SqsTransport
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, user_headers
from delayed_delivery.errors import DestinationNotFoundError, InvalidMessageError, PermanentError
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.settings import DelayedDeliverySettings
from tests.aws.conftest import collect

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


def test_is_a_transport(sqs: SQSClient) -> None:
    assert isinstance(SqsTransport(sqs), Transport)


def test_dispatcher_delivers_due_messages_and_moves_unknown_destinations_to_the_error_queue(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    clock = ManualClock()
    store = InMemoryDelayedMessageStore()
    store.store(DelayedMessage.create("orders", b"due", delay=10, headers={"type": "Reminder"}, clock=clock))
    store.store(DelayedMessage.create("gone", b"lost?", delay=10, clock=clock))
    clock.advance(11)
    dispatcher = Dispatcher(store, SqsTransport(sqs, sqs_settings, clock=clock), settings=settings, clock=clock)
    dispatcher.dispatch_due(budget=5)
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=5)
    assert arrival.body == "due"
    assert user_headers(arrival.attributes) == {"type": {"DataType": "String", "StringValue": "Reminder"}}
    assert decode_delivery(arrival.attributes[DELIVERY_HEADER]["StringValue"]).route == "store"
    [error] = collect(sqs, endpoint.error_url, expect=1, timeout=5)
    assert error.body == "lost?"
    assert error.attributes[ORIGINAL_DESTINATION]["StringValue"] == "gone"
    assert "DestinationNotFoundError" in error.attributes[FAILURE_REASON]["StringValue"]
    assert store.next_due() is None


def test_nearly_due_message_is_handed_over_with_native_delay(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    clock = ManualClock()
    transport = SqsTransport(sqs, sqs_settings, clock=clock)
    transport.send(DelayedMessage.create("orders", b"soon", delay=timedelta(seconds=1.5), clock=clock))
    attrs = sqs.get_queue_attributes(QueueUrl=endpoint.input_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert attrs["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    with pytest.raises(InvalidMessageError, match="only send due"):
        transport.send(DelayedMessage.create("orders", b"later", delay=60, clock=clock))


def test_errors_are_typed(sqs: SQSClient, endpoint: EndpointQueues) -> None:
    transport = SqsTransport(sqs)
    with pytest.raises(DestinationNotFoundError):
        transport.send(DelayedMessage.create("nowhere", b"x", delay=0))
    with pytest.raises(PermanentError, match="UTF-8"):
        transport.send(DelayedMessage.create("orders", b"\xff\xfe", delay=0))
    with pytest.raises(PermanentError, match="at most 10"):
        transport.send(DelayedMessage.create("orders", b"x", delay=0, headers={f"h{i}": "v" for i in range(11)}))
