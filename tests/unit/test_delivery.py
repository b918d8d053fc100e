"""The ``DelayedDelivery.Delivery`` header: written bounded, read totally (malformed gives unknown fields)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery.delivery import (
    MAX_DELIVERY_CHARS,
    DeliveredMessage,
    DeliveryInfo,
    consumed_fields,
    decode_delivery,
    encode_delivery,
    longest_delivery,
    occurrence_of,
    user_headers,
)


def test_a_header_reads_back_what_was_written() -> None:
    text = encode_delivery(
        message_id="order-17", due_ms=1_767_225_600_000, sent_ms=1_767_139_200_000, hops=3, route="fifo"
    )
    assert text == "v1;id=order-17;due=1767225600000;sent=1767139200000;hops=3;route=fifo"
    assert decode_delivery(text) == DeliveryInfo("order-17", 1_767_225_600_000, 1_767_139_200_000, 3, "fifo")


@pytest.mark.parametrize("message_id", ["a;b=c", "100%", "ünï ✓", "x" * 128, ";id=forged"])
def test_ids_with_separators_or_any_text_are_escaped(message_id: str) -> None:
    text = encode_delivery(message_id=message_id, due_ms=5, route="store")
    assert len(text) <= MAX_DELIVERY_CHARS
    assert decode_delivery(text) == DeliveryInfo(message_id, 5, None, 0, "store")


def test_an_id_too_long_to_fit_is_left_out_and_the_rest_kept() -> None:
    text = encode_delivery(message_id="\U0001f600" * 200, due_ms=7, route="table")  # longer than any id may be
    assert len(text) <= MAX_DELIVERY_CHARS
    assert decode_delivery(text) == DeliveryInfo(None, 7, None, 0, "table")


@pytest.mark.parametrize("message_id", ["\U0001f600" * 128, "é" * 128, "%" * 128, "x" * 128])
def test_every_id_a_message_may_have_travels_in_the_header(message_id: str) -> None:
    """Before #23 an id of 128 non-ASCII characters was left out (512 characters at most), so the receive helpers
    fell back to the broker's id, which changes when a message is sent again."""
    longest = longest_delivery(message_id)
    assert len(longest) <= MAX_DELIVERY_CHARS
    assert decode_delivery(longest).message_id == message_id
    text = encode_delivery(message_id=message_id, due_ms=1, sent_ms=2, hops=3, route="buckets")
    assert decode_delivery(text).message_id == message_id
    assert len(text) <= len(longest)


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "",
        "v2;id=a;due=1",
        "v1;due=-5;sent=1e3;hops=x;route=teleport",
        "v1;due=" + "9" * 16,
        "v1;id=%ff%fe",
        "v1;" + "a" * MAX_DELIVERY_CHARS,
        "v1;;;===;due",
    ],
)
def test_anything_malformed_reads_as_unknown_never_an_error(value: object) -> None:
    info = decode_delivery(value)
    assert (info.due_ms, info.sent_ms, info.hops, info.route) == (None, None, None, None)
    assert info.message_id is None


def test_delivered_message_lateness_delay_and_log_fields() -> None:
    due = datetime(2030, 1, 1, tzinfo=UTC)
    d = DeliveredMessage.build(
        fallback_id="broker-id",
        body=b"b",
        headers={"DelayedDelivery.Delivery": "x", "k": "v"},
        info=DeliveryInfo(
            None, int(due.timestamp() * 1000), int((due - timedelta(hours=2)).timestamp() * 1000), 4, "fifo"
        ),
        received_at=due + timedelta(seconds=1.5),
        cloud="aws",
        destination="orders",
    )
    assert (d.message_id, d.headers, d.lateness_s, d.delay_s) == ("broker-id", {"k": "v"}, 1.5, 7200.0)
    assert consumed_fields(d) == {
        "event": "consumed",
        "cloud": "aws",
        "destination": "orders",
        "message_id": "broker-id",
        "due_at": "2030-01-01T00:00:00+00:00",
        "sent_at": "2029-12-31T22:00:00+00:00",
        "hop": 4,
        "route": "fifo",
        "consumer_lateness_s": 1.5,
        "delay_s": 7200.0,
        "schedule_id": None,
        "occurrence": None,
    }
    assert user_headers({"delayeddelivery.x": "1", "DelayedDelivery.Delivery": "2", "a": "3"}) == {"a": "3"}


OCCURRENCE_ID = "sched-42@2027-03-14T07:30:00Z"
NAMES = {"DelayedDelivery.ScheduleId": "sched-42", "DelayedDelivery.Occurrence": "2027-03-14T07:30:00Z"}


@pytest.mark.parametrize(
    "headers",
    [NAMES, {k: {"DataType": "String", "StringValue": v} for k, v in NAMES.items()}],  # Azure envelope, SQS attribute
)
def test_an_occurrence_is_read_from_its_headers_and_logged_on_its_consumed_line(headers: dict[str, object]) -> None:
    d = DeliveredMessage.build(
        fallback_id=OCCURRENCE_ID, body=b"", headers={**headers, "k": "v"}, info=DeliveryInfo(),
        received_at=None, cloud="azure",
    )  # fmt: skip
    assert (d.schedule_id, d.occurrence_at) == ("sched-42", datetime(2027, 3, 14, 7, 30, tzinfo=UTC))
    assert d.headers == {"k": "v"}
    fields = consumed_fields(d)
    assert (fields["schedule_id"], fields["occurrence"]) == ("sched-42", "2027-03-14T07:30:00Z")


@pytest.mark.parametrize(
    ("message_id", "headers"),
    [
        ("sched-42@2027-03-14T07:31:00Z", NAMES),  # another instant than the id's
        ("other@2027-03-14T07:30:00Z", NAMES),  # another schedule than the id's
        ("plain-message", NAMES),
        (OCCURRENCE_ID, {"DelayedDelivery.ScheduleId": "sched-42"}),
        (OCCURRENCE_ID, {**NAMES, "DelayedDelivery.Occurrence": "2027-03-14 07:30:00"}),
        ("sched-42@2027-02-30T07:30:00Z", {**NAMES, "DelayedDelivery.Occurrence": "2027-02-30T07:30:00Z"}),
        ("s" * 101 + "@2027-03-14T07:30:00Z", {**NAMES, "DelayedDelivery.ScheduleId": "s" * 101}),
        (OCCURRENCE_ID, {**NAMES, "DelayedDelivery.Occurrence": {"DataType": "Binary", "BinaryValue": b"x"}}),
        (OCCURRENCE_ID, {**NAMES, "DelayedDelivery.ScheduleId": 42}),
    ],
)
def test_anything_else_is_not_an_occurrence(message_id: str, headers: dict[str, object]) -> None:
    assert occurrence_of(message_id, headers) == (None, None)
