"""The S3 time-bucket object format (v2; v1 still read): gzip-compressed JSON lines, a header line then one per message.

Header: ``{"v":2,"level":"fine","bucket":"2031-02-03T04:05:00Z","count":N}``. Message lines: ``{"id", "destination",
"t" (the body as text) or "body" (base64), "attributes" ({name: [DataType, "s" | "b", text | base64]}),
"due_at_ms", "hops", "sent_at_ms"}``; v1 lines always carry ``"body"``. Reading is bounded and total: a bad line
becomes a ``PoisonEntry``, a bad object a ``problem``; nothing raises. The format is described in docs/buckets.md.

This module is the format's public face: the message and the bounds are ``bucket_message.py``, the writer
``object_writer.py``, the reader ``object_reader.py``.
"""

from __future__ import annotations

from .bucket_message import (
    FORMAT_VERSION,
    MAX_ATTRIBUTES,
    MAX_DECODED_BYTES,
    MAX_LINE_BYTES,
    MAX_LINE_CHARS,
    MAX_OBJECT_MESSAGES,
    MAX_POISON_RAW_BYTES,
    READ_VERSIONS,
    BucketContents,
    BucketMessage,
    PoisonEntry,
)
from .object_reader import BucketHeader, BucketStream, RawLine, decode_bucket, line_id, read_line
from .object_writer import (
    WRITE_BACK_SALT,
    bucket_object_key,
    encode_bucket,
    encode_bucket_object,
    encoded_line_bytes,
    one_per_id,
)

__all__ = [
    "FORMAT_VERSION",
    "MAX_ATTRIBUTES",
    "MAX_DECODED_BYTES",
    "MAX_LINE_BYTES",
    "MAX_LINE_CHARS",
    "MAX_OBJECT_MESSAGES",
    "MAX_POISON_RAW_BYTES",
    "READ_VERSIONS",
    "WRITE_BACK_SALT",
    "BucketContents",
    "BucketHeader",
    "BucketMessage",
    "BucketStream",
    "PoisonEntry",
    "RawLine",
    "bucket_object_key",
    "decode_bucket",
    "encode_bucket",
    "encode_bucket_object",
    "encoded_line_bytes",
    "line_id",
    "one_per_id",
    "read_line",
]
