"""The dispatcher on Azurite: the timer function, lateness, racing dispatchers, lease loss and takeover, poison rows."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.blob import BlobLeaseClient, BlobServiceClient
from azure.storage.queue import QueueServiceClient

import functions.azure.function_app as function_app
from delayed_delivery.azure import function_host
from delayed_delivery.azure.blob_lease import lease_blob_name
from delayed_delivery.azure.config import AzureClients, AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.errors import DestinationNotFoundError, TransientError
from delayed_delivery.headers import FAILURE_COUNT, FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import RecordingTransport, drain, fire_timer, timer_schedule
from tests.fixtures.azurite import Azurite
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.azurite


def make_host(
    conn: str, table: str, *, error_queue: str = "error", lease: int = 15, run: float = 5.0, **kw: Any
) -> AzureDispatcherHost:
    settings = kw.pop("settings", None) or DelayedDeliverySettings(max_concurrency=8, error_queue=error_queue)
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        lease_seconds=lease,
        run_seconds=run,
        claim_timeout=30.0,
        shards=kw.pop("shards", 1),
        settings=settings,
    )
    host = AzureDispatcherHost(config, **kw)
    host.setup_infrastructure()
    return host


def msg(i: int, queue: str, due: datetime, **kw: Any) -> DelayedMessage:
    return DelayedMessage(f"m-{i}", queue, f"body {i}".encode(), due, **kw)


def test_timer_function_dispatches_due_rows_and_keeps_future_ones(
    azurite: Azurite, queues: QueueServiceClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_name()
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", azurite.connection_string)
    monkeypatch.setenv("DELAYED_DELIVERY_TABLE_NAME", table)
    monkeypatch.setenv("DELAYED_DELIVERY_CONTAINER_NAME", table)
    monkeypatch.setenv("DELAYED_DELIVERY_RUN_SECONDS", "3")
    monkeypatch.setenv("DELAYED_DELIVERY_LEASE_SECONDS", "15")
    monkeypatch.setenv("DELAYED_DELIVERY_ERROR_QUEUE", new_name("e"))
    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING", raising=False)
    assert timer_schedule(function_app, "dispatch_delayed_messages") == "0 * * * * *"
    function_host.host_from_settings.cache_clear()
    try:
        host = function_host.host()
        host.setup_infrastructure()
        now = datetime.now(UTC)
        host.store.store_many([msg(i, queue, now - timedelta(seconds=i)) for i in range(20)])
        host.store.store(msg(99, queue, now + timedelta(days=400)))
        started = time.monotonic()
        fire_timer(function_app, "dispatch_delayed_messages")
        elapsed = time.monotonic() - started
    finally:
        function_host.host_from_settings.cache_clear()
    got = drain(queues, queue)
    assert sorted(e.message_id for e in got) == sorted(f"m-{i}" for i in range(20))
    assert {e.body for e in got} == {f"body {i}".encode() for i in range(20)}
    assert host.store.count() == 1 and host.store.get("m-99") is not None
    assert 2.5 <= elapsed < 15, "the run lasts its budget (keeps polling), not longer"


def test_rows_falling_due_during_a_run_are_sent_within_about_a_second_never_early(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    host = make_host(azurite.connection_string, new_name(), run=6.0)
    recorder = RecordingTransport(host.transport)
    host.transport = recorder  # type: ignore[assignment]
    start = datetime.now(UTC)
    dues = {f"m-{i}": start + timedelta(seconds=1.0 + i * 0.15) for i in range(25)}
    host.store.store_many([DelayedMessage(mid, queue, b"x", due) for mid, due in dues.items()])
    summary = host.run()
    assert summary.dispatched == 25
    lateness = [(sent - dues[m.message_id]).total_seconds() for m, sent in recorder.sent]
    assert min(lateness) >= 0, "never early"
    assert max(lateness) < 3.0, f"about one poll late at most: {sorted(lateness)[-3:]}"
    assert len(drain(queues, queue)) == 25


def test_racing_dispatchers_share_one_lease_with_zero_double_dispatch(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    hosts = [
        make_host(
            azurite.connection_string,
            table,
            run=5.0,
            clients=AzureClients.create(
                AzureDelayedDeliveryConfig(table, table, connection_string=azurite.connection_string)
            ),
        )
        for _ in range(3)
    ]
    now = datetime.now(UTC)
    hosts[0].store.store_many([msg(i, queue, now + timedelta(seconds=(i % 20) * 0.15)) for i in range(150)])
    summaries: list[Any] = [None] * len(hosts)

    def run(n: int) -> None:
        summaries[n] = hosts[n].run()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = [e.message_id for e in drain(queues, queue)]
    duplicates = {k: v for k, v in Counter(ids).items() if v > 1}
    assert not duplicates, f"double dispatch: {duplicates}"
    assert len(ids) == 150
    assert sum(s.dispatched for s in summaries) == 150
    assert sum(1 for s in summaries if s.shards[0].acquisitions) >= 1
    assert hosts[0].store.count() == 0


def test_lease_loss_mid_run_stops_dispatching_at_once(
    azurite: Azurite, blobs: BlobServiceClient, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    host = make_host(azurite.connection_string, table, run=7.0, renew_every=0.3)
    recorder = RecordingTransport(host.transport)
    host.transport = recorder  # type: ignore[assignment]
    start = datetime.now(UTC)
    host.store.store_many([msg(i, queue, start + timedelta(seconds=0.5 + i * 0.1)) for i in range(60)])
    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(host.run()))
    runner.start()
    assert wait_for(lambda: len(recorder.sent) >= 5), "the host sends before its lease is broken"
    blob = blobs.get_blob_client(table, lease_blob_name(0))
    BlobLeaseClient(blob).break_lease(lease_break_period=0)
    usurper = BlobLeaseClient(blob)
    usurper.acquire(lease_duration=60)  # someone else holds it now: the host must stop and stay stopped
    broken_at = datetime.now(UTC)
    runner.join(30)
    usurper.release()
    (summary,) = result
    after = [(sent - broken_at).total_seconds() for _, sent in recorder.sent if sent > broken_at]
    assert summary.shards[0].lease_lost == 1
    assert max(after, default=0.0) < 1.5, f"kept sending after losing the lease: {after}"
    assert 0 < len(recorder.sent) < 60
    assert host.store.count() == 60 - len(recorder.sent), "what was not sent is still in the table"


def test_takeover_within_lease_duration_plus_one_tick_after_the_holder_dies(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    dead = make_host(azurite.connection_string, table)
    holder = dead.lease(0)
    assert holder.try_acquire()
    holder.abandon()  # crashed: never renews, never releases
    died = datetime.now(UTC)
    heir = make_host(azurite.connection_string, table, run=15 + 3.5)
    recorder = RecordingTransport(heir.transport)
    heir.transport = recorder  # type: ignore[assignment]
    heir.store.store(msg(1, queue, died))
    summary = heir.run()
    assert summary.dispatched == 1
    ((_, sent),) = recorder.sent
    waited = (sent - died).total_seconds()
    assert 13.0 <= waited <= 15 + 1 + 2.5, f"takeover after {waited:.1f} s (lease 15 s)"


def test_poison_rows_go_to_the_error_queue_with_the_reason(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    error_queue = new_name("e")
    settings = DelayedDeliverySettings(
        error_queue=error_queue, number_of_retries=1, retry_backoff=0.2, max_concurrency=4, failure_delay=0.1
    )
    host = make_host(azurite.connection_string, new_name(), settings=settings, run=4.0)
    flaky = new_name("f")
    queues.create_queue(flaky)
    recorder = RecordingTransport(
        host.transport, fail=lambda m: TransientError("throttled") if m.destination == flaky else None
    )
    host.transport = recorder  # type: ignore[assignment]
    now = datetime.now(UTC)
    missing = new_name("gone")
    host.store.store_many(
        [msg(1, queue, now), msg(2, missing, now), msg(3, flaky, now), msg(4, queue, now + timedelta(seconds=1))]
    )
    summary = host.run()
    assert summary.moved_to_error_queue == 2
    assert sorted(e.message_id for e in drain(queues, queue)) == ["m-1", "m-4"]
    errors = {e.message_id: e for e in drain(queues, error_queue)}
    assert set(errors) == {"m-2", "m-3"}
    assert errors["m-2"].headers[ORIGINAL_DESTINATION] == missing
    assert DestinationNotFoundError.__name__ in errors["m-2"].headers[FAILURE_REASON]
    assert errors["m-2"].headers[FAILURE_COUNT] == "1", "a permanent failure is not retried"
    assert errors["m-3"].headers[FAILURE_COUNT] == "2", "one retry, then the error queue"
    assert "throttled" in errors["m-3"].headers[FAILURE_REASON]
    assert host.store.count() == 0


def test_off_switch_makes_the_function_do_nothing(
    azurite: Azurite, queues: QueueServiceClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_name()
    on = make_host(azurite.connection_string, table)
    on.store.store(msg(1, queue, datetime.now(UTC) - timedelta(seconds=5)))
    for key, value in {
        "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "DELAYED_DELIVERY_TABLE_NAME": table,
        "DELAYED_DELIVERY_CONTAINER_NAME": table,
        "DELAYED_DELIVERY_ENABLED": "false",
    }.items():
        monkeypatch.setenv(key, value)
    function_host.host_from_settings.cache_clear()
    try:
        started = time.monotonic()
        fire_timer(function_app, "dispatch_delayed_messages")
        assert time.monotonic() - started < 2
        assert function_host.host().run().enabled is False
    finally:
        function_host.host_from_settings.cache_clear()
    assert drain(queues, queue) == []
    assert on.store.count() == 1


def test_shards_spread_rows_and_each_gets_its_own_lease(
    azurite: Azurite, blobs: BlobServiceClient, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    host = make_host(azurite.connection_string, table, shards=3, run=3.0)
    now = datetime.now(UTC)
    host.store.store_many([msg(i, queue, now) for i in range(60)])
    per_shard = [host.store.for_shards([s]).fetch_due(now, 100) for s in range(3)]
    assert all(per_shard) and sum(len(p) for p in per_shard) == 60, "every shard got some rows"
    for part in per_shard:
        for m in part:
            host.store.increment_failure_count(m.message_id)  # release the claims
    names = {b.name for b in blobs.get_container_client(table).list_blobs()}
    assert names == {"shard-000", "shard-001", "shard-002"}
    summary = host.run()
    assert [s.shard for s in summary.shards] == [0, 1, 2]
    assert all(s.acquisitions == 1 and s.report.dispatched > 0 for s in summary.shards)
    assert len(drain(queues, queue)) == 60
