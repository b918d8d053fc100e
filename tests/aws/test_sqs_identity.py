"""One id, one message on SQS: the content fingerprint in the deduplication id (a retry of the same send is
deduplicated, another message under the same id is never dropped) and cancel / reschedule records bound to the
messages sent before the request (a record for an id nobody has pending never touches a message sent later)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.cancellations import (
    DynamoDbCancellationStore,
)
from delayed_delivery.aws.fifo_ids import deduplication_id, hop_of, sent_of
from delayed_delivery.aws.packing import PackedMessage, content_fingerprint, decode_envelope, envelope_body, envelope_id
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.cancellations import BINDING_ALLOWANCE, cancel_request, reschedule_request
from tests.aws.conftest import StartPoller, collect, queue_depth

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

SLACK = 3.5
FP = "0123456789ab"
#: 2026-01-01T00:00:00Z in epoch ms.
SENT_MS = 1_767_225_600_000


# --- the deduplication id ------------------------------------------------------------------------------------------


def test_the_first_send_carries_the_fingerprint_and_hop_zero() -> None:
    dedup = deduplication_id("order-1", 0, FP)
    assert dedup == f"order-1:{FP}:0"
    assert hop_of(dedup) == 0
    assert sent_of(dedup, "order-1") is None  # the sender does not know the broker's send time


def test_later_hops_carry_the_original_send_time() -> None:
    dedup = deduplication_id("order-1", 3, FP, SENT_MS)
    assert dedup.startswith(f"order-1:{FP}.") and dedup.endswith(":3")
    assert hop_of(dedup) == 3
    assert sent_of(dedup, "order-1") == SENT_MS


def test_legacy_ids_keep_their_hop_and_have_no_send_time() -> None:
    assert deduplication_id("order-1", 2) == "order-1:2"
    assert hop_of("order-1:2") == 2 and sent_of("order-1:2", "order-1") is None
    # An id that itself ends in what looks like a tag is not misread: the prefix must be the whole id.
    assert sent_of("a:0123456789ab.abc:4", "a:0123456789ab.abc") is None
    assert sent_of(None, "a") is None and sent_of("pack-" + "0" * 64, "a") is None


def test_ids_with_colons_and_long_ids_round_trip_within_128_characters() -> None:
    for message_id in ("a:b:c", "x" * 128, ":" * 100 + "!"):
        dedup = deduplication_id(message_id, 4_294_967_296, FP, SENT_MS)
        assert len(dedup) <= 128
        assert hop_of(dedup) == 4_294_967_296
        assert sent_of(dedup, message_id) == SENT_MS
        assert sent_of(dedup, message_id + "z") is None


def test_the_fingerprint_is_of_the_body_and_the_typed_attributes() -> None:
    attributes: dict[str, Any] = {
        "kind": {"DataType": "String", "StringValue": "order"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    }
    fp = content_fingerprint("body", attributes)
    assert len(fp) == 12 and int(fp, 16) >= 0
    assert content_fingerprint("body", dict(reversed(list(attributes.items())))) == fp  # order does not count
    assert content_fingerprint("body ", attributes) != fp
    assert content_fingerprint("body", {**attributes, "kind": {"DataType": "String", "StringValue": "other"}}) != fp
    assert content_fingerprint("body", {**attributes, "kind": {"DataType": "String.x", "StringValue": "order"}}) != fp
    assert content_fingerprint("body", {"kind": attributes["kind"]}) != fp
    assert content_fingerprint("body", {}) == content_fingerprint("body", None)


def test_envelopes_of_other_content_under_the_same_ids_have_other_ids() -> None:
    first = [PackedMessage("a", 0, 1000, "one", {}), PackedMessage("b", 0, 1000, "two", {})]
    again = [PackedMessage("a", 0, 1000, "one", {}), PackedMessage("b", 0, 1000, "two", {})]
    other = [PackedMessage("a", 0, 1000, "one", {}), PackedMessage("b", 0, 1000, "changed", {})]
    assert envelope_id(first) == envelope_id(again)
    assert envelope_id(first) != envelope_id(other)


def test_an_envelope_entry_carries_its_send_time_and_reads_without_one() -> None:
    sent = PackedMessage("a", 2, 1000, "one", {}, SENT_MS)
    legacy = PackedMessage("b", 2, 1000, "two", {})
    assert decode_envelope(envelope_body([sent, legacy])) == [sent, legacy]
    body = '{"v":1,"m":[{"i":"c","h":1,"d":5,"b":"x","s":"soon"}]}'  # a malformed time is read as unknown
    assert decode_envelope(body) == [PackedMessage("c", 1, 5, "x", {}, None)]


# --- binding a record to the messages sent before it ---------------------------------------------------------------


def test_a_record_binds_to_messages_sent_before_it_or_of_unknown_send_time() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    record = cancel_request("orders", "m", now=now, max_native_delay=900, max_age=60)
    assert record.binds(None)  # a message from an older requeue function: as before
    assert record.binds(now - timedelta(days=3))
    assert record.binds(now)
    assert record.binds(now + BINDING_ALLOWANCE)  # the broker's and the operator's clocks may differ a little
    assert not record.binds(now + BINDING_ALLOWANCE + timedelta(milliseconds=1))
    moved = reschedule_request("orders", "m", now + timedelta(days=1), now=now)
    assert moved.binds(now - timedelta(seconds=1)) and not moved.binds(now + timedelta(minutes=1))


# --- on moto --------------------------------------------------------------------------------------------------------


@pytest.mark.moto
def test_another_message_under_a_waiting_id_is_not_dropped(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    sender.send_delayed("orders", "first", "1d", message_id="dup")
    sender.send_delayed("orders", "second", "1d", message_id="dup")
    assert queue_depth(sqs, endpoint.delay_url) == 2


@pytest.mark.moto
def test_the_same_send_again_is_deduplicated(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    attributes = {"kind": "order"}
    sender.send_delayed("orders", "same", "1d", attributes=attributes, message_id="retry")
    sender.send_delayed("orders", "same", "1d", attributes=attributes, message_id="retry")
    assert queue_depth(sqs, endpoint.delay_url) == 1


@pytest.mark.moto
def test_a_batch_of_other_content_under_the_same_ids_is_not_dropped(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender
) -> None:
    ids = ("b1", "b2", "b3")
    sender.send_delayed_batch([DelayedSend("orders", f"v1 {i}", "1d", message_id=i) for i in ids]).raise_for_failures()
    sender.send_delayed_batch([DelayedSend("orders", f"v1 {i}", "1d", message_id=i) for i in ids]).raise_for_failures()
    assert queue_depth(sqs, endpoint.delay_url) == 1  # the same batch again: the same envelope
    sender.send_delayed_batch([DelayedSend("orders", f"v2 {i}", "1d", message_id=i) for i in ids]).raise_for_failures()
    assert queue_depth(sqs, endpoint.delay_url) == 2


@pytest.mark.moto
def test_a_cancel_for_an_id_nobody_has_pending_leaves_a_later_message_alone(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    records.put(cancel_request("orders", "ghost", now=datetime.now(UTC), max_native_delay=2, max_age=0))
    time.sleep(1.2)  # past the clock allowance: the message is certainly sent after the request
    sender.send_delayed("orders", "sent after the cancel", 5, message_id="ghost")
    sender.send_delayed("orders", "not named by any record", 5, message_id="other")
    start_poller()
    arrivals = collect(sqs, endpoint.input_url, expect=2, timeout=5 + SLACK + 2)
    assert sorted(a.body for a in arrivals) == ["not named by any record", "sent after the cancel"]
    assert [r.message_id for r in records.live("orders")] == ["ghost"]  # not applied: it binds to no message


@pytest.mark.moto
def test_a_reschedule_written_before_the_send_does_not_move_the_message(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    records: DynamoDbCancellationStore,
    start_poller: StartPoller,
) -> None:
    records.put(reschedule_request("orders", "early", datetime.now(UTC) + timedelta(hours=1), now=datetime.now(UTC)))
    time.sleep(1.2)
    start = time.time()
    sender.send_delayed("orders", "on time", 5, message_id="early")
    start_poller()
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=5 + SLACK + 2)
    assert arrival.at <= start + 5 + SLACK


def _envelope_outcomes(sqs: SQSClient, requested_at: datetime) -> dict[str, str]:
    """Run the requeue step on the golden re-packed envelope (hop 1, first sent at ``wire.SENT_MS``) with a cancel
    record for ``golden-batch-b`` requested at ``requested_at``: the outcome of each inner message."""
    from delayed_delivery.aws.requeue import FifoRequeuer
    from delayed_delivery.cancellations import CancellationCache, InMemoryCancellationStore
    from delayed_delivery.clock import ManualClock
    from tests.golden import wire

    wire.create_queues(sqs)
    [request] = wire.load("sqs_envelope.v3.json")["requeued"]["Entries"]
    first_ms = wire.SENT_MS + 60_000
    clock = ManualClock(datetime.fromtimestamp((first_ms + 50) / 1000, UTC))
    store = InMemoryCancellationStore()
    store.put(cancel_request("orders", "golden-batch-b", now=requested_at, max_native_delay=900, max_age=0))
    cache = CancellationCache(store, 0, clock=clock)
    requeuer = FifoRequeuer(sqs, sqs_settings=SqsSettings(max_park_seconds=0), clock=clock, cancellations=cache)
    record = wire.lambda_record(request, record_id="rec", sent_ms=wire.SENT_MS + 1_000, first_receive_ms=first_ms)
    [result] = requeuer.process([record])
    return {r.message_id: r.outcome.value for r in result.inner}


@pytest.mark.moto
def test_an_envelope_entry_is_cancelled_only_by_a_record_requested_after_its_first_send(sqs: SQSClient) -> None:
    from tests.golden import wire

    sent = datetime.fromtimestamp(wire.SENT_MS / 1000, UTC)
    before = _envelope_outcomes(sqs, sent - timedelta(seconds=5))
    assert before == {"golden-batch-a": "requeued", "golden-batch-b": "requeued", "golden-batch-c": "requeued"}
    after = _envelope_outcomes(sqs, sent + timedelta(seconds=5))
    assert after == {"golden-batch-a": "requeued", "golden-batch-b": "cancelled", "golden-batch-c": "requeued"}
