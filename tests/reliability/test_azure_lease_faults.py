"""Sustained lease races on several shards (Azurite): no double dispatch while leases are healthy; broken and
expired leases are taken over within lease duration + one tick, with nothing lost."""

from __future__ import annotations

import pytest

from tests.fixtures.azurite import Azurite
from tests.reliability.azurelab import CONCURRENCY, LEASE, TICK, lease_fault_soak

pytestmark = pytest.mark.azurite

#: Process start-up and a loaded 2-core machine on top of the bounds.
SLACK = 5.0


def test_four_hosts_racing_for_three_shards_never_dispatch_twice(azurite: Azurite) -> None:
    result = lease_fault_soak(azurite.connection_string, "none", 0, processes=4, shards=3, seconds=12.0, rate=20.0)
    assert result.lost == 0 and result.delivered == result.messages, result
    assert result.duplicates == 0, result


def test_a_broken_lease_is_taken_over_at_once_and_nothing_is_lost(azurite: Azurite) -> None:
    result = lease_fault_soak(azurite.connection_string, "break", 1, processes=3, shards=2, seconds=0, seed=3)
    assert result.injected == 1
    assert result.lost == 0 and result.delivered == result.messages, result
    # the old holder notices at its next renewal (≤ 4 s); someone (maybe itself) acquires within a tick
    assert all(t <= 4.0 + TICK + SLACK for t in result.takeover_seconds), result.takeover_seconds
    # both claim in the table, so neither sends what the other holds: only a send under way when its claim ran out
    # (a machine too slow for the lab's 20 s claims) can repeat, at most CONCURRENCY a break (docs/azure.md)
    assert result.duplicates <= CONCURRENCY * result.injected, result


def test_a_frozen_holder_loses_its_leases_to_another_process_and_sends_at_most_its_in_flight_sends(
    azurite: Azurite,
) -> None:
    result = lease_fault_soak(azurite.connection_string, "stop", 1, processes=3, shards=2, seconds=0, seed=5)
    assert result.injected == 1
    assert result.lost == 0 and result.delivered == result.messages, result
    assert result.taken_by_other == len(result.takeover_seconds) >= 1, result
    assert all(t <= LEASE + TICK + SLACK for t in result.takeover_seconds), result.takeover_seconds
    # after SIGCONT its leases have expired, so keep_going() stops it; but sends frozen between their
    # keep_going() check and the HTTP call still go out (no fencing in Storage Queues): at most the in-flight ones
    assert result.stale_sends <= CONCURRENCY * len(result.takeover_seconds), result
