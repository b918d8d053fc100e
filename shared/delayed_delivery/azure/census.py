"""A census of the delays table: pending rows by due hour and the oldest overdue row, logged for the workbook.

``take_census`` reads the due rows' keys only (no bodies), at most ``max_rows`` of them; ``log_census`` writes one
``pending_by_due_hour`` line per hour (the earliest ``MAX_HOURS``) and one ``pending_census`` summary line.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from azure.data.tables import TableClient

from .. import logfields as lf
from . import rows
from .sdk_errors import sdk_errors

__all__ = [
    "EVENT_CENSUS",
    "EVENT_PENDING_HOUR",
    "MAX_HOURS",
    "MAX_ROWS",
    "Census",
    "census_from_settings",
    "log_census",
    "take_census",
]

EVENT_PENDING_HOUR = "pending_by_due_hour"
EVENT_CENSUS = "pending_census"
#: Keys of the census lines.
CENSUS_AT = "census_at"
DUE_HOUR = "due_hour"
PENDING = "pending"
OLDEST_OVERDUE_S = "oldest_overdue_s"
PARTIAL = "partial"
#: Rows one census reads at most (200 pages); beyond, its counts are partial and say so.
MAX_ROWS = 200_000
#: Hour lines one census logs at most, from the earliest due hour; the summary counts every row read.
MAX_HOURS = 48

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Census:
    """Pending due rows by due hour (UTC), their total, the oldest overdue row's lateness, whether it stopped."""

    at: datetime
    by_hour: Mapping[datetime, int]
    total: int
    oldest_overdue_s: float
    partial: bool


def take_census(table: TableClient, now: datetime | None = None, *, max_rows: int = MAX_ROWS) -> Census:
    """Count the due rows of ``table`` by due hour, reading their keys only."""
    at = now or datetime.now(UTC)
    hours: Counter[datetime] = Counter()
    earliest: datetime | None = None
    total = 0
    partial = False
    with sdk_errors(f"census of the delays table {table.table_name!r}"):
        for entity in table.query_entities(
            "RowKey ge @lo and RowKey lt @hi",
            parameters={"lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
            select=["RowKey"],
            results_per_page=1000,
        ):
            if total >= max_rows:
                partial = True
                break
            due = rows.from_due_key(str(entity["RowKey"])[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20])
            total += 1
            earliest = due if earliest is None or due < earliest else earliest
            hours[due.replace(minute=0, second=0, microsecond=0)] += 1
    overdue = max(0.0, (at - earliest).total_seconds()) if earliest is not None else 0.0
    return Census(at, dict(sorted(hours.items())), total, round(overdue, 3), partial)


def log_census(census: Census) -> None:
    """One line per due hour (the earliest ``MAX_HOURS``) and one summary line, with fixed keys."""
    at = census.at.isoformat()
    for hour, count in list(census.by_hour.items())[:MAX_HOURS]:
        _log.info(
            "pending by due hour",
            extra={lf.EVENT: EVENT_PENDING_HOUR, CENSUS_AT: at, DUE_HOUR: hour.isoformat(), PENDING: count},
        )
    _log.info(
        "pending census",
        extra={
            lf.EVENT: EVENT_CENSUS,
            CENSUS_AT: at,
            PENDING: census.total,
            OLDEST_OVERDUE_S: census.oldest_overdue_s,
            PARTIAL: census.partial,
        },
    )


def census_from_settings(env: Mapping[str, str]) -> Census:
    """Take and log a census of the delays table named by the app settings in ``env`` (the census timer)."""
    from .config import AzureClients, AzureDelayedDeliveryConfig
    from .telemetry import configure_telemetry

    configure_telemetry(env)
    config = AzureDelayedDeliveryConfig.from_env(env)
    table = AzureClients.create(config).tables.get_table_client(config.table_name)
    census = take_census(table)
    log_census(census)
    return census
