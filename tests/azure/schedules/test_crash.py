"""Crash and race on Azurite: a schedule timer killed in the middle of a pass (its lease left to expire) re-sends at
most the occurrences of the schedule it was writing; two timers racing over the same tables never write one occurrence
id twice, and the dispatcher delivers each once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from delayed_delivery.azure.blob_lease import BlobLease
from delayed_delivery.azure.schedules.timer import AzureScheduleTimer, ScheduleRun
from delayed_delivery.model import DelayedMessage
from delayed_delivery.schedules.occurrences import parse_occurrence_id
from tests.azure.schedules.conftest import Endpoint, rate_schedule, same_shard_ids

pytestmark = pytest.mark.azurite


class Killed(BaseException):
    """The process died (not an error the materializer would catch and count)."""


class KilledAfter:
    """The delays table as seen by a timer that dies after ``writes`` occurrence writes."""

    def __init__(self, inner: Any, writes: int) -> None:
        self.inner = inner
        self.left = writes
        self.written: list[str] = []

    def store(self, message: DelayedMessage) -> None:
        if self.left == 0:
            raise Killed(f"killed before writing {message.message_id}")
        self.inner.store(message)
        self.written.append(message.message_id)
        self.left -= 1


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


def test_a_timer_killed_mid_pass_resends_at_most_the_schedule_it_was_writing(endpoint: Endpoint) -> None:
    ids = same_shard_ids("k", 3)
    for sid in ids:
        endpoint.schedules.create(rate_schedule(sid, endpoint.queue, minutes_ago=3))
    host = endpoint.host
    dying = KilledAfter(host.store, writes=6)  # the second schedule's batch is half written
    timer = DyingTimer(endpoint.schedules, dying, host.container, clock=host.clock, lead_seconds=0, lease_seconds=15)
    with pytest.raises(Killed):
        timer.run()
    killed_schedule = parse_occurrence_id(dying.written[-1])[0]
    first = Counter(endpoint.deliver())  # the dispatcher sends what the dead timer wrote (due now)
    assert set(first) == set(dying.written) and set(first.values()) == {1}
    after = _until_done(endpoint)  # the next timer takes the shard once the lease expires, and replays
    second = Counter(endpoint.deliver())
    delivered = first + second
    again = {i for i, n in delivered.items() if n > 1}
    assert again, "the kill fell after some writes of a batch: those are written and delivered again"
    assert all(parse_occurrence_id(i)[0] == killed_schedule for i in again), again
    assert max(delivered.values()) == 2
    for sid in ids:  # nothing lost: every occurrence up to each cursor delivered
        stored = endpoint.schedules.get(sid)
        assert stored is not None and stored.missed == 0
        mine = sorted(i for i in delivered if i.startswith(f"{sid}@"))
        assert len(mine) == stored.fired >= 3  # the killed schedule's first batch never counted: its cursor stayed
    assert set(after.ids) >= again


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
