"""The effectively-once contract on DynamoDB (moto server) through the Powertools idempotency utility."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from delayed_delivery.aws.idempotency import DynamoDBEffectivelyOnce, effectively_once, ensure_idempotency_table
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.idempotency import ProcessingInProgressError
from delayed_delivery.testing.idempotency_contract import Fault, IdempotencyContract, Process
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


@pytest.fixture
def dynamodb(moto_endpoint: str) -> DynamoDBClient:
    """A DynamoDB client on the freshly reset moto server, one request in flight at a time.

    moto server applies a conditional ``PutItem`` without a lock, so two threads racing on one id could both pass
    ``attribute_not_exists`` there (CI: the effect ran twice), which DynamoDB never allows. Whole requests still
    interleave in any order, so the race the contract tests is the one DynamoDB has (docs/testing.md).
    """
    client = boto3.client(
        "dynamodb",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    lock = threading.Lock()
    make_call = client._make_api_call

    def one_at_a_time(operation: str, params: dict[str, Any]) -> Any:
        with lock:
            return make_call(operation, params)

    client._make_api_call = one_at_a_time  # type: ignore[method-assign]
    return client


@pytest.fixture
def table(dynamodb: DynamoDBClient) -> str:
    """A fresh idempotency table."""
    name = f"processed-{uuid.uuid4().hex[:8]}"
    ensure_idempotency_table(dynamodb, name)
    return name


class TestDynamoDBEffectivelyOnce(IdempotencyContract):
    """Powertools reads the real clock: the test ends holds and expiries by rewriting the records' times."""

    expiry_seconds = 3600.0
    oversized_result_chars = 410_000  # past DynamoDB's 400 KB item

    @pytest.fixture
    def process(self, dynamodb: DynamoDBClient, table: str) -> Process:
        self.dynamodb, self.table, self.faults = dynamodb, table, _CompletionFaults(dynamodb)
        consumer = DynamoDBEffectivelyOnce(
            table,
            name="orders",
            expires_after=self.expiry_seconds,
            in_progress_timeout=self.in_progress_seconds,
            client=dynamodb,
            clock=ManualClock(),  # the backoff between record attempts
        )
        return consumer.run

    def _items(self) -> list[dict[str, Any]]:
        return list(self.dynamodb.scan(TableName=self.table, ConsistentRead=True)["Items"])

    def _set(self, item: dict[str, Any], field: str, value: int) -> None:
        self.dynamodb.update_item(
            TableName=self.table,
            Key={"id": item["id"]},
            UpdateExpression="SET #f = :v",
            ExpressionAttributeNames={"#f": field},
            ExpressionAttributeValues={":v": {"N": str(value)}},
        )

    def pass_expiry(self) -> None:
        for item in self._items():
            self._set(item, "expiration", 0)

    def pass_hold(self) -> None:
        for item in self._items():
            if item["status"]["S"] == "INPROGRESS":
                self._set(item, "in_progress_expiration", 0)

    def fail_completions(self, times: int, fault: Fault) -> None:
        self.faults.fail(times, fault)

    def forget(self, key: str) -> None:
        (item,) = self._items()  # one id per test table
        self.dynamodb.delete_item(TableName=self.table, Key={"id": item["id"]})


class _CompletionFaults:
    """Makes the client's next ``UpdateItem`` calls (Powertools' ``save_success``) fail as DynamoDB would."""

    def __init__(self, client: DynamoDBClient) -> None:
        self.left, self.fault = 0, "transient"
        client.meta.events.register("before-call.dynamodb.UpdateItem", self._maybe_fail)

    def fail(self, times: int, fault: Fault) -> None:
        self.left, self.fault = times, fault

    def _maybe_fail(self, **_: Any) -> None:
        if not self.left:
            return
        self.left -= 1
        if self.fault == "transient":
            raise EndpointConnectionError(endpoint_url="http://dynamodb (injected)")
        error = {"Code": "ValidationException", "Message": "Item size has exceeded the maximum allowed size"}
        raise ClientError({"Error": error}, "UpdateItem")


def test_the_table_has_the_powertools_key_and_ttl(dynamodb: DynamoDBClient, table: str) -> None:
    ensure_idempotency_table(dynamodb, table)  # a second call leaves it as it is
    described = dynamodb.describe_table(TableName=table)["Table"]
    assert described["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    ttl = dynamodb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert ttl.get("AttributeName") == "expiration"


def test_the_decorator_keys_by_the_first_argument_and_names_the_consumer(dynamodb: DynamoDBClient, table: str) -> None:
    charged: list[tuple[str, int]] = []

    @effectively_once(table, expires_after=3600, client=dynamodb)
    def charge(message_id: str, amount: int) -> dict[str, Any]:
        charged.append((message_id, amount))
        return {"charged": amount}

    assert charge("order-1", 5) == {"charged": 5}
    assert charge("order-1", 7) == {"charged": 5}
    assert charge("order-2", 7) == {"charged": 7}
    assert charged == [("order-1", 5), ("order-2", 7)]
    keys = [item["id"]["S"] for item in dynamodb.scan(TableName=table)["Items"]]
    assert len(keys) == 2
    assert all(k.startswith(f"delayed-delivery.{__name__}.") and "charge#" in k for k in keys)


def test_two_consumers_on_one_table_keep_their_own_records(dynamodb: DynamoDBClient, table: str) -> None:
    effects: list[str] = []
    billing = DynamoDBEffectivelyOnce(table, name="billing", client=dynamodb)
    shipping = DynamoDBEffectivelyOnce(table, name="shipping", client=dynamodb)
    billing.run("order-1", lambda: effects.append("bill"))
    shipping.run("order-1", lambda: effects.append("ship"))
    billing.run("order-1", lambda: effects.append("bill again"))
    assert effects == ["bill", "ship"]


def test_an_attempt_that_died_holds_the_id_only_for_its_in_progress_timeout(
    dynamodb: DynamoDBClient, table: str
) -> None:
    died = DynamoDBEffectivelyOnce(table, name="orders", in_progress_timeout=60, client=dynamodb)
    effects: list[str] = []

    class Died(BaseException):
        """Stands for the process being killed mid-effect: Powertools never gets to release the key."""

    def dies() -> None:
        raise Died

    with pytest.raises(Died):
        died.run("order-1", dies)
    with pytest.raises(ProcessingInProgressError):
        died.run("order-1", lambda: effects.append("too early"))
    (item,) = dynamodb.scan(TableName=table)["Items"]
    assert int(item["in_progress_expiration"]["N"]) > time.time() * 1000 + 50_000  # held for the 60 s asked
    dynamodb.update_item(  # the hold ends (Powertools reads the real clock: the test moves the record's time)
        TableName=table,
        Key={"id": item["id"]},
        UpdateExpression="SET in_progress_expiration = :past",
        ExpressionAttributeValues={":past": {"N": "0"}},
    )
    died.run("order-1", lambda: effects.append("taken over"))
    assert effects == ["taken over"]


def test_an_unreachable_table_is_a_transient_error(dynamodb: DynamoDBClient) -> None:
    from delayed_delivery.errors import TransientError

    consumer = DynamoDBEffectivelyOnce("no-such-table", name="orders", client=dynamodb)
    with pytest.raises(TransientError):
        consumer.run("order-1", lambda: None)


@pytest.mark.parametrize("kw", [{"expires_after": 0.5}, {"in_progress_timeout": 0}, {"name": ""}])
def test_settings_are_checked(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        DynamoDBEffectivelyOnce("t", **{"name": "orders", **kw})
