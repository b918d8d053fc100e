"""The dispatch function's handler: Powertools around ``PartitionWorker.run`` for each task of an SQS event.

The dispatch queue's event source hands it tasks (batch size 1). A task that cannot be read goes to the tier's
error queue with the reason; a task whose run fails unexpectedly is reported as a partial batch failure
(Powertools' ``BatchProcessor``), so SQS hands it out again after the queue's visibility timeout (the partition's
progress says where to go on). A worker that stops near its deadline has enqueued its task again itself.
``functions/aws/bucket_dispatch.py`` (the deployed entry point) builds it once from the environment; tests and
benchmarks build it with their own clients and clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock
from ...errors import ConfigurationError, InvalidMessageError
from ...timebuckets.plans import MAX_TASK_BYTES, decode_task
from ..lambda_entry import invocation_deadline
from .config import BucketTierConfig
from .metrics import WORKER_METRICS as METRICS
from .metrics import Failed, guarded, report
from .runtime import TierRuntime, invocation_owner, partial_batch_response, sqs_records, tier_config
from .store import S3Client
from .timer_sqs import Notice
from .worker import WorkerResult

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
    """The dispatch workers over the tier runtime, one task per record."""
    config = tier_config(config)
    if not config.tier_settings.bucket_dispatch_queue:
        raise ConfigurationError("DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE is not set: the dispatch function needs it")
    runtime = TierRuntime.build(config, s3=s3, sqs=sqs, dynamodb=dynamodb, clock=clock)
    tools = runtime.tools

    def counted() -> None:
        tools.metrics.add_metric(name="BucketDispatchFailures", unit=MetricUnit.Count, value=1)

    def done(record: Mapping[str, Any], deadline: float | None, owner: str) -> bool:
        """Run one record's task; False when it failed (retried by SQS: its progress says where to go on)."""
        body = record.get("body")
        try:
            task = decode_task(body if isinstance(body, str) else "")
        except InvalidMessageError as exc:
            _poison(runtime, body, str(exc))
            return True
        run = partial(runtime.worker(owner).run, task, deadline)
        result = guarded(run, tools, counted, "dispatch task failed; SQS hands it out again", lf.EVENT_RETRY)
        if isinstance(result, Failed):
            return False
        fields = {lf.EVENT: _EVENT_DISPATCH, "bucket": task.bucket.iso, "partition": task.partition}
        report(result, METRICS, tools, "dispatch run", fields)
        if on_result is not None:
            on_result(result)
        return True

    @tools.around
    def entrypoint(event: Any, context: Any) -> dict[str, Any]:
        deadline, owner = invocation_deadline(context), invocation_owner(context)
        records = [r if isinstance(r, Mapping) else {} for r in sqs_records(event)]
        failed = [str(r.get("messageId", "")) for r in records if not done(r, deadline, owner)]
        return partial_batch_response([str(r.get("messageId", "")) for r in records], failed, context)

    return entrypoint


def _poison(runtime: TierRuntime, body: object, reason: str) -> None:
    """A task that cannot be read: to the error queue with the reason (logged, and dropped if refused)."""
    text = body[:_POISON_CHARS] if isinstance(body, str) else f"(a {type(body).__name__}, not text)"
    document = json.dumps({"format": "delayed-delivery-dispatch-poison/1", "task": text, "reason": reason})
    outcome = runtime.send.to_error_queue([Notice(document, f"dispatch task cannot be read: {reason}")])
    runtime.tools.metrics.add_metric(name="BucketDispatchTaskPoison", unit=MetricUnit.Count, value=1)
    runtime.tools.logger.error(
        "a dispatch task cannot be read; it is sent to the error queue",
        extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_ERROR_QUEUE, lf.REASON: reason[:1024], "sent": outcome.sent},
    )
