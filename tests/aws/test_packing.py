"""Envelope packing: the format on its own, then packed hops end to end on moto server (time compressed)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError

from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.packing import (
    ENVELOPE_ATTRIBUTE,
    MAX_ENVELOPE_ENTRIES,
    BadItem,
    PackedMessage,
    decode_envelope,
    envelope_attributes,
    envelope_body,
    envelope_id,
    pack,
)
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.requeue import FifoRequeuer, HopOutcome
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.sqs import message_size, sqs_text_problem
from delayed_delivery.delivery import user_headers
from delayed_delivery.errors import ConfigurationError, InvalidMessageError
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller, lambda_sqs_record
from tests.aws.conftest import collect, handler_env, queue_depth

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

Poller = Callable[..., LocalEventSourcePoller]
SLACK = 3.5
EPSILON = 0.25


def _message(i: int, *, hop: int = 1, remaining_ms: int = 5000, size: int = 10) -> PackedMessage:
    attributes: dict[str, Any] = {
        "n": {"DataType": "Number", "StringValue": str(i)},
        "raw": {"DataType": "Binary", "BinaryValue": bytes([0, 255, i % 256])},
    }
    return PackedMessage(f"m{i}", hop, remaining_ms, f"body {i} ".ljust(size, "é"), attributes)


# --- the format --------------------------------------------------------------------------------------------


def test_an_envelope_round_trips_bodies_binary_attributes_hops_and_remaining_delays() -> None:
    messages = [_message(i, hop=i, remaining_ms=1000 * i + 7) for i in range(5)]
    decoded = decode_envelope(envelope_body(messages))
    assert decoded == messages


def test_envelope_ids_depend_on_the_set_of_messages_and_hops_only() -> None:
    a, b, c = _message(1), _message(2), _message(3)
    assert envelope_id([a, b]) == envelope_id([b, a])
    assert envelope_id([a, b]) != envelope_id([a, c])
    assert envelope_id([a, b]) != envelope_id([_message(1, hop=2), b])  # the next hop is a new id
    assert len(envelope_id([a, b])) <= 128


def test_pack_fills_envelopes_up_to_the_limit_and_leaves_oversized_or_lonely_messages_alone() -> None:
    messages = [_message(i, size=1000) for i in range(50)] + [_message(99, size=5000)]
    envelopes, alone = pack(messages, 8192)
    assert sum(len(e) for e in envelopes) + len(alone) == len(messages)
    for envelope in envelopes:
        assert len(envelope) >= 2
        assert message_size(envelope_body(envelope), envelope_attributes()) <= 8192
    assert _message(99, size=5000) in alone  # cannot share an 8 KiB envelope with anything
    assert len(envelopes) >= 50 // 8  # really packed, not one envelope per message
    assert pack(messages[:1], 65536) == ([], messages[:1])
    # Deterministic regardless of input order: a redelivered batch repeats its envelopes.
    assert pack(list(reversed(messages)), 8192) == pack(messages, 8192)


@pytest.mark.parametrize(
    "body",
    ["{not json", "[]", '{"v":2,"m":[{}]}', '{"v":1,"m":[]}', '{"v":1}', "null"],
)
def test_an_unreadable_envelope_raises_invalid_message(body: str) -> None:
    with pytest.raises(InvalidMessageError, match="malformed envelope"):
        decode_envelope(body)


def test_a_truncated_envelope_is_unreadable() -> None:
    with pytest.raises(InvalidMessageError, match="not JSON"):
        decode_envelope(envelope_body([_message(1), _message(2)])[:-7])


def test_a_bad_entry_is_isolated_from_its_siblings() -> None:
    good = json.loads(envelope_body([_message(1), _message(2)]))["m"]
    document = {"v": 1, "m": [good[0], {"i": "bad", "h": -1, "d": 5, "b": "x"}, 7, good[1]]}
    decoded = decode_envelope(json.dumps(document))
    assert decoded[0] == _message(1) and decoded[3] == _message(2)
    assert isinstance(decoded[1], BadItem) and "hop" in decoded[1].reason and decoded[1].message_id == "bad"
    assert isinstance(decoded[2], BadItem) and "not an object" in decoded[2].reason


def _entry(**changes: Any) -> dict[str, Any]:
    return {"i": "inner", "h": 1, "d": 5000, "b": "body", **changes}


def _decoded_alone(entry: dict[str, Any]) -> PackedMessage | BadItem:
    good = json.loads(envelope_body([_message(1)]))["m"][0]
    decoded = decode_envelope(json.dumps({"v": 1, "m": [good, entry]}, ensure_ascii=True))
    assert decoded[0] == _message(1)  # the sibling is unaffected
    return decoded[1]


@pytest.mark.parametrize(
    "name",
    [ENVELOPE_ATTRIBUTE, FAILURE_REASON, DELAY_SECONDS_ATTRIBUTE, "DelayedDelivery.Unreadable", "delayeddelivery.x"],
)
def test_an_inner_entry_with_a_reserved_attribute_is_a_bad_entry_never_an_envelope(name: str) -> None:
    item = _decoded_alone(_entry(a={name: ["String", "s", "1"]}))
    assert isinstance(item, BadItem) and name in item.reason and "reserved" in item.reason
    assert item.message_id == "inner"


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"d": 10**400}, "100-year"),
        ({"d": 36_525 * 86_400_000 + 1}, "100-year"),
        ({"h": 10**400}, "hop"),
        ({"b": "lone \ud800"}, "SQS refuses"),
        ({"b": "nul \x00"}, "SQS refuses"),
        ({"b": "\uffff"}, "SQS refuses"),
        ({"a": {"k": ["String", "s", "\x01"]}}, "SQS refuses"),
        ({"a": {"k": ["String.\ud800", "s", "v"]}}, "SQS refuses"),
    ],
    ids=["d-1e400", "d-100y+1ms", "h-1e400", "body-surrogate", "body-nul", "body-uffff", "attr-ctrl", "type-surr"],
)
def test_an_inner_entry_out_of_bounds_or_with_text_sqs_refuses_is_a_bad_entry(
    changes: dict[str, Any], needle: str
) -> None:
    item = _decoded_alone(_entry(**changes))
    assert isinstance(item, BadItem) and needle in item.reason, item


def test_an_envelope_with_too_many_entries_is_rejected_whole() -> None:
    entries = [_entry(i=f"m{i}") for i in range(MAX_ENVELOPE_ENTRIES + 1)]
    with pytest.raises(InvalidMessageError, match=f"more than {MAX_ENVELOPE_ENTRIES}"):
        decode_envelope(json.dumps({"v": 1, "m": entries}))
    assert len(decode_envelope(json.dumps({"v": 1, "m": entries[:-1]}))) == MAX_ENVELOPE_ENTRIES


def test_a_deeply_nested_envelope_is_rejected_with_a_reason_not_recursion_error() -> None:
    with pytest.raises(InvalidMessageError, match=r"malformed envelope.*nest"):
        decode_envelope('{"v":1,"m":[' + "[" * 5000 + "]" * 5000 + "]}")


def test_pack_never_puts_more_than_the_decoder_accepts_in_one_envelope() -> None:
    tiny = [PackedMessage(f"m{i:04d}", 0, 901_000, "x", {}) for i in range(MAX_ENVELOPE_ENTRIES * 2 + 3)]
    envelopes, alone = pack(tiny, 262_144)
    assert max(len(e) for e in envelopes) == MAX_ENVELOPE_ENTRIES
    assert sum(len(e) for e in envelopes) + len(alone) == len(tiny)
    for envelope in envelopes:
        assert decode_envelope(envelope_body(envelope)) == envelope


def test_sqs_text_problem_names_the_character_or_returns_none() -> None:
    assert sqs_text_problem("fine \t\n\r é 🎉") is None
    problem = sqs_text_problem("a\x00b")
    assert problem is not None and "'\\x00' at 1" in problem and "SQS refuses" in problem


def test_pack_bytes_setting_is_validated() -> None:
    assert AwsConfig.from_env({}).sqs_settings.pack_bytes == 65536
    assert AwsConfig.from_env({"DELAYED_DELIVERY_PACK_BYTES": "0"}).sqs_settings.pack_bytes == 0
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_PACK_BYTES"):
        AwsConfig.from_env({"DELAYED_DELIVERY_PACK_BYTES": "-1"})
    with pytest.raises(ConfigurationError, match="pack_bytes"):
        SqsSettings(pack_bytes=-5)
    with pytest.raises(ConfigurationError, match="pack_bytes"):
        SqsSettings(pack_bytes=True)  # type: ignore[arg-type]


# --- on moto server ----------------------------------------------------------------------------------------


def _envelopes(poller: LocalEventSourcePoller) -> list[list[str]]:
    """Inner message ids of every envelope record the handler saw."""
    return [
        [m["i"] for m in json.loads(r["body"])["m"]]
        for e in poller.events
        for r in e["Records"]
        if ENVELOPE_ATTRIBUTE in r["messageAttributes"]
    ]


@pytest.mark.moto
def test_packed_hops_deliver_every_message_intact_not_early_and_within_a_poll(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, make_poller: Poller
) -> None:
    poller = make_poller()
    delays = [5, 7, 9] * 8
    start = time.time()
    result = sender.send_delayed_batch(
        [
            DelayedSend("orders", f"{d} {i}", d, message_id=f"p{i}", attributes={"i": i, "b": bytes([i, 0])})
            for i, d in enumerate(delays)
        ]
    )
    assert result.ok
    arrivals = collect(sqs, endpoint.input_url, expect=len(delays), timeout=40, linger=1)
    assert sorted(a.body for a in arrivals) == sorted(f"{d} {i}" for i, d in enumerate(delays))
    for a in arrivals:
        due = start + int(a.body.split()[0])
        assert due - EPSILON <= a.at <= due + SLACK, (a.body, a.at - start)
        i = int(a.body.split()[1])
        assert user_headers(a.attributes) == {
            "i": {"DataType": "Number", "StringValue": str(i)},
            "b": {"DataType": "Binary", "BinaryValue": bytes([i, 0])},
        }
    envelopes = _envelopes(poller)
    assert envelopes and max(len(e) for e in envelopes) >= 2  # hops really travelled packed
    assert queue_depth(sqs, endpoint.delay_url) == 0


@pytest.mark.moto
def test_a_failed_envelope_send_loses_nothing(
    sqs: SQSClient,
    moto_endpoint: str,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    sender: SqsDelayedSender,
) -> None:
    flaky = boto3.client(
        "sqs", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )
    failures: list[int] = []
    lock = threading.Lock()

    def fail_first_envelope(params: dict[str, Any], **_: Any) -> None:
        packed = [e for e in params.get("Entries", []) if ENVELOPE_ATTRIBUTE in e.get("MessageAttributes", {})]
        with lock:
            if packed and not failures:
                failures.append(len(packed))
                raise EndpointConnectionError(endpoint_url=moto_endpoint)

    flaky.meta.events.register("before-parameter-build.sqs.SendMessageBatch", fail_first_envelope)
    poller = LocalEventSourcePoller(
        sqs,
        endpoint.delay_url,
        endpoint.delay_arn,
        build_handler(handler_env(settings, sqs_settings), sqs_client=flaky),
    ).start()
    try:
        assert sender.send_delayed_batch([DelayedSend("orders", f"f{i}", 6, message_id=f"f{i}") for i in range(10)]).ok
        arrivals = collect(sqs, endpoint.input_url, expect=10, timeout=40, linger=2)
    finally:
        poller.stop()
    assert failures == [1]  # one envelope send really failed...
    # ...its records were reported failed (or, when the whole batch failed, the invocation) and came back.
    assert poller.stats.failed + poller.stats.handler_errors >= 1
    assert {a.body for a in arrivals} == {f"f{i}" for i in range(10)}  # nothing lost
    assert poller.stats.poll_errors == 0


def _send_envelope(sqs: SQSClient, endpoint: EndpointQueues, body: str, group: str = "env") -> None:
    sqs.send_message(
        QueueUrl=endpoint.delay_url,
        MessageBody=body,
        MessageGroupId=group,
        MessageDeduplicationId=group,
        MessageAttributes=envelope_attributes(),
    )


@pytest.mark.moto
def test_a_poison_inner_message_goes_to_the_error_queue_alone(
    sqs: SQSClient, endpoint: EndpointQueues, make_poller: Poller
) -> None:
    make_poller()
    good = json.loads(envelope_body([_message(1, remaining_ms=2500), _message(2, remaining_ms=5000)]))["m"]
    bad = {"i": "poison", "h": 1, "d": "soon", "b": "poison body", "a": {"k": ["String", "s", "v"]}}
    start = time.time()
    _send_envelope(sqs, endpoint, json.dumps({"v": 1, "m": [good[0], bad, good[1]]}))
    errors_url = sqs.get_queue_url(QueueName="errors")["QueueUrl"]
    [error] = collect(sqs, errors_url, expect=1, timeout=15)
    assert error.body == "poison body"
    assert "remaining delay" in error.attributes[FAILURE_REASON]["StringValue"]
    assert error.attributes[ORIGINAL_DESTINATION]["StringValue"] == "orders"
    arrivals = collect(sqs, endpoint.input_url, expect=2, timeout=20, linger=1)
    assert sorted(a.body for a in arrivals) == sorted([_message(1).body, _message(2).body])
    # Each sibling kept its own remaining delay (counted from the envelope's send): 2.5 s and 5 s.
    for a in arrivals:
        due = start + (2.5 if a.body == _message(1).body else 5)
        assert due - EPSILON <= a.at <= due + SLACK, (a.body, a.at - start)
        assert DELAY_SECONDS_ATTRIBUTE not in a.attributes and ENVELOPE_ATTRIBUTE not in a.attributes
    assert queue_depth(sqs, endpoint.delay_url) == 0


@pytest.mark.moto
def test_garbage_and_truncated_envelopes_go_to_the_error_queue_with_a_reason(
    sqs: SQSClient, endpoint: EndpointQueues, make_poller: Poller
) -> None:
    make_poller()
    truncated = envelope_body([_message(1), _message(2)])[:-9]
    _send_envelope(sqs, endpoint, "garbage!", group="g1")
    _send_envelope(sqs, endpoint, truncated, group="g2")
    errors_url = sqs.get_queue_url(QueueName="errors")["QueueUrl"]
    errors = collect(sqs, errors_url, expect=2, timeout=15, linger=2)
    assert sorted(e.body for e in errors) == sorted(["garbage!", truncated])
    for e in errors:
        assert e.attributes[FAILURE_REASON]["StringValue"].startswith("malformed envelope")
    assert queue_depth(sqs, endpoint.delay_url) == 0
    assert queue_depth(sqs, endpoint.input_url) == 0


@pytest.mark.moto
def test_a_repeated_batch_repacks_into_the_same_envelope_which_fifo_drops(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    sqs.set_queue_attributes(QueueUrl=endpoint.delay_url, Attributes={"DelaySeconds": "0"})
    unpacked = SqsDelayedSender(
        sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0)
    )  # plain first-hop records, packed by the requeuer
    assert unpacked.send_delayed_batch([DelayedSend("orders", f"d{i}", 3600, message_id=f"d{i}") for i in range(4)]).ok
    received: dict[str, Any] = {}
    for _ in range(10):
        reply = sqs.receive_message(
            QueueUrl=endpoint.delay_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], AttributeNames=["All"]
        )
        received.update({m["MessageId"]: m for m in reply.get("Messages", [])})
        if len(received) >= 4:
            break
    records = [lambda_sqs_record(m, endpoint.delay_arn, "us-east-1") for m in received.values()]
    assert len(records) == 4
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings)
    first = requeuer.process(records)
    again = requeuer.process(records)  # the same batch handled again (e.g. lost deletes)
    assert [r.outcome for r in first + again] == [HopOutcome.REQUEUED] * 8
    ids = {r.envelope_id for r in first + again}
    assert len(ids) == 1 and next(iter(ids)) is not None  # one envelope, one deduplication id
    for m in received.values():
        sqs.delete_message(QueueUrl=endpoint.delay_url, ReceiptHandle=m["ReceiptHandle"])
    reply = sqs.receive_message(
        QueueUrl=endpoint.delay_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )
    [envelope] = reply["Messages"]  # the second send was dropped as a duplicate
    inner = decode_envelope(envelope["Body"])
    assert sorted(m.message_id for m in inner if isinstance(m, PackedMessage)) == ["d0", "d1", "d2", "d3"]
    assert all(isinstance(m, PackedMessage) and m.hop == 1 and 3590_000 < m.remaining_ms <= 3600_000 for m in inner)


@pytest.mark.moto
def test_packing_off_requeues_one_record_per_message(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    sqs.set_queue_attributes(QueueUrl=endpoint.delay_url, Attributes={"DelaySeconds": "0"})
    unpacked = SqsDelayedSender(
        sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0)
    )  # plain first-hop records, packed by the requeuer
    assert unpacked.send_delayed_batch([DelayedSend("orders", f"o{i}", 3600, message_id=f"o{i}") for i in range(3)]).ok
    reply = sqs.receive_message(
        QueueUrl=endpoint.delay_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], AttributeNames=["All"]
    )
    records = [lambda_sqs_record(m, endpoint.delay_arn, "us-east-1") for m in reply["Messages"]]
    hopping = sqs_settings.with_(max_park_seconds=0, pack_bytes=0)  # with parking on, lone plain records park
    results = FifoRequeuer(sqs, settings, sqs_settings=hopping).process(records)
    assert records and all(r.outcome is HopOutcome.REQUEUED and r.envelope_id is None for r in results)
