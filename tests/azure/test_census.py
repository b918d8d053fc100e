"""The census of the delays table (Azurite): pending rows by due hour, the oldest overdue row, a capped read, the
log lines the workbook's and alert's queries read, and the timer that is registered only when its setting is on."""

from __future__ import annotations

import importlib
import logging
from datetime import UTC, datetime, timedelta

import pytest

import functions.azure.function_app as function_app
from delayed_delivery.azure import census as census_module
from delayed_delivery.azure import function_host
from delayed_delivery.azure.census import log_census, take_census
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.model import DelayedMessage
from tests.azure.harness import functions_of, timer_schedule

NOW = datetime(2026, 11, 24, 15, 20, tzinfo=UTC)


def _fill(store: TableDelayedMessageStore) -> None:
    dues = [NOW - timedelta(hours=1, minutes=5), NOW - timedelta(minutes=1)]
    dues += [NOW + timedelta(minutes=m) for m in (5, 30, 50)] + [NOW + timedelta(days=40)]
    for i, due in enumerate(dues):
        store.store(DelayedMessage(f"m-{i}", "orders", b"x" * 1000, due))


def test_counts_pending_rows_by_due_hour_and_the_oldest_overdue(table_store: TableDelayedMessageStore) -> None:
    _fill(table_store)
    census = take_census(table_store.table, NOW)
    hour = NOW.replace(minute=0)
    assert census.by_hour == {
        hour - timedelta(hours=1): 1,  # 14:15
        hour: 3,  # 15:19, 15:25, 15:50
        hour + timedelta(hours=1): 1,  # 16:10
        hour + timedelta(days=40): 1,
    }
    assert sum(census.by_hour.values()) == census.total == 6
    assert census.oldest_overdue_s == pytest.approx(3900, abs=1)
    assert census.partial is False


def test_a_capped_census_says_it_is_partial(table_store: TableDelayedMessageStore) -> None:
    _fill(table_store)
    census = take_census(table_store.table, NOW, max_rows=2)
    assert census.total == 2 and census.partial is True


def test_an_empty_table_has_nothing_overdue(table_store: TableDelayedMessageStore) -> None:
    census = take_census(table_store.table, NOW)
    assert (census.by_hour, census.total, census.oldest_overdue_s) == ({}, 0, 0.0)


def test_log_lines_carry_the_fixed_keys(
    table_store: TableDelayedMessageStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(table_store)
    monkeypatch.setattr(census_module, "MAX_HOURS", 2)
    with caplog.at_level(logging.INFO, logger="delayed_delivery"):
        log_census(take_census(table_store.table, NOW))
    hours = [r for r in caplog.records if getattr(r, "event", None) == "pending_by_due_hour"]
    assert [(r.due_hour, r.pending) for r in hours] == [  # type: ignore[attr-defined]
        ("2026-11-24T14:00:00+00:00", 1),
        ("2026-11-24T15:00:00+00:00", 3),
    ]
    [summary] = [r for r in caplog.records if getattr(r, "event", None) == "pending_census"]
    assert summary.pending == 6 and summary.partial is False  # type: ignore[attr-defined]
    assert summary.oldest_overdue_s == pytest.approx(3900, abs=1)  # type: ignore[attr-defined]
    assert {r.census_at for r in [*hours, summary]} == {NOW.isoformat()}  # type: ignore[attr-defined]


def test_the_census_timer_is_registered_only_when_its_setting_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(function_host.ENV_PENDING_CENSUS, "true")
    try:
        module = importlib.reload(function_app)
        assert sorted(functions_of(module)) == ["census_pending_messages", "dispatch_delayed_messages"]
        assert timer_schedule(module, "census_pending_messages") == function_host.CENSUS_SCHEDULE == "30 */15 * * * *"
    finally:
        monkeypatch.delenv(function_host.ENV_PENDING_CENSUS)
        importlib.reload(function_app)
    assert list(functions_of(function_app)) == ["dispatch_delayed_messages"]
