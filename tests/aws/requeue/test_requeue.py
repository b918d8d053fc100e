"""The FIFO-requeue Lambda end to end on moto server, driven by the local event source (time compressed 450×).

Compression: the 900 s native cap and FIFO hop are 2 s, so the seed's 845 s example is a 2 s native delay
and its 1,925 s example (two FIFO cycles, then a native remainder) is 5 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.fifo_ids import hop_of
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, user_headers
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.planning import SqsRoute
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller
from tests.aws.conftest import collect, queue_depth

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

#: Delivery may be late by the local poll (1 s long poll), the final ceil to whole seconds and a loaded CPU.
SLACK = 3.5
#: Timers and timestamps on one machine: "not early" allows this much measurement noise.
EPSILON = 0.25

Poller = Callable[..., LocalEventSourcePoller]


def _hops(poller: LocalEventSourcePoller, message_id: str) -> list[str]:
    """``<id>:<hop>`` of the records the handler saw for ``message_id``, in order (from their deduplication ids)."""
    return [
        f"{message_id}:{hop_of(r['attributes']['MessageDeduplicationId'])}"
        for event in poller.events
        for r in event["Records"]
        if r["attributes"]["MessageGroupId"] == message_id
    ]


def test_seed_845s_example_goes_straight_to_the_destination(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    poller = make_poller()
    start = time.time()
    receipt = sender.send_delayed("orders", "845", 2, message_id="m845")
    assert receipt.route is SqsRoute.NATIVE and receipt.fifo_cycles == 0
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=10)
    assert start + 2 - EPSILON <= arrival.at <= start + 2 + SLACK
    assert _hops(poller, "m845") == []  # no FIFO cycle, no control attribute
    assert DELAY_SECONDS_ATTRIBUTE not in arrival.attributes


def test_seed_1925s_example_two_fifo_cycles_then_native_remainder(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    poller = make_poller()
    start = time.time()
    receipt = sender.send_delayed("orders", "1925", 5, message_id="m1925", attributes={"kind": "seed"})
    assert (receipt.route, receipt.fifo_cycles) == (SqsRoute.FIFO, 2)
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=15)
    assert start + 5 - EPSILON <= arrival.at <= start + 5 + SLACK, arrival.at - start
    assert arrival.body == "1925"
    assert user_headers(arrival.attributes) == {"kind": {"DataType": "String", "StringValue": "seed"}}
    assert decode_delivery(arrival.attributes[DELIVERY_HEADER]["StringValue"]).message_id == "m1925"
    # Two cycles when each hop is picked up within 1 s of becoming visible (the plan above); a slower pickup
    # leaves less to wait, so the remainder may already fit natively after the first cycle (never early).
    assert _hops(poller, "m1925") in (["m1925:0", "m1925:1"], ["m1925:0"])


def test_many_hops_are_not_early_and_late_by_at_most_a_poll(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    poller = make_poller()
    start = time.time()
    receipt = sender.send_delayed("orders", "year", 11, message_id="year")
    assert receipt.fifo_cycles == 5  # planned with broker-exact hops; real hops take a little longer
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=25)
    assert start + 11 - EPSILON <= arrival.at <= start + 11 + SLACK, arrival.at - start
    hops = _hops(poller, "year")
    assert 2 <= len(hops) <= 5 and hops == [f"year:{h}" for h in range(len(hops))]  # fewer when polls lag


def test_duplicate_from_a_lost_delete_is_suppressed_by_the_per_hop_dedup_id(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    lost: list[str] = []

    def lose_first_delete(record: dict[str, Any]) -> bool:
        if not lost:
            lost.append(record["messageId"])
            return True
        return False

    poller = make_poller(lose_delete=lose_first_delete)
    # 7 s: the first hop is a requeue even if the poll lags by up to 3 s (a forward is at-least-once by design).
    sender.send_delayed("orders", "once", 7, message_id="dup")
    arrivals = collect(sqs, endpoint.input_url, expect=1, timeout=20, linger=3)
    seen = _hops(poller, "dup")
    assert [a.body for a in arrivals] == ["once"], seen
    assert seen.count("dup:0") == 2, seen  # the first hop really ran twice (the delete was lost)...
    assert seen.count("dup:1") == 1, seen  # ...but its re-send was dropped as a duplicate
    assert queue_depth(sqs, endpoint.delay_url) == 0


def _send_raw(
    sqs: SQSClient, endpoint: EndpointQueues, group: str, attributes: dict[str, Any], body: str = "raw"
) -> None:
    sqs.send_message(
        QueueUrl=endpoint.delay_url,
        MessageBody=body,
        MessageGroupId=group,
        MessageDeduplicationId=f"{group}:0",
        MessageAttributes=attributes,
    )


def _error_queue_url(sqs: SQSClient) -> str:
    return sqs.get_queue_url(QueueName="errors")["QueueUrl"]


POISON = {
    "missing": ({}, "missing control attribute"),
    "text": ({DELAY_SECONDS_ATTRIBUTE: {"DataType": "String", "StringValue": "soon"}}, "malformed control attribute"),
    "negative": ({DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": "-5"}}, "malformed control"),
    "binary": ({DELAY_SECONDS_ATTRIBUTE: {"DataType": "Binary", "BinaryValue": b"5"}}, "malformed control attribute"),
}


def test_poison_records_go_to_the_error_queue_with_a_reason_and_never_loop(
    sqs: SQSClient, endpoint: EndpointQueues, make_poller: Poller
) -> None:
    poller = make_poller()
    for group, (attributes, _) in POISON.items():
        _send_raw(sqs, endpoint, group, {**attributes, "keep": {"DataType": "String", "StringValue": "me"}}, body=group)
    errors = collect(sqs, _error_queue_url(sqs), expect=len(POISON), timeout=12, linger=3)
    assert sorted(e.body for e in errors) == sorted(POISON)
    for error in errors:
        assert POISON[error.body][1] in error.attributes[FAILURE_REASON]["StringValue"]
        assert error.attributes[ORIGINAL_DESTINATION]["StringValue"] == "orders"
        assert error.attributes["keep"]["StringValue"] == "me"
        assert _hops(poller, error.body) == [f"{error.body}:0"]  # handled once, not retried
    assert queue_depth(sqs, endpoint.delay_url) == 0
    assert queue_depth(sqs, endpoint.input_url) == 0


def test_destination_gone_goes_to_the_error_queue(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    sender.send_delayed("orders", "orphan", 3, message_id="orphan")
    sqs.delete_queue(QueueUrl=endpoint.input_url)
    make_poller()
    [error] = collect(sqs, _error_queue_url(sqs), expect=1, timeout=12, linger=2)
    assert "destination gone" in error.attributes[FAILURE_REASON]["StringValue"]
    assert queue_depth(sqs, endpoint.delay_url) == 0


def test_body_too_large_for_the_destination_goes_to_the_error_queue(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    sender.send_delayed("orders", "b" * 3000, 3, message_id="big")
    sqs.set_queue_attributes(QueueUrl=endpoint.input_url, Attributes={"MaximumMessageSize": "1024"})
    make_poller()
    [error] = collect(sqs, _error_queue_url(sqs), expect=1, timeout=12, linger=2)
    assert "too large" in error.attributes[FAILURE_REASON]["StringValue"]
    assert len(error.body) == 3000
    assert queue_depth(sqs, endpoint.input_url) == 0


def test_the_destination_cannot_be_chosen_by_message_content(
    sqs: SQSClient, endpoint: EndpointQueues, make_poller: Poller
) -> None:
    evil = sqs.create_queue(QueueName="evil")["QueueUrl"]
    make_poller()
    _send_raw(
        sqs,
        endpoint,
        "sneaky",
        {
            DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": "1"},
            ORIGINAL_DESTINATION: {"DataType": "String", "StringValue": "evil"},
            "destination": {"DataType": "String", "StringValue": "evil"},
            "QueueUrl": {"DataType": "String", "StringValue": evil},
        },
        body=json.dumps({"destination": "evil", "QueueUrl": evil}),
    )
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=10, linger=1)
    assert json.loads(arrival.body)["destination"] == "evil"  # delivered as data, to the owner of the FIFO queue
    assert queue_depth(sqs, evil) == 0


def test_many_messages_batched_all_arrive_in_order_of_due_time(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    make_poller: Poller,
) -> None:
    from delayed_delivery.aws.sender import DelayedSend

    poller = make_poller()
    start = time.time()
    sender = SqsDelayedSender(
        sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0)
    )  # one record per message: the event source batches them
    result = sender.send_delayed_batch(
        [DelayedSend("orders", str(delay), delay, message_id=f"b{i}") for i, delay in enumerate([3, 9, 5, 3, 7] * 6)]
    )
    assert result.ok
    arrivals = collect(sqs, endpoint.input_url, expect=30, timeout=30, linger=1)
    assert sorted(a.body for a in arrivals) == sorted(str(d) for d in [3, 9, 5, 3, 7] * 6)
    for a in arrivals:
        assert start + int(a.body) - EPSILON <= a.at <= start + int(a.body) + SLACK + 1, (a.body, a.at - start)
    assert max(len(e["Records"]) for e in poller.events) > 1  # records really came in batches
