"""The ingest Lambda's handler: Powertools around ``BucketIngest`` over the tier runtime, partial batch responses.

``functions/aws/bucket_ingest.py`` (the deployed entry point) builds it once from the environment; tests, the
demo and benchmarks build it with their own clients and clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock
from .config import BucketTierConfig
from .ingest import IngestResult, reported_id
from .metrics import Failed, guarded, observe_ingest
from .runtime import TierRuntime, partial_batch_response, sqs_records
from .store import S3Client

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["IngestHook", "LambdaHandler", "build_ingest_handler"]

#: ``handler(event, context) -> {"batchItemFailures": [...]}``
LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]
#: Sees every invocation's result before it is reported (tests, benchmarks, the demo).
IngestHook = Callable[[IngestResult], None]


def build_ingest_handler(
    config: BucketTierConfig | Mapping[str, str] | None = None,
    *,
    s3: S3Client | None = None,
    sqs: SQSClient | None = None,
    clock: Clock | None = None,
    on_result: IngestHook | None = None,
) -> LambdaHandler:
    """``BucketIngest`` over the tier runtime (no records or calendar: it sends nothing on); ``config`` defaults to
    the environment's."""
    runtime = TierRuntime.build(config, s3=s3, sqs=sqs, clock=clock, sends=False)
    tools, ingest = runtime.tools, runtime.ingest()

    def counted() -> None:
        tools.metrics.add_metric(name="InvocationFailures", unit=MetricUnit.Count, value=1)

    @tools.around
    def entrypoint(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = sqs_records(event)
        text = "the ingest batch could not be handled; every record will be retried"
        result = guarded(partial(ingest.process, records), tools, counted, text, lf.EVENT_RETRY, fatal=())
        if isinstance(result, Failed):  # never out of the handler: the batch is retried instead
            ids = [r.get("messageId") if isinstance(r, Mapping) else None for r in records]
            result = IngestResult(len(records), 0, failures={i: result.reason for i in ids if isinstance(i, str) and i})
        if on_result is not None:
            on_result(result)
        observe_ingest(result, tools.logger, tools.metrics)
        return partial_batch_response([reported_id(r, n) for n, r in enumerate(records)], result.failures, context)

    return entrypoint
