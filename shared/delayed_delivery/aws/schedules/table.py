"""The schedules table itself: creating it (emulators and scripts; the CDK stack in the cloud) and its errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ...errors import ConfigurationError, DelayedDeliveryError, TransientError
from ..sqs import translate_error
from .layout import DEFAULT_TABLE

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["SCHEDULE_TABLE_ENV", "ensure_schedule_table", "translate"]

#: Environment variable naming the table (the timer and the CLI); default ``DEFAULT_TABLE``.
SCHEDULE_TABLE_ENV = "DELAYED_DELIVERY_SCHEDULE_TABLE"
_THROTTLED = {"ProvisionedThroughputExceededException", "RequestLimitExceeded", "ThrottlingException"}


def translate(exc: BaseException, what: str, table: str) -> DelayedDeliveryError:
    """A botocore error as the package's: a missing table is a configuration error, throttling is transient."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "ResourceNotFoundException":
            return ConfigurationError(
                f"{what}: schedules table {table!r} does not exist (the CDK stack creates it; on an emulator run "
                f"`delayed-delivery aws create`, or set {SCHEDULE_TABLE_ENV})"
            )
        if code in _THROTTLED or code == "TransactionConflictException":
            return TransientError(f"{what}: {code}")
    if isinstance(exc, ClientError | BotoCoreError):
        return translate_error(exc, what)
    return TransientError(f"{what}: unexpected {type(exc).__name__}: {exc}")


def ensure_schedule_table(client: DynamoDBClient, table: str = DEFAULT_TABLE) -> None:
    """Create the table (on demand, ``pk`` and ``sk`` strings) if missing and wait for it."""
    try:
        client.create_table(
            TableName=table,
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise translate(exc, "creating the schedules table", table) from exc
    except BotoCoreError as exc:
        raise translate(exc, "creating the schedules table", table) from exc
    client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
