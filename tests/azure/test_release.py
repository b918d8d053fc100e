"""Release control on Azurite: the shards book from one schedule and place messages at their slots with the
visibility timeout (a cap is shared by what each shard has due); the schedule carries over from run to run; a slot
past what the queue can hide waits in the table; uncapped queues beside a capped one are not slowed.

The dispatcher runs on a manual clock (the run's budget too), so a run that places 50 s of slots takes a few seconds
of wall time: the queue's own delays are what Azurite is given (recorded by a wrapper as send time + delay).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import rows
from delayed_delivery.azure.census import take_census
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.release_state import (
    CALENDAR_BLOB,
    decode_schedule,
    encode_schedule,
    read_release_lags,
    release_blob_name,
)
from delayed_delivery.azure.rows import shard_of
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.clock import ManualClock
from delayed_delivery.model import DelayedMessage
from delayed_delivery.naming import azure_delays_table_name
from delayed_delivery.release import busiest_window
from delayed_delivery.settings import DelayedDeliverySettings
from tests.app.cli.conftest import ok_json
from tests.azure.conftest import new_name
from tests.azure.harness import drain, drain_until
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


class Placed:
    """The host's transport, recording when each message becomes visible: send time (manual clock) + delay."""

    def __init__(self, inner: StorageQueueTransport, clock: ManualClock) -> None:
        self.inner = inner
        self.clock = clock
        self.visible: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    @property
    def max_delay_seconds(self) -> int:
        return self.inner.max_delay_seconds

    def send(self, message: DelayedMessage) -> None:
        self.send_delayed(message, 0)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self.inner.send_delayed(message, delay_seconds)
        with self._lock:
            self.visible.append((message.message_id, message.destination, self.clock.now().timestamp() + delay_seconds))

    def at(self, destination: str) -> list[float]:
        return sorted(t for _, d, t in self.visible if d == destination)


def _host(
    azurite: Azurite, clock: ManualClock, shards: int, rates: dict[str, float], table: str | None = None, **kw: Any
) -> AzureDispatcherHost:
    table = table or new_name()
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=azurite.connection_string,
        lease_seconds=15,
        run_seconds=60,
        claim_timeout=120.0,
        shards=shards,
        settings=DelayedDeliverySettings(max_concurrency=8, error_queue=new_name("e"), release_rates=rates),  # type: ignore[arg-type]
    )
    host = AzureDispatcherHost(config, clock=clock, monotonic=lambda: clock.now().timestamp(), **kw)
    host.setup_infrastructure()
    host.transport = Placed(host.transport, clock)  # type: ignore[assignment]
    return host


def _burst(host: AzureDispatcherHost, queue: str, n: int, due: datetime, prefix: str = "m") -> None:
    host.store.store_many([DelayedMessage(f"{prefix}-{i:05d}", queue, b"x", due) for i in range(n)])


def test_shards_share_the_cap_and_place_a_burst_at_its_slots(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, shards=2, rates={queue: 40})
    _burst(host, queue, 400, start)
    summary = host.run(5)  # over before the last slot: the saved schedule still reaches past it
    placed: Placed = host.transport  # type: ignore[assignment]
    times = placed.at(queue)
    assert summary.dispatched == 400 and len(times) == 400 and host.store.count() == 0
    assert busiest_window(times, 10.0) <= 1.05 * 40 * 10 + 100
    finish = times[-1] - start.timestamp()
    assert 400 / 40 * 0.95 <= finish <= 400 / 40 * 1.01, "the shards share the cap: the burst takes N / cap"
    assert min(times) >= start.timestamp(), "never before due"
    assert clock.now() - start <= timedelta(seconds=6), "placed within the run: nothing waits in the dispatcher"
    lags = read_release_lags(host.container, 2, start)
    assert lags[queue] == pytest.approx(finish, abs=0.2)


