"""A message in an S3 time-bucket object, what a bucket object read holds, and the object format's bounds.

The object format's writer is ``object_writer.py``, its reader ``object_reader.py``; ``format.py`` describes the
format and exports both (docs/buckets.md).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import InvalidMessageError
from ..model import MAX_MESSAGE_ID_LENGTH, check_destination, is_usable_message_id
from ..validation import is_whole
from .wheel import BucketKey

__all__ = [
    "FORMAT_VERSION",
    "MAX_ATTRIBUTES",
    "MAX_DECODED_BYTES",
    "MAX_LINE_BYTES",
    "MAX_LINE_CHARS",
    "MAX_OBJECT_MESSAGES",
    "MAX_POISON_RAW_BYTES",
    "READ_VERSIONS",
    "BucketContents",
    "BucketMessage",
    "PoisonEntry",
    "checked_ms",
    "encode_attributes",
]

#: The version writers write; readers read every version in ``READ_VERSIONS``.
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
#: The most messages one object holds (the ingest writes ~1,000).
MAX_OBJECT_MESSAGES = 10_000
#: The most bytes an object holds once decompressed (writers split beyond it; readers stop there).
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: The longest line: a 1 MiB body in base64 plus its attributes.
MAX_LINE_CHARS = 1_500_000
#: SQS's limit on message attributes.
MAX_ATTRIBUTES = 10
#: How much of a line that cannot be read is kept with its ``PoisonEntry`` (for the error queue).
MAX_POISON_RAW_BYTES = 8_192
#: The longest line a reader holds: ``MAX_LINE_CHARS`` at 4 bytes a character. A longer one is poison, read past.
MAX_LINE_BYTES = 4 * MAX_LINE_CHARS
#: The longest ``sent_at_ms`` / ``due_at_ms`` accepted: the wheel's latest time.
_MAX_MS = 220_898_664_000_000  # 9000-01-01T00:00:00Z
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class BucketMessage:
    """One message waiting in a bucket; ``attributes`` are SQS message attributes in the boto3 shape."""

    message_id: str
    destination: str
    body: bytes
    due_at_ms: int
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    hops: int = 0
    sent_at_ms: int | None = None

    def __post_init__(self) -> None:
        if not is_usable_message_id(self.message_id):
            raise InvalidMessageError(f"message id must be 1-{MAX_MESSAGE_ID_LENGTH} characters of text")
        check_destination(self.destination)
        if not isinstance(self.body, bytes):
            raise InvalidMessageError("body must be bytes")
        checked_ms("due_at_ms", self.due_at_ms)
        if self.sent_at_ms is not None:
            checked_ms("sent_at_ms", self.sent_at_ms)
        if not is_whole(self.hops, 0, 1_000_000):
            raise InvalidMessageError(f"hops must be a whole number from 0 to 1,000,000, got {self.hops!r}")
        encode_attributes(self.attributes)

    @property
    def due_at(self) -> datetime:
        """The due time as an aware UTC datetime."""
        return _EPOCH + timedelta(milliseconds=self.due_at_ms)


@dataclass(frozen=True, slots=True)
class PoisonEntry:
    """A line that could not be read: its line number (1 = the first message), the id if readable, the reason."""

    line: int
    message_id: str | None
    reason: str
    #: The line's first ``MAX_POISON_RAW_BYTES`` bytes, as stored (``raw_size``: its whole length).
    raw: bytes = field(default=b"", compare=False, repr=False)
    raw_size: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class BucketContents:
    """What ``decode_bucket`` read. ``problem`` names what is wrong with the object as a whole, if anything."""

    version: int | None
    bucket: BucketKey | None
    count: int | None
    messages: tuple[BucketMessage, ...]
    poison: tuple[PoisonEntry, ...]
    problem: str | None = None

    @property
    def complete(self) -> bool:
        """Whether every message the header announces was read."""
        return self.problem is None and not self.poison


def checked_ms(name: str, value: object) -> int:
    """``value`` when it is whole milliseconds from 1970 to 9000 (``name`` says what it is in the error)."""
    if is_whole(value, 0, _MAX_MS - 1):
        return value
    raise InvalidMessageError(f"{name} must be whole milliseconds from 1970 to 9000, got {str(value)[:40]}")


def encode_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Attributes (boto3 shape) as a line holds them: ``{name: [DataType, "s" | "b", text | base64]}``."""
    if not isinstance(attributes, Mapping) or len(attributes) > MAX_ATTRIBUTES:
        raise InvalidMessageError(f"attributes must be a mapping of at most {MAX_ATTRIBUTES} entries")
    encoded: dict[str, list[str]] = {}
    for name, value in attributes.items():
        data_type = value.get("DataType") if isinstance(value, Mapping) else None
        if not isinstance(name, str) or not name or not isinstance(data_type, str) or not data_type:
            raise InvalidMessageError(f"attribute {str(name)[:60]!r} needs a name and a DataType")
        _unicode(f"attribute {name[:60]!r}", name, data_type, value.get("StringValue"))
        if isinstance(value.get("BinaryValue"), bytes | bytearray):
            encoded[name] = [data_type, "b", base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")]
        elif isinstance(value.get("StringValue"), str):
            encoded[name] = [data_type, "s", value["StringValue"]]
        else:
            raise InvalidMessageError(f"attribute {name[:60]!r} needs a StringValue text or a BinaryValue bytes")
    return encoded


def _unicode(what: str, *texts: object) -> None:
    """Refuse text that cannot be written back as UTF-8 (a lone surrogate such as ``"\\ud800"``)."""
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidMessageError(f"{what} holds a lone surrogate: not Unicode text") from None
