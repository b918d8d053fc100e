"""The dispatch function's handler: Powertools around ``PartitionWorker.run`` for each task of an SQS event.

The dispatch queue's event source hands it tasks (batch size 1). A task that cannot be read goes to the tier's
error queue with the reason; a task whose run fails unexpectedly is reported as a partial batch failure, so SQS
hands it out again after the queue's visibility timeout (the partition's progress says where to go on). A worker
that stops near its deadline has enqueued its task again itself. ``functions/aws/bucket_dispatch.py`` (the deployed
entry point) builds it once from the environment; tests and benchmarks build it with their own clients and clock.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock, SystemClock
from ...errors import ConfigurationError, InvalidMessageError
from ...timebuckets.plans import MAX_TASK_BYTES, decode_task
from ..lambda_entry import invocation_deadline
from ..powertools import HandlerTools
from .config import BucketTierConfig
from .metrics import WORKER_METRICS as METRICS
from .plan_store import SqsTaskQueue
from .store import S3BucketStore, S3Client
from .timer_sqs import Notice, TimerSqs
from .worker import PartitionWorker, WorkerResult

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["METRICS", "build_dispatch_handler"]

_EVENT_DISPATCH = "bucket_dispatch_run"
#: How much of a task that cannot be read goes to the error queue with its reason.
_POISON_CHARS = 4 * MAX_TASK_BYTES


def build_dispatch_handler(
    config: BucketTierConfig | Mapping[str, str] | None = None,
    *,
    s3: S3Client | None = None,
    sqs: SQSClient | None = None,
    dynamodb: DynamoDBClient | None = None,
    clock: Clock | None = None,
    on_result: Callable[[WorkerResult], None] | None = None,
) -> Callable[[Any, Any], dict[str, Any]]:
    """Wire the store, the worker, the cancellation records and Powertools for one function instance."""
    if not isinstance(config, BucketTierConfig):
        config = BucketTierConfig.from_env(os.environ if config is None else config)
    if not config.tier_settings.bucket_dispatch_queue:
        raise ConfigurationError("DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE is not set: the dispatch function needs it")
    if s3 is None or sqs is None:
        import boto3

        s3 = s3 if s3 is not None else boto3.client("s3")
        sqs = sqs if sqs is not None else boto3.client("sqs")
    tools = HandlerTools.for_service(config.service, config.metrics_namespace)
    logger, metrics = tools.logger, tools.metrics
    store = S3BucketStore.from_config(s3, config)
    cancellations = tools.cancellation_cache(config.cancellation_table, dynamodb, 0, consistent=True)
    clock = clock or SystemClock()
    queue = SqsTaskQueue(sqs, config.tier_settings.bucket_dispatch_queue)
    errors = TimerSqs(sqs, config.settings, clock)
    release = config.release_calendar(dynamodb)  # ConfigurationError at the build: one clear error

    @tools.around
    def entrypoint(event: Any, context: Any) -> dict[str, Any]:
        records = event.get("Records") if isinstance(event, Mapping) else None
        records = records if isinstance(records, list) else []
        deadline = invocation_deadline(context)
        owner = str(getattr(context, "aws_request_id", "") or uuid.uuid4().hex)
        failures: list[dict[str, str]] = []
        for record in records:
            record = record if isinstance(record, Mapping) else {}
            body = record.get("body")
            try:
                task = decode_task(body if isinstance(body, str) else "")
            except InvalidMessageError as exc:
                _poison(errors, body, str(exc), logger, metrics)
                continue
            worker = PartitionWorker(
                store,
                sqs,
                config.settings,
                clock,
                tier=config.tier_settings,
                owner=owner,
                cancellations=cancellations,
                queue=queue,
                destinations=config.destinations,
                release=release,
            )
            try:
                result = worker.run(task, deadline)
            except ConfigurationError:
                metrics.add_metric(name="BucketDispatchFailures", unit=MetricUnit.Count, value=1)
                raise  # the deployment is wrong: fail the invocation loudly
            except Exception as exc:  # retried by SQS: the partition's progress says where to go on
                metrics.add_metric(name="BucketDispatchFailures", unit=MetricUnit.Count, value=1)
                logger.exception(
                    "dispatch task failed; SQS hands it out again",
                    extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_RETRY, lf.REASON: f"{type(exc).__name__}: {exc}"[:1024]},
                )
                failures.append({"itemIdentifier": str(record.get("messageId", ""))})
                continue
            _report(result, task.bucket.iso, task.partition, logger, metrics, on_result)
        return {"batchItemFailures": failures}

    return entrypoint


def _poison(errors: TimerSqs, body: object, reason: str, logger: Logger, metrics: Metrics) -> None:
    """A task that cannot be read: to the error queue with the reason (logged, and dropped if refused)."""
    text = body[:_POISON_CHARS] if isinstance(body, str) else f"(a {type(body).__name__}, not text)"
    document = json.dumps({"format": "delayed-delivery-dispatch-poison/1", "task": text, "reason": reason})
    outcome = errors.to_error_queue([Notice(document, f"dispatch task cannot be read: {reason}")])
    metrics.add_metric(name="BucketDispatchTaskPoison", unit=MetricUnit.Count, value=1)
    logger.error(
        "a dispatch task cannot be read; it is sent to the error queue",
        extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_ERROR_QUEUE, lf.REASON: reason[:1024], "sent": outcome.sent},
    )


def _report(
    result: WorkerResult,
    bucket: str,
    partition: int,
    logger: Logger,
    metrics: Metrics,
    on_result: Callable[[WorkerResult], None] | None,
) -> None:
    summary = asdict(result)
    for field_name, (metric, unit) in METRICS.items():
        metrics.add_metric(name=metric, unit=MetricUnit(unit), value=float(summary[field_name]))
    logger.info(
        "dispatch run",
        extra={lf.CLOUD: "aws", lf.EVENT: _EVENT_DISPATCH, "bucket": bucket, "partition": partition, **summary},
    )
    if on_result is not None:
        on_result(result)
