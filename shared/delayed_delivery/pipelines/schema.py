"""The two legacy timeout shapes, their column mapping, and row normalisation (pure Python, no Spark).

Shapes (column names matched case-insensitively; the first alias present wins):

``timeout-manager`` (the timeout manager's storage, one row per saga or delayed-send timeout)
    ``Id`` → message id · ``Destination`` → destination · ``SagaId`` → header
    ``DelayedDelivery.Migrated.SagaId`` · ``State`` (alias ``Body``) → body · ``Time`` (alias ``Due``) → due time ·
    ``Headers`` → headers · ``Endpoint`` (aliases ``OwningTimeoutManager``, ``Owner``) → endpoint.

``delayed-store`` (the delayed-message-store table ``<endpoint>.timeouts``)
    ``Id`` → message id · ``Destination`` → destination · ``State`` (alias ``Body``) → body ·
    ``Time`` (alias ``Due``) → due time · ``Headers`` → headers · ``RetryCount`` → failure count ·
    ``Endpoint`` if present, else the ``--source-endpoint`` option (the table's endpoint).

Values: times are ISO-8601 or ``yyyy-MM-dd HH:mm:ss[.ffffff]``, UTC when no offset is given (the legacy
tables store UTC); headers are a JSON object (empty or null means none; non-string values are kept as their
JSON text); bodies are bytes in Parquet, and text in CSV/JSON lines decoded by the body encoding
(``base64`` by default, or ``hex`` with an optional ``0x``, or ``text`` for UTF-8). A row that cannot be
mapped becomes a reject with a one-line reason; it is never dropped and never stops the run.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from ..errors import ConfigurationError
from ..headers import HEADER_PREFIX
from ..jsonbounds import MAX_HEADERS_JSON_CHARS, loads_bounded
from ..model import MAX_MESSAGE_ID_LENGTH

__all__ = [
    "MIGRATED_FROM_HEADER",
    "SAGA_ID_HEADER",
    "BodyEncoding",
    "ColumnMapping",
    "LegacyShape",
    "NormalizedRow",
    "Reject",
    "detect_shape",
    "normalize_row",
    "parse_due_time",
]

#: Header added to every migrated message: which legacy shape it came from.
MIGRATED_FROM_HEADER = HEADER_PREFIX + "MigratedFrom"
#: Header carrying the timeout manager's saga id, when the row had one.
SAGA_ID_HEADER = HEADER_PREFIX + "Migrated.SagaId"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class LegacyShape(StrEnum):
    """Which legacy table an export came from."""

    TIMEOUT_MANAGER = "timeout-manager"
    DELAYED_STORE = "delayed-store"


class BodyEncoding(StrEnum):
    """How a text column holds the binary body."""

    BASE64 = "base64"
    HEX = "hex"
    TEXT = "text"


_ALIASES: dict[str, tuple[str, ...]] = {
    "id": ("id", "messageid", "message_id"),
    "destination": ("destination",),
    "body": ("state", "body"),
    "time": ("time", "due", "due_at"),
    "headers": ("headers",),
    "saga_id": ("sagaid", "saga_id"),
    "endpoint": ("endpoint", "owningtimeoutmanager", "owner"),
    "retry_count": ("retrycount", "retry_count", "numberofretries"),
}
_REQUIRED = ("id", "destination", "body", "time")


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """Which source column feeds which field, plus the decoding rules."""

    shape: LegacyShape
    columns: Mapping[str, str]
    body_encoding: BodyEncoding = BodyEncoding.BASE64
    default_endpoint: str = "(unnamed)"

    @classmethod
    def for_columns(
        cls,
        shape: LegacyShape,
        source_columns: list[str],
        body_encoding: BodyEncoding = BodyEncoding.BASE64,
        default_endpoint: str | None = None,
    ) -> ColumnMapping:
        """Resolve the documented aliases against the source's column names; raise if a required one is absent."""
        lower = {c.lower(): c for c in source_columns}
        found: dict[str, str] = {}
        for field_name, aliases in _ALIASES.items():
            if field_name == "saga_id" and shape is not LegacyShape.TIMEOUT_MANAGER:
                continue
            if field_name == "retry_count" and shape is not LegacyShape.DELAYED_STORE:
                continue
            for alias in aliases:
                if alias in lower:
                    found[field_name] = lower[alias]
                    break
        missing = [f for f in _REQUIRED if f not in found]
        if missing:
            raise ConfigurationError(
                f"the source has no column for {', '.join(missing)} (shape {shape.value}; columns: "
                f"{', '.join(source_columns)}); see docs/pipelines.md for the schema mapping"
            )
        return cls(shape, found, body_encoding, default_endpoint or "(unnamed)")


