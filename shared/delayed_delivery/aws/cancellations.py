"""Cancel and reschedule records for the SQS hop cycle, in a DynamoDB table (``CancellationStore`` adapter).

Table (the CDK stack creates it; ``ensure_cancellation_table`` does on emulators): partition key ``endpoint``
(the destination queue), sort key ``message_id``, on-demand, TTL on ``expires_at`` (epoch seconds). An item::

    {"endpoint": "orders", "message_id": "3f2c…", "kind": "cancel" | "reschedule",
     "requested_at": "<ISO-8601>", "expires_at": 1767225600, "due_at": "<ISO-8601>" (reschedule only)}

The requeue function reads one endpoint's items with one eventually consistent ``Query`` per cache period and
deletes an applied item with a ``DeleteItem`` conditioned on its ``requested_at`` (a newer request stays). The
time-bucket tier's timer reads the same items; a record written for it only lives longer (``tier_record_ttl``), so
every item reads the same. ``every`` lists the table for operators (``pending``).

Items are read as a hostile writer could leave them: an item naming a message whose other fields cannot be used (a
naive or unreadable time, a due time outside 1970-9000, an unknown kind, no expiry) is an ``UnreadableRecord``, and
the message it names goes to the error queue instead of being guessed at (docs/identity.md).
botocore errors become the package's errors here; a missing table is a ``ConfigurationError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ..cancellations import Cancellation, CancellationKind, StoredRecord, UnreadableRecord
from ..clock import utc
from ..errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError, TransientError
from .config import CACHE_SECONDS_ENV, DEFAULT_CACHE_SECONDS, MAX_CACHE_SECONDS, TABLE_ENV, cache_seconds_from_env
from .sqs import translate_error
from .ttl_tables import create_ttl_table

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

    def __init__(self, client: DynamoDBClient, table: str, *, consistent: bool = False) -> None:
        if not table:
            raise ConfigurationError("the cancellation table needs a name")
        self.client = client
        self.table = table
        #: Strongly consistent reads (``live``): a record written a moment ago is seen (the tier's certain cancels).
        self.consistent = consistent

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

    def live(self, endpoint: str) -> list[StoredRecord]:
        """Every item of ``endpoint`` (one Query, paged; eventually consistent unless ``consistent``), unreadable ones
        as such."""
        found: list[StoredRecord] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#e = :e",
            "ExpressionAttributeNames": {"#e": "endpoint"},
            "ExpressionAttributeValues": {":e": {"S": endpoint}},
        }
        if self.consistent:
            kwargs["ConsistentRead"] = True
        try:
            while True:
                page = self.client.query(**kwargs)
                found.extend(r for r in (_record(item) for item in page.get("Items", [])) if r is not None)
                if "LastEvaluatedKey" not in page:
                    return found
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, f"reading the cancellation records of {endpoint!r}", self.table) from exc

    def every(self, limit: int = 1_000) -> tuple[list[StoredRecord], bool]:
        """Up to ``limit`` records of every endpoint (a paged Scan: for operators) and whether more were left."""
        found: list[StoredRecord] = []
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

    def delete(self, records: Sequence[StoredRecord]) -> None:
        """Delete each record unless it was replaced by a newer request (then that one stays)."""
        for record in records:
            condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(requested_at)"}
            stored = record.version if isinstance(record, UnreadableRecord) else {"S": record.requested_at.isoformat()}
            if isinstance(stored, Mapping):
                condition = {"ConditionExpression": "requested_at = :r", "ExpressionAttributeValues": {":r": stored}}
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key={"endpoint": {"S": record.endpoint}, "message_id": {"S": record.message_id}},
                    **condition,
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    continue
                raise _translate(exc, f"deleting the record of {record.message_id!r}", self.table) from exc
            except BotoCoreError as exc:
                raise _translate(exc, f"deleting the record of {record.message_id!r}", self.table) from exc

    def settle(self, records: Sequence[Cancellation], until: Mapping[tuple[str, str], datetime]) -> None:
        """Shorten each record's life (its TTL attribute) to ``until``, unless a newer request replaced it or it
        ends sooner already."""
        for record in records:
            when = until.get((record.endpoint, record.message_id))
            if when is None:
                continue
            expires = str(int(utc(when).timestamp()))
            try:
                self.client.update_item(
                    TableName=self.table,
                    Key={"endpoint": {"S": record.endpoint}, "message_id": {"S": record.message_id}},
                    UpdateExpression=f"SET {TTL_ATTRIBUTE} = :t",
                    ConditionExpression=f"requested_at = :r AND {TTL_ATTRIBUTE} > :t",
                    ExpressionAttributeValues={":r": {"S": record.requested_at.isoformat()}, ":t": {"N": expires}},
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    continue
                raise _translate(exc, f"settling the record of {record.message_id!r}", self.table) from exc
            except BotoCoreError as exc:
                raise _translate(exc, f"settling the record of {record.message_id!r}", self.table) from exc

    def check(self) -> None:
        """Raise ``ConfigurationError`` when the table does not exist (one DescribeTable)."""
        try:
            self.client.describe_table(TableName=self.table)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, "checking the cancellation table", self.table) from exc


def _record(item: Mapping[str, Any]) -> StoredRecord | None:
    """An item as a record, or an ``UnreadableRecord`` naming its message; ``None`` only without a key to name one."""
    endpoint, message_id = _attribute(item, "endpoint", "S"), _attribute(item, "message_id", "S")
    if not isinstance(endpoint, str) or not isinstance(message_id, str):
        return None  # the table's keys are text: not an item of this table
    expires_at: datetime | None = None
    try:
        expires_at = _expiry(item)
        kind = _attribute(item, "kind", "S")
        if kind not in {k.value for k in CancellationKind}:
            raise InvalidMessageError(f"kind {_shown(kind)} is neither cancel nor reschedule")
        return Cancellation(
            endpoint=endpoint,
            message_id=message_id,
            kind=CancellationKind(kind),
            requested_at=_time(item, "requested_at"),
            expires_at=expires_at,
            due_at=_time(item, "due_at") if "due_at" in item else None,
        )
    except DelayedDeliveryError as exc:
        return UnreadableRecord(endpoint, message_id, str(exc)[:300], expires_at, version=item.get("requested_at"))


def _attribute(item: Mapping[str, Any], name: str, kind: str) -> object:
    """The ``kind`` (``S``, ``N``) value of attribute ``name``, or ``None``."""
    value = item.get(name)
    return value.get(kind) if isinstance(value, Mapping) else None


def _shown(value: object) -> str:
    return repr(value)[:60] if value is not None else "missing"


def _time(item: Mapping[str, Any], name: str) -> datetime:
    """An ISO-8601 text attribute as a datetime (naive and out-of-range times are refused by ``Cancellation``)."""
    text = _attribute(item, name, "S")
    if not isinstance(text, str) or len(text) > 64:
        raise InvalidMessageError(f"{name} is {_shown(text)}, not ISO-8601 text")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidMessageError(f"{name} {_shown(text)} is not an ISO-8601 time") from None


def _expiry(item: Mapping[str, Any]) -> datetime:
    """The TTL attribute (whole epoch seconds) as a datetime."""
    number = _attribute(item, TTL_ATTRIBUTE, "N")
    try:
        if not isinstance(number, str) or len(number) > 20:
            raise ValueError(number)
        return datetime.fromtimestamp(int(number), tz=UTC)
    except (ValueError, OverflowError, OSError):
        raise InvalidMessageError(f"{TTL_ATTRIBUTE} {_shown(number)} is not whole epoch seconds") from None


def ensure_cancellation_table(client: DynamoDBClient, table: str = DEFAULT_TABLE) -> None:
    """Create the table (on-demand, TTL on ``expires_at``) if missing; for emulators and scripts, CDK in the cloud."""
    try:
        create_ttl_table(client, table, "endpoint", ("message_id", "S"), TTL_ATTRIBUTE)
    except (ClientError, BotoCoreError) as exc:
        raise _translate(exc, "creating the cancellation table", table) from exc
