"""The ingest Lambda's handler: Powertools (``aws/powertools.py``) around ``BucketIngest``, partial batch responses.

``functions/aws/bucket_ingest.py`` (the deployed entry point) builds it once from the environment; tests, the
demo and benchmarks build it with their own clients and clock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock
from ..powertools import HandlerTools
from .config import BucketTierConfig
from .ingest import BucketIngest, IngestResult
from .metrics import observe_ingest
from .store import S3BucketStore, S3Client

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
    """Wire the S3 and SQS clients, Powertools and ``BucketIngest``; ``config`` defaults to the environment's."""
    if not isinstance(config, BucketTierConfig):
        config = BucketTierConfig.from_env(os.environ if config is None else config)
    if s3 is None or sqs is None:
        import boto3

        s3 = s3 if s3 is not None else boto3.client("s3")
        sqs = sqs if sqs is not None else boto3.client("sqs")
    tools = HandlerTools.for_service(config.service, config.metrics_namespace)
    logger, metrics = tools.logger, tools.metrics
    ingest = BucketIngest(
        S3BucketStore.from_config(s3, config), sqs, config.settings, clock, destinations=config.destinations
    )

    @tools.around
    def entrypoint(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event.get("Records") if isinstance(event, Mapping) else None
        records = records if isinstance(records, list) else []
        result = _process_safely(ingest, records, logger, metrics)
        if on_result is not None:
            on_result(result)
        observe_ingest(result, logger, metrics)
        return {"batchItemFailures": result.batch_item_failures()}

    return entrypoint


def _process_safely(ingest: BucketIngest, records: list[Any], logger: Logger, metrics: Metrics) -> IngestResult:
    """Run the ingest; an unexpected exception fails every record (retried by SQS), never the handler."""
    try:
        return ingest.process(records)
    except Exception as exc:  # never out of the handler: the batch is retried instead
        metrics.add_metric(name="InvocationFailures", unit=MetricUnit.Count, value=1)
        reason = f"{type(exc).__name__}: {exc}"[:1024]
        logger.exception(
            "the ingest batch could not be handled; every record will be retried",
            extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_RETRY, lf.REASON: reason},
        )
        ids = [r.get("messageId") if isinstance(r, Mapping) else None for r in records]
        failures = {str(i): reason for i in ids if isinstance(i, str) and i}
        return IngestResult(len(records), 0, failures=failures)
