"""The saved release schedule of an Azure shard: the format written today is the golden one, and it reads back."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.azure.release_state import decode_schedule, encode_calendar, encode_schedule, release_blob_name

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "azure_release_schedule.v1.json"
STATE = {"orders": 1893456050.0, "invoices": 1893456010.5}


def test_the_writer_writes_the_golden_schedule_and_the_reader_reads_it() -> None:
    text = encode_schedule(1, 4, datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC), STATE)
    assert json.loads(text) == json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert decode_schedule(GOLDEN.read_text(encoding="utf-8")) == STATE
    assert release_blob_name(1) == "release-schedule-001.json"


@pytest.mark.parametrize(
    "text",
    ["[]", '{"v": 2, "next_free": {}}', '{"v": 1}', '{"v": 1, "next_free": []}', "not json"],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode_schedule(text)


def test_entries_that_are_not_times_are_left_out() -> None:
    text = '{"v": 1, "next_free": {"a": 5, "b": "x", "c": true, "d": 1e999, "e": 2.5}}'
    assert decode_schedule(text) == {"a": 5.0, "e": 2.5}


def test_the_release_lag_is_its_own_metric_per_destination_the_alert_rule_reads() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from delayed_delivery.azure.telemetry import DispatchMetrics
    from delayed_delivery.dispatcher import DispatchReport

    reader = InMemoryMetricReader()
    report = DispatchReport(dispatched=3, lateness_seconds=[0.1, 0.2, 0.1], release_lag_seconds={"orders": [0, 4, 9]})
    DispatchMetrics(MeterProvider(metric_readers=[reader])).record(report, shard=1)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        m.name: list(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    [lag] = points["delayed_delivery.release_lag"]
    assert (lag.count, lag.max, dict(lag.attributes)) == (3, 9, {"shard": 1, "destination": "orders"})
    assert points["delayed_delivery.lateness"][0].max == 0.2, "transport lateness, apart"
    query = (GOLDEN.parents[2] / "infra/azure/queries/alert_release_lag.kql").read_text()
    assert 'name == "delayed_delivery.release_lag"' in query


CALENDAR_GOLDEN = GOLDEN.with_name("azure_release_calendar.v1.json")


def test_the_shared_schedule_is_the_golden_one_and_reads_back() -> None:
    text = encode_calendar(4, datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC), STATE)
    assert json.loads(text) == json.loads(CALENDAR_GOLDEN.read_text(encoding="utf-8"))
    assert decode_schedule(CALENDAR_GOLDEN.read_text(encoding="utf-8")) == STATE


@pytest.mark.azurite
def test_shards_booking_at_once_never_get_the_same_slot(azurite: Any) -> None:
    from azure.storage.blob import BlobServiceClient

    from delayed_delivery.azure.release_state import SharedBlobReleaseState
    from delayed_delivery.release import ReleasePlanner
    from tests.azure.conftest import new_name

    container = BlobServiceClient.from_connection_string(azurite.connection_string).create_container(new_name())
    booked: list[float] = []
    lock = threading.Lock()

    def shard(n: int) -> None:
        state = SharedBlobReleaseState(container, 8)
        for _ in range(10):
            mine: list[float] = []

            def plan(latest: Mapping[str, float], mine: list[float] = mine) -> Mapping[str, float]:
                planner = ReleasePlanner({"orders": 100.0}, state=latest)
                mine[:] = planner.plan("orders", [0.0] * 5, 0.0)
                return planner.state()

            state.book(plan)
            with lock:
                booked.extend(mine)

    threads = [threading.Thread(target=shard, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(booked) == pytest.approx([k / 100 for k in range(400)]), "400 slots, each once, none skipped"
    container.delete_container()
