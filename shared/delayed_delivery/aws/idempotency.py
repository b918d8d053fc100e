"""Effectively-once processing on AWS: the Powertools idempotency utility over DynamoDB, keyed by the message id."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyPersistenceLayerError,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from ..errors import ConfigurationError, TransientError
from ..idempotency import (
    DEFAULT_EXPIRY,
    DEFAULT_IN_PROGRESS_TIMEOUT,
    HasMessageId,
    ProcessingInProgressError,
    key_of,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["DynamoDBEffectivelyOnce", "effectively_once", "ensure_idempotency_table"]

P = ParamSpec("P")
R = TypeVar("R")

#: The record field Powertools reads the key from: the payload it hashes is ``{"message_id": <id>}``.
_KEY_FIELD = "message_id"


class _HoldTime:
    """A stand-in for the Lambda context: Powertools holds an in-progress key for the remaining time it reports."""

    def __init__(self, hold: timedelta) -> None:
        self._millis = int(hold.total_seconds() * 1000)

    def get_remaining_time_in_millis(self) -> int:
        """How long an attempt holds its key, in milliseconds."""
        return self._millis


def _whole_seconds(value: timedelta | float, what: str) -> int:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        raise ConfigurationError(f"{what} must be at least 1 s on DynamoDB (whole seconds), got {seconds} s")
    return round(seconds)


class DynamoDBEffectivelyOnce:
    """Runs each message's effect at most once per ``name`` while its DynamoDB record lives (Powertools idempotency).

    The table has the partition key ``id`` (string) and TTL on ``expiration`` (``ensure_idempotency_table``);
    ``name`` separates consumers sharing a table, keep it stable across deployments.
    """

    def __init__(
        self,
        table: str,
        *,
        name: str,
        expires_after: timedelta | float = DEFAULT_EXPIRY,
        in_progress_timeout: timedelta | float = DEFAULT_IN_PROGRESS_TIMEOUT,
        client: DynamoDBClient | None = None,
    ) -> None:
        if not name:
            raise ConfigurationError("effectively-once processing needs a consumer name")
        hold = _whole_seconds(in_progress_timeout, "in_progress_timeout")
        self.table = table
        self.name = name
        self.expires_after_seconds = _whole_seconds(expires_after, "expires_after")
        config = IdempotencyConfig(
            event_key_jmespath=_KEY_FIELD,
            expires_after_seconds=self.expires_after_seconds,
            raise_on_no_idempotency_key=True,
        )
        config.register_lambda_context(cast(LambdaContext, _HoldTime(timedelta(seconds=hold))))  # duck-typed
        persistence = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
        self._run: Callable[..., Any] = idempotent_function(
            data_keyword_argument="payload",
            persistence_store=persistence,
            config=config,
            key_prefix=f"delayed-delivery.{name}",
        )(_call)

    def run(self, message: str | HasMessageId, fn: Callable[[], R]) -> R | Any:
        """Run ``fn`` once for ``message``'s id; a duplicate gets the stored JSON result instead.

        Raises ``ProcessingInProgressError`` (transient) while another attempt holds the id and ``TransientError``
        when DynamoDB cannot be read or written; an exception of ``fn`` releases the id and propagates.
        """
        key = key_of(message)
        try:
            return self._run(fn, payload={_KEY_FIELD: key})
        except IdempotencyAlreadyInProgressError as exc:
            raise ProcessingInProgressError(key) from exc
        except IdempotencyPersistenceLayerError as exc:
            raise TransientError(f"idempotency table {self.table!r}: {exc}") from exc

    def __call__(self, handler: Callable[P, R]) -> Callable[P, R]:
        """Decorate a per-message handler whose first argument is the message (or its id)."""

        @functools.wraps(handler)
        def once_per_message(*args: P.args, **kwargs: P.kwargs) -> R:
            if not args:
                raise TypeError(f"{handler.__qualname__} takes the message as its first positional argument")
            message: str | HasMessageId = args[0]  # type: ignore[assignment]  # checked by key_of
            result: R = self.run(message, lambda: handler(*args, **kwargs))
            return result

        return once_per_message


def _call(fn: Callable[[], Any], *, payload: dict[str, str]) -> Any:
    """The function Powertools guards: runs the effect (``payload`` is only the key)."""
    del payload
    return fn()


def effectively_once(
    table: str,
    *,
    name: str | None = None,
    expires_after: timedelta | float = DEFAULT_EXPIRY,
    in_progress_timeout: timedelta | float = DEFAULT_IN_PROGRESS_TIMEOUT,
    client: DynamoDBClient | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: the handler runs at most once per message id (its first argument); ``name`` defaults to its name."""

    def decorate(handler: Callable[P, R]) -> Callable[P, R]:
        consumer = DynamoDBEffectivelyOnce(
            table,
            name=name or f"{handler.__module__}.{handler.__qualname__}",
            expires_after=expires_after,
            in_progress_timeout=in_progress_timeout,
            client=client,
        )
        return consumer(handler)

    return decorate


def ensure_idempotency_table(client: DynamoDBClient, table: str) -> None:
    """Create ``table`` as Powertools expects it (partition key ``id``, on demand, TTL on ``expiration``)."""
    try:
        client.create_table(
            TableName=table,
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except client.exceptions.ResourceInUseException:
        return
    client.get_waiter("table_exists").wait(TableName=table)
    client.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"}
    )
