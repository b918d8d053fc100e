"""Reschedule on the tier, exactly: find one message in its bucket objects and move it to its new due time now.

Used by ``operations.TierOperations.reschedule`` after it wrote the reschedule record. The move runs under the lease
of each bucket the message is found in (the lease the timer takes to cascade or dispatch it): the message is written
first (sent straight to its destination when its new due time is within SQS's 900 s, else into the bucket of that
time), then each old object is written again without it and deleted. A crash between the steps leaves a second copy,
never none. The design, and what a crash leaves, are in docs/operations.md and docs/buckets.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ...cancellations import Cancellation, CancellationKind
from ...clock import Clock, utc
from ...delivery import epoch_ms, from_epoch_ms
from ...errors import DelayedDeliveryError, InvalidMessageError, MessageInFlightError
from ...settings import DelayedDeliverySettings
from ...timebuckets.format import BucketContents, BucketMessage, read_line
from ...timebuckets.plans import DispatchPlan, partition_of
from ...timebuckets.wheel import (
    COARSE,
    FINE,
    MAX_DELAY_SECONDS,
    BucketKey,
    BucketLevel,
    dispatch_window,
    parse_object_key_count,
)
from .held import HeldArea
from .lease import BucketLeases, Lease
from .plan_store import PlanStore
from .store import ObjectMissingError, S3BucketStore, StoredObject, translate_s3_error
from .timer_sqs import TimerSqs

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "DEFAULT_SCAN_LIMIT",
    "LEASE_WAIT_SECONDS",
    "Copy",
    "Relocation",
    "Relocator",
    "ScanLimitError",
    "ScanProgress",
    "Search",
    "candidate_buckets",
]

#: Without the message's current due time, at most this many objects are read (each one GetObject).
DEFAULT_SCAN_LIMIT = 2_000
#: How long a move waits for a bucket another timer holds before giving up (exit 1, try again).
LEASE_WAIT_SECONDS = 10.0
#: A move's lease: a few requests long, so a killed move holds a bucket back from the timer for at most this long.
MOVE_LEASE_SECONDS = 30.0
#: Seconds between two progress reports of a whole-tier scan.
PROGRESS_SECONDS = 3.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ScanLimitError(InvalidMessageError):
    """The tier holds more objects than a scan may read; give the message's current due time instead."""


