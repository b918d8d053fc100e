"""The schedule store contract: every ``ScheduleStore`` must pass these tests, and carry the materializer.

Use it from your own test module::

    from delayed_delivery.testing.schedule_store_contract import ScheduleStoreContract

    class TestMyScheduleStore(ScheduleStoreContract):
        @pytest.fixture
        def schedules(self):
            s = MyScheduleStore(...)
            s.setup_infrastructure()
            yield s

The materializer part runs the core ``Materializer`` over the store with an in-memory message store: every
occurrence written once, a crash between the writes and the cursor write re-sending the same ids (no-ops), a
second timer losing the conditional write, catch-up after downtime, pause / resume / backfill.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest

from ..errors import InvalidScheduleError
from ..memory import InMemoryDelayedMessageStore
from ..model import DelayedMessage
from ..ports import claim_of
from ..schedules.catchup import CatchUp, CatchUpPolicy
from ..schedules.materializer import Materializer
from ..schedules.model import MessageTemplate, Schedule, ScheduleDefinition, ScheduleState
from ..schedules.operations import backfill, pause, resume
from ..schedules.ports import ScheduleExistsError, ScheduleStore

__all__ = ["ScheduleStoreContract", "hourly"]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def hourly(schedule_id: str = "sched-1", **definition: object) -> Schedule:
    """A schedule firing at minute 0 of every hour from ``T0`` to ``orders``."""
    spec = {"expression": "0 * * * *", "start": T0, **definition}
    body = "héllo ☕".encode()
    template = MessageTemplate("orders", body, {"kind": "report", "note": "café"})
    return Schedule.new(schedule_id, ScheduleDefinition(**spec), template)  # type: ignore[arg-type]


def _h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


class ScheduleStoreContract:
    """Behaviour every schedule store shares; subclasses provide a ``schedules`` fixture yielding an empty store."""

    @pytest.fixture
    def schedules(self) -> ScheduleStore:
        raise NotImplementedError("define a `schedules` fixture that yields a fresh, empty schedule store")

    # -- the store -------------------------------------------------------------

    def test_a_schedule_round_trips_every_field(self, schedules: ScheduleStore) -> None:
        definition = ScheduleDefinition(
            expression="30 2 * * *",
            start=T0,
            zone="America/New_York",
            dst="clamp/both",
            day_match="and",  # type: ignore[arg-type]
            end=_h(24 * 400),
            jitter_seconds=90,
            catch_up=CatchUp(CatchUpPolicy.LATEST, 3600, 7),
        )
        original = Schedule.new("rt-1", definition, MessageTemplate("orders", b"\x00\xff body", {"k": "v ☕"}))
        schedules.create(original)
        assert schedules.get("rt-1") == original
        changed = original.next_version(
            state=ScheduleState.PAUSED, cursor=_h(5), fired=3, missed=2, skipped_paused=1, paused_at=_h(6),
            last_fired=_h(5),
        )  # fmt: skip
        assert schedules.replace(changed, original.version)
        assert schedules.get("rt-1") == changed
        rate = hourly("rt-2", expression="rate(90 minutes)")
        schedules.create(rate)
        assert schedules.get("rt-2") == rate

    def test_an_id_is_one_schedule(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly())
        with pytest.raises(ScheduleExistsError):
            schedules.create(hourly(expression="0 9 * * *"))
        assert schedules.get("sched-1") == hourly()
        assert schedules.get("nope") is None

    def test_replace_is_a_conditional_write(self, schedules: ScheduleStore) -> None:
        s = hourly()
        schedules.create(s)
        first = s.next_version(cursor=_h(1))
        assert schedules.replace(first, s.version) is True
        assert schedules.replace(s.next_version(cursor=_h(2)), s.version) is False  # stale: version moved on
        stored = schedules.get("sched-1")
        assert stored is not None and stored.cursor == _h(1) and stored.version == s.version + 1
        with pytest.raises(ValueError):
            schedules.replace(first.next_version().next_version(), first.version)
        assert schedules.replace(hourly("ghost").next_version(), 1) is False

    def test_two_writers_racing_one_version_one_wins(self, schedules: ScheduleStore) -> None:
        s = hourly()
        schedules.create(s)
        wins: list[bool] = []
        gate = threading.Barrier(8)

        def writer(i: int) -> None:
            gate.wait()
            wins.append(schedules.replace(s.next_version(cursor=_h(i)), s.version))

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(wins) == [False] * 7 + [True]

    def test_due_lists_active_schedules_by_next_at(self, schedules: ScheduleStore) -> None:
        for i, minute in enumerate((30, 10, 20)):
            schedules.create(hourly(f"s-{i}", expression=f"{minute} * * * *"))
        paused = hourly("s-paused", expression="5 * * * *")
        schedules.create(paused)
        schedules.replace(paused.next_version(state=ScheduleState.PAUSED), paused.version)
        ended = hourly("s-ended", expression="at(2030-01-01T00:01Z)")
        schedules.create(ended)
        schedules.replace(ended.next_version(cursor=_h(0.02), next_at=None), ended.version)
        assert [s.schedule_id for s in schedules.due(_h(1), 10)] == ["s-1", "s-2", "s-0"]
        assert [s.schedule_id for s in schedules.due(_h(1), 2)] == ["s-1", "s-2"]
        assert [s.schedule_id for s in schedules.due(T0 + timedelta(minutes=15), 10)] == ["s-1"]

    def test_delete_and_list_pages_in_id_order(self, schedules: ScheduleStore) -> None:
        for i in (3, 1, 2, 4):
            schedules.create(hourly(f"s-{i}"))
        assert [s.schedule_id for s in schedules.list(limit=3)] == ["s-1", "s-2", "s-3"]
        assert [s.schedule_id for s in schedules.list(after="s-3")] == ["s-4"]
        assert schedules.delete("s-2") is True and schedules.delete("s-2") is False
        assert [s.schedule_id for s in schedules.list()] == ["s-1", "s-3", "s-4"]

    # -- the materializer over this store ----------------------------------------

    def test_each_occurrence_is_written_once_with_its_id(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly(jitter_seconds=600))
        messages = InMemoryDelayedMessageStore()
        m = Materializer(schedules, messages, lead_seconds=900)
        for minute in range(0, 6 * 60, 7):  # a pass every 7 minutes for 6 hours
            m.run_once(_h(minute / 60) - timedelta(minutes=20))
        ids = sorted(msg.message_id for msg in messages.fetch_due(_h(100), 1000))
        assert ids == [f"sched-1@2030-01-01T0{h}:00:00Z" for h in range(6)]
        stored = schedules.get("sched-1")
        assert stored is not None and stored.fired == 6 and stored.missed == 0 and stored.cursor == _h(5)

    def test_a_crash_before_the_cursor_write_resends_the_same_messages(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly(jitter_seconds=300))
        messages = InMemoryDelayedMessageStore()

        class Crashing:
            """The schedule store as seen by a timer that dies after its writes, before the cursor write."""

            def __init__(self, inner: ScheduleStore) -> None:
                self.inner = inner

            def __getattr__(self, name: str) -> object:
                return getattr(self.inner, name)

            def replace(self, schedule: Schedule, expected_version: int) -> bool:
                raise RuntimeError("killed between the sends and the cursor write")

        crashed = Materializer(Crashing(schedules), messages, lead_seconds=900)  # type: ignore[arg-type]
        assert crashed.run_once(_h(0) - timedelta(minutes=14)).failures == 1
        pending = {m.message_id: m for m in messages.fetch_due(_h(1), 100)}
        assert list(pending) == ["sched-1@2030-01-01T00:00:00Z"]
        messages = _fresh_with(pending.values())
        report = Materializer(schedules, messages, lead_seconds=900).run_once(_h(0) - timedelta(minutes=13))
        assert report.ids == ["sched-1@2030-01-01T00:00:00Z"] and report.already_pending == 0
        assert [m.message_id for m in messages.fetch_due(_h(1), 100)] == list(pending)  # the same one, once
        again = messages.get("sched-1@2030-01-01T00:00:00Z")
        assert again is None or again == pending["sched-1@2030-01-01T00:00:00Z"]

    def test_a_second_timer_loses_the_conditional_write(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly())
        messages = InMemoryDelayedMessageStore()
        read = schedules.due(_h(1), 10)
        first, second = (
            Materializer(schedules, messages, lead_seconds=900),
            Materializer(schedules, messages, lead_seconds=900),
        )
        from ..schedules.materializer import MaterializeReport

        r1, r2 = MaterializeReport(), MaterializeReport()
        assert first.materialize(read[0], _h(0) - timedelta(minutes=10), r1) is True
        assert second.materialize(read[0], _h(0) - timedelta(minutes=10), r2) is False  # same version read
        assert r2.lost_races == 1 and r2.written == 0
        assert [m.message_id for m in messages.fetch_due(_h(1), 10)] == ["sched-1@2030-01-01T00:00:00Z"]
        stored = schedules.get("sched-1")
        assert stored is not None and stored.fired == 1

    def test_a_pass_that_loses_to_a_pause_cancels_what_it_wrote(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly(expression="*/10 * * * *"))
        messages = InMemoryDelayedMessageStore()
        m = Materializer(schedules, messages, lead_seconds=900)
        [read] = schedules.due(_h(1), 10)  # the timer reads the schedule ...
        pause(schedules, messages, "sched-1", T0 - timedelta(minutes=5))  # ... an operator pauses it ...
        from ..schedules.materializer import MaterializeReport

        report = MaterializeReport()
        assert m.materialize(read, T0 - timedelta(minutes=1), report) is False  # ... the timer's writes lose
        assert report.lost_races == 1 and report.ids == []
        assert len(messages) == 0, "what the losing pass wrote is cancelled: nothing fires while paused"
        stored = schedules.get("sched-1")
        assert stored is not None and stored.state is ScheduleState.PAUSED and stored.fired == 0

    @pytest.mark.parametrize(
        ("policy", "fired_late", "missed"),
        [(CatchUpPolicy.ALL, 24, 48), (CatchUpPolicy.LATEST, 1, 71), (CatchUpPolicy.SKIP, 0, 72)],
    )
    def test_three_days_down_fires_or_records_every_occurrence(
        self, schedules: ScheduleStore, policy: CatchUpPolicy, fired_late: int, missed: int
    ) -> None:
        schedules.create(hourly(catch_up=CatchUp(policy, 86_400 - 1, 1000)))
        messages = InMemoryDelayedMessageStore()
        m = Materializer(schedules, messages, lead_seconds=0)
        recovered = _h(72) - timedelta(minutes=30)  # occurrences 00:00 .. 71:00 were missed (72 of them)
        report = m.run_once(recovered)
        assert report.fired_late == fired_late and report.missed == missed
        ids = [x.message_id for x in messages.fetch_due(recovered, 1000)]
        assert len(ids) == fired_late and len(set(ids)) == fired_late
        stored = schedules.get("sched-1")
        assert stored is not None and stored.missed == missed and stored.fired == fired_late
        assert stored.cursor == _h(71) and stored.next_at == _h(72)
        assert report.missed_ids[0] == "sched-1@2030-01-01T00:00:00Z"
        assert m.run_once(recovered).written == 0  # decided once

    def test_pause_cancels_what_is_materialized_and_resume_counts_the_span(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly(expression="*/10 * * * *"))
        messages = InMemoryDelayedMessageStore()
        m = Materializer(schedules, messages, lead_seconds=900)
        m.run_once(T0 - timedelta(minutes=1))  # 00:00, 00:10 written
        assert len(messages) == 2
        result = pause(schedules, messages, "sched-1", T0 + timedelta(seconds=30))
        assert result.cancelled == ("sched-1@2030-01-01T00:10:00Z",) and len(messages) == 1
        assert m.run_once(_h(1)).written == 0  # paused: nothing written
        resumed = resume(schedules, "sched-1", _h(1) + timedelta(seconds=1))
        assert resumed.state is ScheduleState.ACTIVE and resumed.skipped_paused == 6  # 00:10 .. 01:00
        assert resumed.missed == 0 and resumed.next_at == _h(1) + timedelta(minutes=10)
        assert m.run_once(_h(1) + timedelta(minutes=2)).ids == ["sched-1@2030-01-01T01:10:00Z"]

    def test_resume_counts_what_was_due_before_the_pause_as_missed_not_paused(
        self, schedules: ScheduleStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        schedules.create(hourly())  # no timer ran: 00:00, 01:00, 02:00 were due before the pause, never written
        pause(schedules, InMemoryDelayedMessageStore(), "sched-1", _h(2) + timedelta(minutes=30))
        with caplog.at_level(logging.WARNING, logger="delayed_delivery.schedules"):
            resumed = resume(schedules, "sched-1", _h(4) + timedelta(minutes=1))
        assert (resumed.missed, resumed.skipped_paused) == (3, 2)  # 03:00 and 04:00 fell in the paused span
        assert resumed.cursor == _h(4) + timedelta(minutes=1) and resumed.next_at == _h(5)
        lines = [r for r in caplog.records if getattr(r, "event", None) == "schedule_missed"]
        assert [(r.count, r.occurrence_ids) for r in lines] == [  # type: ignore[attr-defined]
            (3, [f"sched-1@2030-01-01T0{h}:00:00Z" for h in range(3)])
        ]

    def test_resume_with_catch_up_applies_the_policy_to_the_span(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly(catch_up=CatchUp(CatchUpPolicy.LATEST)))
        messages = InMemoryDelayedMessageStore()
        pause(schedules, messages, "sched-1", T0 - timedelta(minutes=1))
        resume(schedules, "sched-1", _h(5) + timedelta(minutes=1), catch_up=True)
        report = Materializer(schedules, messages, lead_seconds=0).run_once(_h(5) + timedelta(minutes=1))
        assert report.ids == ["sched-1@2030-01-01T05:00:00Z"] and report.missed == 5

    def test_backfill_writes_history_and_refuses_what_the_cursor_passed(self, schedules: ScheduleStore) -> None:
        schedules.create(hourly())
        messages = InMemoryDelayedMessageStore()
        Materializer(schedules, messages, lead_seconds=0).run_once(_h(2))  # 00:00 .. 02:00 fired late
        history = backfill(schedules, messages, "sched-1", T0 - timedelta(hours=3), T0, _h(2))
        assert history.written == tuple(f"sched-1@2029-12-31T2{h}:00:00Z" for h in (1, 2, 3))
        with pytest.raises(InvalidScheduleError, match="again"):
            backfill(schedules, messages, "sched-1", T0, _h(2), _h(2))
        for x in messages.fetch_due(_h(3), 100):  # delivered
            messages.remove(x.message_id, claim_of(x))
        again = backfill(schedules, messages, "sched-1", T0, _h(4), _h(4), again=True)
        assert again.written == ("sched-1@2030-01-01T00:00:00Z", "sched-1@2030-01-01T01:00:00Z",
                                 "sched-1@2030-01-01T02:00:00Z")  # fmt: skip
        assert again.left_to_timer == 1  # 03:00 is after the cursor: the timer's
        with pytest.raises(InvalidScheduleError, match="after now"):
            backfill(schedules, messages, "sched-1", T0, _h(9), _h(4))


def _fresh_with(messages: object) -> InMemoryDelayedMessageStore:
    """A message store holding ``messages`` (what survived the crash)."""
    store = InMemoryDelayedMessageStore()
    for message in messages:  # type: ignore[attr-defined]
        assert isinstance(message, DelayedMessage)
        store.store(message)
    return store
