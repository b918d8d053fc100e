"""AWS configuration from the environment: one object for the requeue function and the CLI.

Environment variables (all optional):

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_*`` core settings | see ``DelayedDeliverySettings`` | caps, error queue, on/off, parking |
| ``DELAYED_DELIVERY_PACK_BYTES`` | ``65536`` | envelope size of the requeue function; ``0`` turns packing off |
| ``DELAYED_DELIVERY_CANCELLATION_TABLE`` | none (no lookups) | DynamoDB table of cancel / reschedule records |
| ``DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS`` | ``60`` | seconds an instance reuses an endpoint's records, 0-600 |
| ``DELAYED_DELIVERY_MAX_RECEIVE_COUNT`` | ``50`` | receives before the error queue (+ park returns); 0: none |
| ``POWERTOOLS_SERVICE_NAME`` | ``delayed-delivery-requeue`` | service name on logs, metrics and traces |
| ``POWERTOOLS_METRICS_NAMESPACE`` | ``DelayedDelivery`` | CloudWatch namespace of the EMF metrics |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigurationError
from ..settings import DelayedDeliverySettings
from .packing import DEFAULT_PACK_BYTES, PACK_BYTES_ENV

__all__ = [
    "CACHE_SECONDS_ENV",
    "DEFAULT_CACHE_SECONDS",
    "DEFAULT_MAX_RECEIVE_COUNT",
    "MAX_CACHE_SECONDS",
    "MAX_RECEIVE_COUNT_ENV",
    "TABLE_ENV",
    "AwsConfig",
    "cache_seconds_from_env",
]

#: Environment variable naming the table (the requeue function and the CLI); unset or empty turns lookups off.
TABLE_ENV = "DELAYED_DELIVERY_CANCELLATION_TABLE"
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
    pack_bytes: int = DEFAULT_PACK_BYTES
    #: DynamoDB table of cancel and reschedule records; ``None`` = no lookups.
    cancellation_table: str | None = None
    cancellation_cache_seconds: float = DEFAULT_CACHE_SECONDS
    service: str = DEFAULT_SERVICE
    metrics_namespace: str = DEFAULT_NAMESPACE
    #: Receives of one record (park returns not counted) before the error queue; 0 = no limit.
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT

    def __post_init__(self) -> None:
        if self.max_receive_count < 0:
            raise ConfigurationError(
                f"{MAX_RECEIVE_COUNT_ENV}={self.max_receive_count!r} is not a non-negative integer"
            )
        if self.pack_bytes < 0:
            raise ConfigurationError(f"{PACK_BYTES_ENV}={self.pack_bytes!r} is not a non-negative integer")
        if not 0 <= self.cancellation_cache_seconds <= MAX_CACHE_SECONDS:
            raise ConfigurationError(
                f"{CACHE_SECONDS_ENV}={self.cancellation_cache_seconds!r}: use 0-{MAX_CACHE_SECONDS} seconds"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AwsConfig:
        """Read the table above from ``env`` (e.g. ``os.environ``); ``ConfigurationError`` names a bad variable."""
        return cls(
            settings=DelayedDeliverySettings.from_env(env),
            pack_bytes=_pack_bytes(env),
            cancellation_table=env.get(TABLE_ENV, "").strip() or None,
            cancellation_cache_seconds=cache_seconds_from_env(env),
            service=env.get(SERVICE_ENV, "").strip() or DEFAULT_SERVICE,
            metrics_namespace=env.get(NAMESPACE_ENV, "").strip() or DEFAULT_NAMESPACE,
            max_receive_count=_max_receive_count(env),
        )


def _pack_bytes(env: Mapping[str, str]) -> int:
    raw = env.get(PACK_BYTES_ENV, str(DEFAULT_PACK_BYTES)).strip()
    if not raw.isdigit():
        raise ConfigurationError(f"{PACK_BYTES_ENV}={raw!r} is not a non-negative integer")
    return int(raw)


def _max_receive_count(env: Mapping[str, str]) -> int:
    raw = env.get(MAX_RECEIVE_COUNT_ENV, str(DEFAULT_MAX_RECEIVE_COUNT)).strip()
    if not raw.isdigit():
        raise ConfigurationError(f"{MAX_RECEIVE_COUNT_ENV}={raw!r} is not a non-negative integer")
    return int(raw)


def cache_seconds_from_env(env: Mapping[str, str]) -> float:
    """``DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS`` (default 60, 0 = read every invocation, at most 600)."""
    raw = env.get(CACHE_SECONDS_ENV, str(DEFAULT_CACHE_SECONDS)).strip()
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_CACHE_SECONDS:
        raise ConfigurationError(f"{CACHE_SECONDS_ENV}={raw!r}: use 0-{MAX_CACHE_SECONDS} seconds")
    return value
