"""Lambda entry point for the FIFO requeue: parse the SQS event, run ``FifoRequeuer``, map the result.

Wire it to each ``<queue>-delay.fifo`` with an SQS event source (batch 10, ``ReportBatchItemFailures``);
handler ``functions.aws.requeue.handler``. Configuration comes from the environment on the first call
(nothing is read or created at import time): ``DELAYED_DELIVERY_*`` settings (``ERROR_QUEUE``,
``MAX_NATIVE_DELAY``, ``FIFO_QUEUE_DELAY``, ``ENABLED``, ``MAX_PARK_SECONDS`` (default and most 42600; 0 turns parking
off), ``PARK_MAX_IN_FLIGHT``), ``DELAYED_DELIVERY_PACK_BYTES`` (envelope size,
default 65536; 0 turns packing off), ``DELAYED_DELIVERY_CANCELLATION_TABLE`` (DynamoDB table of cancel and
reschedule records; unset = no lookups) with ``DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS`` (default 60),
``POWERTOOLS_SERVICE_NAME``, ``POWERTOOLS_METRICS_NAMESPACE`` and the usual AWS SDK variables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from delayed_delivery import logfields as lf
from delayed_delivery.aws.cancellations import TABLE_ENV, DynamoDbCancellationStore, cache_seconds_from_env
from delayed_delivery.aws.packing import DEFAULT_PACK_BYTES, PACK_BYTES_ENV
from delayed_delivery.aws.queues import check_endpoint
from delayed_delivery.aws.requeue import FifoRequeuer, HopOutcome, RecordResult, parse_source_arn
from delayed_delivery.cancellations import CancellationCache, CancellationKind
from delayed_delivery.errors import ConfigurationError, DelayedDeliveryError
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["build_handler", "cancellation_cache", "handler", "pack_bytes_from_env", "reset"]

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]

_handler: LambdaHandler | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda handler; builds (and caches) its dependencies from the environment on the first call."""
    global _handler
    if _handler is None:
        _handler = build_handler(os.environ)
    return _handler(event, context)


def reset() -> None:
    """Forget the cached dependencies (tests change the environment between runs)."""
    global _handler
    _handler = None


def build_handler(
    env: Mapping[str, str],
    *,
    sqs_client: SQSClient | None = None,
    dynamodb_client: DynamoDBClient | None = None,
    on_results: Callable[[list[RecordResult]], None] | None = None,
) -> LambdaHandler:
    """Wire settings, the SQS (and DynamoDB) clients, Powertools Logger/Metrics/Tracer and the requeuer.

    ``on_results`` (tests and benchmarks) sees every invocation's results before they are reported.
    """
    settings = DelayedDeliverySettings.from_env(env)
    if sqs_client is None:
        import boto3

        sqs_client = boto3.client("sqs")
    service = env.get("POWERTOOLS_SERVICE_NAME", "delayed-delivery-requeue")
    logger = Logger(service=service)
    metrics = Metrics(namespace=env.get("POWERTOOLS_METRICS_NAMESPACE", "DelayedDelivery"), service=service)
    tracer = Tracer(service=service)

    def cancellation_problem(operation: str, error: DelayedDeliveryError) -> None:
        """The table could not be read or written: carry on without it (a late cancel beats a lost message)."""
        metrics.add_metric(name="CancellationLookupFailures", unit=MetricUnit.Count, value=1)
        logger.warning(
            f"cancellation records: {operation} failed; messages go on as planned",
            extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_CANCELLATION_UNAVAILABLE, lf.REASON: str(error)},
        )

    cancellations = cancellation_cache(env, dynamodb_client, cancellation_problem)
    requeuer = FifoRequeuer(sqs_client, settings, pack_bytes=pack_bytes_from_env(env), cancellations=cancellations)
    checked: set[str] = set()

    def startup_check(event: dict[str, Any]) -> None:
        """Once per source queue per instance: the seed's FIFO queue rules (logged and counted, never fatal)."""
        for arn in {str(r.get("eventSourceARN", "")) for r in event.get("Records", [])} - checked:
            checked.add(arn)
            try:
                result = check_endpoint(sqs_client, parse_source_arn(arn).delay_queue, settings)
            except DelayedDeliveryError as exc:
                logger.warning("startup check of the delay queue could not run", extra={lf.REASON: str(exc)})
                continue
            if not result.ok:
                metrics.add_metric(name="DelayQueueMisconfigured", unit=MetricUnit.Count, value=1)
                logger.error(
                    "the delay queue does not meet the seed's requirements",
                    extra={lf.CLOUD: "aws", lf.DESTINATION: result.queue, lf.REASON: "; ".join(result.problems)},
                )

    @logger.inject_lambda_context(clear_state=True)
    @tracer.capture_lambda_handler(capture_response=False)
    @metrics.log_metrics(capture_cold_start_metric=True)
    def entrypoint(event: dict[str, Any], context: Any) -> dict[str, Any]:
        startup_check(event)
        outcome = requeuer.process(event.get("Records", []))
        if on_results is not None:
            on_results(outcome)
        results = {r.record_id: r for r in outcome}
        parked = [r.record_id for r in results.values() if r.outcome is HopOutcome.PARKED]

        def record_handler(record: SQSRecord) -> None:
            result = results[record.message_id]
            for each in result.per_message():  # an envelope: one line per inner message
                _observe(logger, metrics, each)
            if result.error is not None:
                raise result.error

        # One processor per invocation: it holds the batch's state, so concurrent local invocations
        # (the benchmark's pollers) must not share one. Each record is its own FIFO group (the message id),
        # so skip_group_on_error fails only a failed record and later records of the same message.
        processor = SqsFifoPartialProcessor(skip_group_on_error=True)
        response = process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
        if parked:
            # A parked record is hidden on the queue until its park ends: the event source must not delete it.
            failures = [*response.get("batchItemFailures", []), *({"itemIdentifier": rid} for rid in parked)]
            return {**response, "batchItemFailures": failures}
        return dict(response)

    built: LambdaHandler = entrypoint
    return built


