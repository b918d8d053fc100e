"""A big fine bucket's dispatch plan, each partition's progress, and the task that asks a worker to go on with one.

A **plan** (``delayed-delivery-plan/1``) fixes, once, the objects of a ready fine bucket (in order) and how many
partitions split its messages: message id ``i`` belongs to ``partition_of(i, P)`` (a stable hash), so every copy of
an id meets the same worker, which sends it once. A **piece** is a run of one partition's lines, cut by bytes; after
each piece the worker records its **progress** (``delayed-delivery-progress/1``): the next line to read (object index,
line number), its counts and its lease. A **task** (``delayed-delivery-dispatch/1``, an SQS message body) names a
bucket, its plan and one partition. All three are JSON, bounded and validated when read (``InvalidMessageError``
with the reason); golden files pin them. The design is in docs/buckets.md ("Bursts").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import InvalidMessageError
from ..jsonbounds import loads_bounded
from ..validation import is_whole
from .format import RawLine, line_id
from .wheel import FINE, BucketKey, parse_object_key_count

__all__ = [
    "MAX_OWNER_CHARS",
    "MAX_PARTITIONS",
    "MAX_PLAN_BYTES",
    "MAX_PLAN_OBJECTS",
    "MAX_TASK_BYTES",
    "PLAN_FORMAT",
    "PROGRESS_FORMAT",
    "TASK_FORMAT",
    "DispatchPlan",
    "DispatchTask",
    "PartitionProgress",
    "PieceCounts",
    "decode_plan",
    "decode_progress",
    "decode_task",
    "encode_plan",
    "encode_progress",
    "encode_task",
    "line_partition",
    "partition_of",
    "require_whole",
]

PLAN_FORMAT = "delayed-delivery-plan/1"
PROGRESS_FORMAT = "delayed-delivery-progress/1"
TASK_FORMAT = "delayed-delivery-dispatch/1"
#: The most partitions a plan splits a bucket into (each one a task; a worker reads the whole bucket for its share).
MAX_PARTITIONS = 256
#: The most objects one plan covers; a bucket holding more is planned again for the rest once this plan is done.
MAX_PLAN_OBJECTS = 20_000
MAX_PLAN_BYTES = 2 * 1024 * 1024
MAX_PROGRESS_BYTES = 4_096
MAX_TASK_BYTES = 1_024
MAX_OWNER_CHARS = 128
#: Plan times run from 1970 to 9000 (the wheel's range), in epoch milliseconds.
_MAX_MS = 220_898_664_000_000
_COUNT_MAX = 10**12
#: How the writer puts a line's id first: compact, plain text (up to 512 bytes, no quote or backslash inside).
_PLAIN_ID = re.compile(rb'\{"id":"([^"\\]{1,512})"')


def _dumps(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _document(data: bytes | str, what: str, limit: int, fmt: str, depth: int) -> dict[str, Any]:
    if (isinstance(data, bytes | bytearray) and len(data) > limit) or (isinstance(data, str) and len(data) > limit):
        raise InvalidMessageError(f"{what}: more than {limit:,} bytes")
    value = loads_bounded(data, what=what, max_chars=limit, max_depth=depth)
    if not isinstance(value, dict):
        raise InvalidMessageError(f"{what}: a JSON {type(value).__name__}, not an object")
    if value.get("format") != fmt:
        raise InvalidMessageError(f"{what}: format {str(value.get('format'))[:60]!r} is not {fmt!r}")
    return value


def _whole(value: Mapping[str, Any], name: str, low: int, high: int, what: str) -> int:
    found = value.get(name)
    if not is_whole(found, low, high):
        raise InvalidMessageError(f"{what}: {name} {str(found)[:40]} is not a whole number from {low} to {high:,}")
    assert isinstance(found, int)
    return found


def _bucket(value: Mapping[str, Any], what: str) -> BucketKey:
    start = value.get("bucket")
    if not isinstance(start, str):
        raise InvalidMessageError(f"{what}: bucket must be text")
    return BucketKey.parse(FINE, start)


def _owner(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_OWNER_CHARS or not value.isprintable():
        raise InvalidMessageError(f"{what}: owner must be up to {MAX_OWNER_CHARS} printable characters")
    return value


def partition_of(message_id: str | None, partitions: int, object_index: int = 0) -> int:
    """The partition of a line: by its message id (sha256, stable everywhere), or by its object when it names none."""
    if message_id is None:
        return object_index % partitions
    return _hashed(message_id.encode("utf-8", "surrogatepass"), partitions)


def _hashed(data: bytes, partitions: int) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") % partitions


def line_partition(raw: RawLine, partitions: int, object_index: int) -> int:
    """The partition of a stored line, as every worker computes it: ``partition_of`` the id it names.

    A line the writer wrote (compact, the id first, no escapes in it) is hashed straight from its bytes, which are
    the id's UTF-8; any other line goes through ``line_id``.
    """
    plain = _PLAIN_ID.match(raw.data)
    if plain is not None:
        return _hashed(plain[1], partitions)
    return partition_of(line_id(raw), partitions, object_index)


def require_whole(checks: Iterable[tuple[str, object, int, int]], what: str) -> None:
    """``InvalidMessageError`` naming the first of ``checks`` (name, value, low, high) not a whole number in range."""
    for name, value, low, high in checks:
        if not is_whole(value, low, high):
            raise InvalidMessageError(f"{what}: {name} {str(value)[:40]} is not a whole number from {low} to {high:,}")


@dataclass(frozen=True, slots=True)
class DispatchPlan:
    """The objects of one ready fine bucket (their names under the bucket, in order) and its partitions."""

    bucket: BucketKey
    #: When the plan was made (epoch ms): with the bucket, it names the plan (tasks and progress carry it).
    created_ms: int
    partitions: int
    objects: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.bucket.level != FINE:
            raise InvalidMessageError("a dispatch plan is for a fine bucket")
        if not is_whole(self.created_ms, 0, _MAX_MS - 1):
            raise InvalidMessageError(f"plan time {str(self.created_ms)[:40]} is not epoch milliseconds")
        if not is_whole(self.partitions, 1, MAX_PARTITIONS):
            raise InvalidMessageError(f"a plan has 1 to {MAX_PARTITIONS} partitions, not {str(self.partitions)[:20]}")
        if not 1 <= len(self.objects) <= MAX_PLAN_OBJECTS:
            raise InvalidMessageError(f"a plan covers 1 to {MAX_PLAN_OBJECTS:,} objects, not {len(self.objects):,}")
        if len(set(self.objects)) != len(self.objects):
            raise InvalidMessageError("a plan names an object twice")
        for name in self.objects:
            self.key("p", name)

    @property
    def name(self) -> str:
        """The plan's name: its bucket and when it was made (what its tasks and progress carry)."""
        return f"{self.bucket.iso}@{self.created_ms}"

    def key(self, prefix: str, name: str) -> str:
        """The full key of the object ``name`` under ``prefix`` (``InvalidMessageError`` for a name that is none)."""
        if not isinstance(name, str) or "/" in name:
            raise InvalidMessageError(f"plan object {str(name)[:80]!r} is not an object name")
        key = f"{prefix}/{FINE}/{self.bucket.iso}/{name}"
        if parse_object_key_count(key).bucket != self.bucket:
            raise InvalidMessageError(f"plan object {name[:80]!r} is not in bucket {self.bucket.iso}")
        return key

    def keys(self, prefix: str) -> list[str]:
        """The full keys of the plan's objects, in order."""
        return [self.key(prefix, name) for name in self.objects]


