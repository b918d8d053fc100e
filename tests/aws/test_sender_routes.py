"""The sender on every route (native, -delay.fifo plain and packed, the tier's ingest queue, auto): text SQS refuses
is refused before anything is sent, and an entry SQS fails inside a successful batch is that message's failure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.durations import Delay
from delayed_delivery.errors import InvalidMessageError, PermanentError, TransientError
from delayed_delivery.planning import SqsRoute
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import RequestCounter
from tests.fixtures.partial_batch import PartialBatch

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

#: route name -> (long_delay_route, delay, the queue it goes to, pack_bytes)
ROUTES: dict[str, tuple[str, Delay, str, int]] = {
    "native": ("fifo", 1, "orders", 0),
    "delay-fifo": ("fifo", 10, "orders-delay.fifo", 0),
    "delay-fifo-packed": ("fifo", 10, "orders-delay.fifo", 65_536),
    "buckets": ("buckets", "40d", "ingest", 0),
    "auto": ("auto", "2y", "ingest", 0),
}
#: Just outside SQS's set (#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF), and just inside it.
REFUSED = ["\x00", "\x08", "\x0b", "\x0c", "\x1f", "\ud800", "\udfff", "\ufffe", "\uffff"]
ALLOWED = "\t\n\r \x7f\ud7ff\ue000\ufffd\U00010000\U0010ffff"


def _sender(sqs: Any, route: str) -> SqsDelayedSender:
    long_route, _, _, pack = ROUTES[route]
    sqs_settings = SqsSettings(
        max_native_delay=2,
        fifo_queue_delay=2,
        long_delay_route=long_route,
        bucket_ingest_queue="ingest",
        pack_bytes=pack,
    )
    return SqsDelayedSender(sqs, DelayedDeliverySettings(error_queue="errors"), sqs_settings=sqs_settings)


@pytest.fixture
def queues(sqs: SQSClient) -> None:
    ensure_endpoint(sqs, "orders", DelayedDeliverySettings(error_queue="errors"))
    sqs.create_queue(QueueName="ingest")


def _sends(counter: RequestCounter) -> int:
    return sum(n for op, n in counter.snapshot().items() if op.startswith("SendMessage"))


@pytest.mark.parametrize("route", list(ROUTES))
def test_text_sqs_refuses_is_refused_on_every_route_before_anything_is_sent(
    sqs: SQSClient, queues: None, route: str
) -> None:
    sender, delay, queue = _sender(sqs, route), ROUTES[route][1], ROUTES[route][2]
    counter = RequestCounter().attach(sqs)
    for bad in REFUSED:
        for where, body, attributes in (("body", f"a{bad}b", None), ("attribute", "x", {"k": f"a{bad}b"})):
            with pytest.raises(InvalidMessageError, match=r"SQS refuses") as raised:
                sender.send_delayed("orders", body, delay, attributes=attributes)
            assert (where == "body") == ("the body" in str(raised.value)), (route, repr(bad), str(raised.value))
            batch = [DelayedSend("orders", "fine", delay), DelayedSend("orders", body, delay, attributes)]
            with pytest.raises(InvalidMessageError, match=r"message 1: .*SQS refuses"):
                sender.send_delayed_batch(batch)
    assert _sends(counter) == 0
    receipt = sender.send_delayed("orders", f"edges {ALLOWED}", delay, attributes={"k": ALLOWED})
    assert receipt.queue == queue and _sends(counter) == 1  # the edges inside the set go out


@pytest.mark.parametrize("route", list(ROUTES))
def test_an_entry_failed_inside_a_successful_batch_fails_only_its_messages(
    sqs: SQSClient, queues: None, route: str
) -> None:
    # AWS fails one entry of a SendMessageBatch and sends the others (moto refuses the whole batch): the stand-in
    # answers as LocalStack does for a body SQS refuses, InvalidMessageContents with SenderFault false.
    queue = ROUTES[route][2]
    refusing = PartialBatch(sqs, lambda e: "bad" in e["MessageBody"], queue=f"/{queue}")
    sender, delay = _sender(refusing, route), ROUTES[route][1]
    messages = [DelayedSend("orders", body, delay, message_id=f"m-{body}") for body in ("good-1", "bad", "good-2")]
    result = sender.send_delayed_batch(messages)
    packed = route in ("delay-fifo-packed", "buckets", "auto")  # one envelope carries all three: all three fail
    refused = {"m-good-1", "m-bad", "m-good-2"} if packed else {"m-bad"}
    assert set(result.failures) == refused and refusing.failed
    assert all(isinstance(e, PermanentError) and "InvalidMessageContents" in str(e) for e in result.failures.values())
    assert {r.message_id for r in result.receipts} == {m.message_id for m in messages} - refused
    with pytest.raises(PermanentError, match="m-bad"):
        result.raise_for_failures()


def test_an_entry_the_answer_leaves_out_is_retryable(sqs: SQSClient, queues: None) -> None:
    lost = PartialBatch(sqs, lambda e: False, missing=lambda e: e["MessageBody"] == "lost")
    result = _sender(lost, "native").send_delayed_batch(
        [DelayedSend("orders", body, 1, message_id=body) for body in ("kept", "lost")]
    )
    assert [r.message_id for r in result.receipts] == ["kept"] and result.receipts[0].route is SqsRoute.NATIVE
    assert isinstance(result.failures["lost"], TransientError) and "no result" in str(result.failures["lost"])
    with pytest.raises(TransientError):
        result.raise_for_failures()
