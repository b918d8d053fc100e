"""The crash lab's "timer down for 3 days" case on Azure, through the real parts: the function app (schedule timer and
dispatcher host) is down for 3 days over an hourly schedule, on Azurite with a manual clock. On recovery every
occurrence is delivered once or recorded missed (counter and ``schedule_missed`` line), as each catch-up policy says;
none is delivered twice, and the runs after the recovery go on from there."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.schedules.config import schedule_table_name
from delayed_delivery.azure.schedules.timer import ScheduleRun, timer_for_host
from delayed_delivery.clock import ManualClock
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.schedules.conftest import make_schedule_store
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SID = "outage"


def _id(hour: int) -> str:
    return f"{SID}@{(T0 + timedelta(hours=hour)).strftime('%Y-%m-%dT%H:%M:%SZ')}"


class App:
    """The function app's two timers beside each other on a manual clock; what reached the queue, counted by id."""

    def __init__(self, azurite: Azurite, queues: QueueServiceClient, queue: str, clock: ManualClock) -> None:
        table = new_name()
        self.clock, self.queues, self.queue = clock, queues, queue
        self.host = make_host(azurite.connection_string, table, error_queue=new_name("e"), run=3.0, clock=clock,
                              monotonic=lambda: clock.now().timestamp())  # fmt: skip
        self.schedules = make_schedule_store(azurite.connection_string, schedule_table_name(table))
        self.timer = timer_for_host(self.host, {"DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS": "60"})
        self.delivered: Counter[str] = Counter()

    def minute(self, at: datetime) -> ScheduleRun:
        """The app's runs at ``at``: the schedule timer, then the dispatcher; the queue drained."""
        assert at >= self.clock.now()
        self.clock.set(at)
        run = self.timer.run()
        self.host.run(budget=1.0)
        self.delivered.update(e.message_id for e in drain(self.queues, self.queue))
        return run


@pytest.fixture
def app(azurite: Azurite, queues: QueueServiceClient, queue: str) -> Iterator[App]:
    made = App(azurite, queues, queue, ManualClock(T0 - timedelta(minutes=1)))
    yield made
    made.schedules.drop()
    made.host.store.drop()


@pytest.mark.parametrize(
    ("policy", "late"),
    [(CatchUpPolicy.ALL, range(49, 73)), (CatchUpPolicy.LATEST, range(72, 73)), (CatchUpPolicy.SKIP, range(0))],
)
def test_three_days_down_delivers_or_records_every_occurrence_as_the_policy_says(
    app: App, policy: CatchUpPolicy, late: range, caplog: pytest.LogCaptureFixture
) -> None:
    definition = ScheduleDefinition(expression="0 * * * *", start=T0, catch_up=CatchUp(policy, 86_400 - 1, 1000))
    app.schedules.create(Schedule.new(SID, definition, MessageTemplate(app.queue, b"tick")))
    assert app.minute(T0 - timedelta(seconds=30)).ids == [_id(0)], "written within the lead, on time"
    assert app.minute(T0 + timedelta(seconds=30)).fired == 0 and list(app.delivered) == [_id(0)]
    with caplog.at_level("INFO", logger="delayed_delivery.schedules"):
        recovered = app.minute(T0 + timedelta(hours=72, minutes=30))  # 01:00 (day 1) .. 00:00 (day 4) were due
    missed = [h for h in range(1, 73) if h not in late]
    assert (recovered.fired, recovered.fired_late, recovered.missed) == (len(late), len(late), len(missed))
    assert sorted(recovered.ids) == [_id(h) for h in late], "the most recent within the window keep their ids"
    lines = [r.__dict__ for r in caplog.records if r.__dict__.get("event") == "schedule_missed"]
    assert [(line["count"], line["occurrence_ids"]) for line in lines] == ([(len(missed), [_id(h) for h in missed])]
                                                                            if missed else [])  # fmt: skip
    after = app.minute(T0 + timedelta(hours=73, seconds=-30))  # back on time
    assert after.ids == [_id(73)] and after.missed == after.fired_late == 0
    assert app.minute(T0 + timedelta(hours=73, seconds=30)).fired == 0
    assert set(app.delivered.values()) == {1}, "none delivered twice"
    assert sorted(app.delivered) == sorted([_id(0), *(_id(h) for h in late), _id(73)])
    assert set(app.delivered).isdisjoint(_id(h) for h in missed) and len(app.delivered) + len(missed) == 74
    stored = app.schedules.get(SID)
    assert stored is not None and (stored.fired, stored.missed) == (len(late) + 2, len(missed))
    assert app.host.store.count() == 0, "nothing left waiting"
