"""Schedules inside the dispatcher's loop on SQLite: messages and schedules in one file, a manual clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayed_delivery import headers as hdr
from delayed_delivery.clock import ManualClock
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.memory import InMemoryTransport
from delayed_delivery.schedules.loop import run_with_schedules, tick
from delayed_delivery.schedules.materializer import Materializer, MaterializeReport
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.schedules.sqlite_store import SqliteScheduleStore
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore

T0 = datetime(2027, 3, 14, 5, 0, tzinfo=UTC)  # 00:00 in New York, the day 02:00-03:00 does not exist


def _setup(tmp_path: Path, clock: ManualClock) -> tuple[SqliteScheduleStore, Dispatcher, InMemoryTransport]:
    path = tmp_path / "delays.db"
    messages = SqliteDelayedMessageStore(path)
    messages.setup_infrastructure()
    schedules = SqliteScheduleStore(path)
    schedules.setup_infrastructure()
    transport = InMemoryTransport(clock)
    settings = DelayedDeliverySettings(max_idle_sleep=5.0)
    return schedules, Dispatcher(messages, transport, settings, clock=clock), transport


def test_a_schedule_fires_through_the_dispatcher_once_per_occurrence_across_a_gap(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    schedules, dispatcher, transport = _setup(tmp_path, clock)
    definition = ScheduleDefinition("30 */1 * * *", start=T0, zone="America/New_York", jitter_seconds=120)
    schedules.create(Schedule.new("report", definition, MessageTemplate("reports", b"run")))
    materializer = Materializer(schedules, dispatcher, clock=clock, lead_seconds=300)
    for _ in range(6 * 60):  # a timer tick a minute for six hours
        tick(dispatcher, materializer)
        clock.advance(60)
    sent = [s.message for s in transport.sent]
    ids = [m.message_id for m in sent]
    # every real hour once (a cadence: skip/both): 00:30 and 01:30 EST, then 03:30 .. 06:30 EDT (02:30 does not exist)
    assert ids == [f"report@2027-03-14T{h:02d}:30:00Z" for h in range(5, 11)]
    assert all(m.headers[hdr.SCHEDULE_ID] == "report" for m in sent)
    for s in transport.sent:
        nominal = datetime.fromisoformat(s.message.headers[hdr.OCCURRENCE])
        assert nominal <= s.message.due_at <= nominal + timedelta(seconds=120)
        assert s.sent_at - s.message.due_at <= timedelta(seconds=60)  # within one tick
    stored = schedules.get("report")
    assert stored is not None and stored.fired == 6 and stored.missed == 0


def test_run_with_schedules_materializes_and_dispatches_until_stopped(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    schedules, dispatcher, transport = _setup(tmp_path, clock)
    definition = ScheduleDefinition("rate(10 minutes)", start=T0 + timedelta(minutes=1))
    schedules.create(Schedule.new("pulse", definition, MessageTemplate("pulses", b"p")))
    stop = threading.Event()

    class Stopping(Materializer):
        def run_once(self, now: datetime | None = None) -> MaterializeReport:
            if self.clock.now() >= T0 + timedelta(hours=1):
                stop.set()
            return super().run_once(now)

    report = run_with_schedules(dispatcher, Stopping(schedules, dispatcher, clock=clock, lead_seconds=120), stop,
                                pass_every=60)  # fmt: skip
    ids = [s.message.message_id for s in transport.sent]
    assert ids[:2] == ["pulse@2027-03-14T05:01:00Z", "pulse@2027-03-14T05:11:00Z"]
    assert len(ids) == len(set(ids)) >= 6 and report.passes >= 60
    assert report.written >= len(ids) and report.dispatched == len(ids)
