"""SIGKILL of the Azure lease holder among racing dispatcher-host processes (Azurite)."""

from __future__ import annotations

import pytest

from tests.fixtures.azurite import Azurite
from tests.reliability.azurelab import LEASE, TICK, lease_kill_soak

pytestmark = pytest.mark.azurite

#: Process start-up and a loaded 2-core machine on top of lease duration + one tick.
SLACK = 5.0


def test_killed_lease_holder_is_replaced_within_lease_plus_a_tick_and_nothing_is_lost(azurite: Azurite) -> None:
    result = lease_kill_soak(azurite.connection_string, kills=1, processes=3, seed=2)
    assert result.holder_kills == 1
    assert result.lost == 0
    assert result.delivered == result.messages
    assert all(t <= LEASE + TICK + SLACK for t in result.takeover_seconds), result.takeover_seconds
    # only rows the dead holder had claimed can be sent twice (at most its batch of in-flight sends)
    assert result.duplicates <= 8, result
