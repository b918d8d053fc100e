"""The tier's runtime: what the ingest, timer and dispatch functions share, built once per function instance.

``TierRuntime.build`` takes the configuration (or reads it from the environment), the S3 and SQS clients (or makes
them), and builds the bucket store, the send path for notices, Powertools' tools, the clock and, for the functions
that send (timer, dispatch), the cancellation records, the task queue and the release calendar. The engines are
made from it per invocation (``timer``, ``worker``, ``ingest``), each reading its settings from the configuration;
the handlers are shells over it. Nothing is read or created at import time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from ...cancellations import CancellationCache
from ...clock import Clock, SystemClock
from ..powertools import HandlerTools
from ..release_calendar import ReleaseCalendar
from .config import BucketTierConfig
from .ingest import BucketIngest
from .plan_store import SqsTaskQueue
from .store import S3BucketStore, S3Client
from .timer import BucketTimer
from .timer_sqs import TimerSqs
from .worker import PartitionWorker

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["TierRuntime", "invocation_owner", "partial_batch_response", "sqs_records", "tier_config"]


def tier_config(config: BucketTierConfig | Mapping[str, str] | None) -> BucketTierConfig:
    """``config``, or the one read from the environment mapping given (``os.environ`` for None)."""
    if isinstance(config, BucketTierConfig):
        return config
    return BucketTierConfig.from_env(os.environ if config is None else config)


@dataclass(frozen=True, slots=True)
class TierRuntime:
    """The clients, store, send path, records, task queue, release calendar, tools and clock of one instance."""

    config: BucketTierConfig
    s3: S3Client
    sqs: SQSClient
    tools: HandlerTools
    store: S3BucketStore
    clock: Clock
    #: The send path for what goes to the error queue outside an engine's run (a task that cannot be read).
    send: TimerSqs
    #: The functions that send only (``build(sends=True)``): records, dispatch tasks, release slots.
    cancellations: CancellationCache | None = None
    tasks: SqsTaskQueue | None = None
    release: ReleaseCalendar | None = None

    @classmethod
    def build(
        cls,
        config: BucketTierConfig | Mapping[str, str] | None = None,
        *,
        s3: S3Client | None = None,
        sqs: SQSClient | None = None,
        dynamodb: DynamoDBClient | None = None,
        clock: Clock | None = None,
        sends: bool = True,
    ) -> TierRuntime:
        """Build once per cold start; missing clients are made. ``sends`` False (the ingest): no records, task
        queue or release calendar (so no DynamoDB client and no release table needed)."""
        config = tier_config(config)
        if s3 is None or sqs is None:
            import boto3

            s3 = s3 if s3 is not None else boto3.client("s3")
            sqs = sqs if sqs is not None else boto3.client("sqs")
        tools = HandlerTools.for_service(config.service, config.metrics_namespace)
        clock = clock or SystemClock()
        store = S3BucketStore.from_config(s3, config)
        runtime = cls(config, s3, sqs, tools, store, clock, TimerSqs(sqs, config.settings, clock))
        if not sends:
            return runtime
        queue = config.tier_settings.bucket_dispatch_queue
        return replace(
            runtime,
            # Records uncached (max age 0) and read strongly consistent: fresh for every bucket and piece (#31).
            cancellations=tools.cancellation_cache(config.cancellation_table, dynamodb, 0, consistent=True),
            tasks=SqsTaskQueue(sqs, queue) if queue else None,
            release=config.release_calendar(dynamodb),  # ConfigurationError at the build: one clear error
        )

    def timer(self, owner: str) -> BucketTimer:
        """A timer for one run."""
        config = self.config
        return BucketTimer(
            self.store,
            self.sqs,
            config.settings,
            self.clock,
            cancellations=self.cancellations,
            owner=owner,
            tier=config.tier_settings,
            queue=self.tasks,
            destinations=config.destinations,
            release=self.release,
        )

    def worker(self, owner: str) -> PartitionWorker:
        """A dispatch worker for one task."""
        config = self.config
        return PartitionWorker(
            self.store,
            self.sqs,
            config.settings,
            self.clock,
            tier=config.tier_settings,
            owner=owner,
            cancellations=self.cancellations,
            queue=self.tasks,
            destinations=config.destinations,
            release=self.release,
        )

    def ingest(self) -> BucketIngest:
        """The ingest step (one per instance: it keeps no state between invocations)."""
        config = self.config
        return BucketIngest(self.store, self.sqs, config.settings, self.clock, destinations=config.destinations)


def invocation_owner(context: Any) -> str:
    """Who an invocation is (leases and progress name it): its request id, or a fresh one without a context."""
    return str(getattr(context, "aws_request_id", "") or uuid.uuid4().hex)


def sqs_records(event: Any) -> list[Any]:
    """The records of an SQS event (none when it is not one: nothing to do, never a crash)."""
    records = event.get("Records") if isinstance(event, Mapping) else None
    return records if isinstance(records, list) else []


class _RecordFailed(Exception):
    """A record the handler reports failed (SQS hands it out again)."""


def partial_batch_response(ids: Sequence[str], failed: Collection[str], context: Any) -> dict[str, Any]:
    """The partial batch response (Powertools' ``BatchProcessor``) for records ``ids`` in event order, those in
    ``failed`` to be handed out again; a batch that failed whole is reported record by record, never raised."""

    def record_handler(record: SQSRecord) -> None:
        if record.message_id in failed:
            raise _RecordFailed(record.message_id)

    if not ids:  # Powertools takes an event without records for another event type
        return {"batchItemFailures": []}
    # One processor per invocation: it holds the batch's state (local event sources invoke from several threads).
    processor = BatchProcessor(EventType.SQS, raise_on_entire_batch_failure=False)
    event = {"Records": [{"messageId": i} for i in dict.fromkeys(ids)]}
    return dict(
        process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
    )
