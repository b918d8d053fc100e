"""The schedule timer Lambda's handler: Powertools (``aws/powertools.py``) around ``ScheduleTimer.run``, every minute.

``functions/aws/schedule_timer.py`` (the deployed entry point) builds it once from the environment; tests and
benchmarks build it with their own clients and clock. Metrics (EMF, namespace ``DelayedDelivery``):
``ScheduleOccurrencesFired``, ``ScheduleLateness`` (the most an occurrence sent was late, seconds),
``ScheduleOccurrencesMissed``, ``ScheduleOccurrencesSkippedPaused``, ``ScheduleDstAdjusted``, and the run's others
(``METRICS``); ``ScheduleTimerFailures`` counts failed shard passes and schedules.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock, SystemClock
from ..lambda_entry import invocation_deadline
from ..powertools import HandlerTools
from .config import ScheduleTimerConfig
from .sends import OccurrenceSender
from .store import DynamoDbScheduleStore
from .timer import ScheduleTimer, TimerResult

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["METRICS", "build_schedule_timer_handler"]

#: The EMF metric each ``TimerResult`` field is emitted as (with its unit).
METRICS: Mapping[str, tuple[str, str]] = {
    "fired": ("ScheduleOccurrencesFired", MetricUnit.Count.value),
    "fired_late": ("ScheduleOccurrencesFiredLate", MetricUnit.Count.value),
    "lateness_max_seconds": ("ScheduleLateness", MetricUnit.Seconds.value),
    "missed": ("ScheduleOccurrencesMissed", MetricUnit.Count.value),
    "skipped_paused": ("ScheduleOccurrencesSkippedPaused", MetricUnit.Count.value),
    "dst_adjusted": ("ScheduleDstAdjusted", MetricUnit.Count.value),
    "failures": ("ScheduleTimerFailures", MetricUnit.Count.value),
    "retried": ("ScheduleOccurrencesRetried", MetricUnit.Count.value),
    "to_error_queue": ("ScheduleErrorQueueSends", MetricUnit.Count.value),
    "release_held": ("ReleaseWaits", MetricUnit.Count.value),
    "release_lag_max_seconds": ("ReleaseLag", MetricUnit.Seconds.value),
    "shards_skipped_leased": ("ScheduleShardsSkippedLeased", MetricUnit.Count.value),
    "passes_replayed": ("SchedulePassesReplayed", MetricUnit.Count.value),
    "passes_unfinished": ("SchedulePassesUnfinished", MetricUnit.Count.value),
    "unreadable": ("ScheduleEntriesUnreadable", MetricUnit.Count.value),
}
_EVENT = "schedule_timer_run"


def build_schedule_timer_handler(
    config: ScheduleTimerConfig | Mapping[str, str],
    *,
    dynamodb: DynamoDBClient | None = None,
    sqs: SQSClient | None = None,
    clock: Clock | None = None,
    on_result: Callable[[TimerResult], None] | None = None,
) -> Callable[[Any, Any], dict[str, Any]]:
    """Wire the store, the sender, the timer and Powertools for one function instance (missing clients are made)."""
    if not isinstance(config, ScheduleTimerConfig):
        config = ScheduleTimerConfig.from_env(config)
    if dynamodb is None or sqs is None:
        import boto3

        dynamodb = dynamodb if dynamodb is not None else boto3.client("dynamodb")
        sqs = sqs if sqs is not None else boto3.client("sqs")
    tools = HandlerTools.for_service(config.service, config.metrics_namespace)
    logger, metrics = tools.logger, tools.metrics
    clock = clock or SystemClock()
    release = config.release_calendar(dynamodb)  # ConfigurationError at the build: one clear error
    store = DynamoDbScheduleStore(dynamodb, config.table, clock=clock)
    sender = OccurrenceSender(sqs, config.settings.error_queue, clock, release=release,
                              refused_retry_seconds=config.refused_retry_seconds)  # fmt: skip

    @tools.around
    def entrypoint(event: Any, context: Any) -> dict[str, Any]:
        owner = f"timer-{getattr(context, 'aws_request_id', '') or uuid.uuid4().hex}"
        timer = ScheduleTimer(store, sender, clock, lead_seconds=config.lead_seconds,
                              shard_threads=config.shard_threads, owner=owner)  # fmt: skip
        try:
            result = timer.run(invocation_deadline(context))
        except Exception as exc:  # never out of the handler: the next run starts over (passes replay)
            metrics.add_metric(name="ScheduleTimerFailures", unit=MetricUnit.Count, value=1)
            logger.exception(
                "schedule timer run failed; the next run starts over",
                extra={lf.CLOUD: "aws", lf.EVENT: _EVENT, lf.REASON: f"{type(exc).__name__}: {exc}"[:1024]},
            )
            return {"ok": False, "reason": f"{type(exc).__name__}: {exc}"[:1024]}
        summary = {k: v for k, v in asdict(result).items() if k != "lateness"}
        for name, (metric, unit) in METRICS.items():
            metrics.add_metric(name=metric, unit=MetricUnit(unit), value=float(summary[name]))
        logger.info("schedule timer run", extra={lf.CLOUD: "aws", lf.EVENT: _EVENT, **summary})
        if on_result is not None:
            on_result(result)
        return {"ok": True, **summary}

    return entrypoint