@dataclass(frozen=True, slots=True)
class ScanProgress:
    """Where a whole-tier scan is: objects read of those listed, and seconds since it started."""

    read: int
    listed: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy of the message found: the object holding it and the message as stored there."""

    key: str
    bucket: BucketKey
    message: BucketMessage
    #: Its line in the object (1: the first message line).
    line: int = 0


@dataclass(frozen=True, slots=True)
class Relocation:
    """What a move did (``found`` False: no copy waits in the tier; nothing was changed)."""

    message_id: str
    destination: str
    new_due: datetime
    found: bool
    old_due: datetime | None = None
    #: Sent to the destination now with ``DelaySeconds`` (the new due time was within 900 s).
    sent_now: bool = False
    #: The bucket the message now waits in (``None`` when sent now).
    bucket: BucketKey | None = None
    written: tuple[str, ...] = ()
    rewritten: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    #: Copies beyond the first (a retried write, a crash of an earlier move), removed too.
    extra_copies: int = 0
    objects_read: int = 0
    #: Objects with lines that cannot be read: left for the timer (the record moves the message there, late).
    left_alone: tuple[str, ...] = ()
    #: A timer cascaded or dispatched the old object first: the record moved the message (at that run).
    moved_by_timer: bool = False
    #: The copy waits in a bucket the dispatch workers are sending, ahead of its worker: the worker moves it by the
    #: record when it gets there (nothing was written now).
    by_workers: bool = False
    #: The dispatch workers already handed the copy on at its old time (sent, unless written back and found as
    #: another copy): not moved.
    already_sent: bool = False


def _floor(when: datetime, seconds: int) -> datetime:
    elapsed = int((utc(when) - _EPOCH).total_seconds())
    return _EPOCH + timedelta(seconds=elapsed - elapsed % seconds)


def candidate_buckets(due: datetime, levels: BucketLevel) -> tuple[BucketKey, BucketKey]:
    """The two buckets a message due at ``due`` can wait in: its fine bucket and its coarse one."""
    return BucketKey(FINE, _floor(due, levels.fine_seconds)), BucketKey(COARSE, _floor(due, levels.coarse_seconds))


@dataclass(slots=True)
class Search:
    """The copies a search found and how many objects it read."""

    copies: list[Copy] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)

    @property
    def read(self) -> int:
        """Objects read."""
        return len(self.keys)


class Relocator:
    """Finds the copies of one message in the tier and moves them to a reschedule record's due time."""

    def __init__(
        self,
        store: S3BucketStore,
        sqs_client: SQSClient,
        settings: DelayedDeliverySettings,
        clock: Clock,
        *,
        owner: str | None = None,
        lease_wait_seconds: float = LEASE_WAIT_SECONDS,
        direct_seconds: int = MAX_DELAY_SECONDS,
        progress: Callable[[ScanProgress], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.sqs = TimerSqs(sqs_client, settings, clock)
        self.clock = clock
        self.leases = BucketLeases(store, clock, owner or f"reschedule-{uuid.uuid4().hex[:12]}", MOVE_LEASE_SECONDS)
        self.lease_wait_seconds = lease_wait_seconds
        self.direct_seconds = min(direct_seconds, MAX_DELAY_SECONDS)
        self.progress = progress
        self.monotonic = monotonic
        self.sleep = sleep

    # -- finding -----------------------------------------------------------------------------------------------

    def find(
        self, record: Cancellation, *, due: datetime | None = None, scan_limit: int = DEFAULT_SCAN_LIMIT
    ) -> Search:
        """Every copy ``record`` binds, in the buckets of ``due`` and of the record's due time (a copy an interrupted
        move wrote); without ``due``, every object is read (at most ``scan_limit``) until one turns up."""
        assert record.due_at is not None
        search = Search()
        if due is None:
            first = self._scan(record, scan_limit, search)
            if first is None:
                return search
            due = first.message.due_at
        buckets = {*candidate_buckets(due, self.store.levels), *candidate_buckets(record.due_at, self.store.levels)}
        held = HeldArea(self.store).store_for(record.endpoint).prefix  # held by a release cap (#31)
        keys = {
            key
            for bucket in buckets
            for prefix in (self.store.prefix, held)
            for key in self._bucket_keys(bucket, prefix)
        }
        self._read_into(record, sorted(keys - search.keys), search)
        return search

    def _bucket_keys(self, bucket: BucketKey, under: str | None = None) -> Iterator[str]:
        """The object keys of one bucket (one listing of its key prefix) under the store's prefix or ``under``."""
        root = under or self.store.prefix
        prefix = f"{root}/{bucket.level}/{bucket.iso}/"
        paginator = self.store.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.store.bucket_name, Prefix=prefix):
                for item in page.get("Contents", []):
                    key = str(item["Key"])
                    try:
                        parsed = parse_object_key_count(key)
                    except InvalidMessageError:
                        continue  # not a bucket object
                    if parsed.prefix == root and parsed.bucket == bucket:
                        yield key
        except (ClientError, BotoCoreError) as exc:
            raise translate_s3_error(exc, f"list {prefix}", self.store.bucket_name) from exc

    def check_scan_limit(self, scan_limit: int) -> list[StoredObject]:
        """Every object of the tier (fine first), listed only; ``ScanLimitError`` when more than ``scan_limit``."""
        listed: list[StoredObject] = []
        for level in (FINE, COARSE):
            for stored in self.store.objects(level):
                listed.append(stored)
                if len(listed) > scan_limit:
                    raise ScanLimitError(
                        f"the tier holds more than {scan_limit:,} objects (the --scan-limit): give the message's "
                        "current due time (--due) to read only its buckets, or raise --scan-limit"
                    )
        return listed

    def _scan(self, record: Cancellation, scan_limit: int, search: Search) -> Copy | None:
        """Read every object, fine buckets first, until a copy turns up; refused beyond ``scan_limit`` objects."""
        listed = self.check_scan_limit(scan_limit)
        started = last = self.monotonic()
        moved_ms = epoch_ms(record.due_at) if record.due_at is not None else None
        for stored in listed:
            if self.progress is not None and self.monotonic() - last >= PROGRESS_SECONDS:
                last = self.monotonic()
                self.progress(ScanProgress(search.read, len(listed), last - started))
            before = len(search.copies)
            self._read_into(record, [stored.key], search)
            for copy in search.copies[before:]:
                if copy.message.due_at_ms != moved_ms:  # not the copy an interrupted move already wrote
                    return copy
        return search.copies[0] if search.copies else None

    def _read_into(self, record: Cancellation, keys: Sequence[str], search: Search) -> None:
        for key in keys:
            try:
                stream = self.store.open(key)
            except ObjectMissingError:
                continue  # cascaded or dispatched since the listing
            header = stream.open()
            version = header.version if header is not None else 0
            bucket = parse_object_key_count(key).bucket
            for raw in stream.lines():
                item = read_line(raw, version)
                if isinstance(item, BucketMessage) and _bound(record, item):
                    search.copies.append(Copy(key, bucket, item, raw.number))
            search.keys.add(key)

    # -- moving ------------------------------------------------------------------------------------------------

    def relocate(
        self, record: Cancellation, *, due: datetime | None = None, scan_limit: int = DEFAULT_SCAN_LIMIT
    ) -> Relocation:
        """Move the message ``record`` names to ``record.due_at`` now; ``found`` False when it is not in the tier."""
        if record.kind is not CancellationKind.RESCHEDULE or record.due_at is None:
            raise InvalidMessageError("only a reschedule record moves a message")
        new_due = utc(record.due_at)
        search = self.find(record, due=due, scan_limit=scan_limit)
        if not search.copies:
            return Relocation(record.message_id, record.endpoint, new_due, False, objects_read=search.read)
        free, ahead, passed = self._planned(search.copies)
        if not free:
            first = min(ahead or passed, key=lambda c: c.key).message.due_at
            found = Relocation(record.message_id, record.endpoint, new_due, True, old_due=first)
            return replace(found, by_workers=bool(ahead), already_sent=not ahead, objects_read=search.read)
        buckets = sorted({c.bucket for c in free if c.message.due_at_ms != epoch_ms(new_due)})
        leases = self._acquire_all(buckets)
        try:
            moved = self._move(record, new_due, free, place=not ahead)
        finally:
            for lease in leases:
                self._release(lease)
        return replace(moved, objects_read=search.read, by_workers=bool(ahead))

    def _planned(self, copies: Sequence[Copy]) -> tuple[list[Copy], list[Copy], list[Copy]]:
        """The copies split by the plans of their buckets: free to move, ahead of their dispatch worker, and handed
        on by it already; ``MessageInFlightError`` (try again after its lease) when a worker is sending one now."""
        plans = PlanStore(self.store)
        found: dict[BucketKey, DispatchPlan | None] = {}
        free: list[Copy] = []
        ahead: list[Copy] = []
        passed: list[Copy] = []
        now_ms = epoch_ms(self.clock.now())
        for copy in copies:
            if copy.bucket.level != FINE:
                free.append(copy)
                continue
            if copy.bucket not in found:
                found[copy.bucket] = plans.read_plan(copy.bucket)
            plan = found[copy.bucket]
            name = copy.key.rsplit("/", 1)[-1]
            if plan is None or name not in plan.objects:
                free.append(copy)  # beside a plan (a late object, a write-back): the timer sends it after the plan
                continue
            index = plan.objects.index(name)
            partition = partition_of(copy.message.message_id, plan.partitions, index)
            progress = plans.read_progress(plan, partition).progress
            if progress is not None and (progress.done or (index, copy.line) <= (progress.object, progress.line)):
                passed.append(copy)
            elif progress is not None and progress.held_by_other("", now_ms):
                until = from_epoch_ms(progress.lease_until_ms) or self.clock.now()
                raise MessageInFlightError(
                    f"{copy.message.message_id!r} is in flight: a dispatch worker is sending its part of bucket "
                    f"{copy.bucket.level} {copy.bucket.iso} right now (partition {partition} of {plan.partitions}); "
                    f"try after {until.isoformat()}"
                )
            else:
                ahead.append(copy)
        return free, ahead, passed

    def _acquire_all(self, buckets: Sequence[BucketKey]) -> list[Lease]:
        """The leases of ``buckets`` (in order); waits up to ``lease_wait_seconds`` for ones a timer holds."""
        give_up = self.monotonic() + self.lease_wait_seconds
        while True:
            held: list[Lease] = []
            busy: BucketKey | None = None
            for bucket in buckets:
                lease = self.leases.acquire(bucket)
                if lease is None:
                    busy = bucket
                    break
                held.append(lease)
            if busy is None:
                return held
            for lease in held:
                self._release(lease)
            if self.monotonic() >= give_up:
                raise MessageInFlightError(
                    f"bucket {busy.level} {busy.iso} is being dispatched right now (its lease is held); try again"
                )
            self.sleep(1.0)

    def _release(self, lease: Lease) -> None:
        try:
            self.leases.release(lease)
        except DelayedDeliveryError:  # it expires on its own
            return

    def _move(
        self, record: Cancellation, new_due: datetime, copies: Sequence[Copy], *, place: bool = True
    ) -> Relocation:
        """Write the message at its new due time (unless a copy already is, or ``place`` is False: a dispatch worker
        writes it), then take it out of the old objects."""
        due_ms = epoch_ms(new_due)
        stale = self._read_all(sorted({c.key for c in copies if c.message.due_at_ms != due_ms}))
        live = [c for c in copies if c.key in stale or c.message.due_at_ms == due_ms]
        moving = [c for c in copies if c.message.due_at_ms != due_ms] or list(copies)
        first = min(moving, key=lambda c: (c.message.sent_at_ms is None, c.message.sent_at_ms or 0, c.key))
        result = Relocation(record.message_id, record.endpoint, new_due, True, old_due=first.message.due_at)
        if not live:  # a timer took it before we held the lease: the record moved it there
            return replace(result, moved_by_timer=True)
        already = [c for c in live if c.message.due_at_ms == due_ms]  # written by an earlier, interrupted move
        sent_now, bucket = False, already[0].bucket if already else None
        written: tuple[str, ...] = ()
        if not already and place:
            moved = replace(first.message, due_at_ms=due_ms, hops=first.message.hops + 1)
            sent_now, bucket, written = self._place(moved)
        rewritten, deleted, left = self._take_out(record, due_ms, stale, set(written))
        return replace(
            result,
            sent_now=sent_now,
            bucket=bucket,
            written=written,
            rewritten=rewritten,
            deleted=deleted,
            extra_copies=len(live) - 1,
            left_alone=left,
        )

    def _under(self, prefix: str) -> S3BucketStore:
        """The store of objects under ``prefix`` (a held area) in this store's bucket."""
        return S3BucketStore(self.store.client, self.store.bucket_name, prefix, self.store.levels)

    def _read_all(self, keys: Sequence[str]) -> dict[str, BucketContents]:
        """The objects still there, read again under the lease."""
        found: dict[str, BucketContents] = {}
        for key in keys:
            try:
                found[key] = self.store.read(key)
            except ObjectMissingError:
                continue
        return found

    def _place(self, message: BucketMessage) -> tuple[bool, BucketKey | None, tuple[str, ...]]:
        """Send ``message`` now when due within ``direct_seconds``, else write it into its bucket."""
        now = self.clock.now()
        if (message.due_at - now).total_seconds() <= self.direct_seconds:
            window = dispatch_window(now, levels=self.store.levels)
            if self.sqs.dispatch([message], window).sent:
                return True, None, ()
            # refused or unreachable: the timer sends it from its bucket (or reports it to the error queue)
        written = self.store.write_due([message], now)
        ((bucket, keys),) = written.items()
        return False, bucket, tuple(keys)

    def _take_out(
        self, record: Cancellation, due_ms: int, objects: dict[str, BucketContents], keep: set[str]
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Each object written again without the message (when anything is left), then deleted."""
        rewritten: list[str] = []
        deleted: list[str] = []
        left: list[str] = []
        for key, contents in objects.items():
            if key in keep:
                continue
            if contents.poison or contents.problem is not None:
                left.append(key)  # rewriting would drop lines the timer must report
                continue
            rest = [m for m in contents.messages if not (_bound(record, m) and m.due_at_ms != due_ms)]
            if rest:
                parsed = parse_object_key_count(key)
                store = self.store if parsed.prefix == self.store.prefix else self._under(parsed.prefix)
                new_keys = store.write(parsed.bucket, rest)
                rewritten.extend(k for k in new_keys if k != key)
                keep.update(new_keys)
            if key not in keep:
                self.store.delete([key])
                deleted.append(key)
        return tuple(rewritten), tuple(deleted), tuple(left)


def _bound(record: Cancellation, message: BucketMessage) -> bool:
    """Whether ``record`` names ``message``: same id and destination, first sent before the request."""
    return (
        message.message_id == record.message_id
        and message.destination == record.endpoint
        and record.binds(from_epoch_ms(message.sent_at_ms))
    )
