"""The tier's one id policy (docs/identity.md, #31), row by row, on every path where two copies can meet: one ingest
invocation, a coarse bucket's cascade, a small fine bucket the timer sends itself, a planned bucket the dispatch
workers send. A message is its id and due time: the same one twice is delivered once, another due time under the id
is another message, another body under the id and due time goes to the error queue, a copy of the original sent
before a reschedule follows the reschedule, and a copy after the delivery is a new message. On moto, at the deployed
timing, over a manual clock."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE, encode_ingest
from delayed_delivery.aws.tier.operations import TierOperations
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import COARSE, BucketKey
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.aws.tier.plan_support import INLINE, Tier, burst, fine
from tests.aws.tier.timer_support import SETTINGS, START

pytestmark = pytest.mark.moto

PATHS = ("ingest", "cascade", "inline", "planned")
TABLE = "tier-id-policy"
SENT = START - timedelta(seconds=10)


def _due(path: str) -> datetime:
    """Due in the fine bucket of 01:00, or (cascade) in the coarse bucket of the next day, cascaded at START."""
    return START + timedelta(days=1 if path == "cascade" else 0, hours=1, seconds=5)


def _message(due: datetime, body: str = "order 1", sent: datetime = SENT, hops: int = 0) -> BucketMessage:
    attributes = {"kind": {"DataType": "String", "StringValue": "order"}}
    return BucketMessage("m-1", "orders", body.encode(), epoch_ms(due), attributes, hops, epoch_ms(sent))


@pytest.fixture
def tier(moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str) -> Tier:
    client = dynamodb_client(moto_endpoint)
    ensure_cancellation_table(client, TABLE)
    made = Tier(s3, sqs, tier_bucket, cache=CancellationCache(DynamoDbCancellationStore(client, TABLE), 0))
    sqs.create_queue(QueueName="ingest")
    made.operations = TierOperations(  # type: ignore[attr-defined]
        made.store,
        sqs,
        DynamoDbCancellationStore(client, TABLE),
        SETTINGS,
        sqs_settings=SqsSettings(long_delay_route="buckets"),
        clock=made.clock,
    )
    return made


def _place(tier: Tier, path: str, copies: list[BucketMessage]) -> None:
    """Put ``copies`` where they meet on ``path`` (each copy in an object of its own but on the ingest path)."""
    if path == "ingest":
        records = []
        for n, copy in enumerate(copies):
            attributes = {INGEST_ATTRIBUTE: {"dataType": "String", "stringValue": "1"}}
            records.append({"messageId": f"r-{n}", "body": encode_ingest([copy]), "messageAttributes": attributes})
        result = BucketIngest(tier.store, tier.sqs, SETTINGS, tier.clock).process(records)
        assert not result.failures
        return
    for copy in copies:
        bucket = BucketKey(COARSE, copy.due_at.replace(hour=0, minute=0, second=0)) if path == "cascade" else None
        tier.store.write(bucket or fine(copy.due_at, tier.settings), [copy])
    if path == "planned":  # over the inline bound: the workers send it
        due = copies[0].due_at
        tier.store.write(fine(due, tier.settings), burst(INLINE + 1, due, first=5_000 + len(tier.recorder.sent)))


def _run(tier: Tier, until: datetime) -> None:
    """A timer run now (the cascade of the next day), then every minute from 8 minutes before ``until``'s bucket."""
    tier.minute(0)
    start = until - timedelta(seconds=480)
    if tier.clock.now() < start:
        tier.clock.set(start)
    tier.run_until(until + timedelta(minutes=3))


def _deliveries(tier: Tier) -> tuple[list[datetime], int]:
    """When m-1 reaches ``orders`` (SQS visibility), and how many entries reached the error queue."""
    arrivals = sorted(s.arrives for s in tier.recorder.to("orders") if s.message_id == "m-1")
    return arrivals, sum(Counter(s.message_id for s in tier.recorder.to("errors")).values())


def _on_time(arrival: datetime, due: datetime) -> bool:
    return due <= arrival < due + timedelta(seconds=1)


@pytest.mark.parametrize("path", PATHS)
def test_the_same_message_twice_is_delivered_once(tier: Tier, path: str) -> None:
    due = _due(path)
    first = _message(due)
    _place(tier, path, [first, replace(first, sent_at_ms=epoch_ms(SENT) + 5_000, hops=1)])  # a resend, a retry
    _run(tier, due)
    arrivals, errors = _deliveries(tier)
    assert len(arrivals) == 1 and _on_time(arrivals[0], due) and errors == 0


@pytest.mark.parametrize("path", PATHS)
def test_another_due_time_under_the_id_is_another_message(tier: Tier, path: str) -> None:
    # #31: sent 3 days ahead, both copies met in one coarse bucket and the cascade sent one to the error queue; sent
    # 2 hours ahead (apart), both were delivered
    due = _due(path)
    later = due + timedelta(seconds=20)  # the same fine bucket
    _place(tier, path, [_message(due), _message(later)])
    _run(tier, later)
    arrivals, errors = _deliveries(tier)
    assert len(arrivals) == 2 and errors == 0, f"{len(arrivals)} delivered, {errors} to the error queue"
    assert _on_time(arrivals[0], due) and _on_time(arrivals[1], later)


@pytest.mark.parametrize("path", PATHS)
def test_another_body_under_the_id_and_due_time_goes_to_the_error_queue(tier: Tier, path: str) -> None:
    due = _due(path)
    _place(tier, path, [_message(due), _message(due, body="order 1, changed", sent=SENT + timedelta(seconds=5))])
    _run(tier, due)
    arrivals, errors = _deliveries(tier)
    assert len(arrivals) == 1 and errors == 1
    [delivered] = [s for s in tier.recorder.to("orders") if s.message_id == "m-1"]
    if path != "planned":  # a worker sends the first met in the plan's order: it cannot wait for every copy
        assert delivered.body == "order 1", "the first sent is kept"


@pytest.mark.parametrize("path", PATHS)
def test_a_copy_of_the_original_after_a_reschedule_follows_it(tier: Tier, path: str) -> None:
    # #31: a reschedule followed by a retried write of the original gave 2 deliveries or 1 depending on whether the
    # operator's command (record shortened) or only the record (record deleted when applied) moved it
    due = _due(path)
    moved_to = due + timedelta(minutes=10)
    original = _message(due)
    _place(tier, path, [original])
    operations: TierOperations = tier.operations  # type: ignore[attr-defined]
    done = operations.reschedule("orders", "m-1", moved_to, current_due=due)
    assert done.relocation.found
    tier.clock.advance(1_200)  # later, a copy of the original (sent before the reschedule) arrives
    _place(tier, path, [original])
    _run(tier, moved_to)
    arrivals, errors = _deliveries(tier)
    assert len(arrivals) == 1 and errors == 0, f"{len(arrivals)} delivered"
    assert _on_time(arrivals[0], moved_to), "at the new time only"


@pytest.mark.parametrize("path", PATHS)
def test_a_copy_after_the_delivery_is_a_new_message(tier: Tier, path: str) -> None:
    due = _due(path)
    _place(tier, path, [_message(due)])
    _run(tier, due)
    assert len(_deliveries(tier)[0]) == 1
    _place(tier, path, [_message(due)])  # the same message again, after it was delivered
    _run(tier, tier.clock.now())
    arrivals, errors = _deliveries(tier)
    assert len(arrivals) == 2 and errors == 0
