"""The schedule store contract on Azurite: ``TableScheduleStore`` (with the core materializer over it)."""

from __future__ import annotations

import pytest

from delayed_delivery.azure.schedules.store import TableScheduleStore
from delayed_delivery.testing.schedule_store_contract import ScheduleStoreContract

pytestmark = pytest.mark.azurite


class TestTableScheduleStore(ScheduleStoreContract):
    @pytest.fixture
    def schedules(self, schedule_table: TableScheduleStore) -> TableScheduleStore:
        return schedule_table
