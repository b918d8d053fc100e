"""The schedule store contract over the in-memory and SQLite schedule stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delayed_delivery.schedules.memory import InMemoryScheduleStore
from delayed_delivery.schedules.sqlite_store import SqliteScheduleStore
from delayed_delivery.testing.schedule_store_contract import ScheduleStoreContract


class TestInMemoryScheduleStore(ScheduleStoreContract):
    @pytest.fixture
    def schedules(self) -> InMemoryScheduleStore:
        return InMemoryScheduleStore()


class TestSqliteScheduleStore(ScheduleStoreContract):
    @pytest.fixture
    def schedules(self, tmp_path: Path) -> Iterator[SqliteScheduleStore]:
        store = SqliteScheduleStore(tmp_path / "delays.db")
        store.setup_infrastructure()
        yield store
