"""The timer Lambda's handler: Powertools (``aws/powertools.py``) around ``BucketTimer.run``, run every minute.

``functions/aws/bucket_timer.py`` (the deployed entry point) builds it once from the environment; tests, the demo
and benchmarks build it with their own clients and clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock, SystemClock
from ...errors import ConfigurationError
from ..lambda_entry import invocation_deadline
from ..powertools import HandlerTools
from .config import BucketTierConfig
from .metrics import TIMER_METRICS as METRICS
from .plan_store import SqsTaskQueue
from .store import S3BucketStore, S3Client
from .timer import BucketTimer, TimerResult

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["METRICS", "TimerHandler", "build_timer_handler"]

#: ``handler(event, context) -> summary``
TimerHandler = Callable[[Any, Any], dict[str, Any]]
_EVENT_TIMER = "bucket_timer_run"


def _event_problem(event: Any) -> str | None:
    """Why ``event`` is not an EventBridge scheduled event (the run goes ahead anyway: it needs nothing from it)."""
    if not isinstance(event, Mapping):
        return f"the event is a {type(event).__name__}, not an object"
    if event.get("detail-type") not in (None, "Scheduled Event"):
        return f"unexpected detail-type {str(event.get('detail-type'))[:60]!r}"
    return None


def build_timer_handler(
    config: BucketTierConfig | Mapping[str, str],
    *,
    s3: S3Client | None = None,
    sqs: SQSClient | None = None,
    dynamodb: DynamoDBClient | None = None,
    clock: Clock | None = None,
    on_result: Callable[[TimerResult], None] | None = None,
) -> TimerHandler:
    """Wire the store, the timer, the cancellation records and Powertools for one function instance.

    ``config`` is a ``BucketTierConfig`` or an environment mapping to read one from; missing clients are made.
    """
    if not isinstance(config, BucketTierConfig):
        config = BucketTierConfig.from_env(config)
    if s3 is None or sqs is None:
        import boto3

        s3 = s3 if s3 is not None else boto3.client("s3")
        sqs = sqs if sqs is not None else boto3.client("sqs")
    tools = HandlerTools.for_service(config.service, config.metrics_namespace)
    logger, metrics = tools.logger, tools.metrics
    store = S3BucketStore.from_config(s3, config)
    # Records uncached (max age 0) and read strongly consistent: the timer reads them fresh for every bucket (#31).
    cancellations = tools.cancellation_cache(config.cancellation_table, dynamodb, 0, consistent=True)
    clock = clock or SystemClock()
    tasks = config.tier_settings.bucket_dispatch_queue
    queue = SqsTaskQueue(sqs, tasks) if tasks else None
    release = config.release_calendar(dynamodb)  # ConfigurationError at the build: one clear error

    @tools.around
    def entrypoint(event: Any, context: Any) -> dict[str, Any]:
        problem = _event_problem(event)
        if problem is not None:
            logger.warning("not a scheduled event; running anyway", extra={lf.EVENT: _EVENT_TIMER, lf.REASON: problem})
        owner = str(getattr(context, "aws_request_id", "") or uuid.uuid4().hex)
        timer = BucketTimer(
            store,
            sqs,
            config.settings,
            clock,
            cancellations=cancellations,
            owner=owner,
            destinations=config.destinations,
            tier=config.tier_settings,
            queue=queue,
            release=release,
        )
        try:
            result = timer.run(invocation_deadline(context))
        except ConfigurationError:
            metrics.add_metric(name="BucketTimerFailures", unit=MetricUnit.Count, value=1)
            raise  # the deployment is wrong (bucket missing, access refused): fail the invocation loudly
        except Exception as exc:  # never out of the handler: the next run starts over
            metrics.add_metric(name="BucketTimerFailures", unit=MetricUnit.Count, value=1)
            logger.exception(
                "timer run failed; the next run starts over",
                extra={lf.CLOUD: "aws", lf.EVENT: _EVENT_TIMER, lf.REASON: f"{type(exc).__name__}: {exc}"[:1024]},
            )
            return {"ok": False, "reason": f"{type(exc).__name__}: {exc}"[:1024]}
        return _report(result, logger, metrics, on_result)

    return entrypoint


def _report(
    result: TimerResult, logger: Logger, metrics: Metrics, on_result: Callable[[TimerResult], None] | None
) -> dict[str, Any]:
    """Emit the metrics and one summary log line; the summary is also the invocation's response."""
    summary = asdict(result)
    for field_name, (metric, unit) in METRICS.items():
        metrics.add_metric(name=metric, unit=MetricUnit(unit), value=float(summary[field_name]))
    logger.info("timer run", extra={lf.CLOUD: "aws", lf.EVENT: _EVENT_TIMER, **summary})
    if on_result is not None:
        on_result(result)
    return {"ok": True, **summary}
