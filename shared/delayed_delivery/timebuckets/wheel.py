"""The time-bucket tier's timing wheel: which bucket a message waits in, what to cascade, what to dispatch.

Pure and clock-free: every function takes ``now``. Buckets are aligned to the Unix epoch; the design is in
docs/buckets.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple

from ..clock import utc
from ..errors import ConfigurationError, InvalidMessageError
from ..validation import is_whole

__all__ = [
    "COARSE",
    "DEFAULT_DISPATCH_LEAD_SECONDS",
    "EARLIEST",
    "FINE",
    "LATEST",
    "MAX_DELAY_SECONDS",
    "BucketKey",
    "BucketLevel",
    "DispatchWindow",
    "LevelName",
    "ParsedKey",
    "bucket_of",
    "cascade_window",
    "content_hash",
    "content_key",
    "dispatch_window",
    "object_key",
    "parse_object_key",
    "parse_object_key_count",
]

LevelName = Literal["fine", "coarse"]
FINE: LevelName = "fine"
COARSE: LevelName = "coarse"
#: SQS's longest ``DelaySeconds``: the remainder a dispatcher may leave to the queue.
MAX_DELAY_SECONDS = 900
#: How far ahead of its start a fine bucket is dispatched by default (``BucketLevel.dispatch_lead_seconds``).
DEFAULT_DISPATCH_LEAD_SECONDS = 420
#: The range of times the wheel accepts (the epoch, which buckets are aligned to, to well before datetime's end).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

_SECOND = timedelta(seconds=1)
_ISO = "%Y-%m-%dT%H:%M:%SZ"
_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()-]+(?:/[A-Za-z0-9!_.*'()-]+)*")
#: v1 keys end ``<hash>.jsonl.gz``; v2 keys ``<hash>-<count>.jsonl.gz`` (the count of messages inside).
_KEY = re.compile(
    r"(?P<prefix>.+)/(?P<level>fine|coarse)/(?P<start>[0-9T:Z-]{20})/(?P<hash>[0-9a-f]{64})"
    r"(?:-(?P<count>[1-9][0-9]{0,5}))?\.jsonl\.gz"
)


@dataclass(frozen=True, slots=True)
class BucketLevel:
    """The wheel's two levels: coarse buckets (a day) far ahead, fine buckets (a minute) near their due time.

    ``dispatch_lead_seconds`` is how far ahead of its start a fine bucket is dispatched; the remainder goes to SQS as
    ``DelaySeconds``, so the lead plus one fine bucket must fit in SQS's 900 s. The default lead (7 minutes) leaves
    a message routed to the tier 420 s to reach S3 before its bucket is dispatched (``ingest_slack``).
    """

    fine_seconds: int = 60
    coarse_seconds: int = 86_400
    dispatch_lead_seconds: int = DEFAULT_DISPATCH_LEAD_SECONDS

    def __post_init__(self) -> None:
        for name in ("fine_seconds", "coarse_seconds", "dispatch_lead_seconds"):
            value = getattr(self, name)
            if not is_whole(value):
                raise ConfigurationError(f"bucket setting {name} must be a whole number of seconds, got {value!r}")
        if self.fine_seconds < 1:
            raise ConfigurationError("bucket_fine_seconds must be at least 1")
        if self.coarse_seconds <= self.fine_seconds or self.coarse_seconds % self.fine_seconds:
            raise ConfigurationError(
                f"bucket_coarse_seconds ({self.coarse_seconds}) must be a multiple of bucket_fine_seconds "
                f"({self.fine_seconds}) greater than it, so each coarse bucket splits into whole fine buckets"
            )
        if self.dispatch_lead_seconds + self.fine_seconds > MAX_DELAY_SECONDS:
            raise ConfigurationError(
                f"bucket_dispatch_lead_seconds + bucket_fine_seconds must be at most {MAX_DELAY_SECONDS} (SQS's "
                f"longest DelaySeconds), got {self.dispatch_lead_seconds} + {self.fine_seconds}"
            )

    def size(self, level: LevelName) -> int:
        """The length of a ``level`` bucket in seconds."""
        if level == FINE:
            return self.fine_seconds
        if level == COARSE:
            return self.coarse_seconds
        raise InvalidMessageError(f"unknown bucket level {level!r} (fine or coarse)")

    def ingest_slack(self, route_threshold: int = MAX_DELAY_SECONDS) -> int:
        """How long a message routed to the tier (a delay over ``route_threshold`` s) may take to reach S3 and still be
        in the first dispatch of its bucket: ``route_threshold - fine - lead`` seconds (negative: never certain).

        Its due time is after ``sent + route_threshold``, so its bucket starts after ``sent + route_threshold - fine``,
        and no timer run finds that bucket ready before its start less the lead (``dispatch_window``).
        """
        return route_threshold - self.fine_seconds - self.dispatch_lead_seconds

    @property
    def cascade_margin(self) -> timedelta:
        """How long before a coarse bucket starts its last cascade runs: the dispatch lead plus one fine bucket."""
        return timedelta(seconds=self.dispatch_lead_seconds + self.fine_seconds)


@dataclass(frozen=True, slots=True, order=True)
class BucketKey:
    """One bucket: its level and its start (aware UTC, a multiple of the level's size since the epoch)."""

    level: LevelName
    start: datetime

    def __post_init__(self) -> None:
        if self.level not in (FINE, COARSE):
            raise InvalidMessageError(f"unknown bucket level {self.level!r} (fine or coarse)")
        start = _checked(self.start, "bucket start")
        if start.microsecond:
            raise InvalidMessageError(f"bucket start {start.isoformat()} is not a whole second")
        object.__setattr__(self, "start", start)

    @property
    def iso(self) -> str:
        """The start as written in object keys and headers: ``2031-02-03T04:05:00Z``."""
        return self.start.strftime(_ISO)

    @classmethod
    def parse(cls, level: str, iso: str) -> BucketKey:
        """The key written as ``level`` and ``iso`` (the form of ``iso``); anything else raises InvalidMessageError."""
        if level not in (FINE, COARSE):
            raise InvalidMessageError(f"unknown bucket level {level[:20]!r} (fine or coarse)")
        try:
            start = datetime.strptime(iso, _ISO).replace(tzinfo=UTC)
        except (TypeError, ValueError):
            raise InvalidMessageError(
                f"bucket start {str(iso)[:40]!r} is not of the form 2031-02-03T04:05:00Z"
            ) from None
        return cls(FINE if level == FINE else COARSE, start)

    def end(self, levels: BucketLevel) -> datetime:
        """The first instant after this bucket."""
        return self.start + timedelta(seconds=levels.size(self.level))

    def aligned(self, levels: BucketLevel) -> bool:
        """Whether the start is on this level's grid under ``levels``."""
        return _epoch_seconds(self.start) % levels.size(self.level) == 0

    def holds(self, due_at: datetime, levels: BucketLevel) -> bool:
        """Whether ``due_at`` falls inside this bucket."""
        return self.start <= utc(due_at) < self.end(levels)

    def fine_buckets(self, levels: BucketLevel) -> Iterator[BucketKey]:
        """The fine buckets a coarse bucket splits into, in order (a fine bucket yields itself)."""
        step = timedelta(seconds=levels.fine_seconds)
        start, end = self.start, self.end(levels)
        while start < end:
            yield BucketKey(FINE, start)
            start += step


def _checked(value: datetime, what: str) -> datetime:
    value = utc(value)
    if not EARLIEST <= value < LATEST:
        raise InvalidMessageError(f"{what} {value.isoformat()} is outside {EARLIEST.year}–{LATEST.year}")
    return value


def _epoch_seconds(value: datetime) -> int:
    return (value - EARLIEST) // _SECOND


def _floor(value: datetime, seconds: int) -> datetime:
    return EARLIEST + timedelta(seconds=_epoch_seconds(value) // seconds * seconds)


def cascade_window(now: datetime, levels: BucketLevel | None = None) -> BucketKey:
    """The coarse bucket a timer run at ``now`` splits into fine buckets.

    It is the coarse bucket that starts after ``now`` plus the cascade margin, so its last split runs before its first
    fine bucket is dispatched. Runs through a coarse period name the same bucket; consecutive periods name
    consecutive buckets, so every coarse bucket is cascaded.
    """
    levels = levels or BucketLevel()
    ahead = _checked(now, "now") + levels.cascade_margin
    return BucketKey(COARSE, _floor(ahead, levels.coarse_seconds) + timedelta(seconds=levels.coarse_seconds))


def bucket_of(due_at: datetime, now: datetime, levels: BucketLevel | None = None) -> BucketKey:
    """The bucket a message due at ``due_at`` is written to at ``now``.

    Fine when due before the end of the coarse bucket being cascaded now (the coarse horizon), including when already
    due; else the coarse bucket holding ``due_at``, which is always later than the one being cascaded.
    """
    levels = levels or BucketLevel()
    due = _checked(due_at, "due time")
    horizon = cascade_window(now, levels).end(levels)
    if due < horizon:
        return BucketKey(FINE, _floor(due, levels.fine_seconds))
    return BucketKey(COARSE, _floor(due, levels.coarse_seconds))


@dataclass(frozen=True, slots=True)
class DispatchWindow:
    """What a timer run at ``now`` dispatches: every fine bucket starting at or before ``last`` (late ones too)."""

    now: datetime
    last: BucketKey

    def ready(self, bucket: BucketKey) -> bool:
        """Whether ``bucket`` is fine and due for dispatch in this run."""
        return bucket.level == FINE and bucket.start <= self.last.start

    def delay_seconds(self, due_at: datetime) -> int:
        """The ``DelaySeconds`` to send a message due at ``due_at`` with now: the remainder rounded up, 0 to 900."""
        remaining = utc(due_at) - self.now
        if remaining <= timedelta(0):
            return 0
        seconds = -(-remaining // _SECOND)
        if seconds > MAX_DELAY_SECONDS:
            raise InvalidMessageError(
                f"a message due {utc(due_at).isoformat()} is {seconds:,} s away at dispatch, more than SQS's "
                f"{MAX_DELAY_SECONDS} s: it is not in a ready bucket"
            )
        return int(seconds)


def dispatch_window(now: datetime, lead: int | None = None, levels: BucketLevel | None = None) -> DispatchWindow:
    """The fine buckets ready at ``now``: those starting within ``lead`` seconds (default: the levels' lead)."""
    levels = levels or BucketLevel()
    lead = levels.dispatch_lead_seconds if lead is None else lead
    if not is_whole(lead, 0, MAX_DELAY_SECONDS - levels.fine_seconds):
        raise ConfigurationError(
            f"dispatch lead must be from 0 to {MAX_DELAY_SECONDS - levels.fine_seconds} seconds, got {lead!r}"
        )
    now = _checked(now, "now")
    return DispatchWindow(now, BucketKey(FINE, _floor(now + timedelta(seconds=lead), levels.fine_seconds)))


def content_hash(entries: Iterable[tuple[str, int]]) -> str:
    """sha256 (hex) of the sorted distinct ``(message id, due ms)`` pairs: a retried write gets the same key."""
    pairs = sorted({(str(message_id), int(due_ms)) for message_id, due_ms in entries})
    if not pairs:
        raise InvalidMessageError("a bucket object holds at least one message")
    text = json.dumps(pairs, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def object_key(prefix: str, bucket: BucketKey, entries: Iterable[tuple[str, int]]) -> str:
    """Key v2 (no longer written, still read) ``<prefix>/<level>/<start ISO>/<hash of ids and due times>-<count>``;
    count = distinct message ids."""
    pairs = [(str(message_id), int(due_ms)) for message_id, due_ms in entries]
    return content_key(prefix, bucket, content_hash(pairs), len({message_id for message_id, _ in pairs}))


def content_key(prefix: str, bucket: BucketKey, digest: str, count: int) -> str:
    """An object key ``<prefix>/<level>/<start ISO>/<digest>-<count>.jsonl.gz`` (``digest``: 64 hex characters).

    Key v3 (written today): ``digest`` is the sha256 of the object's decompressed bytes (``format.py``). v2 keys
    hashed ids and due times, v1 keys had no count; all three parse alike (``parse_object_key_count``).
    """
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or len(prefix) > 512:
        raise ConfigurationError(
            f"bucket prefix {str(prefix)[:60]!r} must be S3-safe path segments (letters, digits, !_.*'()-) joined "
            "by single slashes, without a slash at either end, at most 512 characters"
        )
    if not re.fullmatch(r"[0-9a-f]{64}", digest) or not is_whole(count, 1, 999_999):
        raise InvalidMessageError(f"an object key needs a 64-hex digest and a count from 1, got {digest!r}, {count!r}")
    return f"{prefix}/{bucket.level}/{bucket.iso}/{digest}-{count}.jsonl.gz"


class ParsedKey(NamedTuple):
    """An object key read back: prefix, bucket, content hash and message count (``None`` for a v1 key)."""

    prefix: str
    bucket: BucketKey
    content_hash: str
    message_count: int | None


def parse_object_key_count(key: str) -> ParsedKey:
    """The parts of a v1 or v2 object key, with the count a v2 key carries; anything else raises InvalidMessageError."""
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise InvalidMessageError(
            f"{str(key)[:200]!r} is not a bucket object key (<prefix>/<level>/<start>/<hash>[-<count>].jsonl.gz)"
        )
    count = int(match["count"]) if match["count"] else None
    return ParsedKey(match["prefix"], BucketKey.parse(match["level"], match["start"]), match["hash"], count)


def parse_object_key(key: str) -> tuple[str, BucketKey, str]:
    """``(prefix, bucket, content hash)`` of a v1 or v2 object key; anything else raises InvalidMessageError."""
    parsed = parse_object_key_count(key)
    return parsed.prefix, parsed.bucket, parsed.content_hash
