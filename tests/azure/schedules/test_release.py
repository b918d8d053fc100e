"""Release caps hold for occurrences on Azure (Azurite), as on AWS: a catch-up burst of occurrences of many schedules
to a capped queue is placed at the cap's slots by the dispatcher, never faster, each occurrence once."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.schedules.config import schedule_table_name
from delayed_delivery.azure.schedules.timer import timer_for_host
from delayed_delivery.clock import ManualClock
from delayed_delivery.release import busiest_window
from tests.azure.conftest import new_name
from tests.azure.schedules.conftest import make_schedule_store, rate_schedule
from tests.azure.test_release import Placed, _host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

CAP = 10.0  # messages a second to the capped queue


def test_a_release_cap_holds_for_a_catch_up_burst_of_occurrences(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    table = new_name()
    host = _host(azurite, clock, shards=2, rates={queue: CAP}, table=table)
    schedules = make_schedule_store(azurite.connection_string, schedule_table_name(table))
    try:
        for i in range(30):  # each 5 minutes behind, catch-up all: 150 occurrences due at once
            schedules.create(rate_schedule(f"capped-{i:02d}", queue, minutes_ago=5))
        fired = timer_for_host(host, {"DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS": "0"}).run()
        assert fired.fired == fired.fired_late >= 150 and fired.failures == 0
        summary = host.run(30)
        placed: Placed = host.transport  # type: ignore[assignment]
        times = placed.at(queue)
        ids = Counter(m for m, d, _ in placed.visible if d == queue)
        assert set(ids) == set(fired.ids) and set(ids.values()) == {1}, "each occurrence placed once"
        assert summary.dispatched == len(fired.ids) and host.store.count() == 0
        assert min(times) >= start.timestamp(), "never before due"
        assert busiest_window(times, 10.0) <= 1.05 * CAP * 10 + 2, "never past the cap"
        finish = times[-1] - start.timestamp()
        assert finish >= len(times) / CAP * 0.95, "paced by the cap, not a burst"
        assert clock.now() - start <= timedelta(seconds=31)
    finally:
        schedules.drop()
        host.store.drop()
