"""The SQS route with the S3 time-bucket tier (``--cloud aws --bucket-name B``): exact pending for bucketed messages
from the object listing, and cancel / reschedule records that live until the tier's timer applies them."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import chain
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.routes.aws_clients import cli_client
from delayed_delivery.app.routes.base import (
    LOCAL_MOTO_URL,
    BacklogPeriod,
    CancelResult,
    CloudOptions,
    PendingReport,
    RecordReceipt,
    RescheduleResult,
    require_queue,
)
from delayed_delivery.app.routes.sqs import SqsOperatorRoute
from delayed_delivery.cancellations import binding_note
from delayed_delivery.clock import SystemClock, utc
from delayed_delivery.errors import DestinationNotFoundError, InvalidMessageError

if TYPE_CHECKING:
    from delayed_delivery.aws.cancellations import DynamoDbCancellationStore
    from delayed_delivery.aws.tier.config import BucketTierConfig
    from delayed_delivery.aws.tier.relocate import Relocation, ScanProgress
    from delayed_delivery.aws.tier.store import S3BucketStore
    from delayed_delivery.cancellations import Cancellation
    from delayed_delivery.timebuckets.census import BucketCensus, CensusPeriod

__all__ = [
    "MAX_LISTED_RECORDS",
    "BucketCancelResult",
    "BucketPendingReport",
    "BucketRescheduleResult",
    "BucketTierRoute",
    "open_bucket_route",
]

#: ``pending`` lists at most this many live cancel / reschedule records (the table holds only unapplied ones).
MAX_LISTED_RECORDS = 1_000
PER_DESTINATION = (
    "not available: the counts come from the object keys alone, and an object holds messages for many destinations; "
    "counting per destination would mean reading every object's body"
)


@dataclass(frozen=True, slots=True)
class BucketPendingReport(PendingReport):
    """``pending`` on AWS with the tier: the tier's exact census beside the FIFO route's approximate queue counts."""

    census: BucketCensus | None = None
    bucket_name: str = ""
    prefix: str = ""
    records: tuple[Cancellation, ...] = ()
    records_truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The ``pending --json`` document: the SQS one plus ``buckets``."""
        d = PendingReport.as_dict(self)
        assert self.census is not None
        d["buckets"] = {
            "bucket_name": self.bucket_name,
            "prefix": self.prefix,
            **self.census.as_dict(),
            "per_destination": PER_DESTINATION,
            "records": [_record_dict(r) for r in self.records],
            "records_truncated": self.records_truncated,
        }
        return d


def _record_dict(record: Cancellation) -> dict[str, Any]:
    return {
        "endpoint": record.endpoint,
        "message_id": record.message_id,
        "kind": record.kind.value,
        "requested_at": record.requested_at.isoformat(),
        "expires_at": record.expires_at.isoformat(),
        "due_at": record.due_at.isoformat() if record.due_at else None,
    }


@dataclass(frozen=True, slots=True)
class BucketRescheduleResult(RescheduleResult):
    """A reschedule on AWS with the tier: the message moved now (``found``), or not found in the tier."""

    found: bool = False
    sent_now: bool = False
    old_due_at: datetime | None = None
    bucket: str | None = None
    objects_read: int = 0
    #: Only the tier carries long delays (``long_delay_route = buckets``): not found means not pending.
    tier_only: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The ``reschedule --json`` document, with what the move did."""
        return {
            **RescheduleResult.as_dict(self),
            "found": self.found,
            "sent_now": self.sent_now,
            "old_due_at": self.old_due_at.isoformat() if self.old_due_at else None,
            "bucket": self.bucket,
            "objects_read": self.objects_read,
        }


@dataclass(frozen=True, slots=True)
class BucketCancelResult(CancelResult):
    """A cancel record on AWS with the tier, with a warning when the message may already be on its way."""

    warning: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``cancel --json`` document, with ``warning``."""
        return {**CancelResult.as_dict(self), "warning": self.warning}


