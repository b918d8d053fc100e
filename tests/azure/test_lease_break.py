"""A lease broken mid-burst (Azurite, the real ``AzureDispatcherHost``): what the old holder has claimed is not sent
again by the new one.

The old holder is parked in the middle of a batch (one send blocked, the rest of its batch sent but not yet removed)
when its lease is broken from outside. A second host takes the lease at once and drains the rest of the burst while
the first still holds its batch; then the first goes on, finishes and settles its batch, learns of the loss at its
next renewal and stops. Before the lease holder marked its rows in the table, the second host fetched the first's
whole batch again: 99 of 100 were delivered twice here (the issue saw 46 in a soak). Now the marks are the fence:
0 duplicates, 0 lost.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.blob import BlobLeaseClient
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import rows
from delayed_delivery.azure.blob_lease import lease_blob_name
from delayed_delivery.azure.runner import RunSummary
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import RecordingTransport, drain
from tests.azure.test_dispatch import make_host
from tests.azure.test_in_flight import REACH, HostClock, Parking
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

BURST = 300


def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + REACH
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_lease_broken_mid_burst_sends_nothing_twice(azurite: Azurite, queues: QueueServiceClient, queue: str) -> None:
    table = new_name()
    settings = DelayedDeliverySettings(max_concurrency=4, batch_size=100, error_queue=new_name("e"))
    clocks = HostClock(), HostClock()
    old = make_host(
        azurite.connection_string, table, run=600.0, settings=settings, clock=clocks[0], monotonic=clocks[0].monotonic
    )
    new = make_host(
        azurite.connection_string, table, run=600.0, settings=settings, clock=clocks[1], monotonic=clocks[1].monotonic
    )
    ids = [f"m-{i:05d}" for i in range(BURST)]
    first = sorted(ids, key=rows.id_hash)[:100]  # the first batch: due together, so in the order of their hashes
    parking = Parking(old.transport, first[50])
    old.transport = parking  # type: ignore[assignment]
    recording = RecordingTransport(new.transport)
    new.transport = recording  # type: ignore[assignment]
    due = datetime.now(UTC) - timedelta(seconds=1)
    old.store.store_many([DelayedMessage(i, queue, b"x", due) for i in ids])
    summaries: dict[str, RunSummary] = {}
    runners = [
        threading.Thread(target=lambda: summaries.__setitem__("old", old.run()), daemon=True),
        threading.Thread(target=lambda: summaries.__setitem__("new", new.run()), daemon=True),
    ]
    runners[0].start()
    try:
        assert parking.parked.wait(REACH), "the old holder never reached the middle of its first batch"
        lease = BlobLeaseClient(old.container.get_blob_client(lease_blob_name(0)))
        lease.break_lease(lease_break_period=0)  # an operator or another tool breaks it
        runners[1].start()
        _until(lambda: len(recording.sent) >= BURST - 100, "the new holder to send the rest of the burst")
        assert not {m.message_id for m, _ in recording.sent} & set(first), (
            "the new holder sent rows of the old holder's batch"
        )
    finally:
        parking.go.set()
    _until(lambda: old.store.count() == 0, "every row settled")
    for clock in clocks:
        clock.finish()
    for runner in runners:
        runner.join(REACH)
    arrivals = Counter(e.message_id for e in drain(queues, queue))
    assert set(arrivals) == set(ids), "nothing lost"
    assert sum(arrivals.values()) - BURST == 0, f"duplicates: {sorted(m for m, n in arrivals.items() if n > 1)}"
    assert summaries["old"].dispatched + summaries["new"].dispatched == BURST
