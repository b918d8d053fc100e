"""The cloud demo's recurring schedule: one ``rate(...)`` schedule per cloud, materialized by that cloud's timer.

The schedule fires every ``RECURRING_EVERY`` real seconds for ``span`` seconds (an every-few-seconds schedule stands in
for a daily one: the timers run in real time, only the delays of the mix are compressed), to its own queue. Its
occurrences are tracked by id (``<schedule-id>@<nominal instant>``) from the moment it is created, so the summary can
say fired / expected / missed and their lateness against each occurrence's nominal instant.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from delayed_delivery.app.demo.cloud_tracking import Tracker
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.schedules.occurrences import utc_text

__all__ = ["RECURRING_EVERY", "RECURRING_QUEUE", "RecurringSchedule", "recurring_summary_rows"]

#: The schedule's queue and its period (real seconds).
RECURRING_QUEUE, RECURRING_EVERY = "digest", 3
#: Seconds from creating the schedule to its first occurrence (the timer writes it ahead).
_FIRST_AFTER = 4


class RecurringSchedule:
    """One cloud's schedule: created, its occurrences expected by id, and what arrived summarised."""

    def __init__(self, cloud: str, span_seconds: float) -> None:
        self.cloud = cloud
        self.tracker = Tracker(f"{cloud}-schedule")
        self.schedule_id = f"demo-{cloud}-{uuid.uuid4().hex[:8]}"
        self.span = max(float(RECURRING_EVERY), span_seconds)
        self.expression = f"rate({RECURRING_EVERY} seconds)"

    def schedule(self, now: datetime | None = None) -> Schedule:
        """The schedule to create (``[start, start + span)``); every occurrence is expected from now on."""
        at = (now or datetime.now(UTC)).replace(microsecond=0) + timedelta(seconds=_FIRST_AFTER)
        definition = ScheduleDefinition(expression=self.expression, start=at, end=at + timedelta(seconds=self.span))
        body = f'{{"schedule": "{self.schedule_id}"}}'.encode()
        schedule = Schedule.new(self.schedule_id, definition, MessageTemplate(RECURRING_QUEUE, body))
        for fire in definition.recurrence().fires(definition.start, definition.end):
            self.tracker.expect(f"{self.schedule_id}@{utc_text(fire.nominal)}", "recurring", fire.nominal.timestamp(),
                                "schedule")  # fmt: skip
        return schedule

    def summary(self, missed: int) -> dict[str, Any]:
        """Fired / expected / missed / lateness (real seconds after each nominal instant)."""
        outcome = self.tracker.summary({})
        return {
            "schedule_id": self.schedule_id,
            "expression": self.expression,
            "destination": RECURRING_QUEUE,
            "expected": outcome.expected_deliveries,
            "fired": outcome.delivered,
            "missed": missed,
            "lost": outcome.lost,
            "duplicates": outcome.duplicates,
            "early": outcome.early,
            "lateness_p50": outcome.lateness_p50,
            "lateness_p99": outcome.lateness_p99,
            "lateness_max": outcome.lateness_max,
            "occurrences": sorted(self.tracker.arrivals),
        }


def recurring_summary_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """A cloud's recurring-schedule rows of the demo's summary table (label, value), from ``CloudSummary.recurring``."""
    return [
        (
            f"recurring schedule {r['expression']} to {r['destination']}: fired / expected / missed",
            f"{r['fired']} / {r['expected']} / {r['missed']}",
        ),
        (
            "  duplicates, lateness p50 / max (real s)",
            f"{r['duplicates']}, {r['lateness_p50']:.2f} / {r['lateness_max']:.2f}",
        ),
        (
            "  occurrences delivered (nominal, UTC)",
            ", ".join(i.rpartition("T")[2].rstrip("Z") for i in r["occurrences"]),
        ),
    ]