class BucketTierRoute(SqsOperatorRoute):
    """``SqsOperatorRoute`` plus the tier: exact counts from the S3 listing, records that wait for the dispatch."""

    #: ``reschedule`` finds and moves the message now (and takes ``current_due``, ``scan_limit``, ``keep_record``).
    relocates = True

    def __init__(self, options: CloudOptions, bucket_name: str, prefix: str | None = None) -> None:
        from delayed_delivery.aws.tier.config import BUCKET_NAME_ENV, BUCKET_PREFIX_ENV, BucketTierConfig
        from delayed_delivery.aws.tier.store import S3BucketStore

        super().__init__(options)
        env = {**os.environ, BUCKET_NAME_ENV: bucket_name}
        if prefix:
            env[BUCKET_PREFIX_ENV] = prefix
        self.config: BucketTierConfig = BucketTierConfig.from_env(env)
        endpoint_url = options.endpoint_url or (LOCAL_MOTO_URL if options.local else None)
        # moto serves S3 on the SQS port; AWS_ENDPOINT_URL_S3 splits them.
        s3_url = os.environ.get("AWS_ENDPOINT_URL_S3") or endpoint_url
        self.s3 = cli_client("s3", s3_url, options.region, local=options.local, path_style=s3_url is not None)
        self.store: S3BucketStore = S3BucketStore.from_config(self.s3, self.config)

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """The tier's exact census by hour or day (listing only) and live records, beside the FIFO queue counts."""
        from delayed_delivery.timebuckets.census import take_census

        period: CensusPeriod = "hour" if bucket_seconds <= 3600 else "day"
        fifo = self._fifo_pending(bucket_seconds, queue)
        census = take_census(
            chain(self.store.objects("fine"), self.store.objects("coarse")),
            SystemClock().now(),
            period=period,
            levels=self.config.levels,
        )
        records, truncated = self._live_records(queue)
        return BucketPendingReport(
            pending=fifo.pending + census.messages,
            route="sqs-queue-attributes+s3-buckets",
            cloud="aws",
            backlog=tuple(BacklogPeriod(row.start, row.messages) for row in census.rows),
            next_due=census.next_due.start if census.next_due else None,
            oldest_overdue_seconds=census.oldest_overdue_seconds,
            queues=fifo.queues,
            error_queue=fifo.error_queue,
            error_queue_messages=fifo.error_queue_messages,
            limits=_limits(census, queue),
            census=census,
            bucket_name=self.config.bucket_name,
            prefix=self.config.prefix,
            records=tuple(records),
            records_truncated=truncated,
        )

    def _fifo_pending(self, bucket_seconds: int, queue: str | None) -> PendingReport:
        """The FIFO route's counts; none for a queue without a ``-delay.fifo`` (it uses only the tier)."""
        try:
            return super().pending(bucket_seconds, queue=queue)
        except DestinationNotFoundError:
            if queue is None:
                raise
            return PendingReport(
                pending=0, route="", queues=(), error_queue=self.settings.error_queue, error_queue_messages=None
            )

    def _live_records(self, queue: str | None) -> tuple[list[Cancellation], bool]:
        """Unexpired records of ``queue`` (or of every queue, at most ``MAX_LISTED_RECORDS``); none without a table."""
        from delayed_delivery.errors import ConfigurationError

        store = self._table()
        try:
            found, truncated = (store.live(queue), False) if queue else store.every(MAX_LISTED_RECORDS)
        except ConfigurationError:
            return [], False  # no table: no records (cancel says how to create it)
        now = SystemClock().now()
        live = sorted((r for r in found if r.expires_at > now), key=lambda r: (r.endpoint, r.requested_at))
        return live, truncated

    def _table(self) -> DynamoDbCancellationStore:
        from delayed_delivery.aws.cancellations import DEFAULT_TABLE, DynamoDbCancellationStore

        return DynamoDbCancellationStore(self.dynamodb, self.config.cancellation_table or DEFAULT_TABLE)

    def _tier_records(self, to: str) -> DynamoDbCancellationStore:
        """The record table, after checking the S3 bucket, the destination queue ``to`` and the table exist."""
        from botocore.exceptions import BotoCoreError, ClientError

        from delayed_delivery.aws.sqs import translate_error

        self.store.check()
        try:
            self.client.get_queue_url(QueueName=to)
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"looking up {to!r} at {self.where}")
            if isinstance(error, DestinationNotFoundError):
                raise DestinationNotFoundError(
                    f"unknown queue {to!r} at {self.where}: no message is delayed for it (check --to)"
                ) from exc
            raise error from exc
        store = self._table()
        store.check()
        return store

    def _reach_seconds(self) -> float:
        """Seconds before its due time a message may have left for its destination (the tier's, or both routes')."""
        from delayed_delivery.aws.cancellations import cache_seconds_from_env

        tier = self.config.levels.dispatch_lead_seconds + self.config.levels.fine_seconds
        if self.settings.long_delay_route == "buckets":
            return float(tier)
        return float(max(tier, self.settings.max_native_delay + cache_seconds_from_env(os.environ)))

    def cancel(self, message_id: str, *, to: str | None = None, due: datetime | None = None) -> CancelResult:
        """Write a cancel record living until the message's dispatch; warn when ``due`` is within the reach."""
        from delayed_delivery.cancellations import cancel_request, tier_record_ttl
        from delayed_delivery.durations import format_duration

        to = require_queue(to)
        store = self._tier_records(to)
        now = SystemClock().now()
        record = cancel_request(to, message_id, now=now, max_native_delay=0, max_age=0, ttl=tier_record_ttl(now, due))
        store.put(record)
        reach = self._reach_seconds()
        warning = None
        if due is not None and (utc(due) - now).total_seconds() <= reach:
            warning = (
                f"{message_id!r} is due {utc(due).isoformat()}, within {format_duration(reach)} of now: it may already "
                f"be on its way to {to!r} and then is delivered; have the consumer drop it by id"
            )
        note = (
            "it is dropped when its time bucket is cascaded or dispatched (or at its next hop on the FIFO route); "
            f"the record lives until then ({record.expires_at.date().isoformat()})"
        )
        receipt = RecordReceipt(to, store.table, record.expires_at, note + binding_note(record.requested_at))
        certain = due is not None and warning is None
        return BucketCancelResult(message_id, "aws", False, receipt, certain, warning)

    def reschedule(
        self,
        message_id: str,
        due: datetime,
        *,
        to: str | None = None,
        current_due: datetime | None = None,
        scan_limit: int | None = None,
        keep_record: bool = False,
        progress: Callable[[ScanProgress], None] | None = None,
    ) -> RescheduleResult:
        """Write a reschedule record, then move the message in the tier now (exact); a time in the past is refused."""
        from delayed_delivery.aws.tier.provision import INGEST_VISIBILITY_SECONDS
        from delayed_delivery.aws.tier.relocate import DEFAULT_SCAN_LIMIT, Relocator
        from delayed_delivery.cancellations import reschedule_request, tier_record_ttl

        to = require_queue(to)
        clock = SystemClock()
        now = clock.now()
        if utc(due) <= now:
            raise InvalidMessageError(
                f"new due time {utc(due).isoformat()} is in the past (now {now.isoformat()}): give a later --at or a "
                "--delay, or cancel it"
            )
        store = self._tier_records(to)
        limit = DEFAULT_SCAN_LIMIT if scan_limit is None else scan_limit
        relocator = Relocator(self.store, self.client, self.settings, clock, progress=progress)
        if current_due is None:
            relocator.check_scan_limit(limit)  # refused before anything is written
        last = max(utc(due), utc(current_due)) if current_due is not None else None
        record = reschedule_request(to, message_id, due, now=now, ttl=tier_record_ttl(now, last))
        store.put(record)  # first: a timer meeting the message meanwhile moves it too
        moved = relocator.relocate(record, due=current_due, scan_limit=limit)
        fifo_too = self.settings.long_delay_route != "buckets"
        if not keep_record and (moved.found or not fifo_too):
            record = replace(record, expires_at=clock.now() + timedelta(seconds=INGEST_VISIBILITY_SECONDS))
            store.put(record)  # kept a little: a copy may still be on its way through the ingest queue
        note = _moved_note(moved, fifo_too, keep_record)
        receipt = RecordReceipt(to, store.table, record.expires_at, note + binding_note(record.requested_at))
        return BucketRescheduleResult(
            message_id,
            "aws",
            utc(due),
            moved=moved.found,
            record=receipt,
            found=moved.found,
            sent_now=moved.sent_now,
            old_due_at=moved.old_due,
            bucket=f"{moved.bucket.level} {moved.bucket.iso}" if moved.bucket else None,
            objects_read=moved.objects_read,
            tier_only=not fifo_too,
        )


