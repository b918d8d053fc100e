"""Cancel and reschedule one message on the tier, for any caller (the CLI's operator route is one of them).

A cancel writes a record in the cancellation table that lives until the timer applies it at the message's cascade or
dispatch (``tier_record_ttl``), with a warning when the message may already be on its way. A reschedule writes its
record first (a timer meeting the message meanwhile moves it too), moves the message now (``Relocator``), then
shortens the record to the ingest queue's visibility, unless it is to be kept or the message may be on the FIFO route
instead. The design, and what a crash leaves, are in docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import chain
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ...cancellations import (
    Cancellation,
    StoredRecord,
    binding_note,
    cancel_request,
    is_live,
    reschedule_request,
    tier_record_ttl,
)
from ...clock import Clock, SystemClock, utc
from ...delivery import epoch_ms, from_epoch_ms
from ...durations import format_duration, new_due_time
from ...errors import DestinationNotFoundError
from ...settings import DelayedDeliverySettings
from ...timebuckets.census import BucketCensus, CensusPeriod, take_census
from ...timebuckets.wheel import BucketKey
from ..cancellations import DEFAULT_CACHE_SECONDS, DEFAULT_TABLE, TABLE_ENV, DynamoDbCancellationStore
from ..settings import SqsSettings
from ..sqs import translate_error
from .held import HeldArea
from .plan_store import PlanStore
from .provision import INGEST_VISIBILITY_SECONDS
from .relocate import DEFAULT_SCAN_LIMIT, Relocation, Relocator, ScanProgress
from .store import S3BucketStore, S3Client
from .timer_work import SETTLE_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from .config import BucketTierConfig

__all__ = ["PlanInFlight", "TierCancel", "TierOperations", "TierReschedule"]


@dataclass(frozen=True, slots=True)
class TierCancel:
    """A cancel record written: the record, its table, whether the message is certainly dropped, and why not."""

    record: Cancellation
    table: str
    #: The due time was given and is far enough away that the message cannot have left yet.
    certain: bool
    #: What happens to the message and how long the record lives.
    note: str
    #: Set when the due time is near enough that the message may already be on its way (the record is written all
    #: the same).
    warning: str | None = None


@dataclass(frozen=True, slots=True)
class TierReschedule:
    """A reschedule: the record as it stays, what the move did, and what that means for the message."""

    record: Cancellation
    table: str
    relocation: Relocation
    #: Only the tier carries long delays (``long_delay_route = buckets``): not found there means not pending.
    tier_only: bool
    note: str

    @property
    def missing(self) -> bool:
        """No such message is pending: not in the tier, and no other route could hold it."""
        return self.tier_only and not self.relocation.found


@dataclass(frozen=True, slots=True)
class PlanInFlight:
    """A big bucket the dispatch workers are sending now: its partitions and what they did so far."""

    bucket: BucketKey
    planned_at: datetime
    partitions: int
    done: int
    #: Partitions a worker holds now (its lease not run out).
    working: int
    sent: int
    #: Lines of the plan's objects dealt with: sent, cancelled, moved, to the error queue, copies, written back.
    handled: int

    def as_dict(self) -> dict[str, object]:
        """The ``pending --json`` form."""
        return {
            "bucket": self.bucket.iso,
            "planned_at": self.planned_at.isoformat(),
            "partitions": self.partitions,
            "partitions_done": self.done,
            "partitions_working": self.working,
            "sent": self.sent,
            "handled": self.handled,
        }


class TierOperations:
    """Cancel and reschedule on the tier: records in the cancellation table, moves under the buckets' leases."""

    def __init__(
        self,
        store: S3BucketStore,
        sqs_client: SQSClient,
        records: DynamoDbCancellationStore,
        settings: DelayedDeliverySettings,
        *,
        sqs_settings: SqsSettings | None = None,
        clock: Clock | None = None,
        where: str = "AWS",
        record_cache_seconds: float = DEFAULT_CACHE_SECONDS,
        table_named: bool = True,
    ) -> None:
        self.store = store
        self.sqs = sqs_client
        self.records = records
        self.settings = settings
        #: The SQS route's settings: ``long_delay_route`` and the native cap decide what may have left already.
        self.sqs_settings = sqs_settings or SqsSettings()
        self.clock = clock or SystemClock()
        #: Where the queues are, for error texts (an endpoint URL, or "AWS").
        self.where = where
        #: The requeue function's record cache (``DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS``), for the FIFO route.
        self.record_cache_seconds = record_cache_seconds
        #: The table was named (``DELAYED_DELIVERY_CANCELLATION_TABLE``), as the tier's functions are told it; False:
        #: the default table, which the deployed timer may not read, so no cancel is certain.
        self.table_named = table_named

    @classmethod
    def from_config(
        cls,
        config: BucketTierConfig,
        *,
        s3_client: S3Client,
        sqs_client: SQSClient,
        dynamodb_client: DynamoDBClient,
        clock: Clock | None = None,
    ) -> TierOperations:
        """The tier of ``config``: its bucket objects, and its cancellation table (the default one when unset)."""
        records = DynamoDbCancellationStore(dynamodb_client, config.cancellation_table or DEFAULT_TABLE)
        store = S3BucketStore.from_config(s3_client, config)
        named = config.cancellation_table is not None
        routes = config.sqs_settings
        return cls(store, sqs_client, records, config.settings, sqs_settings=routes, clock=clock, table_named=named)

    @property
    def fifo_too(self) -> bool:
        """Whether a long delay may also take the ``-delay.fifo`` route (``long_delay_route`` is not ``buckets``)."""
        return self.sqs_settings.long_delay_route != "buckets"

    def check(self, destination: str) -> None:
        """The S3 bucket, the destination queue and the cancellation table exist (one request each)."""
        self.store.check()
        try:
            self.sqs.get_queue_url(QueueName=destination)
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"looking up {destination!r} at {self.where}")
            if isinstance(error, DestinationNotFoundError):
                raise DestinationNotFoundError(
                    f"unknown queue {destination!r} at {self.where}: no message is delayed for it"
                ) from exc
            raise error from exc
        self.records.check()

    def reach_seconds(self) -> float:
        """Seconds before its due time a message may have left for its destination: the tier's dispatch (lead and a
        fine bucket), a delay the sender sent natively (up to ``max_native_delay``: it never waits in the tier, on any
        route; #31), and with the FIFO route its last hop (plus the requeue function's record cache)."""
        levels = self.store.levels
        tier = levels.dispatch_lead_seconds + levels.fine_seconds
        native = self.sqs_settings.max_native_delay
        if not self.fifo_too:
            return float(max(tier, native))
        return float(max(tier, native + self.record_cache_seconds))

    def cancel(self, destination: str, message_id: str, *, due: datetime | None = None) -> TierCancel:
        """Write a cancel record living until the message's dispatch (``due``: its due time, if known)."""
        self.check(destination)
        now = self.clock.now()
        record = cancel_request(
            destination, message_id, now=now, max_native_delay=0, max_age=0, ttl=tier_record_ttl(now, due)
        )
        self.records.put(record)
        reach = self.reach_seconds()
        warning = None
        if due is not None and (utc(due) - now).total_seconds() <= reach:
            warning = (
                f"{message_id!r} is due {utc(due).isoformat()}, within {format_duration(reach)} of now: it may already "
                f"be on its way to {destination!r} and then is delivered; have the consumer drop it by id"
            )
        if not self.table_named:
            warning = (
                f"{TABLE_ENV} is not set, so the record went to the default table {self.records.table!r}: the tier's "
                "timer drops the message only if it reads that table (`aws tier --local` does; a deployed tier reads "
                f"the table its stack names), so this cancel cannot be certain; set {TABLE_ENV} to the tier's table"
                + (f". Also: {warning}" if warning else "")
            )
        note = (
            "it is dropped when its time bucket is cascaded or dispatched (or at its next hop on the FIFO route); "
            f"the record lives until then ({record.expires_at.date().isoformat()})"
        )
        certain = due is not None and warning is None
        return TierCancel(record, self.records.table, certain, note + binding_note(record.requested_at), warning)

    def reschedule(
        self,
        destination: str,
        message_id: str,
        due: datetime,
        *,
        current_due: datetime | None = None,
        scan_limit: int | None = None,
        keep_record: bool = False,
        progress: Callable[[ScanProgress], None] | None = None,
    ) -> TierReschedule:
        """Write a reschedule record, then move the message in the tier now; a time in the past is refused.

        ``current_due`` (its due time now, if known) reads only its buckets, else every object is read (at most
        ``scan_limit``, refused before anything is written); ``keep_record`` keeps the record until the due time.
        """
        now = self.clock.now()
        due = new_due_time(due, now)
        self.check(destination)
        limit = DEFAULT_SCAN_LIMIT if scan_limit is None else scan_limit
        relocator = Relocator(self.store, self.sqs, self.settings, self.clock, progress=progress)
        if current_due is None:
            relocator.check_scan_limit(limit)  # refused before anything is written
        last = max(utc(due), utc(current_due)) if current_due is not None else None
        record = reschedule_request(destination, message_id, due, now=now, ttl=tier_record_ttl(now, last))
        self.records.put(record)  # first: a timer meeting the message meanwhile moves it too
        moved = relocator.relocate(record, due=current_due, scan_limit=limit)
        if not keep_record and not moved.by_workers and (moved.found or not self.fifo_too):
            # Kept a little: a copy may still be on its way through the ingest queue. Once the message was found,
            # as long as a timer keeps a record it applied (SETTLE_SECONDS past the later due time), so a copy of the
            # original sent before it is moved too, whoever moved the message (#31).
            ends = self.clock.now() + timedelta(seconds=INGEST_VISIBILITY_SECONDS)
            if moved.found:
                latest = max(utc(due), moved.old_due or utc(due))
                ends = max(ends, latest + timedelta(seconds=SETTLE_SECONDS))
            record = replace(record, expires_at=min(record.expires_at, ends))
            self.records.put(record)
        note = _moved_note(moved, self.fifo_too, keep_record) + binding_note(record.requested_at)
        return TierReschedule(record, self.records.table, moved, not self.fifo_too, note)

    def live_records(self, destination: str | None = None, *, limit: int = 1_000) -> tuple[list[StoredRecord], bool]:
        """Unexpired records of ``destination`` (or of every one, at most ``limit``; unreadable ones last), and whether
        more were left."""
        found, truncated = (self.records.live(destination), False) if destination else self.records.every(limit)
        now = self.clock.now()
        live = sorted((r for r in found if is_live(r, now)), key=_record_order)
        return live, truncated

    def in_flight(self) -> list[PlanInFlight]:
        """The plans the dispatch workers are sending now, oldest first (a LIST, then a few small GETs each)."""
        plans = PlanStore(self.store)
        now_ms = epoch_ms(self.clock.now())
        found: list[PlanInFlight] = []
        for bucket in plans.buckets():
            plan = plans.read_plan(bucket)
            if plan is None:
                continue
            progress = [plans.read_progress(plan, k).progress for k in range(plan.partitions)]
            counts = [p.counts for p in progress if p is not None]
            handled = sum(
                c.sent + c.duplicates + c.cancelled + c.rescheduled + c.to_error_queue + c.kept_for_retry
                for c in counts
            )
            found.append(
                PlanInFlight(
                    bucket,
                    from_epoch_ms(plan.created_ms) or self.clock.now(),
                    plan.partitions,
                    sum(1 for p in progress if p is not None and p.done),
                    sum(1 for p in progress if p is not None and not p.done and p.lease_until_ms > now_ms),
                    sum(c.sent for c in counts),
                    handled,
                )
            )
        return found

    def census(self, period: CensusPeriod = "day") -> BucketCensus:
        """The tier's exact counts by due hour or day, from the object listing alone (no body read)."""
        held = HeldArea(self.store).objects()  # what a release cap holds waits apart, per destination (#31)
        objects = chain(self.store.objects("fine"), self.store.objects("coarse"), held)
        return take_census(objects, self.clock.now(), period=period, levels=self.store.levels)


