"""Create an on-demand DynamoDB table with a hash and range key and TTL, once; for emulators and scripts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

KeyType = Literal["S", "N"]


def create_ttl_table(
    client: DynamoDBClient, table: str, hash_key: str, range_key: tuple[str, KeyType], ttl_attribute: str
) -> None:
    """Create ``table`` if missing (hash key a string), wait for it, and turn TTL on; botocore errors propagate."""
    range_name, range_type = range_key
    try:
        client.create_table(
            TableName=table,
            AttributeDefinitions=[
                {"AttributeName": hash_key, "AttributeType": "S"},
                {"AttributeName": range_name, "AttributeType": range_type},
            ],
            KeySchema=[
                {"AttributeName": hash_key, "KeyType": "HASH"},
                {"AttributeName": range_name, "KeyType": "RANGE"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
    client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    ttl = client.describe_time_to_live(TableName=table).get("TimeToLiveDescription", {})
    if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
        client.update_time_to_live(
            TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl_attribute}
        )
