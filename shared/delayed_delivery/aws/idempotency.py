"""Effectively-once processing on AWS: the Powertools idempotency utility over DynamoDB, keyed by the message id."""

from __future__ import annotations

import functools
import json
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
from botocore.exceptions import BotoCoreError, ClientError

from ..clock import Clock, SystemClock
from ..errors import ConfigurationError, DelayedDeliveryError, PermanentError, TransientError
from ..idempotency import (
    DEFAULT_EXPIRY,
    DEFAULT_IN_PROGRESS_TIMEOUT,
    HasMessageId,
    ProcessingInProgressError,
    RecordRetry,
    key_of,
    result_text,
    retry_record,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["MAX_RESULT_CHARS", "DynamoDBEffectivelyOnce", "effectively_once", "ensure_idempotency_table"]

P = ParamSpec("P")
R = TypeVar("R")

#: The record field Powertools reads the key from: the payload it hashes is ``{"message_id": <id>}``.
_KEY_FIELD = "message_id"
#: Longest result JSON stored: a DynamoDB item holds 400 KB, the key, status and times fit in what is left.
MAX_RESULT_CHARS = 400_000
#: DynamoDB's answers that refuse an item for good (e.g. too large), not for now.
_REFUSALS = frozenset({"ValidationException", "SerializationException"})


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
    ``name`` separates consumers sharing a table, keep it stable across deployments. Once the effect returned, its
    id is recorded as done whatever the result (``idempotency.retry_record``; ``clock`` and ``retry`` pace it).
    """

    def __init__(
        self,
        table: str,
        *,
        name: str,
        expires_after: timedelta | float = DEFAULT_EXPIRY,
        in_progress_timeout: timedelta | float = DEFAULT_IN_PROGRESS_TIMEOUT,
        client: DynamoDBClient | None = None,
        clock: Clock | None = None,
        retry: RecordRetry | None = None,
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
        self.clock = clock or SystemClock()
        self.retry = retry
        self._persistence = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
        self._run: Callable[..., Any] = idempotent_function(
            data_keyword_argument="payload",
            persistence_store=self._persistence,
            config=config,
            key_prefix=f"delayed-delivery.{name}",
        )(_call)

    def run(self, message: str | HasMessageId, fn: Callable[[], R]) -> R | Any:
        """Run ``fn`` once for ``message``'s id; a duplicate gets the stored JSON result instead.

        Raises ``ProcessingInProgressError`` (transient) while another attempt holds the id and ``TransientError``
        when DynamoDB cannot be read or written before the effect; an exception of ``fn`` releases the id and
        propagates. After the effect, an unstorable result is recorded as ``None`` (logged) and a failed record is
        tried again; ``EffectNotRecordedError`` (not retryable) when that stays impossible.
        """
        key = key_of(message)
        payload = {_KEY_FIELD: key}
        effect = _Effect(key, fn)
        try:
            stored = self._run(effect, payload=payload)
        except IdempotencyAlreadyInProgressError as exc:
            raise ProcessingInProgressError(key) from exc
        except IdempotencyPersistenceLayerError as exc:
            if not effect.ran:
                raise TransientError(f"idempotency table {self.table!r}: {exc}") from exc
            failed = [self._store_error(exc.__cause__ or exc)]  # Powertools' own attempt is the first one

            def attempt(text: str | None) -> bool:
                if failed:
                    raise failed.pop()
                return self._save(payload, text)

            retry_record(key, effect.text, attempt, clock=self.clock, retry=self.retry)
        return effect.result if effect.ran else stored

    def _save(self, payload: dict[str, str], text: str | None) -> bool:
        """Powertools' own ``save_success`` (the record it could not write), its errors as the core's."""
        try:
            result: Any = None if text is None else json.loads(text)
            self._persistence.save_success(data=payload, result=result)
        except (ClientError, BotoCoreError) as exc:
            raise self._store_error(exc) from exc
        return True

    def _store_error(self, exc: BaseException) -> DelayedDeliveryError:
        """DynamoDB refusing the record for good (e.g. too large) is permanent; anything else may pass."""
        code = str(exc.response.get("Error", {}).get("Code", "")) if isinstance(exc, ClientError) else ""
        kind = PermanentError if code in _REFUSALS else TransientError
        return kind(f"idempotency table {self.table!r}: {exc}")

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


class _Effect:
    """The effect as Powertools runs it: keeps what ``fn`` returned and hands Powertools only what it can store."""

    def __init__(self, key: str, fn: Callable[[], Any]) -> None:
        self.key = key
        self.fn = fn
        self.ran = False
        self.result: Any = None
        self.text: str | None = None

    def __call__(self) -> Any:
        """Run the effect; return its result, or ``None`` when that cannot be stored (logged by ``result_text``)."""
        self.result = self.fn()
        self.ran = True
        self.text = result_text(self.key, self.result, MAX_RESULT_CHARS)
        return None if self.text is None else self.result


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
    clock: Clock | None = None,
    retry: RecordRetry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: the handler runs at most once per message id (its first argument); ``name`` defaults to its name."""

    def decorate(handler: Callable[P, R]) -> Callable[P, R]:
        consumer = DynamoDBEffectivelyOnce(
            table,
            name=name or f"{handler.__module__}.{handler.__qualname__}",
            expires_after=expires_after,
            in_progress_timeout=in_progress_timeout,
            client=client,
            clock=clock,
            retry=retry,
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
