"""Cancel and reschedule on the tier as a library user calls them (``TierOperations``, no CLI route) on moto: the
record, the move, the record shortened, what "not in the tier" means per long-delay route, errors in library words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.operations import TierOperations
from delayed_delivery.aws.tier.provision import INGEST_VISIBILITY_SECONDS
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.cancellations import RECORD_TTL, CancellationKind
from delayed_delivery.durations import MAX_DELAY
from delayed_delivery.errors import DestinationNotFoundError, InvalidMessageError
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import COARSE, FINE
from tests.aws.test_cancel_dynamodb import dynamodb_client

pytestmark = pytest.mark.moto

TABLE = "tier-operations"


def _operations(moto_endpoint: str, s3: Any, sqs: Any, bucket: str, route: str) -> TierOperations:
    config = BucketTierConfig(
        bucket_name=bucket, sqs_settings=SqsSettings(long_delay_route=route), cancellation_table=TABLE
    )
    return TierOperations.from_config(
        config, s3_client=s3, sqs_client=sqs, dynamodb_client=dynamodb_client(moto_endpoint)
    )


@pytest.fixture
def tier_only(moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str) -> TierOperations:
    """The tier as the only long-delay route, with its table and an ``orders`` queue."""
    ensure_cancellation_table(dynamodb_client(moto_endpoint), TABLE)
    sqs.create_queue(QueueName="orders")
    return _operations(moto_endpoint, s3, sqs, tier_bucket, "buckets")


@pytest.fixture
def table(moto_endpoint: str) -> DynamoDbCancellationStore:
    return DynamoDbCancellationStore(dynamodb_client(moto_endpoint), TABLE)


def _bucketed(store: S3BucketStore, ids: str, due: datetime) -> None:
    now = datetime.now(UTC)
    sent = int((now - timedelta(seconds=5)).timestamp() * 1000)
    store.write_due([BucketMessage(i, "orders", b"x", int(due.timestamp() * 1000), sent_at_ms=sent) for i in ids], now)


def test_reschedule_moves_the_message_now_and_keeps_the_record_past_both_due_times(
    tier_only: TierOperations, table: DynamoDbCancellationStore
) -> None:
    now = datetime.now(UTC)
    old = now + timedelta(days=5)
    _bucketed(tier_only.store, "ab", old)

    done = tier_only.reschedule("orders", "a", now + timedelta(hours=1), current_due=old)

    assert done.relocation.found and not done.relocation.sent_now and not done.missing
    assert done.relocation.bucket is not None and done.relocation.bucket.level == FINE
    assert done.relocation.old_due is not None and abs((done.relocation.old_due - old).total_seconds()) < 0.01
    assert "moved now into the fine bucket" in done.note and "sent before now" in done.note
    (record,) = table.live("orders")
    assert (record.message_id, record.kind, record.due_at) == ("a", CancellationKind.RESCHEDULE, done.record.due_at)
    assert abs((record.expires_at - done.record.expires_at).total_seconds()) < 1  # the table keeps whole seconds
    # kept until an hour after the later due time, as a timer keeps a record it applied (#31: the ingest's visibility)
    assert abs((record.expires_at - (old + timedelta(hours=1))).total_seconds()) <= 2
    assert record.expires_at - record.requested_at > timedelta(seconds=INGEST_VISIBILITY_SECONDS)
    counts = sorted((o.bucket.level, o.count) for level in (FINE, COARSE) for o in tier_only.store.objects(level))
    assert counts == [(COARSE, 1), (FINE, 1)]  # 'b' stays where it was, 'a' waits in the fine bucket of its new time


def test_not_in_the_tier_is_missing_only_when_the_tier_is_the_only_route(
    tier_only: TierOperations, moto_endpoint: str, s3: Any, sqs: Any, table: DynamoDbCancellationStore
) -> None:
    due = datetime.now(UTC) + timedelta(hours=3)
    gone = tier_only.reschedule("orders", "x", due)
    assert gone.missing and not gone.relocation.found and gone.relocation.objects_read == 0
    assert "no message 'x' is waiting in the tier" in gone.note
    assert gone.record.expires_at - gone.record.requested_at <= timedelta(seconds=INGEST_VISIBILITY_SECONDS + 5)

    either = _operations(moto_endpoint, s3, sqs, tier_only.store.bucket_name, "auto")
    maybe_hopping = either.reschedule("orders", "y", due)
    assert not maybe_hopping.missing and not maybe_hopping.tier_only
    assert "next hop on the FIFO route" in maybe_hopping.note
    (waiting,) = [r for r in table.live("orders") if r.message_id == "y"]
    assert waiting.expires_at - waiting.requested_at > MAX_DELAY  # waits for its next hop


def test_cancel_writes_a_record_until_dispatch_and_warns_near_the_due_time(
    tier_only: TierOperations, table: DynamoDbCancellationStore
) -> None:
    due = datetime.now(UTC) + timedelta(days=40)
    far = tier_only.cancel("orders", "far", due=due)
    assert far.certain and far.warning is None and far.table == TABLE
    assert abs((far.record.expires_at - (due + RECORD_TTL)).total_seconds()) <= 2

    reach = tier_only.reach_seconds()
    levels = tier_only.store.levels
    assert reach == max(levels.dispatch_lead_seconds + levels.fine_seconds, 900)  # the native cap too (#31)
    near = tier_only.cancel("orders", "near", due=datetime.now(UTC) + timedelta(seconds=reach / 2))
    assert not near.certain and near.warning is not None and "may already be on its way" in near.warning
    assert sorted(r.message_id for r in table.live("orders")) == ["far", "near"]  # written all the same
    live, more = tier_only.live_records()
    assert [r.message_id for r in live] == ["far", "near"] and not more


def test_errors_speak_the_librarys_words_not_the_commands(tier_only: TierOperations) -> None:
    with pytest.raises(DestinationNotFoundError, match="unknown queue 'nope'") as unknown:
        tier_only.cancel("nope", "m")
    with pytest.raises(InvalidMessageError, match="in the past") as past:
        tier_only.reschedule("orders", "m", datetime.now(UTC) - timedelta(seconds=1))
    assert "--" not in str(unknown.value) and "--" not in str(past.value)
