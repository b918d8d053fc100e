"""The S3 time-bucket object writer: a bucket's messages as one gzip object of JSON lines, and its content key.

The same messages in any order give the same bytes and the same key (``format.py`` describes the format).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidMessageError
from .bucket_message import (
    FORMAT_VERSION,
    MAX_DECODED_BYTES,
    MAX_LINE_CHARS,
    MAX_OBJECT_MESSAGES,
    BucketMessage,
    encode_attributes,
)
from .identity import first_sent, same_message
from .wheel import BucketKey, BucketLevel, content_key

__all__ = [
    "WRITE_BACK_SALT",
    "bucket_object_key",
    "encode_bucket",
    "encode_bucket_object",
    "encoded_line_bytes",
    "one_per_id",
]

#: What a salted key's hash starts with (``encode_bucket_object``): never the start of an object's own bytes.
WRITE_BACK_SALT = "delayed-delivery-write-back/1 "


def _body_field(body: bytes) -> tuple[str, str]:
    """``("t", text)`` for a UTF-8 body no longer in JSON than in base64, else ``("body", base64)``.

    The length test keeps a v2 line never longer than the v1 line of the same message, so every bound holds.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and len(_dumps(text).encode("utf-8")) - 2 <= (len(body) + 2) // 3 * 4:
        return "t", text
    return "body", base64.b64encode(body).decode("ascii")


def _line(message: BucketMessage) -> dict[str, Any]:
    name, body = _body_field(message.body)
    return {
        "id": message.message_id,
        "destination": message.destination,
        name: body,
        "attributes": encode_attributes(message.attributes),
        "due_at_ms": message.due_at_ms,
        "hops": message.hops,
        "sent_at_ms": message.sent_at_ms,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def one_per_id(messages: Sequence[BucketMessage]) -> dict[tuple[str, int], BucketMessage]:
    """One copy per message, the first sent (``identity.py``: a message is its id and due time; under one id, other
    due times are other messages); raises ``InvalidMessageError`` for two different messages under one id and due
    time (a writer refuses what would replace a message)."""
    unique: dict[tuple[str, int], BucketMessage] = {}
    for message in messages:
        if not isinstance(message, BucketMessage):
            raise InvalidMessageError(f"expected BucketMessage, got {type(message).__name__}")
        key = (message.message_id, message.due_at_ms)
        known = unique.setdefault(key, message)
        if known is message:
            continue
        if not same_message(known, message):
            raise InvalidMessageError(
                f"two different messages with id {message.message_id!r} and one due time in one bucket object"
            )
        unique[key] = first_sent(known, message)
    return unique


def _ordered(bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel) -> list[BucketMessage]:
    """The messages sorted by (due, id), copies of one message kept once; refuses a conflict, an outsider, too many."""
    unique = one_per_id(messages)
    for message in unique.values():
        if not bucket.holds(message.due_at, levels):
            raise InvalidMessageError(f"message {message.message_id!r} is not due within bucket {bucket.iso}")
    if not unique or len(unique) > MAX_OBJECT_MESSAGES:
        raise InvalidMessageError(f"a bucket object holds 1 to {MAX_OBJECT_MESSAGES:,} messages, not {len(unique):,}")
    return sorted(unique.values(), key=lambda m: (m.due_at_ms, m.message_id))


def encoded_line_bytes(message: BucketMessage) -> int:
    """The bytes ``message`` takes in an object once decompressed (its line and the newline), for writers that split."""
    return len(_dumps(_line(message)).encode("utf-8")) + 1


def _text(bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel | None) -> tuple[bytes, int]:
    """The object's decompressed bytes and its message count: the same messages in any order give the same bytes."""
    ordered = _ordered(bucket, messages, levels or BucketLevel())
    header = {"v": FORMAT_VERSION, "level": bucket.level, "bucket": bucket.iso, "count": len(ordered)}
    lines = [_dumps(header)]
    for message in ordered:
        line = _dumps(_line(message))
        if len(line) > MAX_LINE_CHARS:
            raise InvalidMessageError(f"message {message.message_id!r} is {len(line):,} characters, over the bound")
        lines.append(line)
    text = ("\n".join(lines) + "\n").encode("utf-8")
    if len(text) > MAX_DECODED_BYTES:
        raise InvalidMessageError(f"{len(text):,} bytes is more than one bucket object holds: write two objects")
    return text, len(ordered)


def encode_bucket(bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel | None = None) -> bytes:
    """The object for ``messages`` in ``bucket``: the same messages in any order give the same bytes."""
    text, _ = _text(bucket, messages, levels)
    return gzip.compress(text, compresslevel=6, mtime=0)


def encode_bucket_object(
    prefix: str,
    bucket: BucketKey,
    messages: Sequence[BucketMessage],
    levels: BucketLevel | None = None,
    *,
    salt: str = "",
    ordered: bool = False,
) -> tuple[str, bytes]:
    """The key (v3: the sha256 of the object's decompressed bytes, and the count) and the object for ``messages``.

    The key names the content itself, so a retried write of the same messages writes the same key and bytes, and
    no write can replace a different message (key v2 hashed only ids and due times: another body under the same id
    and due time overwrote the first, #23). ``salt`` (a dispatch plan's name) hashes it in too: the same content
    then gets another key, so a worker's write-back never lands on an object of the plan that wrote it (#31).
    ``ordered``: the hash's first 16 hex characters are the first due time's epoch ms instead, so a bucket's objects
    list in due order (the held areas, ``aws/tier/held.py``). Readers never recompute the hash, so every reader reads
    such a key.
    """
    text, count = _text(bucket, messages, levels)
    digest = hashlib.sha256(f"{WRITE_BACK_SALT}{salt}\n".encode() + text if salt else text).hexdigest()
    if ordered:
        first = min(m.due_at_ms for m in messages)
        digest = f"{first:016x}{digest[16:]}"
    key = content_key(prefix, bucket, digest, count)
    return key, gzip.compress(text, compresslevel=6, mtime=0)


def bucket_object_key(
    prefix: str, bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel | None = None
) -> str:
    """The key of the object ``encode_bucket`` writes for ``messages`` (key v3, ``encode_bucket_object``)."""
    return encode_bucket_object(prefix, bucket, messages, levels)[0]
