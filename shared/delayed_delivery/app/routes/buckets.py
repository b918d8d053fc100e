"""The SQS route with the S3 time-bucket tier (``--cloud aws --bucket-name B``): exact pending for bucketed messages
from the object listing, and cancel / reschedule records that live until the tier's timer applies them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from delayed_delivery.app.routes.aws_clients import cli_client
from delayed_delivery.app.routes.base import (
    LOCAL_MOTO_URL,
    BacklogPeriod,
    CancelRequest,
    CancelResult,
    Capability,
    CloudOptions,
    PendingReport,
    RecordReceipt,
    RescheduleRequest,
    RescheduleResult,
    SqsCounts,
    require_queue,
    resolve_due,
)
from delayed_delivery.app.routes.sqs import SqsOperatorRoute
from delayed_delivery.clock import utc
from delayed_delivery.errors import ConfigurationError, DestinationNotFoundError

if TYPE_CHECKING:
    from delayed_delivery.aws.tier.config import BucketTierConfig
    from delayed_delivery.aws.tier.operations import PlanInFlight, TierOperations
    from delayed_delivery.aws.tier.store import S3BucketStore
    from delayed_delivery.cancellations import StoredRecord
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
    records: tuple[StoredRecord, ...] = ()
    records_truncated: bool = False
    #: Big buckets the dispatch workers are sending now (their objects still listed until the last piece).
    in_flight: tuple[PlanInFlight, ...] = ()

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
            "in_flight": [plan.as_dict() for plan in self.in_flight],
        }
        return d


def _record_dict(record: StoredRecord) -> dict[str, Any]:
    from delayed_delivery.cancellations import UnreadableRecord

    if isinstance(record, UnreadableRecord):
        return {
            "endpoint": record.endpoint,
            "message_id": record.message_id,
            "kind": "unreadable",
            "reason": record.reason,
            "expires_at": record.expires_at.isoformat() if record.expires_at else None,
        }
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

    @property
    def missing(self) -> bool:
        """Not in the tier, and only the tier carries long delays: no such message is pending."""
        return self.tier_only and not self.found

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
    """A cancel record on AWS with the tier; its ``--json`` document always says ``warning``."""

    def as_dict(self) -> dict[str, Any]:
        """The ``cancel --json`` document, with ``warning``."""
        return {**CancelResult.as_dict(self), "warning": self.warning}


class BucketTierRoute(SqsOperatorRoute):
    """``SqsOperatorRoute`` plus the tier: exact counts from the S3 listing, records that wait for the dispatch."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.HOP_CYCLE, Capability.TIER_SEARCH})

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

    def _operations(self, record_cache_seconds: float | None = None) -> TierOperations:
        """The tier's cancel / reschedule operations on this route's clients."""
        from delayed_delivery.aws.cancellations import DEFAULT_CACHE_SECONDS, DEFAULT_TABLE, DynamoDbCancellationStore
        from delayed_delivery.aws.tier.operations import TierOperations

        table = DynamoDbCancellationStore(self.dynamodb, self.config.cancellation_table or DEFAULT_TABLE)
        cache = DEFAULT_CACHE_SECONDS if record_cache_seconds is None else record_cache_seconds
        return TierOperations(
            self.store,
            self.client,
            table,
            self.settings,
            sqs_settings=self.sqs_settings,
            where=self.where,
            record_cache_seconds=cache,
            table_named=self.config.cancellation_table is not None,
        )

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """The tier's exact census by hour or day (listing only) and live records, beside the FIFO queue counts."""
        period: CensusPeriod = "hour" if bucket_seconds <= 3600 else "day"
        fifo = self._fifo_pending(bucket_seconds, queue)
        operations = self._operations()
        census = operations.census(period)
        in_flight = tuple(operations.in_flight())
        records, truncated = self._live_records(queue)
        handled = sum(plan.handled for plan in in_flight)  # listed until their plan is done, no longer waiting
        return BucketPendingReport(
            # exact; the SQS queues' counts stay apart, in ``approximate``
            pending=max(0, census.messages - handled),
            route="sqs-queue-attributes+s3-buckets",
            cloud="aws",
            backlog=tuple(BacklogPeriod(row.start, row.messages) for row in census.rows),
            next_due=census.next_due.start if census.next_due else None,
            oldest_overdue_seconds=census.oldest_overdue_seconds,
            queues=fifo.queues,
            error_queue=fifo.error_queue,
            error_queue_messages=fifo.error_queue_messages,
            limits=_limits(census, queue),
            approximate=fifo.approximate,
            census=census,
            bucket_name=self.config.bucket_name,
            prefix=self.config.prefix,
            records=tuple(records),
            records_truncated=truncated,
            in_flight=in_flight,
        )

    def _fifo_pending(self, bucket_seconds: int, queue: str | None) -> PendingReport:
        """The FIFO route's counts; none for a queue without a ``-delay.fifo`` (it uses only the tier)."""
        try:
            return super().pending(bucket_seconds, queue=queue)
        except DestinationNotFoundError:
            if queue is None:
                raise
            from delayed_delivery.aws.packing import MAX_ENVELOPE_ENTRIES

            counts = self._with_ingest(SqsCounts(0, MAX_ENVELOPE_ENTRIES))
            return PendingReport(
                pending=None,
                route="",
                queues=(),
                error_queue=self.settings.error_queue,
                error_queue_messages=None,
                approximate=counts,
            )

    def _live_records(self, queue: str | None) -> tuple[list[StoredRecord], bool]:
        """Unexpired records of ``queue`` (or of every queue, at most ``MAX_LISTED_RECORDS``); none without a table."""
        try:
            return self._operations().live_records(queue, limit=MAX_LISTED_RECORDS)
        except ConfigurationError:
            return [], False  # no table: no records (cancel says how to create it)

    def cancel(self, request: CancelRequest) -> CancelResult:
        """Write a cancel record living until the message's dispatch; warn when ``due`` is within the reach."""
        from delayed_delivery.aws.cancellations import cache_seconds_from_env

        to = require_queue(request.to)
        fifo_too = self.sqs_settings.long_delay_route != "buckets"
        operations = self._operations(cache_seconds_from_env(os.environ) if fifo_too else None)
        with _unknown_queue_is_to():
            done = operations.cancel(to, request.message_id, due=request.due)
        receipt = RecordReceipt(to, done.table, done.record.expires_at, done.note)
        return BucketCancelResult(request.message_id, "aws", False, receipt, done.certain, done.warning)

    def reschedule(self, request: RescheduleRequest) -> RescheduleResult:
        """Write a reschedule record, then move the message in the tier now (exact); a time in the past is refused."""
        to = require_queue(request.to)
        operations = self._operations()
        moment = resolve_due(request.due, operations.clock.now())  # after connecting: a delay counts from the write
        with _unknown_queue_is_to():
            done = operations.reschedule(
                to,
                request.message_id,
                moment,
                current_due=request.current_due,
                scan_limit=request.scan_limit,
                keep_record=request.keep_record,
                progress=request.progress,
            )
        moved = done.relocation
        receipt = RecordReceipt(to, done.table, done.record.expires_at, done.note)
        return BucketRescheduleResult(
            request.message_id,
            "aws",
            utc(moment),
            moved=moved.found and not moved.already_sent,
            record=receipt,
            found=moved.found,
            sent_now=moved.sent_now,
            old_due_at=moved.old_due,
            bucket=f"{moved.bucket.level} {moved.bucket.iso}" if moved.bucket else None,
            objects_read=moved.objects_read,
            tier_only=done.tier_only,
        )


