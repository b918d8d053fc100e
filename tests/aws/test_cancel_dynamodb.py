"""The DynamoDB cancellation store against moto server: table, records, conditional delete, errors."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

from delayed_delivery.aws.cancellations import (
    DEFAULT_CACHE_SECONDS,
    TTL_ATTRIBUTE,
    DynamoDbCancellationStore,
    cache_seconds_from_env,
    ensure_cancellation_table,
)
from delayed_delivery.cancellations import UnreadableRecord, cancel_request, reschedule_request
from delayed_delivery.errors import ConfigurationError, TransientError
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

pytestmark = pytest.mark.moto


def dynamodb_client(endpoint_url: str) -> DynamoDBClient:
    """A DynamoDB client on moto (or on a dead port, failing fast)."""
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 1}),
    )


@pytest.fixture
def dynamodb(moto_endpoint: str) -> DynamoDBClient:
    """DynamoDB on the freshly reset moto server."""
    return dynamodb_client(moto_endpoint)


def test_table_is_created_once_with_ttl_and_records_round_trip(dynamodb: DynamoDBClient) -> None:
    ensure_cancellation_table(dynamodb, "cancellations")
    ensure_cancellation_table(dynamodb, "cancellations")  # idempotent
    ttl = dynamodb.describe_time_to_live(TableName="cancellations")["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", TTL_ATTRIBUTE)
    table = dynamodb.describe_table(TableName="cancellations")["Table"]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    store = DynamoDbCancellationStore(dynamodb, "cancellations")
    store.check()
    now = datetime.now(UTC).replace(microsecond=123456)
    cancel = cancel_request("orders", "m1", now=now, max_native_delay=900, max_age=60)
    move = reschedule_request("orders", "m2", now + timedelta(days=3), now=now)
    other = cancel_request("billing", "m1", now=now, max_native_delay=900, max_age=60)
    for record in (cancel, move, other):
        store.put(record)
    got = {r.message_id: r for r in store.live("orders")}
    for record in (cancel, move):  # the TTL attribute keeps whole epoch seconds
        assert got[record.message_id] == replace(record, expires_at=record.expires_at.replace(microsecond=0))
    assert [r.endpoint for r in store.live("billing")] == ["billing"]


def test_delete_spares_a_newer_request_and_unreadable_items_are_named(dynamodb: DynamoDBClient) -> None:
    ensure_cancellation_table(dynamodb, "cancellations")
    store = DynamoDbCancellationStore(dynamodb, "cancellations")
    now = datetime.now(UTC)
    old = cancel_request("orders", "m1", now=now, max_native_delay=900, max_age=60)
    store.put(old)
    newer = reschedule_request("orders", "m1", now + timedelta(hours=2), now=now + timedelta(seconds=1))
    store.put(newer)
    store.delete([old])  # conditional on requested_at: the newer request stays
    assert [r.kind for r in store.live("orders")] == ["reschedule"]
    store.delete([newer, old])
    assert store.live("orders") == []
    # an item that cannot be used is no longer skipped in silence (#23): it names its message, which goes to the
    # error queue, and it is deleted like any applied record (conditional on its stored request time, even absent)
    dynamodb.put_item(TableName="cancellations", Item={"endpoint": {"S": "orders"}, "message_id": {"S": "junk"}})
    naive = {"endpoint": {"S": "orders"}, "message_id": {"S": "naive"}, "kind": {"S": "cancel"}}
    naive |= {"requested_at": {"S": "2030-01-01T00:00:00"}, TTL_ATTRIBUTE: {"N": "1893456000"}}
    dynamodb.put_item(TableName="cancellations", Item=naive)
    junk, unusable = sorted(store.live("orders"), key=lambda r: r.message_id)
    assert isinstance(junk, UnreadableRecord) and junk.expires_at is None and "expires_at" in junk.reason
    assert isinstance(unusable, UnreadableRecord) and "naive" in unusable.reason
    assert unusable.expires_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert "cannot be read" in unusable.problem() and unusable.binds(datetime.now(UTC))
    store.delete([junk, unusable])
    assert store.live("orders") == []


def test_missing_table_and_unreachable_endpoint_are_the_packages_errors(dynamodb: DynamoDBClient) -> None:
    store = DynamoDbCancellationStore(dynamodb, "never-created")
    with pytest.raises(ConfigurationError, match="'never-created' does not exist"):
        store.check()
    with pytest.raises(ConfigurationError, match="does not exist"):
        store.live("orders")
    dead = DynamoDbCancellationStore(dynamodb_client("http://127.0.0.1:9"), "cancellations")
    with pytest.raises(TransientError):
        dead.live("orders")


def test_cache_seconds_setting() -> None:
    assert cache_seconds_from_env({}) == DEFAULT_CACHE_SECONDS
    assert cache_seconds_from_env({"DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS": "0"}) == 0
    for bad in ("-1", "901", "soon"):
        with pytest.raises(ConfigurationError, match="0-600 seconds"):
            cache_seconds_from_env({"DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS": bad})
