"""Schedules on PostgreSQL: the shipped schedule store contract on the throwaway cluster, and the materializer inside
a dispatcher's loop over the PostgreSQL message store (occurrences written as rows, dispatched when due)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery.clock import ManualClock
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.memory import InMemoryTransport
from delayed_delivery.postgres.schedules import PostgresScheduleStore
from delayed_delivery.postgres.store import PostgresDelayedMessageStore
from delayed_delivery.schedules.loop import tick
from delayed_delivery.schedules.materializer import Materializer
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.schedule_store_contract import ScheduleStoreContract

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_schedules(postgres_conninfo: str, postgres_table: str) -> Iterator[PostgresScheduleStore]:
    store = PostgresScheduleStore(postgres_conninfo, table=postgres_table.replace("_delayed", "_schedules"))
    store.setup_infrastructure()
    yield store
    store.drop_infrastructure()
    store.close()


class TestPostgresScheduleStore(ScheduleStoreContract):
    @pytest.fixture
    def schedules(self, pg_schedules: PostgresScheduleStore) -> PostgresScheduleStore:
        return pg_schedules


def test_occurrences_are_rows_of_the_message_table_dispatched_when_due(
    pg_schedules: PostgresScheduleStore, pg_store: PostgresDelayedMessageStore
) -> None:
    start = datetime(2031, 5, 1, 6, 55, tzinfo=UTC)
    clock = ManualClock(start)
    definition = ScheduleDefinition("*/5 * * * *", start=start, zone="Europe/Berlin")
    pg_schedules.create(Schedule.new("pg-1", definition, MessageTemplate("reports", b"tick", {"k": "v"})))
    transport = InMemoryTransport(clock)
    dispatcher = Dispatcher(pg_store, transport, DelayedDeliverySettings(error_queue="errors"), clock=clock)
    materializer = Materializer(pg_schedules, dispatcher, clock=clock, lead_seconds=300)
    tick(dispatcher, materializer)
    pending = pg_store.get("pg-1@2031-05-01T07:00:00Z")
    assert pending is not None and pending.due_at == datetime(2031, 5, 1, 7, 0, tzinfo=UTC)
    for _ in range(12):  # an hour, a pass every 5 minutes
        clock.advance(300)
        tick(dispatcher, materializer)
    ids = [s.message.message_id for s in transport.sent]
    expected = ["pg-1@2031-05-01T06:55:00Z", *(f"pg-1@2031-05-01T07:{m:02d}:00Z" for m in range(0, 60, 5))]
    assert ids == expected  # each once, in order, by the hour's end
    assert all(s.sent_at >= s.message.due_at for s in transport.sent)
    stored = pg_schedules.get("pg-1")
    assert stored is not None and stored.fired >= 12 and stored.cursor is not None
    assert stored.cursor >= start + timedelta(minutes=60)
