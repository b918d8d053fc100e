"""Cancel and reschedule records for the SQS hop cycle, in a DynamoDB table (``CancellationStore`` adapter).

Table (the CDK stack creates it; ``ensure_cancellation_table`` does on emulators): partition key ``endpoint``
(the destination queue), sort key ``message_id``, on-demand, TTL on ``expires_at`` (epoch seconds). An item::

    {"endpoint": "orders", "message_id": "3f2c…", "kind": "cancel" | "reschedule",
     "requested_at": "<ISO-8601>", "expires_at": 1767225600, "due_at": "<ISO-8601>" (reschedule only)}

The requeue function reads one endpoint's items with one eventually consistent ``Query`` per cache period and
deletes an applied item with a ``DeleteItem`` conditioned on its ``requested_at`` (a newer request stays). The
time-bucket tier's timer reads the same items; a record written for it only lives longer (``tier_record_ttl``), so
every item reads the same. ``every`` lists the table for operators (``pending``).
botocore errors become the package's errors here; a missing table is a ``ConfigurationError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ..cancellations import Cancellation, CancellationKind
from ..errors import ConfigurationError, DelayedDeliveryError, TransientError
from .config import CACHE_SECONDS_ENV, DEFAULT_CACHE_SECONDS, MAX_CACHE_SECONDS, TABLE_ENV, cache_seconds_from_env
from .sqs import translate_error

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

__all__ = [
    "CACHE_SECONDS_ENV",
    "DEFAULT_CACHE_SECONDS",
    "DEFAULT_TABLE",
    "MAX_CACHE_SECONDS",
    "TABLE_ENV",
    "TTL_ATTRIBUTE",
    "DynamoDbCancellationStore",
    "cache_seconds_from_env",
    "ensure_cancellation_table",
]

#: The table name the CDK stack and ``delayed-delivery aws create`` use unless told otherwise.
DEFAULT_TABLE = "delayed-delivery-cancellations"
TTL_ATTRIBUTE = "expires_at"
_THROTTLED = {"ProvisionedThroughputExceededException", "RequestLimitExceeded", "ThrottlingException"}


def _translate(exc: BaseException, what: str, table: str) -> DelayedDeliveryError:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "ResourceNotFoundException":
            return ConfigurationError(
                f"{what}: cancellation table {table!r} does not exist (the CDK stack creates it; on an emulator "
                f"run `delayed-delivery aws create --queue <queue>`, or set {TABLE_ENV})"
            )
        if code in _THROTTLED:
            return TransientError(f"{what}: {code}")
    return translate_error(exc, what)


class DynamoDbCancellationStore:
    """``CancellationStore`` on one DynamoDB table (client injected; nothing is called at construction)."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        if not table:
            raise ConfigurationError("the cancellation table needs a name")
        self.client = client
        self.table = table

    def put(self, record: Cancellation) -> None:
        """Write ``record`` (replaces an earlier request for the same message)."""
        item: dict[str, AttributeValueTypeDef] = {
            "endpoint": {"S": record.endpoint},
            "message_id": {"S": record.message_id},
            "kind": {"S": record.kind.value},
            "requested_at": {"S": record.requested_at.isoformat()},
            TTL_ATTRIBUTE: {"N": str(int(record.expires_at.timestamp()))},
        }
        if record.due_at is not None:
            item["due_at"] = {"S": record.due_at.isoformat()}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(
                exc, f"writing the {record.kind.value} record of {record.message_id!r}", self.table
            ) from exc

    def live(self, endpoint: str) -> list[Cancellation]:
        """Every item of ``endpoint`` (one Query, paged; eventually consistent)."""
        found: list[Cancellation] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#e = :e",
            "ExpressionAttributeNames": {"#e": "endpoint"},
            "ExpressionAttributeValues": {":e": {"S": endpoint}},
        }
        try:
            while True:
                page = self.client.query(**kwargs)
                found.extend(r for r in (_record(item) for item in page.get("Items", [])) if r is not None)
                if "LastEvaluatedKey" not in page:
                    return found
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, f"reading the cancellation records of {endpoint!r}", self.table) from exc

    def every(self, limit: int = 1_000) -> tuple[list[Cancellation], bool]:
        """Up to ``limit`` records of every endpoint (a paged Scan: for operators) and whether more were left."""
        found: list[Cancellation] = []
        kwargs: dict[str, Any] = {"TableName": self.table}
        try:
            while len(found) < limit:
                page = self.client.scan(**kwargs, Limit=min(1_000, limit - len(found)))
                found.extend(r for r in (_record(item) for item in page.get("Items", [])) if r is not None)
                if "LastEvaluatedKey" not in page:
                    return found, False
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, "reading the cancellation records", self.table) from exc
        return found[:limit], True

    def delete(self, records: Sequence[Cancellation]) -> None:
        """Delete each record unless it was replaced by a newer request (then that one stays)."""
        for record in records:
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key={"endpoint": {"S": record.endpoint}, "message_id": {"S": record.message_id}},
                    ConditionExpression="requested_at = :r",
                    ExpressionAttributeValues={":r": {"S": record.requested_at.isoformat()}},
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    continue
                raise _translate(exc, f"deleting the record of {record.message_id!r}", self.table) from exc
            except BotoCoreError as exc:
                raise _translate(exc, f"deleting the record of {record.message_id!r}", self.table) from exc

    def check(self) -> None:
        """Raise ``ConfigurationError`` when the table does not exist (one DescribeTable)."""
        try:
            self.client.describe_table(TableName=self.table)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, "checking the cancellation table", self.table) from exc


def _record(item: Mapping[str, Any]) -> Cancellation | None:
    """An item as a record; an item that cannot be read is skipped (never blocks a hop)."""
    try:
        kind = CancellationKind(item["kind"]["S"])
        due = item.get("due_at", {}).get("S")
        return Cancellation(
            endpoint=item["endpoint"]["S"],
            message_id=item["message_id"]["S"],
            kind=kind,
            requested_at=datetime.fromisoformat(item["requested_at"]["S"]),
            expires_at=datetime.fromtimestamp(int(item[TTL_ATTRIBUTE]["N"]), tz=UTC),
            due_at=datetime.fromisoformat(due) if due else None,
        )
    except (KeyError, ValueError, TypeError, DelayedDeliveryError):
        return None


def ensure_cancellation_table(client: DynamoDBClient, table: str = DEFAULT_TABLE) -> None:
    """Create the table (on-demand, TTL on ``expires_at``) if missing; for emulators and scripts, CDK in the cloud."""
    try:
        try:
            client.create_table(
                TableName=table,
                AttributeDefinitions=[
                    {"AttributeName": "endpoint", "AttributeType": "S"},
                    {"AttributeName": "message_id", "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": "endpoint", "KeyType": "HASH"},
                    {"AttributeName": "message_id", "KeyType": "RANGE"},
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
                TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
            )
    except (ClientError, BotoCoreError) as exc:
        raise _translate(exc, "creating the cancellation table", table) from exc
