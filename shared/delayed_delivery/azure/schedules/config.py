"""The Azure schedule timer's app settings (read on its first run, never at import).

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_SCHEDULES`` | ``false`` | ``true`` registers the schedule timer (``function_host``) |
| ``DELAYED_DELIVERY_SCHEDULE_TABLE_NAME`` | the delays table's name + ``sched`` | the schedules table |
| ``DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS`` | ``300`` | how far ahead occurrences become delay rows (0-900) |

plus the dispatcher's settings (``AzureDelayedDeliveryConfig``: the storage account, the delays table and container).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...envsettings import env_value
from ...errors import ConfigurationError
from ...naming import validate_azure_table_name
from ...schedules.materializer import MAX_LEAD_SECONDS

__all__ = [
    "ENV_SCHEDULES",
    "ENV_SCHEDULE_LEAD",
    "ENV_SCHEDULE_TABLE",
    "AzureScheduleConfig",
    "schedule_table_name",
]

#: ``true`` turns recurring schedules on (the function app registers the timer; ``azure verify`` requires them).
ENV_SCHEDULES = "DELAYED_DELIVERY_SCHEDULES"
ENV_SCHEDULE_TABLE = "DELAYED_DELIVERY_SCHEDULE_TABLE_NAME"
ENV_SCHEDULE_LEAD = "DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS"
_SUFFIX = "sched"


def schedule_table_name(delays_table: str) -> str:
    """The default schedules table of a delays table: its name plus ``sched`` (at most 63 characters)."""
    return validate_azure_table_name(delays_table[: 63 - len(_SUFFIX)] + _SUFFIX)


@dataclass(frozen=True, slots=True)
class AzureScheduleConfig:
    """Where the schedules are and how far ahead the timer writes occurrences."""

    table_name: str
    lead_seconds: int = 300

    def __post_init__(self) -> None:
        validate_azure_table_name(self.table_name)
        if not 0 <= self.lead_seconds <= MAX_LEAD_SECONDS:
            raise ConfigurationError(f"{ENV_SCHEDULE_LEAD}={self.lead_seconds}: use 0-{MAX_LEAD_SECONDS} seconds")

    @classmethod
    def from_env(cls, env: Mapping[str, str], delays_table: str) -> AzureScheduleConfig:
        """Read the table above; ``ConfigurationError`` names a bad variable."""
        return cls(
            table_name=env_value(env, ENV_SCHEDULE_TABLE, str, "") or schedule_table_name(delays_table),
            lead_seconds=env_value(env, ENV_SCHEDULE_LEAD, int, 300),
        )
