"""The release schedule contract over the PostgreSQL movers' shared schedule table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delayed_delivery.postgres.release import SharedReleaseSchedule
from delayed_delivery.postgres.store import PostgresDelayedMessageStore
from delayed_delivery.release import ReleaseRates
from delayed_delivery.testing.release_contract import OpenSchedule, ReleaseScheduleContract

pytestmark = pytest.mark.postgres


class TestSharedReleaseSchedule(ReleaseScheduleContract):
    @pytest.fixture
    def open_schedule(self, postgres_conninfo: str, postgres_table: str) -> Iterator[OpenSchedule]:
        stores: list[PostgresDelayedMessageStore] = []

        def open_schedule(rates: ReleaseRates) -> SharedReleaseSchedule:
            store = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table)  # a connection of its own
            stores.append(store)
            schedule = SharedReleaseSchedule(store, rates)
            schedule.setup()
            return schedule

        yield open_schedule
        with stores[0].cursor() as cur:
            cur.execute(
                f'DROP TABLE IF EXISTS "{stores[0].schema}"."{SharedReleaseSchedule(stores[0], ReleaseRates()).table}"'
            )
        for store in stores:
            store.close()
