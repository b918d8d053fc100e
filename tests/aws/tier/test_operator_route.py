"""The AWS operator route with the time-bucket tier on moto: exact pending from the listing, records kept until
dispatch, refusals and warnings; the records' time to live in the core."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.app.routes.base import CancelRequest, CloudOptions, RescheduleRequest
from delayed_delivery.app.routes.buckets import PER_DESTINATION, BucketPendingReport, BucketTierRoute
from delayed_delivery.aws.cancellations import TABLE_ENV, DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.cancellations import (
    RECORD_TTL,
    CancellationKind,
    cancel_request,
    reschedule_request,
    tier_record_ttl,
)
from delayed_delivery.durations import MAX_DELAY
from delayed_delivery.errors import ConfigurationError, DestinationNotFoundError, InvalidMessageError
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import FINE, BucketKey, BucketLevel
from tests.aws.test_cancel_dynamodb import dynamodb_client

pytestmark = pytest.mark.moto

TABLE = "tier-cancellations"
PREFIX = "delayed-delivery/buckets"


@pytest.fixture
def route(
    moto_endpoint: str, dynamodb_endpoint: str, tier_bucket: str, sqs: Any, monkeypatch: pytest.MonkeyPatch
) -> BucketTierRoute:
    """The route on moto with default bucket sizes, the table created and an ``orders`` queue."""
    monkeypatch.setenv(TABLE_ENV, TABLE)
    for name in ("DELAYED_DELIVERY_BUCKET_PREFIX", "DELAYED_DELIVERY_LONG_DELAY_ROUTE"):
        monkeypatch.delenv(name, raising=False)
    ensure_cancellation_table(dynamodb_client(dynamodb_endpoint), TABLE)
    sqs.create_queue(QueueName="orders")
    return BucketTierRoute(CloudOptions("aws", endpoint_url=moto_endpoint, region="us-east-1"), tier_bucket)


@pytest.fixture
def table(dynamodb_endpoint: str) -> DynamoDbCancellationStore:
    return DynamoDbCancellationStore(dynamodb_client(dynamodb_endpoint), TABLE)


def _message(n: int, due: datetime, destination: str = "orders") -> BucketMessage:
    return BucketMessage(f"m-{n:04d}", destination, b"x", int(due.timestamp() * 1000))


def test_pending_counts_exactly_from_the_listing(route: BucketTierRoute, s3: Any, tier_bucket: str) -> None:
    store = S3BucketStore(s3, tier_bucket, PREFIX, BucketLevel())
    now = datetime.now(UTC)
    store.write_due([_message(i, now + timedelta(minutes=30)) for i in range(3)], now)  # fine
    store.write_due([_message(10 + i, now + timedelta(days=3), "billing") for i in range(5)], now)  # coarse
    late = BucketKey(FINE, (now - timedelta(hours=1)).replace(second=0, microsecond=0))
    store.write(late, [_message(20, late.start)])
    calls: list[str] = []
    s3.meta.events.register("before-send.s3.GetObject", lambda **kw: calls.append("get"))

    report = route.pending(3600)

    assert isinstance(report, BucketPendingReport) and report.census is not None
    census = report.census
    assert (census.messages, census.fine_messages, census.coarse_messages, census.objects) == (9, 4, 5, 3)
    assert census.exact and calls == []  # no body read
    assert census.next_due == late and census.oldest_overdue == late
    assert census.oldest_overdue_seconds >= 60 * 59
    assert report.pending == 9 and report.oldest_overdue_seconds == census.oldest_overdue_seconds
    doc = report.as_dict()
    assert doc["buckets"]["messages"] == 9 and doc["buckets"]["per_destination"] == PER_DESTINATION
    assert doc["buckets"]["bucket_name"] == tier_bucket and doc["backlog"][0]["count"] == 1
    assert "per destination: not available" in (report.limits or "")


def test_a_v1_key_makes_the_total_a_lower_bound(route: BucketTierRoute, s3: Any, tier_bucket: str) -> None:
    start = (datetime.now(UTC) + timedelta(minutes=5)).replace(second=0, microsecond=0)
    digest = hashlib.sha256(b"v1").hexdigest()
    s3.put_object(Bucket=tier_bucket, Key=f"{PREFIX}/fine/{start.strftime('%Y-%m-%dT%H:%M:%SZ')}/{digest}.jsonl.gz")
    report = route.pending(86_400)
    assert isinstance(report, BucketPendingReport) and report.census is not None
    assert report.census.uncounted_objects == 1 and report.census.describe_total() == "at least 0"
    assert "keys without a count" in (report.limits or "")


def test_cancel_writes_a_record_living_until_dispatch(route: BucketTierRoute, table: DynamoDbCancellationStore) -> None:
    result = route.cancel(CancelRequest("m-1", to="orders"))
    (record,) = table.live("orders")
    assert record.kind is CancellationKind.CANCEL and record.message_id == "m-1"
    assert record.expires_at - record.requested_at >= MAX_DELAY  # no due time: it may wait up to 100 years
    assert result.record is not None and abs((result.record.expires_at - record.expires_at).total_seconds()) < 1
    assert "cascaded or dispatched" in result.record.note and not result.certain
    assert result.as_dict()["warning"] is None


def test_cancel_with_a_due_time_lives_until_just_after_it(
    route: BucketTierRoute, table: DynamoDbCancellationStore
) -> None:
    due = datetime.now(UTC) + timedelta(days=40)
    result = route.cancel(CancelRequest("m-2", to="orders", due=due))
    (record,) = table.live("orders")
    assert abs((record.expires_at - (due + RECORD_TTL)).total_seconds()) <= 2
    assert result.certain and result.as_dict()["warning"] is None


def test_cancel_near_the_due_time_warns(route: BucketTierRoute, table: DynamoDbCancellationStore) -> None:
    result = route.cancel(CancelRequest("m-3", to="orders", due=datetime.now(UTC) + timedelta(minutes=5)))
    warning = result.as_dict()["warning"]
    assert warning and "may already be on its way" in warning and not result.certain
    assert [r.message_id for r in table.live("orders")] == ["m-3"]  # written all the same


def test_cancel_for_an_unknown_queue_or_bucket_is_refused(route: BucketTierRoute, s3: Any, tier_bucket: str) -> None:
    with pytest.raises(DestinationNotFoundError, match="unknown queue 'nope'"):
        route.cancel(CancelRequest("m-4", to="nope"))
    s3.delete_bucket(Bucket=tier_bucket)
    with pytest.raises(ConfigurationError, match="does not exist"):
        route.cancel(CancelRequest("m-4", to="orders"))


def test_reschedule_refuses_the_past_and_beyond_a_century(route: BucketTierRoute) -> None:
    now = datetime.now(UTC)
    with pytest.raises(InvalidMessageError, match="in the past"):
        route.reschedule(RescheduleRequest("m-5", now - timedelta(seconds=1), to="orders"))
    with pytest.raises(InvalidMessageError, match="100 years"):
        route.reschedule(RescheduleRequest("m-5", now + MAX_DELAY + timedelta(days=2), to="orders"))


def test_reschedule_writes_a_long_lived_record_and_pending_lists_it(
    route: BucketTierRoute, table: DynamoDbCancellationStore
) -> None:
    due = datetime.now(UTC) + timedelta(days=90)
    result = route.reschedule(RescheduleRequest("m-6", due, to="orders"))
    route.cancel(CancelRequest("m-7", to="orders"))
    (moved,) = [r for r in table.live("orders") if r.message_id == "m-6"]
    assert moved.due_at == due and moved.expires_at - moved.requested_at > MAX_DELAY
    assert result.record is not None and "late" in result.record.note
    report = route.pending(86_400)
    assert isinstance(report, BucketPendingReport)
    assert [(r.message_id, r.kind.value) for r in report.records] == [("m-6", "reschedule"), ("m-7", "cancel")]
    assert [r["message_id"] for r in report.as_dict()["buckets"]["records"]] == ["m-6", "m-7"]
    only_billing = route.pending(86_400, queue="billing")
    assert isinstance(only_billing, BucketPendingReport) and only_billing.records == ()


def test_every_lists_all_endpoints_up_to_a_limit(table: DynamoDbCancellationStore, route: BucketTierRoute) -> None:
    now = datetime.now(UTC)
    for i in range(5):
        table.put(cancel_request(f"q{i % 2}", f"id-{i}", now=now, max_native_delay=0, max_age=0))
    found, more = table.every()
    assert sorted(r.message_id for r in found) == [f"id-{i}" for i in range(5)] and not more
    some, more = table.every(limit=2)
    assert len(some) == 2 and more


def test_records_ttl_in_the_core() -> None:
    now = datetime(2031, 1, 1, tzinfo=UTC)
    assert tier_record_ttl(now) == MAX_DELAY + RECORD_TTL
    assert tier_record_ttl(now, now + timedelta(days=400)) == timedelta(days=400) + RECORD_TTL
    assert tier_record_ttl(now, now - timedelta(days=1)) == RECORD_TTL  # never shorter than the FIFO route's
    plain = cancel_request("q", "a", now=now, max_native_delay=900, max_age=60)
    assert plain.expires_at == now + RECORD_TTL  # the default is unchanged
    long = reschedule_request("q", "a", now + timedelta(days=1), now=now, ttl=timedelta(days=1000))
    assert long.expires_at == now + timedelta(days=1000)
    with pytest.raises(InvalidMessageError, match="positive"):
        cancel_request("q", "a", now=now, max_native_delay=0, max_age=0, ttl=timedelta(0))


def test_an_old_record_reads_unchanged(table: DynamoDbCancellationStore, route: BucketTierRoute) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    old = cancel_request("orders", "legacy", now=now, max_native_delay=900, max_age=60)
    table.put(old)
    assert table.live("orders") == [old]


def test_the_timer_applies_the_routes_cancel_record(
    route: BucketTierRoute, s3: Any, tier_bucket: str, sqs: Any, table: DynamoDbCancellationStore
) -> None:
    from delayed_delivery.aws.tier.timer import BucketTimer
    from delayed_delivery.cancellations import CancellationCache
    from delayed_delivery.clock import SystemClock
    from delayed_delivery.settings import DelayedDeliverySettings

    sqs.create_queue(QueueName="errors")
    store = S3BucketStore(s3, tier_bucket, PREFIX, BucketLevel())
    now = datetime.now(UTC)
    sent = int((now - timedelta(seconds=5)).timestamp() * 1000)
    due = int((now + timedelta(seconds=1)).timestamp() * 1000)
    store.write_due([BucketMessage(i, "orders", i.encode(), due, sent_at_ms=sent) for i in ("gone", "kept")], now)
    route.cancel(CancelRequest("gone", to="orders"))
    timer = BucketTimer(
        store,
        sqs,
        DelayedDeliverySettings(error_queue="errors"),
        SystemClock(),
        cancellations=CancellationCache(table, 0),
        owner="test",
    )
    result = timer.run()
    assert (result.dispatched, result.cancelled) == (1, 1)
    # applied, so settled: it ends within an hour of the message's due time (#31: it was deleted)
    assert all(r.expires_at <= datetime.now(UTC) + timedelta(hours=1, minutes=1) for r in table.live("orders"))
    url = sqs.get_queue_url(QueueName="orders")["QueueUrl"]
    assert [m["Body"] for m in drain(sqs, url, expect=1)] == ["kept"]  # due 1 s from now: polled, not waited for


def test_reschedule_moves_a_bucketed_message_now(
    route: BucketTierRoute, s3: Any, tier_bucket: str, table: DynamoDbCancellationStore
) -> None:
    from delayed_delivery.app.routes.buckets import BucketRescheduleResult
    from delayed_delivery.aws.tier.provision import INGEST_VISIBILITY_SECONDS

    store = S3BucketStore(s3, tier_bucket, PREFIX, BucketLevel())
    now = datetime.now(UTC)
    sent = int((now - timedelta(seconds=5)).timestamp() * 1000)
    old = now + timedelta(days=5)
    store.write_due([BucketMessage(i, "orders", b"x", int(old.timestamp() * 1000), sent_at_ms=sent) for i in "ab"], now)
    result = route.reschedule(RescheduleRequest("a", now + timedelta(hours=1), to="orders", current_due=old))
    assert isinstance(result, BucketRescheduleResult) and result.found and result.moved and not result.sent_now
    assert result.bucket is not None and result.bucket.startswith("fine") and result.objects_read == 1
    (record,) = table.live("orders")
    # kept until an hour after the later due time, as an applied record is (#31: the ingest's visibility)
    assert abs((record.expires_at - (old + timedelta(hours=1))).total_seconds()) <= 2
    assert INGEST_VISIBILITY_SECONDS < 3_600
    assert "moved now into the fine bucket" in (result.record.note if result.record else "")
    counts = sorted((o.bucket.level, o.count) for level in (FINE, "coarse") for o in store.objects(level))
    assert counts == [("coarse", 1), ("fine", 1)]
    kept = route.reschedule(
        RescheduleRequest("b", now + timedelta(days=2), to="orders", current_due=old, keep_record=True)
    )
    assert kept.moved and [
        r.expires_at >= now + timedelta(days=5) for r in table.live("orders") if r.message_id == "b"
    ] == [True]


def test_reschedule_not_in_the_tier(
    route: BucketTierRoute, table: DynamoDbCancellationStore, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    from delayed_delivery.app.routes.buckets import BucketRescheduleResult

    due = datetime.now(UTC) + timedelta(hours=3)
    fifo = route.reschedule(
        RescheduleRequest("x", due, to="orders")
    )  # long_delay_route fifo: it may be on the hop cycle
    assert isinstance(fifo, BucketRescheduleResult) and not fifo.found and not fifo.tier_only
    assert table.live("orders")[0].expires_at - datetime.now(UTC) > MAX_DELAY  # waits for its next hop
    monkeypatch.setenv("DELAYED_DELIVERY_LONG_DELAY_ROUTE", "buckets")
    tier_only = BucketTierRoute(
        CloudOptions("aws", endpoint_url=moto_endpoint, region="us-east-1"), route.config.bucket_name
    )
    gone = tier_only.reschedule(RescheduleRequest("y", due, to="orders"))
    assert isinstance(gone, BucketRescheduleResult) and not gone.found and gone.tier_only and not gone.moved
    assert gone.record is not None and "no message 'y' is waiting in the tier" in gone.record.note
    (short,) = [r for r in table.live("orders") if r.message_id == "y"]
    from delayed_delivery.aws.tier.provision import INGEST_VISIBILITY_SECONDS

    assert short.expires_at - short.requested_at <= timedelta(seconds=INGEST_VISIBILITY_SECONDS + 5)
    tier_only.reschedule(RescheduleRequest("z", due, to="orders", keep_record=True))
    (long,) = [r for r in table.live("orders") if r.message_id == "z"]
    assert long.expires_at - long.requested_at > MAX_DELAY


def test_a_scan_beyond_the_limit_is_refused_before_the_record(
    route: BucketTierRoute, s3: Any, tier_bucket: str, table: DynamoDbCancellationStore
) -> None:
    from delayed_delivery.aws.tier.relocate import ScanLimitError

    store = S3BucketStore(s3, tier_bucket, PREFIX, BucketLevel())
    now = datetime.now(UTC)
    for n in range(3):
        store.write_due([_message(n, now + timedelta(days=2 + n))], now)
    with pytest.raises(ScanLimitError, match="--due"):
        route.reschedule(RescheduleRequest("m-0000", now + timedelta(hours=1), to="orders", scan_limit=2))
    assert table.live("orders") == []
