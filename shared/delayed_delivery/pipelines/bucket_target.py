"""The S3 time-bucket tier as a migration target: ``s3buckets:BUCKET[?prefix=…&endpoint_url=…&region=…]``.

Design and reruns: docs/pipelines.md ("Into the S3 time-bucket tier").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from ..delivery import DELIVERY_HEADER, longest_delivery
from ..errors import ConfigurationError, InvalidMessageError, extra_missing
from ..headers import HEADER_PREFIX
from ..model import DelayedMessage
from ..timebuckets.format import MAX_OBJECT_MESSAGES, BucketMessage
from ..timebuckets.wheel import BucketKey, BucketLevel, bucket_of
from .batches import one_per_id

if TYPE_CHECKING:
    from ..aws.tier.store import S3BucketStore
    from .targets import MigrationTarget, TargetSpec

__all__ = [
    "BUCKET_SCHEME",
    "BucketTarget",
    "bucket_batches",
    "bucket_levels",
    "bucket_sort_expression",
    "bucket_target_url",
    "build_bucket_target",
    "to_bucket_message",
    "with_run_time",
]

#: The target URL scheme of the S3 time-bucket tier.
BUCKET_SCHEME = "s3buckets"
#: The largest message SQS takes (body plus attributes): the timer must be able to send what is migrated.
SQS_MAX_MESSAGE_BYTES = 262_144
#: The option the job sets to the run's start time (epoch ms): every executor buckets against the same ``now``.
RUN_TIME_OPTION = "at_ms"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_DEFAULT_LEVELS = BucketLevel()
_LEVEL_OPTIONS = (
    ("fine_seconds", _DEFAULT_LEVELS.fine_seconds),
    ("coarse_seconds", _DEFAULT_LEVELS.coarse_seconds),
    ("lead_seconds", _DEFAULT_LEVELS.dispatch_lead_seconds),
)


def bucket_target_url(
    bucket_name: str | None, prefix: str | None = None, endpoint_url: str | None = None, region: str | None = None
) -> str:
    """The URL for ``--target s3buckets --bucket-name B [--prefix P] [--endpoint-url U]`` (B from the environment)."""
    import os

    from ..aws.tier.config import BUCKET_NAME_ENV

    bucket_name = bucket_name or os.environ.get(BUCKET_NAME_ENV, "").strip()
    if not bucket_name:
        raise ConfigurationError(f"--target s3buckets needs --bucket-name (the tier's S3 bucket) or ${BUCKET_NAME_ENV}")
    options = {"prefix": prefix, "endpoint_url": endpoint_url, "region": region}
    query = urlencode(sorted((k, v) for k, v in options.items() if v), safe=":/")
    return f"{BUCKET_SCHEME}:{bucket_name}" + (f"?{query}" if query else "")


def bucket_levels(spec: TargetSpec) -> BucketLevel:
    """The wheel's levels: ``?fine_seconds=&coarse_seconds=&lead_seconds=``, the tier's defaults otherwise."""
    values: list[int] = []
    for name, default in _LEVEL_OPTIONS:
        text = spec.option(name) or str(default)
        try:
            values.append(int(text))
        except ValueError:
            raise ConfigurationError(f"s3buckets {name} must be a whole number of seconds, got {text!r}") from None
    return BucketLevel(*values)


def with_run_time(spec: TargetSpec, now: datetime) -> TargetSpec:
    """``spec`` with the run's start time, which every executor buckets against (not part of the run's URL)."""
    options = tuple(sorted({**dict(spec.options), RUN_TIME_OPTION: str((now - _EPOCH) // _MS)}.items()))
    return dataclasses.replace(spec, options=options)


def bucket_batches(valid: Any, batches: int, spec: TargetSpec) -> Any:
    """Add ``batch`` by the coarse bucket (day) of each id's latest due time, so one batch holds whole buckets.

    Every bucket, fine or coarse, lies inside one coarse period, and every copy of an id shares a batch: one Spark
    task writes each bucket, whatever ``now`` is when a resumed run buckets it.
    """
    from pyspark.sql import functions as F

    coarse_us = bucket_levels(spec).coarse_seconds * 1_000_000
    latest = valid.withColumn("_latest_us", F.expr("max(due_us) over (partition by message_id)"))
    day = F.expr(f"_latest_us div {coarse_us}")
    return latest.withColumn("batch", F.pmod(F.xxhash64(day), F.lit(batches)).cast("int"))


def bucket_sort_expression(spec: TargetSpec) -> str:
    """The order inside a batch: the fine bucket of the id's latest due time, so buckets arrive one after another."""
    return f"_latest_us div {bucket_levels(spec).fine_seconds * 1_000_000}"


