"""Effectively-once processing on Azure: a ``ProcessedLog`` over an Azure Table, claimed by a conditional insert."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from ..clock import Clock
from ..errors import ConfigurationError, TransientError
from ..idempotency import (
    DEFAULT_EXPIRY,
    DEFAULT_IN_PROGRESS_TIMEOUT,
    AlreadyDone,
    Claim,
    HasMessageId,
    InProgress,
    RecordRetry,
    once,
)
from ..naming import validate_azure_table_name
from .sdk_errors import sdk_errors

__all__ = ["MAX_RESULT_CHARS", "TableProcessedLog", "effectively_once", "table_key"]

P = ParamSpec("P")
R = TypeVar("R")

IN_PROGRESS = "in-progress"
COMPLETED = "completed"
#: Characters a table key may not hold (plus ``%``, the escape, and ``~``, which marks a hashed key).
_RESERVED = frozenset("/\\#?%~") | {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))}
#: Longest escaped key kept readable; longer ones are stored as ``~`` + their SHA-256.
_MAX_READABLE = 255
#: Attempts at a claim when the record changes between reading and writing it.
_ATTEMPTS = 5
#: Longest string property a table stores: 64 KiB of UTF-16 (result JSON is ASCII: one unit a character).
MAX_RESULT_CHARS = 32_768


def table_key(text: str) -> str:
    """``text`` as a table key: reserved characters percent-escaped, a long key hashed (distinct keys stay distinct)."""
    escaped = "".join(f"%{ord(c):02X}" if c in _RESERVED else c for c in text)
    if len(escaped) <= _MAX_READABLE:
        return escaped
    return "~" + hashlib.sha256(text.encode()).hexdigest()


def _time(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise TransientError(f"idempotency record has no readable time: {value!r}")
    return datetime.fromtimestamp(value.timestamp(), UTC)


class TableProcessedLog:
    """Processed message ids in an Azure Table: one row per (message id, consumer ``name``).

    ``begin`` inserts an in-progress row (the insert fails with 409 when the row exists); a row whose time ended is
    replaced under its ETag, so two attempts never both take it; ``complete`` and ``release`` act only while the
    claim's ETag still matches. A result longer than ``MAX_RESULT_CHARS`` is recorded without it (``once``).
    """

    #: Longest result JSON a row holds.
    max_result_chars: int | None = MAX_RESULT_CHARS

    def __init__(self, table: TableClient, *, name: str = "consumer") -> None:
        if not name:
            raise ConfigurationError("effectively-once processing needs a consumer name")
        self.table = table
        self.name = name
        self._row_key = table_key(name)

    @classmethod
    def from_connection_string(cls, connection_string: str, table: str, *, name: str = "consumer") -> TableProcessedLog:
        """A log on ``table`` of the storage account in ``connection_string``."""
        validate_azure_table_name(table)
        return cls(TableClient.from_connection_string(connection_string, table_name=table), name=name)

    def setup_infrastructure(self) -> None:
        """Create the table if it does not exist."""
        exists = contextlib.suppress(ResourceExistsError)
        with sdk_errors(f"create idempotency table {self.table.table_name!r}"), exists:
            self.table.create_table()

    def drop(self) -> None:
        """Delete the table (tests)."""
        with sdk_errors(f"delete idempotency table {self.table.table_name!r}"):
            self.table.delete_table()

    def _entity(self, key: str, status: str, until: datetime, result: str | None = None) -> dict[str, Any]:
        entity: dict[str, Any] = {
            "PartitionKey": table_key(key),
            "RowKey": self._row_key,
            "MessageId": key,
            "Status": status,
            "Until": until,
        }
        if result is not None:
            entity["Result"] = result
        return entity

    def begin(self, key: str, *, now: datetime, in_progress_until: datetime) -> Claim | AlreadyDone | InProgress:
        """Claim ``key`` by a conditional insert, or take over its row when that row's time ended."""
        fresh = self._entity(key, IN_PROGRESS, in_progress_until)
        with sdk_errors(f"claim message {key!r} in {self.table.table_name!r}"):
            for _ in range(_ATTEMPTS):
                try:
                    return Claim(key, self.table.create_entity(fresh)["etag"])
                except ResourceExistsError:
                    pass
                try:
                    row = self.table.get_entity(fresh["PartitionKey"], self._row_key)
                except ResourceNotFoundError:
                    continue  # released meanwhile: insert again
                until = _time(row.get("Until"))
                if until > now:
                    if row.get("Status") == COMPLETED:
                        return AlreadyDone(key, row.get("Result"))
                    return InProgress(key, until)
                try:
                    meta = self.table.update_entity(
                        fresh,
                        mode=UpdateMode.REPLACE,
                        etag=row.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified,
                    )
                    return Claim(key, meta["etag"])
                except (ResourceModifiedError, ResourceNotFoundError):
                    continue  # another attempt took it or it was released: look again
        raise TransientError(f"message {key!r}: its idempotency record kept changing; retry later")

    def complete(self, claim: Claim, result: str | None, *, expires_at: datetime) -> bool:
        """Mark the claim's row completed until ``expires_at``; False when the claim was lost."""
        with sdk_errors(f"complete message {claim.key!r} in {self.table.table_name!r}"):
            try:
                self.table.update_entity(
                    self._entity(claim.key, COMPLETED, expires_at, result),
                    mode=UpdateMode.REPLACE,
                    etag=claim.token,
                    match_condition=MatchConditions.IfNotModified,
                )
                return True
            except (ResourceModifiedError, ResourceNotFoundError):
                return False

    def release(self, claim: Claim) -> None:
        """Delete the claim's row while it still holds it."""
        gone = contextlib.suppress(ResourceModifiedError, ResourceNotFoundError)  # taken over or gone
        with sdk_errors(f"release message {claim.key!r} in {self.table.table_name!r}"), gone:
            self.table.delete_entity(
                table_key(claim.key), self._row_key, etag=claim.token, match_condition=MatchConditions.IfNotModified
            )


def effectively_once(
    log: TableProcessedLog,
    *,
    expires_after: timedelta | float = DEFAULT_EXPIRY,
    in_progress_timeout: timedelta | float = DEFAULT_IN_PROGRESS_TIMEOUT,
    clock: Clock | None = None,
    retry: RecordRetry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: the handler runs at most once per message id (its first argument) while the record lives."""

    def decorate(handler: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(handler)
        def once_per_message(*args: P.args, **kwargs: P.kwargs) -> R:
            if not args:
                raise TypeError(f"{handler.__qualname__} takes the message as its first positional argument")
            message: str | HasMessageId = args[0]  # type: ignore[assignment]  # checked by key_of
            result: R = once(
                log,
                message,
                lambda: handler(*args, **kwargs),
                expiry=expires_after,
                in_progress_timeout=in_progress_timeout,
                clock=clock,
                retry=retry,
            )
            return result

        return once_per_message

    return decorate
