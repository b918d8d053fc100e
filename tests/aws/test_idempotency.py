"""The effectively-once contract on DynamoDB (moto server) through the Powertools idempotency utility."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from delayed_delivery.aws.idempotency import DynamoDBEffectivelyOnce, effectively_once, ensure_idempotency_table
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.idempotency import ProcessingInProgressError
from delayed_delivery.testing.idempotency_contract import IdempotencyContract, Process
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


@pytest.fixture
def dynamodb(moto_endpoint: str) -> DynamoDBClient:
    """A DynamoDB client on the freshly reset moto server."""
    return boto3.client(
        "dynamodb",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def table(dynamodb: DynamoDBClient) -> str:
    """A fresh idempotency table."""
    name = f"processed-{uuid.uuid4().hex[:8]}"
    ensure_idempotency_table(dynamodb, name)
    return name


class TestDynamoDBEffectivelyOnce(IdempotencyContract):
    expiry_seconds = 1.0

    @pytest.fixture
    def process(self, dynamodb: DynamoDBClient, table: str) -> Process:
        consumer = DynamoDBEffectivelyOnce(
            table, name="orders", expires_after=self.expiry_seconds, in_progress_timeout=60, client=dynamodb
        )
        return consumer.run


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
    import time

    died = DynamoDBEffectivelyOnce(table, name="orders", in_progress_timeout=1, client=dynamodb)
    effects: list[str] = []

    class Died(BaseException):
        """Stands for the process being killed mid-effect: Powertools never gets to release the key."""

    def dies() -> None:
        raise Died

    with pytest.raises(Died):
        died.run("order-1", dies)
    with pytest.raises(ProcessingInProgressError):
        died.run("order-1", lambda: effects.append("too early"))
    time.sleep(1.2)
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
