"""Crash and race on Azurite: a schedule timer killed at any point of a pass (its lease left to expire) writes
nothing twice: the next pass finds each occurrence's marker, whether the occurrence is still pending or was sent in
between; two timers racing over the same tables never write one occurrence id twice, and the dispatcher delivers
each once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from delayed_delivery.azure.blob_lease import BlobLease
from delayed_delivery.azure.schedules import rows
from delayed_delivery.azure.schedules.occurrence_rows import OccurrenceRows
from delayed_delivery.azure.schedules.timer import AzureScheduleTimer, ScheduleRun
from delayed_delivery.model import DelayedMessage
from delayed_delivery.schedules.materializer import Materializer, MaterializeReport
from delayed_delivery.schedules.model import Schedule
from delayed_delivery.schedules.occurrences import parse_occurrence_id
from tests.azure.schedules.conftest import Endpoint, rate_schedule, same_shard_ids

pytestmark = pytest.mark.azurite


class Killed(BaseException):
    """The process died (not an error the materializer would catch and count)."""


class KilledAfter:
    """The timer's occurrence writer as seen by a timer that dies after ``writes`` occurrence writes."""

    def __init__(self, inner: OccurrenceRows, writes: int) -> None:
        self.inner = inner
        self.left = writes
        self.written: list[str] = []

    def _count(self, message: DelayedMessage) -> None:
        if self.left == 0:
            raise Killed(f"killed before writing {message.message_id}")
        self.left -= 1

    def store(self, message: DelayedMessage) -> None:
        self._count(message)
        self.inner.store(message)
        self.written.append(message.message_id)

    def store_occurrence(self, message: DelayedMessage, keep_until: datetime) -> None:
        self._count(message)
        self.inner.store_occurrence(message, keep_until)
        self.written.append(message.message_id)


class KilledAtCursor:
    """A schedule store whose cursor write kills the timer, before it is stored or right after."""

    def __init__(self, inner: Any, *, after: bool) -> None:
        self.inner = inner
        self.after = after

    def due(self, until: datetime, limit: int) -> Any:
        return self.inner.due(until, limit)

    def get(self, schedule_id: str) -> Any:
        return self.inner.get(schedule_id)

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        if not self.after:
            raise Killed("killed before the cursor write")
        self.inner.replace(schedule, expected_version)
        raise Killed("killed after the cursor write")


class DyingTimer(AzureScheduleTimer):
    """A timer whose leases are abandoned, never released: what a killed process leaves behind."""

    def lease(self, shard: int) -> BlobLease:
        lease = super().lease(shard)
        lease.release = lease.abandon  # type: ignore[method-assign]
        return lease


def _until_done(endpoint: Endpoint, seconds: float = 90.0) -> ScheduleRun:
    """Timer runs until no shard is leased elsewhere (the dead holder's lease expired), within a deadline."""
    total = ScheduleRun()
    deadline = time.monotonic() + seconds
    while True:
        run = endpoint.timer().run()
        total.ids.extend(run.ids)
        total.fired += run.fired
        if run.shards_skipped_leased == 0:
            return total
        assert time.monotonic() < deadline, "the dead timer's lease never expired"
        time.sleep(1.0)


def test_a_timer_killed_mid_pass_sends_nothing_twice(endpoint: Endpoint) -> None:
    ids = same_shard_ids("k", 3)
    for sid in ids:
        endpoint.schedules.create(rate_schedule(sid, endpoint.queue, minutes_ago=3))
    host = endpoint.host
    dying = KilledAfter(OccurrenceRows(host.store), writes=6)  # the second schedule's batch is half written
    timer = DyingTimer(endpoint.schedules, dying, host.container, clock=host.clock, lead_seconds=0, lease_seconds=15)
    with pytest.raises(Killed):
        timer.run()
    killed_schedule = parse_occurrence_id(dying.written[-1])[0]
    first = Counter(endpoint.deliver())  # the dispatcher sends what the dead timer wrote (due now)
    assert set(first) == set(dying.written) and set(first.values()) == {1}
    assert endpoint.schedules.get(killed_schedule).fired == 0  # type: ignore[union-attr]  # its cursor stayed
    after = _until_done(endpoint)  # the next timer takes the shard once the lease expires, and plans them again
    second = Counter(endpoint.deliver())
    delivered = first + second
    assert {i for i, n in delivered.items() if n > 1} == set(), "an occurrence sent twice"
    assert set(after.ids) & set(first), "the next pass planned the sent occurrences again (and wrote nothing)"
    for sid in ids:  # nothing lost: every occurrence up to each cursor delivered, once
        stored = endpoint.schedules.get(sid)
        assert stored is not None and stored.missed == 0
        mine = sorted(i for i in delivered if i.startswith(f"{sid}@"))
        assert len(mine) == stored.fired >= 3


def test_a_kill_at_every_point_between_the_writes_sends_each_occurrence_once(endpoint: Endpoint) -> None:
    """One schedule with four occurrences due (catch-up: all); the timer dies before its k-th row write (k = 0..4),
    before its cursor write, or right after it; the dispatcher runs; then a pass recovers. Each occurrence is
    delivered exactly once, whatever was sent in between."""
    host = endpoint.host
    rows_store = OccurrenceRows(host.store)
    points: list[tuple[str, int | None, bool]] = [(f"p{k}", k, False) for k in range(4)]
    points += [("pc", None, False), ("pa", None, True)]
    for name, writes, after_cursor in points:
        (sid,) = same_shard_ids(f"every-{name}", 1)
        endpoint.schedules.create(rate_schedule(sid, endpoint.queue, minutes_ago=3))
        view = endpoint.schedules.for_shards([rows.shard_of(sid)])
        if writes is not None:
            dying: Any = Materializer(view, KilledAfter(rows_store, writes), lead_seconds=0)
        else:
            dying = Materializer(KilledAtCursor(view, after=after_cursor), rows_store, lead_seconds=0)
        now = datetime.now(UTC)
        with pytest.raises(Killed):
            dying.materialize(view.get(sid), now, MaterializeReport())
        first = Counter(i for i in endpoint.deliver() if i.startswith(f"{sid}@"))
        recovered = Materializer(view, rows_store, lead_seconds=0).run_once(datetime.now(UTC))
        assert recovered.failures == 0
        second = Counter(i for i in endpoint.deliver() if i.startswith(f"{sid}@"))
        delivered = first + second
        stored = view.get(sid)
        assert stored is not None
        assert set(delivered.values()) == {1}, (name, delivered)
        assert len(delivered) == stored.fired >= 4, (name, delivered, stored.fired)


def test_two_timers_racing_never_write_one_occurrence_id_twice(endpoint: Endpoint) -> None:
    ids = [f"race-{i}" for i in range(12)]
    for sid in ids:
        endpoint.schedules.create(rate_schedule(sid, endpoint.queue, minutes_ago=3))
    runs: list[ScheduleRun] = []
    gate = threading.Barrier(2)

    def race() -> None:
        timer = endpoint.timer(lead=300)
        gate.wait()
        runs.append(timer.run())

    threads = [threading.Thread(target=race) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    a, b = runs
    assert not set(a.ids) & set(b.ids), "an occurrence id written by both timers"
    assert a.lost_races == b.lost_races == 0
    written = set(a.ids) | set(b.ids)
    assert len(written) == a.fired + b.fired >= 12 * 8
    delivered = Counter(endpoint.deliver())
    assert set(delivered.values()) == {1} and set(delivered) <= written
    assert {i.split("@")[0] for i in delivered} == set(ids)
