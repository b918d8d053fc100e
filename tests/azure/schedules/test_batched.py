"""The Azure timer writes in entity-group transactions (Azurite): rows and markers 33 occurrences a transaction,
cursors 33 schedules a transaction; a timer killed between two transactions of a pass (rows, or cursors) repeats
nothing and loses nothing once the next timer takes the shard."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from delayed_delivery.azure.schedules.occurrence_rows import OccurrenceRows
from delayed_delivery.azure.schedules.store import TableScheduleStore
from delayed_delivery.testing.request_counter import counting_requests
from tests.azure.schedules.conftest import Endpoint, rate_schedule, same_shard_ids
from tests.azure.schedules.test_crash import DyingTimer, Killed, _until_done

pytestmark = pytest.mark.azurite


def _kind(request: Any) -> str:
    url = str(request.url)
    if "$batch" in url:
        return "transaction"
    if request.method == "GET" and "RowKey=" in url and "$filter" not in url:
        return "point read"
    return "other"


def _create(endpoint: Endpoint, prefix: str, count: int) -> list[str]:
    """``count`` schedules of one shard, each with four or five occurrences due (catch-up: all)."""
    ids = same_shard_ids(prefix, count)
    for sid in ids:
        endpoint.schedules.create(rate_schedule(sid, endpoint.queue, minutes_ago=3))
    return ids


def _deliver(endpoint: Endpoint, count: int, seconds: float = 180.0) -> Counter[str]:
    """Dispatcher runs until ``count`` distinct ids were delivered (within a deadline), then one more run."""
    delivered: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    while len(delivered) < count and time.monotonic() < deadline:
        delivered.update(endpoint.deliver())
    delivered.update(endpoint.deliver())  # a copy sent late would show here
    return delivered


def _fired(endpoint: Endpoint, ids: Iterable[str]) -> int:
    return sum(endpoint.schedules.get(sid).fired for sid in ids)  # type: ignore[union-attr]


def _each_once_and_counted(endpoint: Endpoint, ids: Iterable[str], delivered: Counter[str]) -> None:
    """Every id delivered once, and each schedule's delivered occurrences are exactly those its cursor counts."""
    assert {i for i, n in delivered.items() if n > 1} == set(), "an occurrence sent twice"
    for sid in ids:
        stored = endpoint.schedules.get(sid)
        assert stored is not None and stored.missed == 0
        mine = [i for i in delivered if i.startswith(f"{sid}@")]
        assert len(mine) == stored.fired >= 4, (sid, mine, stored.fired)


def test_a_pass_writes_33_occurrences_and_33_cursors_a_transaction(endpoint: Endpoint) -> None:
    """Before: one transaction per occurrence and one per cursor (330 or more here), a point read per schedule,
    about 3 requests an occurrence."""
    ids = _create(endpoint, "n", 66)
    with counting_requests(_kind) as counts:
        run = endpoint.timer().run()
    assert run.failures == 0 and run.lost_races == 0 and run.fired >= 66 * 4
    # the delays table's partitions (its shards) each take 33 occurrences a transaction; 66 cursors take 2
    most = endpoint.host.store.shards * math.ceil(run.fired / 33 / endpoint.host.store.shards + 1) + 2
    assert counts["transaction"] <= most, (counts, run.fired)
    assert counts["point read"] <= 2, counts  # the 66 rows are read by a range read (before: 66 point reads)
    assert sum(counts.values()) / run.fired < 0.5, (counts, run.fired)  # leases, queries, transactions
    _each_once_and_counted(endpoint, ids, _deliver(endpoint, run.fired))


class _KilledAfterGroups(OccurrenceRows):
    """The timer's occurrence writer in a process that dies before its ``groups + 1``-th transaction."""

    def __init__(self, inner: OccurrenceRows, groups: int) -> None:
        super().__init__(inner.store_port)
        self.left = groups
        self.written: list[str] = []

    def _submit(self, ops: list[Any]) -> None:
        if self.left == 0:
            raise Killed("killed between two occurrence transactions")
        self.left -= 1
        super()._submit(ops)
        self.written += [str(e["MessageId"]) for _, e, _ in ops if str(e["RowKey"]).startswith("o_")]


def test_a_kill_between_two_occurrence_transactions_repeats_nothing_and_loses_nothing(endpoint: Endpoint) -> None:
    ids = _create(endpoint, "ko", 40)  # 160 or more occurrences: five transactions or more
    host = endpoint.host
    dying = _KilledAfterGroups(OccurrenceRows(host.store), groups=2)
    timer = DyingTimer(endpoint.schedules, dying, host.container, clock=host.clock, lead_seconds=0, lease_seconds=15)
    with pytest.raises(Killed):
        timer.run()
    assert len(dying.written) == 66  # two whole transactions of 33
    first = _deliver(endpoint, len(dying.written))  # the dispatcher sends what the dead timer wrote
    assert set(first) == set(dying.written) and set(first.values()) == {1}
    assert all(endpoint.schedules.get(sid).fired == 0 for sid in ids)  # type: ignore[union-attr]  # no cursor moved
    after = _until_done(endpoint)  # the next timer plans the same ids again: the written ones are no-ops
    assert set(dying.written) <= set(after.ids)
    _each_once_and_counted(endpoint, ids, first + _deliver(endpoint, _fired(endpoint, ids) - len(first)))


class _KilledAfterCursorGroups(TableScheduleStore):
    """The schedules as seen by a timer that dies before its ``groups + 1``-th cursor transaction."""

    def __init__(self, inner: TableScheduleStore, left: list[int], **kwargs: Any) -> None:
        super().__init__(inner.table, **kwargs)
        self.left = left

    def for_shards(self, shards: Iterable[int], *, reports_skipped: bool = False) -> TableScheduleStore:
        return _KilledAfterCursorGroups(self, self.left, shards=shards, reports_skipped=reports_skipped)

    def _submit(self, ops: list[Any]) -> None:
        if self.left[0] == 0:
            raise Killed("killed between two cursor transactions")
        self.left[0] -= 1
        super()._submit(ops)


def test_a_kill_between_two_cursor_transactions_repeats_nothing_and_loses_nothing(endpoint: Endpoint) -> None:
    ids = _create(endpoint, "kc", 70)  # three cursor transactions: 33, 33, 4
    host = endpoint.host
    dying_view = _KilledAfterCursorGroups(endpoint.schedules, [1])
    timer = DyingTimer(dying_view, OccurrenceRows(host.store), host.container, clock=host.clock, lead_seconds=0,
                       lease_seconds=15)  # fmt: skip
    with pytest.raises(Killed):
        timer.run()
    moved = [sid for sid in ids if endpoint.schedules.get(sid).fired]  # type: ignore[union-attr]
    assert len(moved) == 33  # the first transaction's cursors landed, together
    first = _deliver(endpoint, 70 * 4)  # every occurrence of the 70 was written before any cursor moved
    assert set(first.values()) == {1}
    _until_done(endpoint)  # the other 37 planned again: their rows found by their markers, their cursors moved
    _each_once_and_counted(endpoint, ids, first + _deliver(endpoint, _fired(endpoint, ids) - len(first)))
