"""The tier's object store on S3: bucket objects written, listed oldest first, read and deleted (docs/buckets.md).

Every S3 error leaves this module as the package's own: ``TransientError`` for throttling, 5xx and connection
trouble, ``ConfigurationError`` for a missing bucket or refused access, ``ObjectMissingError`` for a key gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import utc
from ...errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError, PermanentError, TransientError
from ...timebuckets.format import (
    MAX_DECODED_BYTES,
    MAX_OBJECT_MESSAGES,
    BucketContents,
    BucketMessage,
    BucketStream,
    encode_bucket_object,
    encoded_line_bytes,
    one_per_id,
)
from ...timebuckets.wheel import BucketKey, BucketLevel, LevelName, bucket_of, parse_object_key_count
from ..sqs import translate_error
from .config import BUCKET_NAME_ENV, DEFAULT_PREFIX, BucketTierConfig

__all__ = [
    "DELETE_BATCH",
    "READ_CHUNK_BYTES",
    "ObjectMissingError",
    "S3BucketStore",
    "S3Client",
    "StoredObject",
    "translate_s3_error",
]

#: boto3's S3 client (the dev extras carry no S3 stubs, so it is typed loosely).
S3Client: TypeAlias = Any
#: DeleteObjects takes at most 1,000 keys.
DELETE_BATCH = 1_000
#: Compressed bytes read from an object's body at a time.
READ_CHUNK_BYTES = 256 * 1024
#: Room kept for the header line when splitting by bytes.
_HEADER_BYTES = 200
_CONTENT_TYPE = "application/x-ndjson"
_MISSING_BUCKET = {"NoSuchBucket"}
_DENIED = {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden", "403"}
_MISSING_KEY = {"NoSuchKey"}
_TRANSIENT = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed", "503"}


class ObjectMissingError(PermanentError):
    """The object named is not there (already deleted, e.g. by another timer run)."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One listed bucket object: its key, bucket, message count from the key (``None`` for a v1 key) and size."""

    key: str
    bucket: BucketKey
    count: int | None
    size: int


