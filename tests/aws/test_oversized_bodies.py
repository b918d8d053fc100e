"""A body bigger than its SQS destination takes (#15 finding 7: 2 MB stored through the store route) goes to the
error queue at its due time, cut to fit with the reason giving its size, instead of being retried forever."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from delayed_delivery import DelayedMessage, Dispatcher, InMemoryDelayedMessageStore, ManualClock
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.transport import SqsTransport
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.settings import DelayedDeliverySettings
from tests.aws.conftest import collect

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


def test_oversized_body_is_moved_to_the_error_queue_cut_to_fit(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    attrs = sqs.get_queue_attributes(QueueUrl=endpoint.input_url, AttributeNames=["MaximumMessageSize"])
    limit = int(attrs["Attributes"]["MaximumMessageSize"])
    size = 2 * 1024 * 1024
    assert size > limit
    clock = ManualClock()
    store = InMemoryDelayedMessageStore()
    store.store(DelayedMessage.create("orders", b"x" * size, delay=10, message_id="big", clock=clock))
    clock.advance(11)
    dispatcher = Dispatcher(store, SqsTransport(sqs, sqs_settings, clock=clock), settings=settings, clock=clock)
    report = dispatcher.dispatch_due(budget=5)
    assert report.moved_to_error_queue == 1
    assert store.next_due() is None
    [error] = collect(sqs, endpoint.error_url, expect=1, timeout=5)
    reason = error.attributes[FAILURE_REASON]["StringValue"]
    assert "PermanentError" in reason and f"body of {size:,} bytes cut to fit" in reason
    assert error.attributes[ORIGINAL_DESTINATION]["StringValue"] == "orders"
    assert limit - 1024 < len(error.body) < limit and set(error.body) == {"x"}
    assert collect(sqs, endpoint.input_url, expect=0, timeout=1) == []
