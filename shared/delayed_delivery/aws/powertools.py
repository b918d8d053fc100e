"""The Powertools wiring every Lambda handler of the package shares (requeue, the tier's ingest and timer).

One ``Logger``, ``Metrics`` and ``Tracer`` per function instance, named by the function's service; ``around`` puts
the three decorators on the invocation the same way everywhere; ``cancellation_cache`` reads the cancellation table
with short timeouts, and a table that cannot be read is logged and counted, never fatal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

from .. import logfields as lf
from ..cancellations import CancellationCache
from ..errors import DelayedDeliveryError
from .cancellations import DynamoDbCancellationStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["LAMBDA_FUNCTION_ENV", "HandlerTools", "Invocation", "route_package_lines"]

#: Set by the Lambda runtime in every function's environment: its presence means the handler runs in a Lambda.
LAMBDA_FUNCTION_ENV = "AWS_LAMBDA_FUNCTION_NAME"
#: ``invocation(event, context) -> response``
Invocation = Callable[[Any, Any], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class HandlerTools:
    """Powertools Logger, Metrics and Tracer for one Lambda function's handler."""

    logger: Logger
    metrics: Metrics
    tracer: Tracer

    @classmethod
    def for_service(cls, service: str, namespace: str) -> HandlerTools:
        """The three tools for ``service`` (logs, metrics and traces carry it), metrics in ``namespace``."""
        tools = cls(Logger(service=service), Metrics(namespace=namespace, service=service), Tracer(service=service))
        if os.environ.get(LAMBDA_FUNCTION_ENV):
            route_package_lines(tools.logger)
        return tools

    def around(self, invocation: Invocation) -> Invocation:
        """``invocation`` with the Lambda context on each log line (state cleared per call), a trace segment
        (responses not captured) and the EMF metrics flushed after each call, cold starts counted."""
        traced = self.tracer.capture_lambda_handler(capture_response=False)(
            self.metrics.log_metrics(capture_cold_start_metric=True)(invocation)
        )
        wrapped: Invocation = self.logger.inject_lambda_context(clear_state=True)(traced)
        return wrapped

    def count(self, name: str, value: float = 1) -> None:
        """Add ``value`` to the Count metric ``name``."""
        self.metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)

    def cancellation_cache(
        self, table: str | None, dynamodb: DynamoDBClient | None, max_age: float, *, consistent: bool = False
    ) -> CancellationCache | None:
        """The cached reader of ``table`` (``None`` without a table); a DynamoDB client is made when none is given.
        ``consistent``: strongly consistent reads."""
        if table is None:
            return None
        if dynamodb is None:
            import boto3
            from botocore.config import Config

            # Short timeouts, one retry: a slow table must not hold up a run (lookups are skipped on failure).
            quick = Config(connect_timeout=2, read_timeout=3, retries={"mode": "standard", "max_attempts": 2})
            dynamodb = boto3.client("dynamodb", config=quick)
        store = DynamoDbCancellationStore(dynamodb, table, consistent=consistent)
        return CancellationCache(store, max_age, on_error=self._table_problem)

    def _table_problem(self, operation: str, error: DelayedDeliveryError) -> None:
        """The table could not be read or written: carry on without it (a late cancel beats a lost message)."""
        self.count("CancellationLookupFailures")
        self.logger.warning(
            f"cancellation records: {operation} failed; messages go on as planned",
            extra={lf.CLOUD: "aws", lf.EVENT: lf.EVENT_CANCELLATION_UNAVAILABLE, lf.REASON: str(error)},
        )


def route_package_lines(logger: Logger) -> None:
    """The package's own log lines (``delayed_delivery.*``: standard-library loggers, such as the tier's "bucket
    left for a later run" or the schedule timer's ``schedule_missed``) go out through ``logger``'s Powertools JSON
    handler, their keys and the invocation's included, instead of the Lambda runtime's text format (level, time,
    request id and message only: keys dropped). Done for the process, once its handler is built in a Lambda (one
    handler per process there); levels are left as they are. Never done outside a Lambda (the demo and the local
    functions run handlers in threads beside other loggers)."""
    package = logging.getLogger("delayed_delivery")
    package.handlers, package.propagate = [*logger.handlers], False
