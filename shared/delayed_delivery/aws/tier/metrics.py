"""The tier functions' metrics: the EMF metric each result field is emitted as, and the ingest's counts and lines.

One table per result (``TimerResult``, ``WorkerResult``); the handlers emit them (``timer_handler``,
``worker_handler``, ``ingest_handler``). Metric names are a contract with the alarms and dashboards (``infra/aws``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...errors import ConfigurationError
from ..powertools import HandlerTools
from .ingest import IngestResult

__all__ = ["TIMER_METRICS", "WORKER_METRICS", "Failed", "guarded", "observe_ingest", "report"]

_R = TypeVar("_R")

#: The EMF metric each ``TimerResult`` field is emitted as (with its unit).
TIMER_METRICS: Mapping[str, tuple[str, str]] = {
    "dispatched": ("BucketMessagesDispatched", MetricUnit.Count.value),
    "duplicates_skipped": ("BucketDuplicatesSkipped", MetricUnit.Count.value),
    "to_error_queue": ("BucketErrorQueueSends", MetricUnit.Count.value),
    "oldest_overdue_seconds": ("BucketOldestOverdueSeconds", MetricUnit.Seconds.value),
    "cascaded_messages": ("BucketMessagesCascaded", MetricUnit.Count.value),
    "cancelled": ("BucketMessagesCancelled", MetricUnit.Count.value),
    "rescheduled": ("BucketMessagesRescheduled", MetricUnit.Count.value),
    "kept_for_retry": ("BucketMessagesKeptForRetry", MetricUnit.Count.value),
    "buckets_skipped_leased": ("BucketsSkippedLeased", MetricUnit.Count.value),
    "buckets_failed": ("BucketFailures", MetricUnit.Count.value),
    "dropped": ("BucketErrorQueueDrops", MetricUnit.Count.value),
    "strays_set_aside": ("BucketStraysSetAside", MetricUnit.Count.value),
    "refused": ("BucketDestinationRefusals", MetricUnit.Count.value),
    "refused_given_up": ("BucketRefusedToErrorQueue", MetricUnit.Count.value),
    "release_held": ("ReleaseWaits", MetricUnit.Count.value),
    "release_lag_max_seconds": ("ReleaseLag", MetricUnit.Seconds.value),
    "held_written": ("BucketMessagesHeld", MetricUnit.Count.value),
    "held_released": ("BucketHeldReleased", MetricUnit.Count.value),
    "held_rewritten": ("BucketHeldRewritten", MetricUnit.Count.value),
    "buckets_planned": ("BucketsPlanned", MetricUnit.Count.value),
    "tasks_enqueued": ("BucketDispatchTasksEnqueued", MetricUnit.Count.value),
    "plans_finished": ("BucketPlansFinished", MetricUnit.Count.value),
    "inline_over_bound": ("BucketsOverInlineBound", MetricUnit.Count.value),
}
#: The EMF metric each ``WorkerResult`` field is emitted as (with its unit).
WORKER_METRICS: Mapping[str, tuple[str, str]] = {
    "dispatched": ("BucketMessagesDispatched", MetricUnit.Count.value),
    "duplicates_skipped": ("BucketDuplicatesSkipped", MetricUnit.Count.value),
    "to_error_queue": ("BucketErrorQueueSends", MetricUnit.Count.value),
    "cancelled": ("BucketMessagesCancelled", MetricUnit.Count.value),
    "rescheduled": ("BucketMessagesRescheduled", MetricUnit.Count.value),
    "kept_for_retry": ("BucketMessagesKeptForRetry", MetricUnit.Count.value),
    "dropped": ("BucketErrorQueueDrops", MetricUnit.Count.value),
    "pieces": ("BucketDispatchPieces", MetricUnit.Count.value),
    "lines_read": ("BucketDispatchLinesRead", MetricUnit.Count.value),
    "finished": ("BucketPartitionsFinished", MetricUnit.Count.value),
    "continued": ("BucketPartitionsContinued", MetricUnit.Count.value),
    "lost_partition": ("BucketPartitionsLost", MetricUnit.Count.value),
    "seen_overflow": ("BucketDispatchSeenOverflow", MetricUnit.Count.value),
    "refused": ("BucketDestinationRefusals", MetricUnit.Count.value),
    "refused_given_up": ("BucketRefusedToErrorQueue", MetricUnit.Count.value),
    "release_held": ("ReleaseWaits", MetricUnit.Count.value),
    "release_lag_max_seconds": ("ReleaseLag", MetricUnit.Seconds.value),
    "held_written": ("BucketMessagesHeld", MetricUnit.Count.value),
    "lines_reread": ("BucketDispatchLinesReread", MetricUnit.Count.value),
    "inherited": ("BucketDispatchInherited", MetricUnit.Count.value),
}


def observe_ingest(result: IngestResult, logger: Logger, metrics: Metrics) -> None:
    """The tier's metrics and one log line per poison entry and per failed record (fixed keys)."""
    metrics.add_metric(name="BucketMessagesIngested", unit=MetricUnit.Count, value=result.ingested)
    metrics.add_metric(name="BucketObjectsWritten", unit=MetricUnit.Count, value=result.objects_written)
    metrics.add_metric(name="BucketIngestPoison", unit=MetricUnit.Count, value=len(result.poison))
    if result.duplicates:
        metrics.add_metric(name="BucketIngestDuplicates", unit=MetricUnit.Count, value=result.duplicates)
    if result.failures:
        metrics.add_metric(name="BucketIngestRetries", unit=MetricUnit.Count, value=len(result.failures))
    for bucket, keys in result.written.items():
        logger.info(
            f"{len(keys)} object(s) written to the {bucket.level} bucket",
            extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_STORED, lf.DUE_AT: bucket.iso},
        )
    for poison in result.poison:
        fields = {
            lf.CLOUD: "aws",
            lf.EVENT: lf.EVENT_ERROR_QUEUE,
            lf.MESSAGE_ID: poison.message_id,
            lf.DESTINATION: poison.destination,
            lf.REASON: poison.reason[:1024],
        }
        if poison.sent:
            logger.error("ingest entry moved to the error queue", extra=fields)
        else:
            logger.warning("ingest entry kept for the retry of its record", extra=fields)
    for record_id, reason in result.failures.items():
        logger.warning(
            f"ingest record {record_id[:128]} will be retried",
            extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_RETRY, lf.REASON: reason[:1024]},
        )