def test_a_placed_message_stays_invisible_until_its_slot(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    clock = ManualClock(datetime.now(UTC))
    host = _host(azurite, clock, shards=1, rates={queue: 0.5})
    _burst(host, queue, 2, clock.now())
    host.run(10)
    first = drain(queues, queue)
    assert [e.message_id for e in first] == ["m-00000"], "the second slot is 2 s later: still hidden on the queue"
    assert [e.message_id for e in drain_until(queues, queue, expect=1)] == ["m-00001"]


def test_the_schedule_carries_over_to_the_next_run(azurite: Azurite, blobs: BlobServiceClient, queue: str) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, shards=1, rates={queue: 10})
    _burst(host, queue, 100, start, "a")
    host.run(2)
    saved = decode_schedule(
        blobs.get_container_client(host.config.container_name).download_blob(CALENDAR_BLOB).readall().decode()
    )
    assert saved[queue] == pytest.approx(start.timestamp() + 10.0)
    _burst(host, queue, 10, clock.now(), "b")
    host.run(2)
    placed: Placed = host.transport  # type: ignore[assignment]
    second = sorted(t for m, _, t in placed.visible if m.startswith("b-"))
    assert second[0] == pytest.approx(start.timestamp() + 10.0, abs=0.01), "after the first run's slots, not beside"
    assert busiest_window(placed.at(queue), 10.0) <= 1.05 * 10 * 10 + 100


def test_uncapped_queues_beside_a_capped_one_are_not_slowed(azurite: Azurite, queues: QueueServiceClient) -> None:
    capped, free = new_name("q"), new_name("q")
    for name in (capped, free):
        queues.create_queue(name)
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, shards=1, rates={capped: 20})
    _burst(host, capped, 160, start, "c")
    host.store.store_many(
        [DelayedMessage(f"f-{i:03d}", free, b"x", start + timedelta(seconds=1 + i * 0.1)) for i in range(50)]
    )
    host.run(7)
    placed: Placed = host.transport  # type: ignore[assignment]
    assert len(placed.at(capped)) == 160
    due = {f"f-{i:03d}": start.timestamp() + 1 + i * 0.1 for i in range(50)}
    lateness = [t - due[m] for m, d, t in placed.visible if d == free]
    assert len(lateness) == 50 and max(lateness) < 0.2


class Hiding(Placed):
    """``Placed``, with a queue that hides a message for at most ``max_delay_seconds`` (Azure's 7 days, compressed)."""

    def __init__(self, inner: StorageQueueTransport, clock: ManualClock, max_delay: int) -> None:
        super().__init__(inner, clock)
        self.max_delay = max_delay

    @property
    def max_delay_seconds(self) -> int:
        return self.max_delay

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        assert delay_seconds <= self.max_delay, "asked the queue to hide a message longer than it can"
        super().send_delayed(message, delay_seconds)


def test_a_backlog_longer_than_the_queue_can_hide_waits_in_the_table_and_keeps_the_cap(
    azurite: Azurite, queue: str
) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, shards=1, rates={queue: 1.0})
    placed = Hiding(host.transport.inner, clock, max_delay=10)  # type: ignore[attr-defined]
    host.transport = placed  # type: ignore[assignment]
    _burst(host, queue, 30, start)
    host.run(3)
    kept = sorted(rows.due_of_row_key(k) for k in _due_row_keys(host))
    assert kept == [start + timedelta(seconds=k) for k in range(11, 30)], "the rest wait in the table at their slots"
    host.run(40)
    visible = placed.at(queue)
    assert visible == [start.timestamp() + k for k in range(30)], "each visible exactly at its slot, one a second"
    assert busiest_window(visible, 10.0) <= 10 + 1
    assert host.store.count() == 0