def encode_plan(plan: DispatchPlan) -> bytes:
    """The plan object's bytes."""
    return _dumps(
        {
            "format": PLAN_FORMAT,
            "bucket": plan.bucket.iso,
            "created_ms": plan.created_ms,
            "partitions": plan.partitions,
            "objects": list(plan.objects),
        }
    )


def decode_plan(data: bytes | str) -> DispatchPlan:
    """A plan object read back; ``InvalidMessageError`` names what is wrong."""
    what = "dispatch plan"
    value = _document(data, what, MAX_PLAN_BYTES, PLAN_FORMAT, 2)
    objects = value.get("objects")
    if not isinstance(objects, list) or not all(isinstance(name, str) for name in objects):
        raise InvalidMessageError(f"{what}: objects must be a list of names")
    return DispatchPlan(
        _bucket(value, what),
        _whole(value, "created_ms", 0, _MAX_MS - 1, what),
        _whole(value, "partitions", 1, MAX_PARTITIONS, what),
        tuple(objects),
    )


@dataclass(frozen=True, slots=True)
class PieceCounts:
    """What a partition's pieces did so far."""

    sent: int = 0
    duplicates: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    to_error_queue: int = 0
    kept_for_retry: int = 0
    pieces: int = 0

    def plus(self, other: PieceCounts) -> PieceCounts:
        """The sum of two counts."""
        return PieceCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """Where one partition of a plan is: the next line to read, whether it is done, who holds it until when."""

    bucket: BucketKey
    plan_ms: int
    partition: int
    partitions: int
    #: The next line to read is after line ``line`` (1 = the first message line) of object ``object`` of the plan.
    object: int = 0
    line: int = 0
    done: bool = False
    #: The worker holding the partition ("" = none) and until when (epoch ms); renewed with every piece.
    owner: str = ""
    lease_until_ms: int = 0
    updated_ms: int = 0
    counts: PieceCounts = field(default_factory=PieceCounts)

    def __post_init__(self) -> None:
        what = "partition progress"
        checks = (
            ("plan_ms", self.plan_ms, 0, _MAX_MS - 1),
            ("partitions", self.partitions, 1, MAX_PARTITIONS),
            ("partition", self.partition, 0, self.partitions - 1 if is_whole(self.partitions) else 0),
            ("object", self.object, 0, MAX_PLAN_OBJECTS),
            ("line", self.line, 0, 10_000_000),
            ("lease_until_ms", self.lease_until_ms, 0, _MAX_MS - 1),
            ("updated_ms", self.updated_ms, 0, _MAX_MS - 1),
        )
        require_whole(checks, what)
        if not isinstance(self.done, bool):
            raise InvalidMessageError(f"{what}: done must be true or false")
        _owner(self.owner, what)
        for f in fields(self.counts):
            if not is_whole(getattr(self.counts, f.name), 0, _COUNT_MAX):
                raise InvalidMessageError(f"{what}: count {f.name} is not a whole number")

    def held_by_other(self, owner: str, now_ms: int) -> bool:
        """Whether another worker holds the partition at ``now_ms``."""
        return bool(self.owner) and self.owner != owner and self.lease_until_ms > now_ms


