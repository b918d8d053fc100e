"""The Azure schedule timer's lateness and skipped_paused, as the AWS timer's ``ScheduleLateness`` and
``ScheduleOccurrencesSkippedPaused`` mean them: the most an occurrence written was late (seconds), and the occurrences
a resume counted skipped while paused, reported once by the next timer run (Azurite)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from delayed_delivery.azure.schedules import rows
from delayed_delivery.azure.schedules.timer import ScheduleMetrics
from delayed_delivery.schedules import operations
from delayed_delivery.schedules.model import ScheduleState
from tests.azure.schedules.conftest import Endpoint, rate_schedule


def _points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: m.data.data_points[0] for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics}  # fmt: skip


@pytest.mark.azurite
def test_the_run_reports_how_late_it_wrote_occurrences(endpoint: Endpoint, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the run had no lateness at all (no field, no metric, nothing in the run line)."""
    endpoint.schedules.create(rate_schedule("late", endpoint.queue, minutes_ago=4))
    reader = InMemoryMetricReader()
    with caplog.at_level("INFO", logger="delayed_delivery.azure.schedules"):
        run = endpoint.timer(metrics_sink=ScheduleMetrics(MeterProvider(metric_readers=[reader]))).run()
    assert run.fired >= 5 and 240 <= run.lateness_max_seconds < 240 + 600, "the first fired 4 minutes late"
    lateness = _points(reader)["delayed_delivery.schedule.lateness"]
    assert lateness.max == run.lateness_max_seconds and lateness.count == 1, "once a run: the run's most"
    [line] = [r for r in caplog.records if getattr(r, "event", None) == "schedule_timer_run"]
    assert line.__dict__["lateness_max_seconds"] == run.lateness_max_seconds
    ahead = endpoint.timer(lead=600).run()  # written ahead of their fire times: none late
    assert ahead.fired >= 9 and ahead.lateness_max_seconds < 60


@pytest.mark.azurite
def test_a_resumed_span_is_reported_skipped_paused_by_the_next_run_once(endpoint: Endpoint) -> None:
    """Before: resume counted the span in the row only; the timer reported nothing (no field, no metric)."""
    now = datetime.now(UTC)
    s = rate_schedule("napped", endpoint.queue, minutes_ago=10)
    endpoint.schedules.create(s)
    paused_at = now.replace(second=0, microsecond=0) - timedelta(minutes=5, seconds=30)
    assert endpoint.schedules.replace(s.next_version(state=ScheduleState.PAUSED, paused_at=paused_at,
                                                     cursor=paused_at - timedelta(seconds=30)), s.version)  # fmt: skip
    resumed = operations.resume(endpoint.schedules, "napped", now)
    assert resumed.skipped_paused >= 5
    reader = InMemoryMetricReader()
    run = endpoint.timer(lead=60, metrics_sink=ScheduleMetrics(MeterProvider(metric_readers=[reader]))).run()
    assert run.skipped_paused == resumed.skipped_paused and run.fired >= 1
    assert _points(reader)["delayed_delivery.schedule.skipped_paused"].value == resumed.skipped_paused
    assert endpoint.timer(lead=180).run().skipped_paused == 0, "reported once"
    stored = endpoint.schedules.get("napped")
    assert stored is not None and stored.skipped_paused == resumed.skipped_paused


@pytest.mark.parametrize(
    ("stored", "reported"),
    [
        ({"SkippedPaused": 7}, 7),  # a row written before SkippedReported: its span was counted by resume's line
        ({"SkippedPaused": 7, "SkippedReported": 3}, 3),
        ({"SkippedPaused": 7, "SkippedReported": 9}, 7),  # more than was skipped: unreadable, nothing to report
        ({"SkippedPaused": 7, "SkippedReported": -1}, 7),
        ({"SkippedPaused": 7, "SkippedReported": True}, 7),
        ({"SkippedPaused": "7", "SkippedReported": 3}, 0),
    ],
)
def test_what_a_row_says_was_reported(stored: dict[str, Any], reported: int) -> None:
    assert rows.reported_of(stored) == reported