def detect_shape(source_columns: list[str]) -> LegacyShape:
    """Guess the shape: a saga id or owner column means the timeout manager, a retry count the delayed store."""
    lower = {c.lower() for c in source_columns}
    if lower & {"sagaid", "saga_id", "owningtimeoutmanager"}:
        return LegacyShape.TIMEOUT_MANAGER
    if lower & {"retrycount", "retry_count", "numberofretries"}:
        return LegacyShape.DELAYED_STORE
    raise ConfigurationError(
        "cannot tell the legacy shape from the columns " + ", ".join(source_columns) + ": pass --shape"
    )


@dataclass(frozen=True, slots=True)
class NormalizedRow:
    """A legacy row ready to migrate; ``due_us`` is microseconds since the Unix epoch (UTC)."""

    message_id: str
    destination: str
    body: bytes
    due_us: int
    headers_json: str
    failure_count: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class Reject:
    """A row that cannot be migrated, with why."""

    reason: str


def parse_due_time(value: object) -> datetime:
    """Parse a legacy due time into an aware UTC datetime; raise ValueError when unparsable."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("missing time")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def to_epoch_us(value: datetime) -> int:
    """Microseconds since the Unix epoch for an aware datetime."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _body(value: object, encoding: BodyEncoding) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    text = str(value)
    if encoding is BodyEncoding.TEXT:
        return text.encode("utf-8")
    if encoding is BodyEncoding.HEX:
        stripped = text.strip()
        return bytes.fromhex(stripped[2:] if stripped[:2].lower() == "0x" else stripped)
    return base64.b64decode(text.strip(), validate=True)


def _headers(value: object) -> dict[str, str]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8")
    parsed = (
        value
        if isinstance(value, Mapping)
        else loads_bounded(str(value), what="headers", max_chars=MAX_HEADERS_JSON_CHARS, max_depth=64)
    )
    if parsed is None:
        return {}
    if not isinstance(parsed, dict):
        raise ValueError("headers are not a JSON object")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in parsed.items() if str(k)}


def _retry_count(value: object) -> int:
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0
    count = int(str(value).strip())
    if count < 0:
        raise ValueError("negative retry count")
    return count


def normalize_row(row: Mapping[str, object], mapping: ColumnMapping) -> NormalizedRow | Reject:
    """Map one source row to a NormalizedRow, or a Reject naming the first problem found."""
    cols = mapping.columns

    def get(name: str) -> object:
        column = cols.get(name)
        return None if column is None else row.get(column)

    message_id = _text(get("id"))
    if message_id is None:
        return Reject("missing id")
    if len(message_id) > MAX_MESSAGE_ID_LENGTH:
        return Reject(f"id longer than {MAX_MESSAGE_ID_LENGTH} characters")
    destination = _text(get("destination"))
    if destination is None:
        return Reject("missing destination")
    try:
        due = parse_due_time(get("time"))
    except (ValueError, TypeError, OverflowError) as exc:
        return Reject("missing time" if str(exc) == "missing time" else f"unparsable time {get('time')!r}")
    try:
        headers = _headers(get("headers"))
    except (ValueError, TypeError, UnicodeDecodeError):
        return Reject("unparsable headers (not a JSON object)")
    try:
        body = _body(get("body"), mapping.body_encoding)
    except (ValueError, TypeError, binascii.Error):
        return Reject(f"unparsable body (not {mapping.body_encoding.value})")
    try:
        failures = _retry_count(get("retry_count"))
    except (ValueError, TypeError):
        return Reject(f"unparsable retry count {get('retry_count')!r}")
    saga_id = _text(get("saga_id"))
    if saga_id is not None:
        headers[SAGA_ID_HEADER] = saga_id
    headers[MIGRATED_FROM_HEADER] = mapping.shape.value
    endpoint = _text(get("endpoint")) or mapping.default_endpoint
    return NormalizedRow(
        message_id=message_id,
        destination=destination,
        body=body,
        due_us=to_epoch_us(due),
        headers_json=json.dumps(headers, ensure_ascii=False, sort_keys=True),
        failure_count=failures,
        endpoint=endpoint,
    )
