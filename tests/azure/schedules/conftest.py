"""Azure schedule stores on the session's Azurite, each on a fresh table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.schedules import rows
from delayed_delivery.azure.schedules.config import schedule_table_name
from delayed_delivery.azure.schedules.store import TableScheduleStore
from delayed_delivery.azure.schedules.timer import AzureScheduleTimer, timer_for_host
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from tests.azure.conftest import new_name
from tests.azure.harness import drain
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


@dataclass
class Endpoint:
    """A dispatcher host on a fresh delays table, its schedules table and a destination queue (Azurite)."""

    host: AzureDispatcherHost
    schedules: TableScheduleStore
    queue: str
    queues: QueueServiceClient

    def timer(self, lead: int = 0, **kwargs: Any) -> AzureScheduleTimer:
        """A schedule timer beside the host (lead 0 unless given: only what is due now is written)."""
        return timer_for_host(self.host, {"DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS": str(lead)}, **kwargs)

    def deliver(self, seconds: float = 3.0) -> list[str]:
        """One dispatcher run, then the ids now on the queue."""
        self.host.run(budget=seconds)
        return [e.message_id for e in drain(self.queues, self.queue)]


@pytest.fixture
def endpoint(azurite: Azurite, queues: QueueServiceClient, queue: str) -> Iterator[Endpoint]:
    """A fresh endpoint on Azurite; its tables are dropped afterwards."""
    from tests.azure.test_dispatch import make_host

    table = new_name()
    host = make_host(azurite.connection_string, table, error_queue=new_name("e"), run=3.0)
    schedules = make_schedule_store(azurite.connection_string, schedule_table_name(table))
    yield Endpoint(host, schedules, queue, queues)
    schedules.drop()
    host.store.drop()


def rate_schedule(schedule_id: str, queue: str, minutes_ago: int, **definition: Any) -> Schedule:
    """``rate(1 minutes)`` to ``queue``, anchored ``minutes_ago`` whole minutes before now (catch-up: all)."""
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)
    spec = {"expression": "rate(1 minutes)", "start": start, **definition}
    return Schedule.new(schedule_id, ScheduleDefinition(**spec), MessageTemplate(queue, schedule_id.encode()))


def same_shard_ids(prefix: str, count: int) -> list[str]:
    """``count`` schedule ids that share one shard (so one timer pass writes them in order)."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        sid = f"{prefix}-{i}"
        if rows.shard_of(sid) == 0:
            found.append(sid)
        i += 1
    return found