def _record_order(record: StoredRecord) -> tuple[str, bool, str, str]:
    """By endpoint, then readable records by request time, then unreadable ones by id."""
    if isinstance(record, Cancellation):
        return record.endpoint, False, record.requested_at.isoformat(), record.message_id
    return record.endpoint, True, "", record.message_id


def _moved_note(moved: Relocation, fifo_too: bool, keep_record: bool) -> str:
    """What happened to the message, and how long the record stays."""
    kept = "the record is kept until the message's due time" if keep_record else ""
    if not moved.found:
        where = f"no message {moved.message_id!r} is waiting in the tier ({moved.objects_read} object(s) read)"
        if fifo_too:
            return f"{where}; the record waits for its next hop on the FIFO route, where a message sooner is met late"
        return f"{where}; " + (kept or "the record is kept for the ingest queue's visibility, in case it is on its way")
    if moved.already_sent:
        old = moved.old_due.isoformat() if moved.old_due else "its old time"
        return (
            f"not moved: the dispatch workers already handed it to {moved.destination!r}, due {old}, where it cannot "
            "be recalled; have the consumer drop it by id"
        )
    if moved.by_workers and not moved.written:
        done = (
            "its bucket is being sent by the dispatch workers and its worker has not reached it yet: the worker reads "
            "the record before each piece and moves it there, so it is not sent at its old time"
        )
        if moved.deleted or moved.rewritten:
            done += f" (other copies taken out: {len(moved.deleted)} object(s))"
        return f"{done}; the record is kept until then"
    if moved.moved_by_timer:
        done = "a timer took its object first: moved by the record, or sent at its old time if it read no record yet"
    elif moved.sent_now:
        done = f"sent to {moved.destination!r} now with the rest of its delay (due within 900 s)"
    else:
        done = f"moved now into the {moved.bucket.level if moved.bucket else ''} bucket of its new due time"
    if moved.left_alone:
        done += f"; {len(moved.left_alone)} object(s) with unreadable lines left for the timer, which moves it there"
    kept = kept or (
        "the record is kept until an hour after the later due time, so that a copy of the original still on its way "
        "is moved too"
    )
    return f"{done}; {kept}"