def _observe(logger: Logger, metrics: Metrics, result: RecordResult) -> None:
    """One log line with the fixed keys and the EMF metrics for one record or inner message."""
    logger.set_correlation_id(result.message_id)
    fields = {
        lf.CLOUD: "aws",
        lf.EVENT: _EVENTS[result.outcome],
        lf.MESSAGE_ID: result.message_id,
        lf.DESTINATION: result.destination,
        lf.HOP: result.hop,
        lf.REMAINING_DELAY_S: result.remaining_delay_s,
    }
    if result.remaining_delay_s is not None:
        metrics.add_metric(name="RemainingDelay", unit=MetricUnit.Seconds, value=result.remaining_delay_s)
    record = result.cancellation
    if record is not None and record.kind is CancellationKind.RESCHEDULE and record.due_at is not None:
        metrics.add_metric(name="Rescheduled", unit=MetricUnit.Count, value=1)
        logger.info(
            "rescheduled at this hop",
            extra={**fields, lf.EVENT: lf.EVENT_RESCHEDULED, lf.DUE_AT: record.due_at.isoformat()},
        )
    if result.outcome is HopOutcome.PARKED:
        metrics.add_metric(name="Parked", unit=MetricUnit.Count, value=1)
        logger.info("parked on the delay queue", extra={**fields, lf.PARK_S: result.park_s})
    elif result.outcome is HopOutcome.CANCELLED:
        metrics.add_metric(name="Cancelled", unit=MetricUnit.Count, value=1)
        logger.info("cancelled: dropped from the hop cycle", extra=fields)
    elif result.outcome is HopOutcome.REQUEUED:
        if result.reason:  # SQS refused to park it (e.g. no sqs:ChangeMessageVisibility): it hopped
            metrics.add_metric(name="ParkRefusals", unit=MetricUnit.Count, value=1)
            logger.warning("parking refused by SQS; hopped instead", extra={**fields, lf.REASON: result.reason})
        metrics.add_metric(name="Requeued", unit=MetricUnit.Count, value=1)
        metrics.add_metric(name="Hops", unit=MetricUnit.Count, value=1)
        logger.info("requeued to the delay queue", extra=fields)
    elif result.outcome is HopOutcome.FORWARDED:
        metrics.add_metric(name="Forwarded", unit=MetricUnit.Count, value=1)
        metrics.add_metric(name="Hops", unit=MetricUnit.Count, value=1)
        metrics.add_metric(name="HopsPerMessage", unit=MetricUnit.Count, value=result.hop)
        logger.info("forwarded to the destination", extra=fields)
    elif result.outcome is HopOutcome.ERROR_QUEUE:
        metrics.add_metric(name="ErrorQueueForwards", unit=MetricUnit.Count, value=1)
        logger.error("moved to the error queue", extra={**fields, lf.REASON: result.reason})
    else:
        metrics.add_metric(name="HopFailures", unit=MetricUnit.Count, value=1)
        logger.warning("hop failed; the record will be retried", extra={**fields, lf.REASON: result.reason})


def cancellation_cache(
    env: Mapping[str, str],
    client: DynamoDBClient | None,
    on_error: Callable[[str, DelayedDeliveryError], None],
) -> CancellationCache | None:
    """The cached reader of ``DELAYED_DELIVERY_CANCELLATION_TABLE``, or None when no table is configured."""
    table = env.get(TABLE_ENV, "").strip()
    cache_seconds = cache_seconds_from_env(env)
    if not table:
        return None
    if client is None:
        import boto3
        from botocore.config import Config

        # Short timeouts, one retry: a slow table must not hold up the hop (lookups are skipped on failure).
        quick = Config(connect_timeout=2, read_timeout=3, retries={"mode": "standard", "max_attempts": 2})
        client = boto3.client("dynamodb", config=quick)
    return CancellationCache(DynamoDbCancellationStore(client, table), cache_seconds, on_error=on_error)


def pack_bytes_from_env(env: Mapping[str, str]) -> int:
    """``DELAYED_DELIVERY_PACK_BYTES`` (default 65536, 0 = off); raises ``ConfigurationError`` when malformed."""
    raw = env.get(PACK_BYTES_ENV, str(DEFAULT_PACK_BYTES)).strip()
    if not raw.isdigit():
        raise ConfigurationError(f"{PACK_BYTES_ENV}={raw!r} is not a non-negative integer")
    return int(raw)


_EVENTS = {
    HopOutcome.REQUEUED: lf.EVENT_REQUEUED,
    HopOutcome.FORWARDED: lf.EVENT_FORWARDED,
    HopOutcome.ERROR_QUEUE: lf.EVENT_ERROR_QUEUE,
    HopOutcome.FAILED: lf.EVENT_RETRY,
    HopOutcome.CANCELLED: lf.EVENT_CANCELLED,
    HopOutcome.PARKED: lf.EVENT_PARKED,
}
