"""The schedule timer's configuration from the environment (read on the Lambda's first call, never at import).

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_SCHEDULE_TABLE`` | ``delayed-delivery-schedules`` | the schedules table |
| ``DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS`` | ``300`` | how far ahead occurrences are sent (0-840 s) |
| ``DELAYED_DELIVERY_SCHEDULE_SHARD_THREADS`` | ``8`` | shards worked side by side in one run (1-16) |
| ``DELAYED_DELIVERY_SCHEDULE_REFUSED_RETRY_SECONDS`` | ``3600`` | retrying a refused occurrence past its fire time |
| ``DELAYED_DELIVERY_*`` core settings | ``DelayedDeliverySettings`` | the error queue, ``release_rates`` |
| ``DELAYED_DELIVERY_RELEASE_TABLE`` | none | the release calendar; required when ``release_rates`` caps anything |
| ``POWERTOOLS_SERVICE_NAME`` | ``delayed-delivery-schedules`` | service name on logs, metrics and traces |
| ``POWERTOOLS_METRICS_NAMESPACE`` | ``DelayedDelivery`` | CloudWatch namespace |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...envsettings import env_value
from ...errors import ConfigurationError
from ...settings import DelayedDeliverySettings
from ..config import NAMESPACE_ENV, RELEASE_TABLE_ENV, SERVICE_ENV
from .layout import DEFAULT_TABLE, SHARDS
from .table import SCHEDULE_TABLE_ENV
from .timer import MAX_TIMER_LEAD_SECONDS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from ..release_calendar import ReleaseCalendar

__all__ = ["LEAD_ENV", "REFUSED_RETRY_ENV", "SHARD_THREADS_ENV", "ScheduleTimerConfig"]

LEAD_ENV = "DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS"
SHARD_THREADS_ENV = "DELAYED_DELIVERY_SCHEDULE_SHARD_THREADS"
REFUSED_RETRY_ENV = "DELAYED_DELIVERY_SCHEDULE_REFUSED_RETRY_SECONDS"
DEFAULT_SERVICE = "delayed-delivery-schedules"
DEFAULT_NAMESPACE = "DelayedDelivery"


@dataclass(frozen=True, slots=True)
class ScheduleTimerConfig:
    """Everything the schedule timer reads from the environment."""

    settings: DelayedDeliverySettings = field(default_factory=DelayedDeliverySettings)
    table: str = DEFAULT_TABLE
    lead_seconds: int = 300
    shard_threads: int = 8
    refused_retry_seconds: int = 3600
    release_table: str | None = None
    service: str = DEFAULT_SERVICE
    metrics_namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not 0 <= self.lead_seconds <= MAX_TIMER_LEAD_SECONDS:
            raise ConfigurationError(f"{LEAD_ENV}={self.lead_seconds}: use 0-{MAX_TIMER_LEAD_SECONDS} seconds")
        if not 1 <= self.shard_threads <= SHARDS:
            raise ConfigurationError(f"{SHARD_THREADS_ENV}={self.shard_threads}: use 1-{SHARDS}")
        if not 0 <= self.refused_retry_seconds <= 7 * 86_400:
            raise ConfigurationError(f"{REFUSED_RETRY_ENV}={self.refused_retry_seconds}: use 0-604800 seconds")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ScheduleTimerConfig:
        """Read the table above; ``ConfigurationError`` names a bad variable."""
        return cls(
            settings=DelayedDeliverySettings.from_env(env),
            table=env_value(env, SCHEDULE_TABLE_ENV, str, DEFAULT_TABLE),
            lead_seconds=env_value(env, LEAD_ENV, int, 300),
            shard_threads=env_value(env, SHARD_THREADS_ENV, int, 8),
            refused_retry_seconds=env_value(env, REFUSED_RETRY_ENV, int, 3600),
            release_table=env_value(env, RELEASE_TABLE_ENV, str, "") or None,
            service=env_value(env, SERVICE_ENV, str, DEFAULT_SERVICE),
            metrics_namespace=env_value(env, NAMESPACE_ENV, str, DEFAULT_NAMESPACE),
        )

    def release_calendar(self, dynamodb: DynamoDBClient) -> ReleaseCalendar | None:
        """The shared release calendar when ``release_rates`` caps anything; its table is then required."""
        rates = self.settings.release_rates
        if not rates:
            return None
        if self.release_table is None:
            raise ConfigurationError(
                f"release_rates ({rates}) caps destinations, and occurrences take their release slots from the "
                f"shared calendar: set {RELEASE_TABLE_ENV}"
            )
        from ..release_calendar import ReleaseCalendar

        return ReleaseCalendar(dynamodb, self.release_table, rates)
