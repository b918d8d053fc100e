"""The Azure schedule timer on Azurite: occurrences become rows of the delays table, the dispatcher sends each once;
the function app's trigger; a leased shard is skipped."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
from azure.storage.blob import BlobLeaseClient

import functions.azure.function_app as function_app
from delayed_delivery.azure import function_host
from delayed_delivery.azure.schedules import rows
from delayed_delivery.azure.schedules.timer import schedule_lease_name
from delayed_delivery.headers import OCCURRENCE, SCHEDULE_ID
from tests.azure.harness import drain, fire_timer, timer_schedule
from tests.azure.schedules.conftest import Endpoint, rate_schedule

pytestmark = pytest.mark.azurite


def test_occurrences_become_delay_rows_and_are_delivered_once_each(endpoint: Endpoint) -> None:
    endpoint.schedules.create(rate_schedule("tick", endpoint.queue, minutes_ago=4))
    run = endpoint.timer().run()
    assert run.fired == run.fired_late >= 5 and run.missed == 0 and run.shards_done == rows.SHARDS
    assert all(endpoint.host.store.get(i) is not None for i in run.ids), "rows of the delays table, by id"
    got = endpoint.deliver()
    assert sorted(got) == sorted(run.ids) and len(set(got)) == len(got)
    again = endpoint.timer().run()  # the cursor moved on: only occurrences that fell due since, never one again
    later = endpoint.deliver()
    assert sorted(later) == sorted(again.ids) and not set(later) & set(got)
    stored = endpoint.schedules.get("tick")
    assert stored is not None and stored.fired >= run.fired and stored.cursor is not None


def test_an_occurrence_carries_its_schedule_and_nominal_instant(endpoint: Endpoint) -> None:
    endpoint.schedules.create(rate_schedule("hdr", endpoint.queue, minutes_ago=1))
    run = endpoint.timer().run()
    endpoint.host.run(budget=3.0)
    [first, *_] = sorted(drain(endpoint.queues, endpoint.queue), key=lambda e: e.message_id)
    assert first.message_id == sorted(run.ids)[0] and first.body == b"hdr"
    assert first.headers[SCHEDULE_ID] == "hdr" and first.message_id == f"hdr@{first.headers[OCCURRENCE]}"


def test_a_shard_leased_elsewhere_is_skipped_this_run(endpoint: Endpoint) -> None:
    endpoint.schedules.create(rate_schedule("held", endpoint.queue, minutes_ago=2))
    shard = rows.shard_of("held")
    timer = endpoint.timer()
    timer.lease(shard).setup_infrastructure()
    other = BlobLeaseClient(endpoint.host.container.get_blob_client(schedule_lease_name(shard)))
    other.acquire(lease_duration=15)
    try:
        run = timer.run()
        assert run.shards_skipped_leased == 1 and run.fired == 0
    finally:
        other.release()
    assert endpoint.timer().run().fired >= 2


def test_the_function_app_registers_and_runs_the_schedule_timer(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = endpoint.host.config
    monkeypatch.setenv("DELAYED_DELIVERY_SCHEDULES", "true")
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", str(config.connection_string))
    monkeypatch.setenv("DELAYED_DELIVERY_TABLE_NAME", config.table_name)
    monkeypatch.setenv("DELAYED_DELIVERY_CONTAINER_NAME", config.container_name)
    monkeypatch.setenv("DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS", "0")
    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING", raising=False)
    endpoint.schedules.create(rate_schedule("via-app", endpoint.queue, minutes_ago=2))
    function_host.host_from_settings.cache_clear()
    module = importlib.reload(function_app)
    try:
        assert timer_schedule(module, "materialize_schedules") == "20 * * * * *"
        fire_timer(module, "materialize_schedules")
    finally:
        function_host.host_from_settings.cache_clear()
        monkeypatch.delenv("DELAYED_DELIVERY_SCHEDULES")
        importlib.reload(function_app)
    got = Counter(endpoint.deliver())
    assert len(got) >= 2 and set(got.values()) == {1}
    assert all(i.startswith("via-app@") for i in got)


def test_a_shard_that_fails_is_counted_and_logged_and_the_run_goes_on(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: reading a shard's due schedules failing (here: the table gone) raised out of the whole run, so no
    run line, no metric and no ``schedule_failed`` line for the schedule-failures alert."""
    endpoint.schedules.create(rate_schedule("gone", endpoint.queue, minutes_ago=1))
    timer = endpoint.timer()
    endpoint.schedules.drop()
    with caplog.at_level("WARNING", logger="delayed_delivery.azure.schedules"):
        run = timer.run()
    assert run.failures == rows.SHARDS and run.shards_done == 0
    failed = [r for r in caplog.records if getattr(r, "event", None) == "schedule_failed"]
    assert sorted(getattr(r, "shard", None) for r in failed) == list(range(rows.SHARDS))