def report(
    result: Any, table: Mapping[str, tuple[str, str]], tools: HandlerTools, text: str, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """Emit ``result``'s metrics by ``table`` and one summary log line (``fields`` first); the summary."""
    summary = asdict(result)
    for field_name, (metric, unit) in table.items():
        tools.metrics.add_metric(name=metric, unit=MetricUnit(unit), value=float(summary[field_name]))
    tools.logger.info(text, extra={lf.CLOUD: "aws", **fields, **summary})
    return summary


@dataclass(frozen=True, slots=True)
class Failed:
    """A run that raised (logged with its reason and counted by the handler's failure metric)."""

    reason: str


def guarded(
    run: Callable[[], _R],
    tools: HandlerTools,
    counted: Callable[[], None],
    text: str,
    event: str,
    *,
    fatal: tuple[type[Exception], ...] = (ConfigurationError,),
) -> _R | Failed:
    """``run()``; ``counted()`` when it raises: a ``fatal`` error (the deployment is wrong) is raised again to fail
    the invocation loudly, any other is logged with ``text`` and returned as ``Failed`` (never out of the handler)."""
    try:
        return run()
    except fatal:
        counted()
        raise
    except Exception as exc:
        counted()
        reason = f"{type(exc).__name__}: {exc}"[:1024]
        tools.logger.exception(text, extra={lf.CLOUD: "aws", lf.EVENT: event, lf.REASON: reason})
        return Failed(reason)
