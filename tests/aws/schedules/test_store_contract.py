"""The shipped schedule store contract over the DynamoDB schedules table, on moto server."""

from __future__ import annotations

import pytest

from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
from delayed_delivery.testing.schedule_store_contract import ScheduleStoreContract


class TestDynamoDbScheduleStore(ScheduleStoreContract):
    @pytest.fixture
    def schedules(self, schedule_store: DynamoDbScheduleStore) -> DynamoDbScheduleStore:
        return schedule_store
