"""Blob leases on Azurite: exclusivity, release, renewal failure stops at once, re-acquiring one's own lease."""

from __future__ import annotations

import time

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.storage.blob import BlobServiceClient

from delayed_delivery.azure.blob_lease import BlobLease
from tests.azure.conftest import new_name
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.azurite


def test_one_holder_at_a_time_and_release_frees_it(blobs: BlobServiceClient) -> None:
    container = blobs.get_container_client(new_name())
    first, second = BlobLease(container, 3, duration=15), BlobLease(container, 3, duration=15)
    first.setup_infrastructure()
    assert first.try_acquire() and first.keep_going()
    assert second.try_acquire() is False and not second.keep_going()
    assert BlobLease(container, 4, duration=15).try_acquire(), "another shard is another lease"
    first.release()
    assert not first.keep_going()
    assert second.try_acquire()
    second.release()


def test_renewal_keeps_it_and_a_failed_renewal_stops_at_once(blobs: BlobServiceClient) -> None:
    container = blobs.get_container_client(new_name())
    lease = BlobLease(container, duration=15, renew_every=0.2)
    lease.setup_infrastructure()
    assert lease.try_acquire()
    assert wait_for(lambda: lease.renewals >= 2) and lease.keep_going()
    client = lease._client
    assert client is not None

    def fail(**_: object) -> None:
        raise ServiceRequestError("network blip")

    client.renew = fail  # type: ignore[method-assign]
    deadline = time.monotonic() + 3
    while lease.keep_going() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not lease.keep_going(), "renewal failed: stop dispatching"
    assert lease.try_acquire(), "the lease is still ours: re-acquired at once with the same lease id"
    assert lease.keep_going()
    lease.release()


def test_keep_going_turns_false_when_renewals_fall_behind(blobs: BlobServiceClient) -> None:
    now = [0.0]
    container = blobs.get_container_client(new_name())
    lease = BlobLease(container, duration=15, renew_every=10, monotonic=lambda: now[0])
    lease.setup_infrastructure()
    assert lease.try_acquire() and lease.keep_going()
    now[0] = 12.9
    assert lease.keep_going()
    now[0] = 13.0  # duration minus the 2 s margin, without a renewal: the lease may be gone
    assert not lease.keep_going()
    lease.release()
