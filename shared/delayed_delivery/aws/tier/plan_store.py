"""Dispatch plans and partition progress on S3, and dispatch tasks on SQS (the formats: ``timebuckets/plans.py``).

Keys: the plan of a fine bucket ``<prefix>/plans/fine/<start ISO>.json``, written once (``IfNoneMatch="*"``); the
progress of its partition ``k`` ``<prefix>/plans/fine/<start ISO>/<k>.json``, each write conditional on the one
read before it (``IfMatch``, or ``IfNoneMatch`` for the first), so of two workers on one partition only one goes on.
A task is one SQS message on the dispatch queue. What a partition met up to a recorded point (its seen snapshot,
``timebuckets/seen.py``) is kept at ``<prefix>/seen/fine/<start ISO>/<plan ms>-<k>.jsonl.gz``, apart from the plans:
it must outlive a plan lost or expired (the 7-day lifecycle of ``plans/``); the delta written after a piece that ends
at ``(object, line)`` beside it, at ``<plan ms>-<k>-<object>-<line>.jsonl.gz``. The design is in docs/buckets.md
("Bursts").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from ... import logfields as lf
from ...errors import DelayedDeliveryError, InvalidMessageError, TransientError
from ...timebuckets.plans import (
    MAX_PLAN_BYTES,
    MAX_PROGRESS_BYTES,
    DispatchPlan,
    DispatchTask,
    PartitionProgress,
    decode_plan,
    decode_progress,
    encode_plan,
    encode_progress,
    encode_task,
)
from ...timebuckets.seen import SeenSnapshot, decode_seen, encode_seen
from ...timebuckets.wheel import FINE, BucketKey
from ..sqs import QueueDirectory, send_batches
from .store import S3BucketStore, translate_s3_error

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["PlanStore", "SeenName", "SqsTaskQueue", "StoredProgress", "TaskQueue", "seen_name"]

_log = logging.getLogger(__name__)
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_GONE = {"NoSuchKey", "404", "NotFound"}
_JSON = "application/json"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


_SEEN_NAME = re.compile(r"(\d{1,15})-(\d{1,3})(?:-(\d{1,7})-(\d{1,8}))?\.jsonl\.gz")


@dataclass(frozen=True, slots=True)
class SeenName:
    """What a seen object's key names: its plan and partition, and for a delta the point it was written at."""

    plan_ms: int
    partition: int
    #: None: the partition's snapshot; else the delta's (object, line).
    position: tuple[int, int] | None


def seen_name(key: str) -> SeenName | None:
    """The plan, partition and (for a delta) point a seen key names; None for a key that is none of ours."""
    found = _SEEN_NAME.fullmatch(key.rsplit("/", 1)[-1])
    if found is None:
        return None
    plan_ms, partition, obj, line = found.groups()
    position = None if obj is None else (int(obj), int(line))
    return SeenName(int(plan_ms), int(partition), position)


@dataclass(frozen=True, slots=True)
class StoredProgress:
    """A partition's progress as read: ``None`` when there is none (or it belongs to another plan, or is damaged),
    and the ETag to write over (``None``: nothing there)."""

    progress: PartitionProgress | None
    etag: str | None


class TaskQueue(Protocol):
    """Where the timer and the workers put dispatch tasks."""

    def send(self, tasks: Sequence[DispatchTask]) -> None:
        """Enqueue ``tasks``; raises the package's error when some were not taken."""


class SqsTaskQueue:
    """Tasks as messages on the dispatch queue (``bucket_dispatch_queue``)."""

    def __init__(self, client: SQSClient, queue: str, directory: QueueDirectory | None = None) -> None:
        self.client = client
        self.queue = queue
        self.directory = directory or QueueDirectory(client)

    def send(self, tasks: Sequence[DispatchTask]) -> None:
        """SendMessageBatch in tens; ``TransientError`` (or the queue's own error) when one is not taken."""
        if not tasks:
            return
        info = self.directory.get(self.queue)
        entries: list[Any] = [{"Id": str(n), "MessageBody": encode_task(t)} for n, t in enumerate(tasks)]
        results = send_batches(self.client, info.url, entries, what=f"dispatch queue {self.queue!r}")
        failed = [r.error for r in results.values() if r.error is not None]
        if failed:
            first = failed[0]
            raise first if isinstance(first, DelayedDeliveryError) else TransientError(str(first))


