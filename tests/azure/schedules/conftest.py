"""Azure schedule stores on the session's Azurite, each on a fresh table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.data.tables import TableServiceClient

from delayed_delivery.azure.schedules.store import TableScheduleStore
from tests.azure.conftest import new_name
from tests.fixtures.azurite import Azurite


def make_schedule_store(conn: str, table: str) -> TableScheduleStore:
    """A schedule store on ``table`` (created if missing)."""
    store = TableScheduleStore(TableServiceClient.from_connection_string(conn).get_table_client(table))
    store.setup_infrastructure()
    return store


@pytest.fixture
def schedule_table(azurite: Azurite) -> Iterator[TableScheduleStore]:
    """An empty schedule store on a fresh table."""
    store = make_schedule_store(azurite.connection_string, new_name("sch"))
    yield store
    store.drop()