def _moved_note(moved: Relocation, fifo_too: bool, keep_record: bool) -> str:
    """What happened to the message, and how long the record stays."""
    kept = "the record is kept until the message's due time" if keep_record else ""
    if not moved.found:
        where = f"no message {moved.message_id!r} is waiting in the tier ({moved.objects_read} object(s) read)"
        if fifo_too:
            return f"{where}; the record waits for its next hop on the FIFO route, where a message sooner is met late"
        return f"{where}; " + (kept or "the record is kept for the ingest queue's visibility, in case it is on its way")
    if moved.moved_by_timer:
        done = "a timer took its object first: moved by the record, or sent at its old time if it read no record yet"
    elif moved.sent_now:
        done = f"sent to {moved.destination!r} now with the rest of its delay (due within 900 s)"
    else:
        done = f"moved now into the {moved.bucket.level if moved.bucket else ''} bucket of its new due time"
    if moved.left_alone:
        done += f"; {len(moved.left_alone)} object(s) with unreadable lines left for the timer, which moves it there"
    return f"{done}; " + (kept or "the record is kept for the ingest queue's visibility, in case a copy is on its way")


def _limits(census: BucketCensus, queue: str | None) -> str:
    """What ``pending`` says it cannot know."""
    parts = [
        f"time-bucket tier: {census.describe_total()} message(s), exact, from the object listing (no body read)",
        f"per destination: {PER_DESTINATION}" + (f", so --queue {queue!r} filters only the records" if queue else ""),
        "a coarse bucket's messages are due anywhere in it (shown in the row where it starts)",
        "the FIFO route's counts ('hop cycle', 'final native delay') are approximate SQS attributes",
    ]
    if not census.exact:
        parts.insert(1, f"{census.uncounted_objects} object(s) have keys without a count (written before key v2)")
    return "; ".join(parts) + "."


def open_bucket_route(options: CloudOptions, bucket_name: str, prefix: str | None = None) -> BucketTierRoute:
    """The AWS route with the tier; ``ConfigurationError`` without the aws extra."""
    from delayed_delivery.errors import ConfigurationError

    try:
        return BucketTierRoute(options, bucket_name, prefix)
    except ImportError as exc:
        raise ConfigurationError("the aws route needs the aws extra: pip install 'delayed-delivery[aws]'") from exc