@contextmanager
def _unknown_queue_is_to() -> Iterator[None]:
    """An unknown destination queue is the one ``--to`` named."""
    try:
        yield
    except DestinationNotFoundError as exc:
        raise DestinationNotFoundError(f"{exc} (check --to)") from exc


def _limits(census: BucketCensus, queue: str | None) -> str:
    """What ``pending`` says it cannot know."""
    parts = [
        f"time-bucket tier: {census.describe_total()} message(s) in S3 from the object listing (no body read), "
        f"counting {census.counts}; messages still in the ingest queue are not in S3 yet and are counted apart, "
        "approximately, in SQS messages",
        f"per destination: {PER_DESTINATION}" + (f", so --queue {queue!r} filters only the records" if queue else ""),
        "a coarse bucket's messages are due anywhere in it (shown in the row where it starts)",
        "the SQS counts ('hop cycle', 'final native delay', 'ingest') are approximate SQS attributes in SQS messages "
        "(an envelope counts once), never added to the tier's exact count",
        "a big bucket the dispatch workers are sending is listed until its last piece; the total leaves out what "
        "they sent already",
    ]
    if not census.exact:
        parts.insert(1, f"{census.uncounted_objects} object(s) have keys without a count (written before key v2)")
    return "; ".join(parts) + "."


def open_bucket_route(options: CloudOptions, bucket_name: str, prefix: str | None = None) -> BucketTierRoute:
    """The AWS route with the tier; ``ConfigurationError`` without the aws extra."""
    from delayed_delivery.errors import extra_missing

    try:
        return BucketTierRoute(options, bucket_name, prefix)
    except ImportError as exc:
        raise extra_missing("the aws route", "cli", "aws") from exc
