"""A cancel the tier answers ``certain`` is never delivered (#31), on moto: the timer reads the records afresh for
every bucket (and a worker for every piece), strongly consistent, and leaves a bucket for a later run rather than
send it without its records; ``certain`` is never answered for a delay the sender sends natively, nor when the
records go to a table the tier's timer may not read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.app.cli import aws_tier
from delayed_delivery.aws.cancellations import (
    DEFAULT_TABLE,
    TABLE_ENV,
    DynamoDbCancellationStore,
    ensure_cancellation_table,
)
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.operations import TierOperations
from delayed_delivery.cancellations import CancellationCache, cancel_request
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import TransientError
from delayed_delivery.timebuckets.wheel import COARSE, BucketKey
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.aws.tier.plan_support import Tier, burst, fine
from tests.aws.tier.timer_support import SETTINGS, START, message

pytestmark = pytest.mark.moto

TABLE = "tier-certain"
#: The tier only, with a native cap of 300 s (so that 490 s before due is past every route's reach: certain).
ROUTES = SqsSettings(long_delay_route="buckets", max_native_delay=300)


@pytest.fixture
def table(moto_endpoint: str) -> DynamoDbCancellationStore:
    client = dynamodb_client(moto_endpoint)
    ensure_cancellation_table(client, TABLE)
    return DynamoDbCancellationStore(client, TABLE, consistent=True)


def _operations(tier: Tier, table: DynamoDbCancellationStore, routes: SqsSettings = ROUTES) -> TierOperations:
    return TierOperations(tier.store, tier.sqs, table, SETTINGS, sqs_settings=routes, clock=tier.clock)


def test_a_cancel_made_during_a_long_cascade_is_applied_by_the_same_runs_dispatch(
    s3: Any, sqs: Any, tier_bucket: str, table: DynamoDbCancellationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # #31: the timer read each destination's records once per run; a cancel made during a long cascade, answered
    # certain 490 s before the due time, was sent by the same run's dispatch
    tier = Tier(s3, sqs, tier_bucket, cache=CancellationCache(table, 0))
    tier.clock.set(START)
    coarse = BucketKey(COARSE, START + timedelta(days=1))
    tier.store.write(coarse, burst(5, coarse.start + timedelta(hours=3)))  # the day cascaded now: "orders" looked up
    target = message(1, START + timedelta(seconds=495))  # its fine bucket starts 480 s on
    tier.store.write(fine(target.due_at, tier.settings), [target])
    real = tier.store.write_due
    answers = []

    def slow_cascade(messages: Any, now: Any, **kwargs: Any) -> Any:
        if not answers:  # the records of the group were read just before: the operator cancels now
            tier.clock.set(START + timedelta(seconds=5))
            answers.append(_operations(tier, table).cancel("orders", "m-1", due=target.due_at))
            tier.clock.set(START + timedelta(seconds=75))  # the rest of a slow cascade
        return real(messages, now, **kwargs)

    monkeypatch.setattr(tier.store, "write_due", slow_cascade)
    result = tier.timer().run()
    assert answers[0].certain and answers[0].warning is None, "490 s before due: certain"
    assert result.cascaded_messages == 5 and result.cancelled == 1
    assert tier.sent() == {}, "a certain cancel is never delivered"


def test_a_bucket_whose_records_cannot_be_read_waits_rather_than_send_a_cancelled_message(
    s3: Any, sqs: Any, tier_bucket: str, table: DynamoDbCancellationStore
) -> None:
    # the cache skipped a failed lookup ("a late cancel beats a lost message") and the timer sent the bucket: a
    # message cancelled for certain was delivered
    tier = Tier(s3, sqs, tier_bucket, cache=CancellationCache(table, 0))
    due = START + timedelta(minutes=30)
    tier.store.write(fine(due, tier.settings), [message(1, due), message(2, due)])
    table.put(cancel_request("orders", "m-1", now=START, max_native_delay=0, max_age=0))
    real_live = table.live
    failing = [True]

    def live(endpoint: str) -> Any:
        if failing[0]:
            raise TransientError("ProvisionedThroughputExceededException")
        return real_live(endpoint)

    table.live = live  # type: ignore[method-assign]
    tier.clock.set(due - timedelta(seconds=420))
    tier.minute()
    assert tier.sent() == {} and tier.total("buckets_failed") == 1, "left for a later run"
    failing[0] = False
    tier.minute()
    assert tier.sent() == {"m-2": 1} and tier.total("cancelled") == 1


def test_a_delay_the_sender_sends_natively_is_never_cancelled_for_certain(
    s3: Any, sqs: Any, tier_bucket: str, table: DynamoDbCancellationStore
) -> None:
    # #31: with long_delay_route=buckets a 10-minute delay goes straight to its queue; cancel 5 s later answered
    # certain=True (the reach was the tier's lead + fine bucket, 480 s)
    tier = Tier(s3, sqs, tier_bucket)
    routes = SqsSettings(long_delay_route="buckets", bucket_ingest_queue="ingest")
    sqs.create_queue(QueueName="ingest")
    clock = ManualClock(START)
    receipt = SqsDelayedSender(sqs, SETTINGS, sqs_settings=routes, clock=clock).send_delayed(
        "orders", "soon", "10m", message_id="native-1"
    )
    assert receipt.route.value == "native"
    tier.clock.set(START + timedelta(seconds=5))
    answer = _operations(tier, table, routes).cancel("orders", "native-1", due=START + timedelta(minutes=10))
    assert not answer.certain and answer.warning is not None and "may already be on its way" in answer.warning


def test_without_a_named_table_a_cancel_is_not_certain_and_the_local_tier_reads_the_default_table(
    moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str
) -> None:
    # #31: DELAYED_DELIVERY_CANCELLATION_TABLE unset (the README's quick start): the record went to the default
    # table, the answer said certain, and `aws tier --local`, reading no table, delivered the message
    client = dynamodb_client(moto_endpoint)
    ensure_cancellation_table(client, DEFAULT_TABLE)
    sqs.create_queue(QueueName="orders")
    config = BucketTierConfig(bucket_name=tier_bucket, sqs_settings=ROUTES)
    operations = TierOperations.from_config(config, s3_client=s3, sqs_client=sqs, dynamodb_client=client)
    answer = operations.cancel("orders", "far", due=operations.clock.now() + timedelta(days=40))
    assert not answer.certain and answer.warning is not None and TABLE_ENV in answer.warning
    assert answer.table == DEFAULT_TABLE
    named = TierOperations.from_config(
        BucketTierConfig(bucket_name=tier_bucket, sqs_settings=ROUTES, cancellation_table=DEFAULT_TABLE),
        s3_client=s3,
        sqs_client=sqs,
        dynamodb_client=client,
    )
    assert named.cancel("orders", "far", due=named.clock.now() + timedelta(days=40)).certain
    sqs.create_queue(QueueName=config.sqs_settings.bucket_ingest_queue)
    local = aws_tier._build(config, moto_endpoint, "us-east-1", True, aws_tier.TierTally())
    assert local.config.cancellation_table == DEFAULT_TABLE, "the local tier reads the table cancel writes to"
