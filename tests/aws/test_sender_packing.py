"""Sender-side packing: ``send_delayed_batch`` puts long delays into envelopes on the first hop (moto server).

Time is compressed as in the other AWS tests: the 900 s native cap and FIFO hop are 2 s.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE, PackedMessage, content_fingerprint, decode_envelope
from delayed_delivery.aws.queues import EndpointQueues, ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.delivery import user_headers
from delayed_delivery.errors import ConfigurationError, PermanentError, TransientError
from delayed_delivery.planning import SqsRoute
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller, RequestCounter
from tests.aws.conftest import collect, handler_env, queue_depth

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

SLACK = 3.5
EPSILON = 0.25


def _client(endpoint_url: str) -> SQSClient:
    return boto3.client(
        "sqs", endpoint_url=endpoint_url, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )


def _drain_delay_queue(sqs: SQSClient, url: str, expect: int) -> list[Any]:
    """Receive ``expect`` records from a ``-delay.fifo`` queue whose queue delay was set to 0."""
    got: dict[str, Any] = {}
    deadline = time.monotonic() + 10
    while len(got) < expect and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
        )
        got.update({m["MessageId"]: m for m in reply.get("Messages", [])})
    return list(got.values())


def test_long_delays_to_one_destination_travel_in_one_envelope_short_ones_stay_native(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    counter: RequestCounter,
) -> None:
    sqs.set_queue_attributes(QueueUrl=endpoint.delay_url, Attributes={"DelaySeconds": "0"})
    sender = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)
    sender.directory.get("orders")
    sender.directory.get("orders-delay.fifo")
    counter.reset()
    long = [DelayedSend("orders", f"long {i}", 3600 + i, message_id=f"L{i}", attributes={"i": i}) for i in range(25)]
    short = [DelayedSend("orders", f"short {i}", 1, message_id=f"S{i}") for i in range(3)]
    result = sender.send_delayed_batch(long + short)
    assert result.ok and [r.message_id for r in result.receipts] == [m.message_id for m in long + short]
    assert counter.snapshot() == {"SendMessageBatch": 2}  # one envelope request, one native request
    packed = [r for r in result.receipts if r.route is SqsRoute.FIFO]
    assert len({r.envelope_id for r in packed}) == 1 and packed[0].envelope_id is not None
    assert len({r.sqs_message_id for r in packed}) == 1  # the envelope's SQS message id
    assert all(r.envelope_id is None for r in result.receipts if r.route is SqsRoute.NATIVE)
    [record] = _drain_delay_queue(sqs, endpoint.delay_url, 1)
    assert record["MessageAttributes"][ENVELOPE_ATTRIBUTE]["StringValue"] == "1"
    assert record["Attributes"]["MessageDeduplicationId"] == packed[0].envelope_id
    inner = decode_envelope(record["Body"])
    assert inner == [
        PackedMessage(f"L{i}", 0, (3600 + i) * 1000, f"long {i}", {"i": {"DataType": "Number", "StringValue": str(i)}})
        for i in sorted(range(25), key=lambda i: f"L{i}")
    ]


def test_envelopes_respect_the_configured_size_and_a_lone_long_delay_is_not_packed(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    sqs.set_queue_attributes(QueueUrl=endpoint.delay_url, Attributes={"DelaySeconds": "0"})
    sender = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=4096))
    result = sender.send_delayed_batch(
        [DelayedSend("orders", "x" * 900, 3600, message_id=f"b{i}") for i in range(10)]
        + [DelayedSend("orders", "y" * 5000, 3600, message_id="big")]
    )
    assert result.ok
    records = _drain_delay_queue(sqs, endpoint.delay_url, 4)
    envelopes = [r for r in records if ENVELOPE_ATTRIBUTE in r.get("MessageAttributes", {})]
    assert len(envelopes) == 3 and all(len(r["Body"]) <= 4096 for r in envelopes)  # 4 + 4 + 2 messages of 900 B
    [alone] = [r for r in records if r not in envelopes]
    fp = content_fingerprint("y" * 5000, {})
    assert alone["Attributes"]["MessageDeduplicationId"] == f"big:{fp}:0"  # too big to share: sent as before
    assert (
        SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)
        .send_delayed("orders", "one", 3600, message_id="one")
        .envelope_id
        is None
    )
    with pytest.raises(ConfigurationError):
        SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=-1))


def _collect_all(sqs: SQSClient, queues: dict[str, EndpointQueues], expect: int, linger: float) -> dict[str, Any]:
    """Collect from every destination at once (one thread each), so no arrival waits for another queue's turn."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(queues)) as pool:
        futures = {
            name: pool.submit(collect, sqs, q.input_url, expect=expect, timeout=30, linger=linger)
            for name, q in queues.items()
        }
        return {name: f.result() for name, f in futures.items()}