def encode_progress(progress: PartitionProgress) -> bytes:
    """A progress object's bytes."""
    return _dumps(
        {
            "format": PROGRESS_FORMAT,
            "bucket": progress.bucket.iso,
            "plan_ms": progress.plan_ms,
            "partition": progress.partition,
            "partitions": progress.partitions,
            "object": progress.object,
            "line": progress.line,
            "done": progress.done,
            "owner": progress.owner,
            "lease_until_ms": progress.lease_until_ms,
            "updated_ms": progress.updated_ms,
            "counts": asdict(progress.counts),
        }
    )


def decode_progress(data: bytes | str) -> PartitionProgress:
    """A progress object read back; ``InvalidMessageError`` names what is wrong."""
    what = "partition progress"
    value = _document(data, what, MAX_PROGRESS_BYTES, PROGRESS_FORMAT, 2)
    counts = value.get("counts")
    names = {f.name for f in fields(PieceCounts)}
    if not isinstance(counts, dict) or set(counts) != names:
        raise InvalidMessageError(f"{what}: counts must hold {', '.join(sorted(names))}")
    scalars = ("plan_ms", "partition", "partitions", "object", "line", "done", "owner", "lease_until_ms", "updated_ms")
    missing = [name for name in scalars if name not in value]
    if missing:
        raise InvalidMessageError(f"{what}: missing {', '.join(missing)}")
    try:
        return PartitionProgress(
            _bucket(value, what), **{name: value[name] for name in scalars}, counts=PieceCounts(**counts)
        )
    except TypeError as exc:  # a count that is not a number
        raise InvalidMessageError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class DispatchTask:
    """Go on with one partition of a plan (an SQS message on the dispatch queue)."""

    bucket: BucketKey
    plan_ms: int
    partition: int
    partitions: int

    def __post_init__(self) -> None:
        if self.bucket.level != FINE:
            raise InvalidMessageError("a dispatch task is for a fine bucket")
        if not is_whole(self.plan_ms, 0, _MAX_MS - 1):
            raise InvalidMessageError(f"dispatch task: plan {str(self.plan_ms)[:40]} is not epoch milliseconds")
        if not is_whole(self.partitions, 1, MAX_PARTITIONS) or not is_whole(self.partition, 0, self.partitions - 1):
            raise InvalidMessageError(
                f"dispatch task: partition {str(self.partition)[:20]} of {str(self.partitions)[:20]} is out of range"
            )


def encode_task(task: DispatchTask) -> str:
    """A task's SQS message body."""
    body = {
        "format": TASK_FORMAT,
        "bucket": task.bucket.iso,
        "plan_ms": task.plan_ms,
        "partition": task.partition,
        "partitions": task.partitions,
    }
    return _dumps(body).decode("ascii")


def decode_task(data: bytes | str) -> DispatchTask:
    """A task read from its message body; ``InvalidMessageError`` names what is wrong."""
    what = "dispatch task"
    value = _document(data, what, MAX_TASK_BYTES, TASK_FORMAT, 1)
    extra = set(value) - {"format", "bucket", "plan_ms", "partition", "partitions"}
    if extra:
        raise InvalidMessageError(f"{what}: unknown fields {', '.join(sorted(extra))[:100]}")
    partitions = _whole(value, "partitions", 1, MAX_PARTITIONS, what)
    return DispatchTask(
        _bucket(value, what),
        _whole(value, "plan_ms", 0, _MAX_MS - 1, what),
        _whole(value, "partition", 0, partitions - 1, what),
        partitions,
    )
