"""The requeue Lambda's handler: Powertools (``aws/powertools.py``) around ``FifoRequeuer``, partial batch responses.

``functions/aws/requeue.py`` (the deployed entry point) builds it once from the environment; tests, benchmarks,
the demo and ``delayed-delivery aws requeue --local`` build it with their own clients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from ... import logfields as lf
from ...cancellations import Cancellation, CancellationKind
from ...errors import ConfigurationError, DelayedDeliveryDisabledError, DelayedDeliveryError
from ..config import RELEASE_TABLE_ENV, AwsConfig
from ..errorqueue import DROPPED
from ..powertools import HandlerTools
from ..queues import check_endpoint
from ..release_calendar import ReleaseCalendar
from . import FifoRequeuer, HopOutcome, RecordResult, failed_record, parse_source_arn

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["LambdaHandler", "Observation", "ResultsHook", "build_handler"]

#: ``handler(event, context) -> {"batchItemFailures": [...]}``
LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]
#: Sees every invocation's results before they are reported (tests, benchmarks, the demo).
ResultsHook = Callable[[list[RecordResult]], None]


@dataclass(frozen=True, slots=True)
class Observation:
    """What the handler logs and counts for one outcome."""

    event: str
    #: The logger method: ``info``, ``warning`` or ``error``.
    level: str
    text: str
    #: Counted once each.
    metrics: tuple[str, ...]
    #: Also logged: the park length (``park_s``) or the reason (``reason``).
    detail: str | None = None
    #: Also emitted with the message's hop count as its value.
    hop_metric: str | None = None


_OUTCOMES: dict[HopOutcome, Observation] = {
    HopOutcome.PARKED: Observation(lf.EVENT_PARKED, "info", "parked on the delay queue", ("Parked",), lf.PARK_S),
    HopOutcome.CANCELLED: Observation(
        lf.EVENT_CANCELLED, "info", "cancelled: dropped from the hop cycle", ("Cancelled",)
    ),
    HopOutcome.REQUEUED: Observation(lf.EVENT_REQUEUED, "info", "requeued to the delay queue", ("Requeued", "Hops")),
    HopOutcome.FORWARDED: Observation(
        lf.EVENT_FORWARDED, "info", "forwarded to the destination", ("Forwarded", "Hops"), hop_metric="HopsPerMessage"
    ),
    HopOutcome.ERROR_QUEUE: Observation(
        lf.EVENT_ERROR_QUEUE, "error", "moved to the error queue", ("ErrorQueueForwards",), lf.REASON
    ),
    HopOutcome.FAILED: Observation(
        lf.EVENT_RETRY, "warning", "hop failed; the record will be retried", ("HopFailures",), lf.REASON
    ),
}


def build_handler(
    config: AwsConfig | Mapping[str, str],
    *,
    sqs_client: SQSClient | None = None,
    dynamodb_client: DynamoDBClient | None = None,
    on_results: ResultsHook | None = None,
) -> LambdaHandler:
    """Wire the SQS (and DynamoDB) clients, Powertools Logger/Metrics/Tracer and the requeuer.

    ``config`` is an ``AwsConfig`` or an environment mapping to read one from.
    """
    if not isinstance(config, AwsConfig):
        config = AwsConfig.from_env(config)
    if sqs_client is None:
        import boto3

        sqs_client = boto3.client("sqs")
    tools = HandlerTools.for_service(config.service, config.metrics_namespace)
    logger, metrics = tools.logger, tools.metrics
    cancellations = tools.cancellation_cache(
        config.cancellation_table, dynamodb_client, config.cancellation_cache_seconds
    )
    requeuer = FifoRequeuer(
        sqs_client,
        config.settings,
        sqs_settings=config.sqs_settings,
        cancellations=cancellations,
        max_receive_count=config.max_receive_count,
        release=_release_calendar(config, dynamodb_client),
    )
    startup_check = _startup_check(sqs_client, config, logger, metrics)

    @tools.around
    def entrypoint(event: dict[str, Any], context: Any) -> dict[str, Any]:
        startup_check(event)
        outcome = _process_safely(requeuer, event.get("Records", []), context, logger, metrics)
        if on_results is not None:
            on_results(outcome)
        return _respond(event, context, outcome, logger, metrics)

    return entrypoint


def _release_calendar(config: AwsConfig, dynamodb: DynamoDBClient | None) -> ReleaseCalendar | None:
    """The shared release calendar when ``release_rates`` caps anything (its table is then required)."""
    rates = config.settings.release_rates
    if not rates:
        return None
    if config.release_table is None:
        raise ConfigurationError(
            f"release_rates ({rates}) caps destinations, and the FIFO route keeps their release slots in a DynamoDB "
            f"table: set {RELEASE_TABLE_ENV} (the CDK construct does when given release_rates)"
        )
    if dynamodb is None:
        import boto3

        dynamodb = boto3.client("dynamodb")
    return ReleaseCalendar(dynamodb, config.release_table, rates, horizon=config.sqs_settings.max_native_delay)


def _process_safely(
    requeuer: FifoRequeuer, records: list[Any], context: Any, logger: Logger, metrics: Metrics
) -> list[RecordResult]:
    """Run the requeuer; an unexpected exception fails every record of the batch (retried), never the handler."""
    try:
        return requeuer.process(records, getattr(context, "get_remaining_time_in_millis", None))
    except (ConfigurationError, DelayedDeliveryDisabledError):
        raise  # the deployment is wrong: fail the invocation loudly, the records stay on the queue
    except Exception as exc:  # never out of the handler: the batch is retried instead
        metrics.add_metric(name="InvocationFailures", unit=MetricUnit.Count, value=1)
        logger.exception(
            "the batch could not be handled; every record will be retried",
            extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_RETRY, lf.REASON: f"{type(exc).__name__}: {exc}"[:1024]},
        )
        return [failed_record(r, exc) for r in records]


def _startup_check(
    sqs_client: SQSClient, config: AwsConfig, logger: Logger, metrics: Metrics
) -> Callable[[dict[str, Any]], None]:
    """Once per source queue per instance: the FIFO queue rules (logged and counted, never fatal)."""
    checked: set[str] = set()

    def check(event: dict[str, Any]) -> None:
        for arn in {str(r.get("eventSourceARN", "")) for r in event.get("Records", [])} - checked:
            checked.add(arn)
            try:
                result = check_endpoint(sqs_client, parse_source_arn(arn).delay_queue, config.sqs_settings)
            except DelayedDeliveryError as exc:
                logger.warning("startup check of the delay queue could not run", extra={lf.REASON: str(exc)})
                continue
            if not result.ok:
                metrics.add_metric(name="DelayQueueMisconfigured", unit=MetricUnit.Count, value=1)
                logger.error(
                    "the delay queue does not meet the FIFO queue rules",
                    extra={lf.CLOUD: "aws", lf.DESTINATION: result.queue, lf.REASON: "; ".join(result.problems)},
                )

    return check


def _respond(
    event: dict[str, Any], context: Any, outcome: list[RecordResult], logger: Logger, metrics: Metrics
) -> dict[str, Any]:
    """Log and count every record, then report the failed and the parked ones (partial batch response)."""
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
    try:
        response = process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
    except BatchProcessingError:  # every record failed: report them all rather than raise
        response = {"batchItemFailures": [{"itemIdentifier": str(r["messageId"])} for r in event["Records"]]}
    if parked:
        # A parked record is hidden on the queue until its park ends: the event source must not delete it.
        failures = [*response.get("batchItemFailures", []), *({"itemIdentifier": rid} for rid in parked)]
        return {**response, "batchItemFailures": failures}
    return dict(response)


def _observe(logger: Logger, metrics: Metrics, result: RecordResult) -> None:
    """One log line with the fixed keys and the EMF metrics for one record or inner message."""
    seen = _OUTCOMES[result.outcome]
    logger.set_correlation_id(result.message_id)
    fields: dict[str, Any] = {
        lf.CLOUD: "aws",
        lf.EVENT: seen.event,
        lf.MESSAGE_ID: result.message_id,
        lf.DESTINATION: result.destination,
        lf.HOP: result.hop,
        lf.REMAINING_DELAY_S: result.remaining_delay_s,
    }
    if result.remaining_delay_s is not None:
        metrics.add_metric(name="RemainingDelay", unit=MetricUnit.Seconds, value=result.remaining_delay_s)
    if result.release_lag_s is not None:  # what release control added, apart from any other lateness
        metrics.add_metric(name="ReleaseLag", unit=MetricUnit.Seconds, value=result.release_lag_s)
        fields[lf.RELEASE_LAG_S] = round(result.release_lag_s, 3)
    if result.release_wait:
        metrics.add_metric(name="ReleaseWaits", unit=MetricUnit.Count, value=1)
        fields[lf.REASON] = "no release slot free within the native cap: requeued to ask again after the hop"
    record = result.cancellation
    if isinstance(record, Cancellation) and record.kind is CancellationKind.RESCHEDULE and record.due_at is not None:
        metrics.add_metric(name="Rescheduled", unit=MetricUnit.Count, value=1)
        logger.info(
            "rescheduled at this hop",
            extra={**fields, lf.EVENT: lf.EVENT_RESCHEDULED, lf.DUE_AT: record.due_at.isoformat()},
        )
    if result.outcome is HopOutcome.REQUEUED and result.reason:
        # SQS refused to park it (e.g. no sqs:ChangeMessageVisibility): it hopped
        metrics.add_metric(name="ParkRefusals", unit=MetricUnit.Count, value=1)
        logger.warning("parking refused by SQS; hopped instead", extra={**fields, lf.REASON: result.reason})
    if result.outcome is HopOutcome.ERROR_QUEUE and (result.reason or "").startswith(DROPPED):
        metrics.add_metric(name="ErrorQueueDrops", unit=MetricUnit.Count, value=1)
        logger.error("dropped: the error queue refused it, even reduced", extra={**fields, lf.REASON: result.reason})
        return
    for name in seen.metrics:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
    if seen.hop_metric is not None:
        metrics.add_metric(name=seen.hop_metric, unit=MetricUnit.Count, value=result.hop)
    if seen.detail == lf.PARK_S:
        fields[lf.PARK_S] = result.park_s
    elif seen.detail == lf.REASON:
        fields[lf.REASON] = result.reason
    getattr(logger, seen.level)(seen.text, extra=fields)