def to_bucket_message(message: DelayedMessage) -> BucketMessage:
    """The migrated message as the tier stores it; ``InvalidMessageError`` says why SQS could never take it."""
    from ..aws.sqs import MAX_ATTRIBUTES, message_size, normalize_attributes, sqs_text_problem
    from ..naming import FIFO_SUFFIX, validate_sqs_queue_name

    try:
        validate_sqs_queue_name(message.destination)
    except ConfigurationError as exc:
        raise InvalidMessageError(str(exc)) from None
    if message.destination.endswith(FIFO_SUFFIX):
        raise InvalidMessageError("a FIFO destination takes no per-message delay: the tier cannot deliver to it")
    try:
        text = message.body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessageError("SQS bodies are text: the body is not UTF-8") from None
    problem = sqs_text_problem(text)
    if problem:
        raise InvalidMessageError(f"the body {problem}")
    headers = {k: v for k, v in message.headers.items() if not k.startswith(HEADER_PREFIX)}
    if len(headers) >= MAX_ATTRIBUTES:
        raise InvalidMessageError(
            f"{len(headers)} headers: at most {MAX_ATTRIBUTES - 1} fit (SQS carries {MAX_ATTRIBUTES} message "
            f"attributes, one is the delivery header {DELIVERY_HEADER})"
        )
    attributes = normalize_attributes(headers)
    header = {DELIVERY_HEADER: {"DataType": "String", "StringValue": longest_delivery(message.message_id)}}
    size = message_size(text, {**attributes, **header})
    if size > SQS_MAX_MESSAGE_BYTES:
        raise InvalidMessageError(
            f"{size:,} bytes (body + headers + the delivery header): SQS takes at most {SQS_MAX_MESSAGE_BYTES:,}"
        )
    due_ms = (message.due_at - _EPOCH) // _MS
    return BucketMessage(message.message_id, message.destination, message.body, due_ms, attributes)


class BucketTarget:
    """Writes migrated messages as bucket objects: one object per bucket (split past 10,000 messages) per batch.

    ``write`` keeps the messages of the current bucket and writes them when a message of another bucket arrives,
    when 10,000 are held, or at ``flush``; the job hands each batch over bucket after bucket, so each bucket is one
    object. Keys come from the content (``S3BucketStore.write``): the same batch written again writes the same keys.
    """

    can_undo = False
    checkpoint_rows = 0
    undo_note = (
        "the S3 time-bucket tier cannot take back migrated messages by id: the timer may already be moving or "
        "sending them; cancel them one by one (delayed-delivery cancel) or remove the objects under the tier's prefix"
    )

    def __init__(self, store: S3BucketStore, now: datetime | None = None) -> None:
        self.store = store
        self.now = now or datetime.now(UTC)
        self._bucket: BucketKey | None = None
        self._held: dict[str, BucketMessage] = {}
        #: Objects written and the messages in them, per bucket (for reports and tests).
        self.objects: dict[BucketKey, list[str]] = {}
        self.messages_written = 0

    def prepare(self) -> None:
        """Check that the S3 bucket is there (HeadBucket); ``delayed-delivery aws create`` or the CDK creates it."""
        self.store.check()

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Hold the messages by bucket, writing a bucket's object once it is complete; refuse what SQS cannot take."""
        unique, refused = one_per_id(messages)
        for message in unique:
            try:
                item = to_bucket_message(message)
                bucket = bucket_of(item.due_at, self.now, self.store.levels)
            except InvalidMessageError as exc:
                refused.append((message.message_id, str(exc)))
                continue
            if bucket != self._bucket:
                self._write_held()
                self._bucket = bucket
            earlier = self._held.get(item.message_id)
            if earlier is not None:  # a copy in an earlier call: keep the later due time, as one_per_id does
                kept, other = (item, earlier) if item.due_at_ms >= earlier.due_at_ms else (earlier, item)
                refused.append((other.message_id, f"id repeated in the export: the copy due {kept.due_at} was kept"))
                item = kept
            self._held[item.message_id] = item
            if len(self._held) >= MAX_OBJECT_MESSAGES:
                self._write_held()
        return refused

    def _write_held(self) -> None:
        if self._bucket is None or not self._held:
            return
        keys = self.store.write(self._bucket, list(self._held.values()))
        self.objects.setdefault(self._bucket, []).extend(keys)
        self.messages_written += len(self._held)
        self._held = {}

    def flush(self) -> None:
        """Write the bucket still held; when it returns, every message given to ``write`` is in S3."""
        self._write_held()
        self._bucket = None

    def undo(self, message_ids: Sequence[str]) -> int:
        """The tier cannot take back a message by id."""
        raise ConfigurationError(self.undo_note)

    def close(self) -> None:
        """Nothing to release (what was never flushed is not written)."""


def build_bucket_target(spec: TargetSpec) -> MigrationTarget:
    """The target ``spec`` names, with its own boto3 S3 client (built here, on the executor)."""
    try:
        import boto3

        from ..aws.tier.config import DEFAULT_PREFIX, BucketTierConfig
        from ..aws.tier.store import S3BucketStore
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise extra_missing("the s3buckets target", "spark", "aws") from exc
    config = BucketTierConfig(spec.location, spec.option("prefix") or DEFAULT_PREFIX)
    client = boto3.client("s3", region_name=spec.option("region"), endpoint_url=spec.option("endpoint_url"))
    store = S3BucketStore(client, config.bucket_name, config.prefix, bucket_levels(spec))
    at_ms = spec.option(RUN_TIME_OPTION)
    return BucketTarget(store, _EPOCH + int(at_ms) * _MS if at_ms else None)
