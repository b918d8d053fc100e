"""Two dispatcher hosts on one table split its shards (Azurite): each takes its share, both dispatch, once.

Both hosts have announced themselves (as their previous runs did); the first starts its run, and only once it holds
shards does the second start: before #34 the first took every free shard and the second got none for the whole run.
A shard left free (its host is gone) is taken beyond the share once the grace is over: nothing is left undispatched.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.blob_lease import lease_blob_name
from delayed_delivery.azure.host_share import ShareGate
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

SHARDS = 4
REACH = 120.0


def _host(azurite: Azurite, table: str, queue: str, run: float) -> AzureDispatcherHost:
    settings = DelayedDeliverySettings(max_concurrency=4, error_queue=f"{queue}e")
    return make_host(azurite.connection_string, table, run=run, shards=SHARDS, settings=settings)


def _leased(blobs: BlobServiceClient, table: str) -> int:
    container = blobs.get_container_client(table)
    states = [container.get_blob_client(lease_blob_name(s)).get_blob_properties().lease.state for s in range(SHARDS)]
    return sum(1 for s in states if s == "leased")


def _held(summary: Any) -> list[int]:
    return [s.shard for s in summary.shards if s.acquisitions]


def test_two_hosts_split_the_shards_both_dispatch_and_nothing_is_lost_or_sent_twice(
    azurite: Azurite, queues: QueueServiceClient, blobs: BlobServiceClient, queue: str
) -> None:
    table = new_name()
    first, second = _host(azurite, table, queue, run=12.0), _host(azurite, table, queue, run=12.0)
    for host in (first, second):  # as their previous runs did
        host.hosts.announce(120.0)
    now = datetime.now(UTC)
    ids = [f"m-{i}" for i in range(200)]
    first.store.store_many(
        [DelayedMessage(mid, queue, b"x", now + timedelta(seconds=i % 8)) for i, mid in enumerate(ids)]
    )

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(first.run)
        deadline = time.monotonic() + REACH
        while _leased(blobs, table) == 0:  # the first host has taken what it takes
            assert time.monotonic() < deadline and not running.done(), "the first host never took a shard"
            time.sleep(0.05)
        time.sleep(0.5)
        later = pool.submit(second.run)
        one, two = running.result(), later.result()

    assert len(_held(one)) == 2 and len(_held(two)) == 2, (_held(one), _held(two))
    assert not set(_held(one)) & set(_held(two)), "each shard to one host"
    assert one.dispatched > 0 and two.dispatched > 0, (one.dispatched, two.dispatched)
    seen = [e.message_id for e in drain(queues, queue)]
    deadline = time.monotonic() + REACH
    while len(seen) < len(ids) and time.monotonic() < deadline:
        seen += [e.message_id for e in drain(queues, queue)]
    assert sorted(seen) == sorted(ids), "every message once: nothing lost, no duplicate without a crash"
    assert one.dispatched + two.dispatched == len(ids)


def test_a_lone_host_takes_every_shard_and_a_gate_opens_past_its_share_after_the_grace() -> None:
    now = [0.0]
    gate = ShareGate.of(4, 2, grace_ends=10.0, monotonic=lambda: now[0])
    assert [gate.reserve() for _ in range(3)] == [True, True, False], "its share: 2 of 4"
    gate.unreserve()
    assert gate.reserve() is True and gate.reserve() is False
    now[0] = 10.0
    assert gate.reserve() is True, "a shard still free after the grace is taken: a dead host's shards go too"
    lone = ShareGate.of(4, 1, grace_ends=10.0, monotonic=lambda: 0.0)
    assert all(lone.reserve() for _ in range(4))