class PlanStore:
    """Plans and progress under the store's prefix (the store's client and bucket)."""

    def __init__(self, store: S3BucketStore) -> None:
        self.store = store
        self.root = f"{store.prefix}/plans/{FINE}"
        self.seen_root = f"{store.prefix}/seen/{FINE}"

    def plan_key(self, bucket: BucketKey) -> str:
        """The plan's key for ``bucket``."""
        return f"{self.root}/{bucket.iso}.json"

    def progress_key(self, bucket: BucketKey, partition: int) -> str:
        """The key of partition ``partition``'s progress."""
        return f"{self.root}/{bucket.iso}/{partition}.json"

    def _error(self, exc: BaseException, what: str) -> DelayedDeliveryError:
        return translate_s3_error(exc, what, self.store.bucket_name)

    def _get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        try:
            reply = self.store.client.get_object(Bucket=self.store.bucket_name, Key=key)
            body = reply["Body"]
            try:
                data = body.read(limit + 1)
            finally:
                body.close()
        except ClientError as exc:
            if _code(exc) in _GONE:
                return None
            raise self._error(exc, f"read {key}") from exc
        except BotoCoreError as exc:
            raise self._error(exc, f"read {key}") from exc
        return bytes(data), str(reply["ETag"])

    def _put(self, key: str, data: bytes, etag: str | None) -> str | None:
        """Write ``data`` at ``key`` only over ``etag`` (or only where nothing is); the new ETag, or None: lost."""
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            reply = self.store.client.put_object(
                Bucket=self.store.bucket_name, Key=key, Body=data, ContentType=_JSON, **condition
            )
        except ClientError as exc:
            if _code(exc) in _LOST_RACE or (etag is not None and _code(exc) in _GONE):
                return None
            raise self._error(exc, f"write {key}") from exc
        except BotoCoreError as exc:
            raise self._error(exc, f"write {key}") from exc
        return str(reply["ETag"])

    def read_plan(self, bucket: BucketKey) -> DispatchPlan | None:
        """The plan of ``bucket``, or None. A damaged one is kept under ``problems/``, deleted and logged (None)."""
        key = self.plan_key(bucket)
        found = self._get(key, MAX_PLAN_BYTES)
        if found is None:
            return None
        try:
            plan = decode_plan(found[0])
            if plan.bucket != bucket:
                raise InvalidMessageError(f"it names bucket {plan.bucket.iso}")
        except InvalidMessageError as exc:
            copy = self.store.set_aside(key)
            self.store.delete([key])
            _log.error(
                "a dispatch plan cannot be read; it is kept under problems/ and the bucket is planned again",
                extra={lf.EVENT: lf.EVENT_ERROR_QUEUE, "object": copy, lf.REASON: str(exc)[:1024]},
            )
            return None
        return plan

    def create_plan(self, plan: DispatchPlan) -> bool:
        """Write ``plan`` unless its bucket has one; whether this call wrote it."""
        return self._put(self.plan_key(plan.bucket), encode_plan(plan), None) is not None

    def read_progress(self, plan: DispatchPlan, partition: int) -> StoredProgress:
        """Partition ``partition``'s progress in ``plan`` (none yet, or one of another plan: ``progress`` None)."""
        found = self._get(self.progress_key(plan.bucket, partition), MAX_PROGRESS_BYTES)
        if found is None:
            return StoredProgress(None, None)
        data, etag = found
        try:
            progress = decode_progress(data)
        except InvalidMessageError as exc:
            _log.warning(
                "partition progress cannot be read; the partition starts over (its messages may be sent twice)",
                extra={lf.EVENT: lf.EVENT_RETRY, lf.REASON: str(exc)[:1024]},
            )
            return StoredProgress(None, etag)
        same = (progress.bucket, progress.plan_ms, progress.partition, progress.partitions) == (
            plan.bucket,
            plan.created_ms,
            partition,
            plan.partitions,
        )
        return StoredProgress(progress if same else None, etag)

    def write_progress(self, progress: PartitionProgress, etag: str | None) -> str | None:
        """Write ``progress`` over the version read (``etag``); its new ETag, or None when another write came first."""
        return self._put(self.progress_key(progress.bucket, progress.partition), encode_progress(progress), etag)

    def delete_plan(self, plan: DispatchPlan) -> None:
        """Delete the bucket's seen snapshots and the plan's progress objects, then the plan (its objects are deleted
        before this)."""
        self.store.delete(self.seen_keys(plan.bucket))
        keys = [self.progress_key(plan.bucket, k) for k in range(plan.partitions)]
        self.store.delete([*keys, self.plan_key(plan.bucket)])

    def seen_key(self, bucket: BucketKey, plan_ms: int, partition: int) -> str:
        """The key of a partition's seen snapshot."""
        return f"{self.seen_root}/{bucket.iso}/{plan_ms}-{partition}.jsonl.gz"

    def seen_delta_key(self, bucket: BucketKey, plan_ms: int, partition: int, position: tuple[int, int]) -> str:
        """The key of a partition's delta written after the piece that ends at ``position``."""
        return f"{self.seen_root}/{bucket.iso}/{plan_ms}-{partition}-{position[0]}-{position[1]}.jsonl.gz"

    def write_seen(self, snapshot: SeenSnapshot) -> None:
        """Write a partition's seen snapshot (over the one before), or a delta (at its own key)."""
        key = (
            self.seen_delta_key(snapshot.bucket, snapshot.plan_ms, snapshot.partition, snapshot.position)
            if snapshot.delta
            else self.seen_key(snapshot.bucket, snapshot.plan_ms, snapshot.partition)
        )
        try:
            self.store.client.put_object(
                Bucket=self.store.bucket_name, Key=key, Body=encode_seen(snapshot), ContentType="application/gzip"
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"write {key}") from exc

    def read_seen(self, key: str, limit: int) -> SeenSnapshot | None:
        """The snapshot at ``key``; None when it is gone or cannot be read (logged: the worker reads lines instead)."""
        found = self._get(key, limit)
        if found is None:
            return None
        try:
            return decode_seen(found[0])
        except InvalidMessageError as exc:
            _log.warning(
                "a seen snapshot cannot be read; the lines before the progress are read again instead",
                extra={lf.EVENT: lf.EVENT_RETRY, "object": key, lf.REASON: str(exc)[:1024]},
            )
            return None

    def seen_keys(self, bucket: BucketKey) -> list[str]:
        """The keys of every seen snapshot of ``bucket`` (this plan's and any earlier plan's)."""
        prefix = f"{self.seen_root}/{bucket.iso}/"
        keys: list[str] = []
        paginator = self.store.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.store.bucket_name, Prefix=prefix):
                keys += [str(item["Key"]) for item in page.get("Contents", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"list {prefix}") from exc
        return keys

    def buckets(self) -> Iterator[BucketKey]:
        """The buckets that have a plan (listing only)."""
        paginator = self.store.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.store.bucket_name, Prefix=f"{self.root}/", Delimiter="/"):
                for item in page.get("Contents", []):
                    name = str(item["Key"]).rsplit("/", 1)[-1].removesuffix(".json")
                    try:
                        yield BucketKey.parse(FINE, name)
                    except InvalidMessageError:
                        continue
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"list {self.root}/") from exc