def _poller(
    sqs: SQSClient, queues: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> LocalEventSourcePoller:
    handler = build_handler(handler_env(settings, sqs_settings), sqs_client=sqs)
    return LocalEventSourcePoller(sqs, queues.delay_url, queues.delay_arn, handler).start()


def test_packed_first_hops_deliver_every_message_once_and_never_early(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    """Two destinations, mixed delays: the sender packs, the requeue handler unpacks and re-packs, all arrive once."""
    queues = {
        name: ensure_endpoint(sqs, name, settings, sqs_settings=sqs_settings, visibility_timeout=2)
        for name in ("orders", "billing")
    }
    pollers = [_poller(sqs, q, settings, sqs_settings) for q in queues.values()]
    delays = [1, 3, 5, 8] * 6
    messages = [
        DelayedSend(name, f"{name} {d} {i}", d, message_id=f"{name}-{i}", attributes={"b": bytes([i, 255])})
        for name in queues
        for i, d in enumerate(delays)
    ]
    try:
        start = time.time()
        result = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings).send_delayed_batch(messages)
        assert result.ok
        assert len({r.envelope_id for r in result.receipts if r.envelope_id}) == 2  # one envelope per destination
        arrivals = _collect_all(sqs, queues, len(delays), linger=2)
    finally:
        for p in pollers:
            p.stop()
    for name, got in arrivals.items():
        assert sorted(a.body for a in got) == sorted(f"{name} {d} {i}" for i, d in enumerate(delays))  # once each
        for a in got:
            due = start + int(a.body.split()[1])
            assert due - EPSILON <= a.at <= due + SLACK, (a.body, a.at - start)
            assert user_headers(a.attributes) == {
                "b": {"DataType": "Binary", "BinaryValue": bytes([int(a.body.split()[2]), 255])}
            }
    for p in pollers:
        first_hop = [r for e in p.events for r in e["Records"] if r["attributes"]["MessageDeduplicationId"]]
        assert any(ENVELOPE_ATTRIBUTE in r["messageAttributes"] for r in first_hop)
        assert (p.stats.handler_errors, p.stats.poll_errors, p.stats.failed) == (0, 0, 0)
    for q in queues.values():
        assert queue_depth(sqs, q.delay_url) == 0


def test_a_failed_envelope_is_reported_by_message_id_and_resending_the_batch_duplicates_nothing(
    sqs: SQSClient, moto_endpoint: str, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    """``orders``: SQS took the envelope but the reply was lost; ``billing``: the request never arrived."""
    queues = {
        name: ensure_endpoint(sqs, name, settings, sqs_settings=sqs_settings, visibility_timeout=2)
        for name in ("orders", "billing")
    }
    flaky = _client(moto_endpoint)
    broken = {"before": "billing-delay.fifo", "after": "orders-delay.fifo"}
    lock = threading.Lock()

    def fail_before(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        url = str(params.get("QueueUrl", ""))
        with lock:
            if broken.get("before") and url.endswith(broken["before"]):
                raise EndpointConnectionError(endpoint_url=moto_endpoint)
            context["lose_reply"] = bool(broken.get("after")) and url.endswith(broken["after"])

    def fail_after(context: dict[str, Any], **_: Any) -> None:
        if context.get("lose_reply"):  # SQS has accepted the request; the caller never hears so
            raise ReadTimeoutError(endpoint_url=moto_endpoint)

    flaky.meta.events.register("before-parameter-build.sqs.SendMessageBatch", fail_before)
    flaky.meta.events.register("after-call.sqs.SendMessageBatch", fail_after)
    sender = SqsDelayedSender(flaky, settings, sqs_settings=sqs_settings)
    delays = [4, 6] * 5
    batch = [
        DelayedSend(name, f"{name} {d} {i}", d, message_id=f"{name}-{i}")
        for name in queues
        for i, d in enumerate(delays)
    ]
    pollers = [_poller(sqs, q, settings, sqs_settings) for q in queues.values()]
    try:
        start = time.time()
        first = sender.send_delayed_batch(batch)
        assert sorted(first.failures) == sorted(m.message_id for m in batch)  # every message of both envelopes
        assert all(isinstance(e, TransientError) for e in first.failures.values())
        with pytest.raises(TransientError, match=r"20 of 20 messages were not accepted") as raised:
            first.raise_for_failures()
        assert "orders-3" in str(raised.value) and "billing-7" in str(raised.value)
        with lock:
            broken.clear()
        again = sender.send_delayed_batch(batch)  # the caller retries the whole batch, as told
        assert again.ok
        again.raise_for_failures()  # nothing to raise
        arrivals = _collect_all(sqs, queues, len(delays), linger=3)
    finally:
        for p in pollers:
            p.stop()
    for name, got in arrivals.items():
        # orders' first envelope was accepted, so the resend was dropped by FIFO deduplication: still once each.
        assert sorted(a.body for a in got) == sorted(f"{name} {d} {i}" for i, d in enumerate(delays))
        for a in got:
            assert a.at >= start + int(a.body.split()[1]) - EPSILON


def test_raise_for_failures_names_a_permanent_refusal() -> None:
    from delayed_delivery.aws.sender import BatchSendResult

    result = BatchSendResult((), {"a": PermanentError("too big"), "b": PermanentError("too big")})
    with pytest.raises(PermanentError, match=r"2 of 2 messages were not accepted.*a: too big; b: too big"):
        result.raise_for_failures()
    mixed = BatchSendResult((), {"a": PermanentError("no"), "b": TransientError("later")})
    with pytest.raises(TransientError):
        mixed.raise_for_failures()
    assert json.dumps(sorted(mixed.failures)) == '["a", "b"]'
