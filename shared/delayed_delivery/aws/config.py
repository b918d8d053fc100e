"""AWS configuration from the environment: one object for the requeue function and the CLI.

Environment variables (all optional):

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_*`` core settings | see ``DelayedDeliverySettings`` | error queue, on/off, retries |
| ``DELAYED_DELIVERY_*`` SQS settings | see ``SqsSettings`` | caps, hop delay, parking, packing (``PACK_BYTES``) |
| ``DELAYED_DELIVERY_CANCELLATION_TABLE`` | none (no lookups) | DynamoDB table of cancel / reschedule records |
| ``DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS`` | ``60`` | seconds an instance reuses an endpoint's records, 0-600 |
| ``DELAYED_DELIVERY_MAX_RECEIVE_COUNT`` | ``50`` | receives before the error queue (+ park returns); 0: none |
| ``DELAYED_DELIVERY_RELEASE_TABLE`` | none | DynamoDB table of release slots; needed when ``release_rates`` caps |
| ``POWERTOOLS_SERVICE_NAME`` | ``delayed-delivery-requeue`` | service name on logs, metrics and traces |
| ``POWERTOOLS_METRICS_NAMESPACE`` | ``DelayedDelivery`` | CloudWatch namespace of the EMF metrics |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..envsettings import env_value
from ..errors import ConfigurationError
from ..settings import DelayedDeliverySettings
from ..validation import is_number, is_whole
from .settings import SqsSettings

__all__ = [
    "CACHE_SECONDS_ENV",
    "DEFAULT_CACHE_SECONDS",
    "DEFAULT_MAX_RECEIVE_COUNT",
    "MAX_CACHE_SECONDS",
    "MAX_RECEIVE_COUNT_ENV",
    "RELEASE_TABLE_ENV",
    "TABLE_ENV",
    "AwsConfig",
    "cache_seconds_from_env",
]

#: Environment variable naming the table (the requeue function and the CLI); unset or empty turns lookups off.
TABLE_ENV = "DELAYED_DELIVERY_CANCELLATION_TABLE"
#: Environment variable naming the DynamoDB table of release slots (``aws.release_calendar``).
RELEASE_TABLE_ENV = "DELAYED_DELIVERY_RELEASE_TABLE"
#: Environment variable: seconds a function instance reuses an endpoint's records (well below the 900 s hop).
CACHE_SECONDS_ENV = "DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS"
DEFAULT_CACHE_SECONDS = 60
#: Longest cache allowed: a record must be seen before a message's last hop (the 900 s hop minus slack).
MAX_CACHE_SECONDS = 600
#: Environment variable: receives of one record before the requeue function sends it to the error queue.
MAX_RECEIVE_COUNT_ENV = "DELAYED_DELIVERY_MAX_RECEIVE_COUNT"
DEFAULT_MAX_RECEIVE_COUNT = 50
SERVICE_ENV = "POWERTOOLS_SERVICE_NAME"
NAMESPACE_ENV = "POWERTOOLS_METRICS_NAMESPACE"
DEFAULT_SERVICE = "delayed-delivery-requeue"
DEFAULT_NAMESPACE = "DelayedDelivery"


@dataclass(frozen=True, slots=True)
class AwsConfig:
    """Everything the requeue function (and the ``aws`` commands) read from the environment."""

    settings: DelayedDeliverySettings = field(default_factory=DelayedDeliverySettings)
    #: The SQS route's settings: the native cap, the hop, parking, packing.
    sqs_settings: SqsSettings = field(default_factory=SqsSettings)
    #: DynamoDB table of cancel and reschedule records; ``None`` = no lookups.
    cancellation_table: str | None = None
    cancellation_cache_seconds: float = DEFAULT_CACHE_SECONDS
    service: str = DEFAULT_SERVICE
    metrics_namespace: str = DEFAULT_NAMESPACE
    #: Receives of one record (park returns not counted) before the error queue; 0 = no limit.
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT
    #: DynamoDB table of release slots (``aws.release_calendar``); the requeue function needs it with release rates.
    release_table: str | None = None

    def __post_init__(self) -> None:
        if not is_whole(self.max_receive_count):
            raise ConfigurationError(
                f"{MAX_RECEIVE_COUNT_ENV}={self.max_receive_count!r} is not a non-negative integer"
            )
        _check_cache_seconds(self.cancellation_cache_seconds)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AwsConfig:
        """Read the table above from ``env`` (e.g. ``os.environ``); ``ConfigurationError`` names a bad variable."""
        return cls(
            settings=DelayedDeliverySettings.from_env(env),
            sqs_settings=SqsSettings.from_env(env),
            cancellation_table=env_value(env, TABLE_ENV, str, "") or None,
            cancellation_cache_seconds=cache_seconds_from_env(env),
            service=env_value(env, SERVICE_ENV, str, DEFAULT_SERVICE),
            metrics_namespace=env_value(env, NAMESPACE_ENV, str, DEFAULT_NAMESPACE),
            max_receive_count=env_value(env, MAX_RECEIVE_COUNT_ENV, int, DEFAULT_MAX_RECEIVE_COUNT),
            release_table=env_value(env, RELEASE_TABLE_ENV, str, "") or None,
        )


def cache_seconds_from_env(env: Mapping[str, str]) -> float:
    """``DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS`` (default 60, 0 = read every invocation, at most 600)."""
    what = f"a number of seconds (use 0-{MAX_CACHE_SECONDS} seconds)"
    return _check_cache_seconds(env_value(env, CACHE_SECONDS_ENV, float, float(DEFAULT_CACHE_SECONDS), what=what))


def _check_cache_seconds(value: float) -> float:
    if not (is_number(value) and value <= MAX_CACHE_SECONDS):
        raise ConfigurationError(f"{CACHE_SECONDS_ENV}={value!r}: use 0-{MAX_CACHE_SECONDS} seconds")
    return value
