"""Local AWS tooling (tests, benchmarks, the demo, ``aws requeue --local``): SQS event source, request counter."""

from __future__ import annotations

from .counting import BILLING_CHUNK, RequestCounter
from .poller import LocalEventSourcePoller, LocalLambdaContext, PollerStats, lambda_sqs_record

__all__ = [
    "BILLING_CHUNK",
    "LocalEventSourcePoller",
    "LocalLambdaContext",
    "PollerStats",
    "RequestCounter",
    "lambda_sqs_record",
]