def test_a_slot_past_seven_days_is_kept_in_the_table_until_it_comes(azurite: Azurite, queue: str) -> None:
    """The issue's case: a cap of 0.0002/s (121 per 7 days) and 200 due at once. Before, 79 were placed at +7 d."""
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    endpoint = new_name("ep")
    host = _host(azurite, clock, shards=1, rates={queue: 0.0002}, table=azure_delays_table_name(endpoint))
    _burst(host, queue, 200, start)
    summary = host.run(5)
    placed: Placed = host.transport  # type: ignore[assignment]
    step = 5000.0
    assert placed.at(queue) == [start.timestamp() + k * step for k in range(121)], "the ones within 7 days, placed"
    kept = sorted(rows.due_of_row_key(k) for k in _due_row_keys(host))
    assert kept == [start + timedelta(seconds=k * step) for k in range(121, 200)], "the rest keyed by their slots"
    lags = sorted(summary.shards[0].report.release_lag_seconds[queue])
    assert lags == [k * step for k in range(200)], "the release lag reported is the slot that will happen"
    assert read_release_lags(host.container, 1, start)[queue] == pytest.approx(200 * step)
    census = take_census(host.store.table, start)  # the workbook's pending rows and oldest-overdue alert
    assert census.total == 79 and census.oldest_overdue_s == 0 and min(census.by_hour) >= kept[0] - timedelta(hours=1)
    where = ["--cloud", "azure", "--connection-string", azurite.connection_string, "--endpoint", endpoint]
    pending = ok_json("pending", *where, "--by", "day")
    assert pending["pending"] == 79 and datetime.fromisoformat(pending["next_due"]) == kept[0]
    assert pending["oldest_overdue_seconds"] == 0 and pending["claimed_or_retrying"] == 0
    clock.set(start + timedelta(seconds=121 * step))  # a later timer run, when the first kept slot comes
    host.run(2)
    assert placed.at(queue)[-1] == start.timestamp() + 121 * step and len(placed.at(queue)) == 122
    assert busiest_window(placed.at(queue), 7 * 86400.0) <= 0.0002 * 7 * 86400 + 1
    assert host.store.count() == 78


def _due_row_keys(host: AzureDispatcherHost) -> list[str]:
    return [str(e["RowKey"]) for e in host.store.table.query_entities("RowKey ge 'd_' and RowKey lt 'd`'")]


def test_a_burst_that_lands_in_one_partition_gets_the_whole_cap(azurite: Azurite, queue: str) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, shards=4, rates={queue: 40})
    ids = [f"m-{i:05d}" for i in range(2000) if shard_of(f"m-{i:05d}", 4) == 2][:200]
    host.store.store_many([DelayedMessage(i, queue, b"x", start) for i in ids])
    run = host.run_shard(2, start.timestamp() + 3)  # the one shard with rows (the others would book nothing)
    placed: Placed = host.transport  # type: ignore[assignment]
    assert run.report.dispatched == 200
    assert placed.at(queue) == [start.timestamp() + k / 40 for k in range(200)], "the whole cap: 5 s, not 20 s"


def test_the_shared_schedule_continues_after_what_the_shards_booked_on_their_own_before(
    azurite: Azurite, blobs: BlobServiceClient, queue: str
) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, shards=2, rates={queue: 10})
    legacy = start.timestamp() + 30.0  # an earlier version placed shard 1's messages up to 30 s ahead
    container = blobs.get_container_client(host.config.container_name)
    container.upload_blob(release_blob_name(1), encode_schedule(1, 2, start, {queue: legacy}), overwrite=True)
    _burst(host, queue, 10, start)
    host.run(10)  # 2 s sent 8 of the 10 in a loaded CI run
    placed: Placed = host.transport  # type: ignore[assignment]
    times = placed.at(queue)
    assert len(times) == 10 and min(times) >= legacy, ("no slot beside what was placed before", times, legacy)
    assert read_release_lags(host.container, 2, start)[queue] == pytest.approx(30.0 + 10 / 10)


def test_an_operator_may_cancel_or_move_a_row_kept_for_its_slot(table_store: Any) -> None:
    from delayed_delivery.ports import claim_of, slot_of

    due = datetime(2030, 1, 1, tzinfo=UTC)
    slot = due + timedelta(days=9)
    table_store.store_many([DelayedMessage(f"m-{i}", "orders", b"x", due) for i in range(3)])
    view = table_store.for_shards([0], exclusive=True)
    batch = view.fetch_due(due, 10)
    assert list(view.defer([(m.message_id, slot, claim_of(m) or "") for m in batch])) == [True] * 3
    assert table_store.get("m-0") == DelayedMessage("m-0", "orders", b"x", due), "its own due time is kept"
    assert table_store.remove("m-0") is True, "kept for its slot is not in flight"
    assert table_store.reschedule("m-1", slot) is True  # to the very time it waits for: now simply due then
    assert table_store.reschedule("m-2", due + timedelta(days=1)) is True
    back = {m.message_id: m for m in view.fetch_due(slot, 10)}
    assert back["m-1"].due_at == slot and slot_of(back["m-1"]) is None
    assert back["m-2"].due_at == due + timedelta(days=1) and slot_of(back["m-2"]) is None
    assert set(back) == {"m-1", "m-2"}
