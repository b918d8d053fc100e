"""Shared fixtures for the AWS tests: compressed-time settings, an endpoint on moto and a local event source."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.cancellations import (
    CACHE_SECONDS_ENV,
    TABLE_ENV,
    DynamoDbCancellationStore,
    ensure_cancellation_table,
)
from delayed_delivery.aws.powertools import LAMBDA_FUNCTION_ENV
from delayed_delivery.aws.queues import EndpointQueues, ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller, RequestCounter
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.fixtures.moto import queue_depth as queue_depth  # re-exported for the aws tests

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

#: Time compression: the 900 s native cap and FIFO hop become 2 s.
CAP = 2
ERRORS = "errors"


@pytest.fixture
def in_a_lambda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Handlers built in this test believe they run in a Lambda (``AWS_LAMBDA_FUNCTION_NAME`` set): the package's
    own log lines go through Powertools' JSON handler; the package logger is restored afterwards."""
    package = logging.getLogger("delayed_delivery")
    saved = (package.handlers[:], package.propagate)
    monkeypatch.setenv(LAMBDA_FUNCTION_ENV, "test-function")
    yield
    package.handlers, package.propagate = saved


@pytest.fixture
def settings() -> DelayedDeliverySettings:
    """The core settings: error queue ``errors``."""
    return DelayedDeliverySettings(error_queue=ERRORS)


@pytest.fixture
def sqs_settings() -> SqsSettings:
    """Compressed SQS settings: cap 2 s, FIFO hop 2 s; long delays on the -delay.fifo route (the tier's tests are
    under tests/aws/tier)."""
    return SqsSettings(max_native_delay=CAP, fifo_queue_delay=CAP, long_delay_route="fifo")


def handler_env(settings: DelayedDeliverySettings, sqs_settings: SqsSettings) -> dict[str, str]:
    """The Lambda environment for ``settings`` and ``sqs_settings`` (what the CDK construct sets)."""
    return {
        "DELAYED_DELIVERY_MAX_NATIVE_DELAY": str(sqs_settings.max_native_delay),
        "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": str(sqs_settings.fifo_queue_delay),
        "DELAYED_DELIVERY_ERROR_QUEUE": settings.error_queue,
        "DELAYED_DELIVERY_ENABLED": "true" if settings.enabled else "false",
        "DELAYED_DELIVERY_MAX_PARK_SECONDS": str(sqs_settings.max_park_seconds),
        "DELAYED_DELIVERY_PARK_MAX_IN_FLIGHT": str(sqs_settings.park_max_in_flight),
        "POWERTOOLS_SERVICE_NAME": "requeue-test",
        "POWERTOOLS_METRICS_NAMESPACE": "DelayedDeliveryTest",
    }


@pytest.fixture
def endpoint(sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings) -> EndpointQueues:
    """``orders``, ``orders-delay.fifo`` (DelaySeconds = 2) and ``errors``; 1 s visibility so retries are quick."""
    return ensure_endpoint(sqs, "orders", settings, sqs_settings=sqs_settings, visibility_timeout=1)


@pytest.fixture
def counter(sqs: SQSClient) -> RequestCounter:
    """Counts the test client's SQS requests."""
    return RequestCounter().attach(sqs)


@pytest.fixture
def sender(sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings) -> SqsDelayedSender:
    """A sender with the compressed settings."""
    return SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings)


@pytest.fixture
def make_poller(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings, endpoint: EndpointQueues
) -> Iterator[Callable[..., LocalEventSourcePoller]]:
    """Start a local event source on ``orders-delay.fifo`` that invokes the real Lambda handler."""
    started: list[LocalEventSourcePoller] = []

    def make(
        *, env: Mapping[str, str] | None = None, dynamodb: DynamoDBClient | None = None, **kwargs: Any
    ) -> LocalEventSourcePoller:
        handler = build_handler(
            {**handler_env(settings, sqs_settings), **(env or {})}, sqs_client=sqs, dynamodb_client=dynamodb
        )
        poller = LocalEventSourcePoller(sqs, endpoint.delay_url, endpoint.delay_arn, handler, **kwargs)
        started.append(poller.start())
        return poller

    yield make
    for poller in started:
        poller.stop()
    for poller in started:  # a handler crash or a failing poll would otherwise go unnoticed
        assert (poller.stats.handler_errors, poller.stats.poll_errors) == (0, 0), poller.stats


#: The cancellation table of the cancel / reschedule tests.
CANCELLATION_TABLE = "cancellations"
StartPoller = Callable[..., LocalEventSourcePoller]


@pytest.fixture
def records(dynamodb_endpoint: str) -> DynamoDbCancellationStore:
    """The cancellation table on moto."""
    client = dynamodb_client(dynamodb_endpoint)
    ensure_cancellation_table(client, CANCELLATION_TABLE)
    return DynamoDbCancellationStore(client, CANCELLATION_TABLE)


@pytest.fixture
def start_poller(make_poller: Callable[..., LocalEventSourcePoller], dynamodb_endpoint: str) -> StartPoller:
    """Start the local event source with the real handler reading the cancellation table (no cache)."""

    def start(dynamodb: DynamoDBClient | None = None) -> LocalEventSourcePoller:
        env = {TABLE_ENV: CANCELLATION_TABLE, CACHE_SECONDS_ENV: "0"}
        return make_poller(env=env, dynamodb=dynamodb or dynamodb_client(dynamodb_endpoint))

    return start


@dataclass(frozen=True, slots=True)
class Arrival:
    """A message received from a queue and when."""

    at: float
    body: str
    attributes: dict[str, Any]


def collect(sqs: SQSClient, url: str, *, expect: int, timeout: float, linger: float = 0.0) -> list[Arrival]:
    """Receive (and delete) from ``url`` until ``expect`` messages arrived or ``timeout``; then ``linger`` more."""
    arrivals: list[Arrival] = []
    deadline = time.monotonic() + timeout
    extra_until: float | None = None
    while True:
        now = time.monotonic()
        if len(arrivals) >= expect and extra_until is None:
            extra_until = now + linger
        if now >= deadline or (extra_until is not None and now >= extra_until):
            return arrivals
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageAttributeNames=["All"]
        )
        for m in reply.get("Messages", []):
            arrivals.append(Arrival(time.time(), m["Body"], m.get("MessageAttributes", {})))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