def translate_s3_error(exc: BaseException, what: str, bucket_name: str) -> DelayedDeliveryError:
    """Map a botocore S3 error to the package's hierarchy (retryability is the type)."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _MISSING_BUCKET or (code in {"404", "NotFound"} and what.startswith("check")):
            return ConfigurationError(
                f"{what}: the S3 bucket {bucket_name!r} does not exist (create it with `delayed-delivery aws create` "
                f"or the CDK stack, or set {BUCKET_NAME_ENV})"
            )
        if code in _DENIED:
            return ConfigurationError(f"{what}: access to the S3 bucket {bucket_name!r} is refused ({code})")
        if code in _MISSING_KEY or code in {"404", "NotFound"}:
            return ObjectMissingError(f"{what}: not found in {bucket_name!r} ({code})")
        if code in _TRANSIENT or status >= 500 or status == 429:
            return TransientError(f"{what}: {code or status}")
    return translate_error(exc, what)


def _chunks(messages: Sequence[BucketMessage], max_messages: int, max_bytes: int) -> Iterator[list[BucketMessage]]:
    """The distinct messages sorted by (due, id), cut into runs under both bounds (the same input, the same cut).

    Copies of one message are written once, the first sent; two different messages under one id are refused."""
    unique = one_per_id(messages)
    chunk: list[BucketMessage] = []
    size = _HEADER_BYTES
    for message in sorted(unique.values(), key=lambda m: (m.due_at_ms, m.message_id)):
        line = encoded_line_bytes(message)
        if chunk and (len(chunk) >= max_messages or size + line > max_bytes):
            yield chunk
            chunk, size = [], _HEADER_BYTES
        chunk.append(message)
        size += line
    if chunk:
        yield chunk


class S3BucketStore:
    """Bucket objects in one S3 bucket under ``prefix`` (client injected; nothing is called at construction)."""

    def __init__(
        self,
        client: S3Client,
        bucket_name: str,
        prefix: str = DEFAULT_PREFIX,
        levels: BucketLevel | None = None,
        *,
        max_object_messages: int = MAX_OBJECT_MESSAGES,
        max_object_bytes: int = MAX_DECODED_BYTES,
        ordered_keys: bool = False,
    ) -> None:
        if not 1 <= max_object_messages <= MAX_OBJECT_MESSAGES or not 1 <= max_object_bytes <= MAX_DECODED_BYTES:
            raise ConfigurationError("object bounds must be positive and within the format's bounds")
        self.client = client
        self.bucket_name = bucket_name
        self.prefix = prefix
        self.levels = levels or BucketLevel()
        self.max_object_messages = max_object_messages
        self.max_object_bytes = max_object_bytes
        #: Keys that list a bucket's objects in due order (``encode_bucket_object(..., ordered=True)``).
        self.ordered_keys = ordered_keys

    @classmethod
    def from_config(cls, client: S3Client, config: BucketTierConfig) -> S3BucketStore:
        """The store ``config`` names (bucket, prefix, levels)."""
        return cls(client, config.bucket_name, config.prefix, config.levels)

    def _error(self, exc: BaseException, what: str) -> DelayedDeliveryError:
        return translate_s3_error(exc, what, self.bucket_name)

    def write(self, bucket: BucketKey, messages: Sequence[BucketMessage], *, salt: str = "") -> list[str]:
        """Objects for messages of one bucket (split past the bounds); the keys written. Idempotent.

        ``salt`` (a dispatch plan's name): keys apart from every object of that plan (``encode_bucket_object``)."""
        keys: list[str] = []
        for chunk in _chunks(messages, self.max_object_messages, self.max_object_bytes):
            key, data = encode_bucket_object(
                self.prefix, bucket, chunk, self.levels, salt=salt, ordered=self.ordered_keys
            )
            try:
                self.client.put_object(Bucket=self.bucket_name, Key=key, Body=data, ContentType=_CONTENT_TYPE)
            except (ClientError, BotoCoreError) as exc:
                raise self._error(exc, f"write {key}") from exc
            keys.append(key)
        return keys

    def write_due(
        self, messages: Sequence[BucketMessage], now: datetime, *, salt: str = ""
    ) -> dict[BucketKey, list[str]]:
        """Group by ``bucket_of(due, now)`` and write each group; the keys written per bucket."""
        groups: dict[BucketKey, list[BucketMessage]] = {}
        for message in messages:
            groups.setdefault(bucket_of(message.due_at, now, self.levels), []).append(message)
        salted = {"salt": salt} if salt else {}
        return {bucket: self.write(bucket, group, **salted) for bucket, group in sorted(groups.items())}

    def objects(
        self, level: LevelName, *, until: datetime | None = None, on_stray: Callable[[str], None] | None = None
    ) -> Iterator[StoredObject]:
        """Listing only (ListObjectsV2), oldest bucket first; ``until``: only buckets starting at or before it.

        Keys under the level that are not bucket object keys are skipped, each passed to ``on_stray`` when given.
        """
        limit = utc(until) if until is not None else None
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket_name, Prefix=f"{self.prefix}/{level}/")
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    found = self._stored(item, level)
                    if found is None:
                        if on_stray is not None:
                            on_stray(str(item["Key"]))
                        continue
                    if limit is not None and found.bucket.start > limit:
                        return  # keys sort in time order: nothing later is wanted
                    yield found
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"list {self.prefix}/{level}/") from exc

    def _stored(self, item: Any, level: LevelName) -> StoredObject | None:
        try:
            parsed = parse_object_key_count(str(item["Key"]))
        except InvalidMessageError:
            return None  # not a bucket object (a stray upload): left alone
        if parsed.prefix != self.prefix or parsed.bucket.level != level:
            return None
        return StoredObject(str(item["Key"]), parsed.bucket, parsed.message_count, int(item.get("Size", 0)))

    def read(self, key: str) -> BucketContents:
        """The object at ``key``, decoded whole (never raises on bad content: see ``BucketContents.problem``)."""
        return self.open(key).contents()

    def open(self, key: str) -> BucketStream:
        """The object at ``key`` as a stream read while it arrives (``GetObject`` now, the body as it is read).

        ``ObjectMissingError`` when it is gone; an S3 failure while reading raises the package's error from the
        stream's iteration. The connection closes when the stream is read to its end or dropped.
        """
        try:
            reply = self.client.get_object(Bucket=self.bucket_name, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"read {key}") from exc
        return BucketStream(self._chunks(key, reply["Body"]))

    def _chunks(self, key: str, body: Any) -> Iterator[bytes]:
        try:
            while chunk := body.read(READ_CHUNK_BYTES):
                yield chunk
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"read {key}") from exc
        finally:
            body.close()

    def set_aside(self, key: str) -> str:
        """Copy the object at ``key`` under ``<prefix>/problems/`` (kept for an operator); the copy's key."""
        copy = f"{self.prefix}/problems/{key.removeprefix(self.prefix + '/')}"
        try:
            self.client.copy_object(
                Bucket=self.bucket_name, Key=copy, CopySource={"Bucket": self.bucket_name, "Key": key}
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"set aside {key}") from exc
        return copy

    def delete(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (DeleteObjects, up to 1,000 per call); a key already gone is not an error."""
        for start in range(0, len(keys), DELETE_BATCH):
            batch = list(keys[start : start + DELETE_BATCH])
            try:
                reply = self.client.delete_objects(
                    Bucket=self.bucket_name, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except (ClientError, BotoCoreError) as exc:
                raise self._error(exc, f"delete {len(batch)} objects") from exc
            errors = [e for e in reply.get("Errors", []) if e.get("Code") not in _MISSING_KEY]
            if errors:
                codes = sorted({str(e.get("Code")) for e in errors})
                denied = any(code in _DENIED for code in codes)
                kind = ConfigurationError if denied else TransientError
                raise kind(f"delete: {len(errors)} of {len(batch)} objects not deleted ({', '.join(codes)})")

    def check(self) -> None:
        """HeadBucket; ``ConfigurationError`` when the bucket is missing or refused."""
        try:
            self.client.head_bucket(Bucket=self.bucket_name)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"check bucket {self.bucket_name}") from exc
