"""The time-bucket tier's configuration from the environment: one object for its two functions and the CLI.

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_*`` core settings | see ``DelayedDeliverySettings`` | error queue, bucket sizes, ingest queue |
| ``DELAYED_DELIVERY_BUCKET_NAME`` | none (required by both functions) | the S3 bucket holding the bucket objects |
| ``DELAYED_DELIVERY_BUCKET_PREFIX`` | ``delayed-delivery/buckets`` | key prefix of the objects inside it |
| ``DELAYED_DELIVERY_CANCELLATION_TABLE`` | none (no lookups) | DynamoDB table of cancel / reschedule records |
| ``POWERTOOLS_SERVICE_NAME`` | ``delayed-delivery-buckets`` | service name on logs, metrics and traces |
| ``POWERTOOLS_METRICS_NAMESPACE`` | ``DelayedDelivery`` | CloudWatch namespace of the EMF metrics |
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...errors import ConfigurationError
from ...settings import DelayedDeliverySettings
from ...timebuckets.wheel import BucketLevel
from ..config import NAMESPACE_ENV, SERVICE_ENV, TABLE_ENV

__all__ = [
    "BUCKET_NAME_ENV",
    "BUCKET_PREFIX_ENV",
    "DEFAULT_PREFIX",
    "DEFAULT_SERVICE",
    "BucketTierConfig",
]

#: Environment variable naming the S3 bucket of the tier.
BUCKET_NAME_ENV = "DELAYED_DELIVERY_BUCKET_NAME"
#: Environment variable: the key prefix of the bucket objects (S3-safe segments joined by slashes).
BUCKET_PREFIX_ENV = "DELAYED_DELIVERY_BUCKET_PREFIX"
DEFAULT_PREFIX = "delayed-delivery/buckets"
DEFAULT_SERVICE = "delayed-delivery-buckets"
DEFAULT_NAMESPACE = "DelayedDelivery"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class BucketTierConfig:
    """Everything the ingest and timer functions (and the ``aws`` commands) read for the tier."""

    bucket_name: str
    prefix: str = DEFAULT_PREFIX
    settings: DelayedDeliverySettings = field(default_factory=DelayedDeliverySettings)
    #: DynamoDB table of cancel and reschedule records; ``None`` = no lookups.
    cancellation_table: str | None = None
    service: str = DEFAULT_SERVICE
    metrics_namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not _BUCKET_NAME.fullmatch(self.bucket_name or ""):
            raise ConfigurationError(
                f"{BUCKET_NAME_ENV}={str(self.bucket_name)[:70]!r} is not an S3 bucket name (3-63 lower-case "
                "letters, digits, dots and hyphens)"
            )
        if not self.prefix or self.prefix.startswith("/") or self.prefix.endswith("/") or len(self.prefix) > 512:
            raise ConfigurationError(
                f"{BUCKET_PREFIX_ENV}={self.prefix[:60]!r} must be path segments without a slash at either end"
            )

    @property
    def levels(self) -> BucketLevel:
        """The timing wheel's levels from the settings."""
        return BucketLevel.from_settings(self.settings)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BucketTierConfig:
        """Read the table above from ``env``; ``ConfigurationError`` names a missing or bad variable."""
        name = env.get(BUCKET_NAME_ENV, "").strip()
        if not name:
            raise ConfigurationError(f"{BUCKET_NAME_ENV} is not set: the time-bucket tier needs its S3 bucket")
        return cls(
            bucket_name=name,
            prefix=env.get(BUCKET_PREFIX_ENV, "").strip() or DEFAULT_PREFIX,
            settings=DelayedDeliverySettings.from_env(env),
            cancellation_table=env.get(TABLE_ENV, "").strip() or None,
            service=env.get(SERVICE_ENV, "").strip() or DEFAULT_SERVICE,
            metrics_namespace=env.get(NAMESPACE_ENV, "").strip() or DEFAULT_NAMESPACE,
        )
