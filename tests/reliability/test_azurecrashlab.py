"""The Azure crash lab at CI size (``azurecrashlab.py``): placer and dispatchers killed at their requests, transport
faults on puts, deletes, table transactions and lease renewals, a lease broken mid-burst, operators racing placement."""

from __future__ import annotations

import pytest

from tests.fixtures.azurite import Azurite
from tests.reliability.azurecrashlab import EPISODES, soak

pytestmark = pytest.mark.azurite

#: The targets every tick reaches (the main paths of a burst), so a few dozen faults need no quiet ticks.
CI_TARGETS = (
    *(
        f"crash_{when}:{role}.{step}"
        for role in ("placer", "dispatcher")
        for step in ("claim", "put")
        for when in ("before", "after")
    ),
    "crash_before:placer.record",
    "crash_after:placer.record",
    "crash_before:dispatcher.delete",
    "crash_after:dispatcher.delete",
    "crash_after:lease.renew",
    "reset_after:placer.record",
    "timeout_after:placer.put",
    "reset_after:dispatcher.put",
    "throttled_503:placer.put",
    "throttled_503:dispatcher.delete",
    "reset_after:dispatcher.delete",
    "reset_before:placer.claim",
    "reset_after:placer.claim",
    "throttled_503:lease.renew",
    *EPISODES,
)


def test_placer_and_dispatchers_dying_and_failing_at_their_requests_lose_nothing(own_azurite: Azurite) -> None:
    result = soak(own_azurite.connection_string, faults=len(CI_TARGETS), seed=5, name="cilab", timeout=600,
                  targets=CI_TARGETS)  # fmt: skip
    figures = f"{result.faults_by_kind} {result.crashes_by_point} unreached {result.unreached} {result.diagnoses}"
    # each target fired (a cycle over them all; one not reached within its quiet ticks is left for the next cycle)
    fired = set(result.faults_by_kind) | set(result.crashes_by_point)
    assert fired | set(result.unreached) == set(CI_TARGETS) and len(fired) >= len(CI_TARGETS) - 2, figures
    assert result.faults >= len(CI_TARGETS), figures
    assert result.lost == 0, figures
    assert result.certain_cancels_delivered == 0 and result.cancels_certain >= 1, figures
    assert result.early == 0 and result.stale_after_reschedule == 0, figures
    assert result.error_queue == 0, figures
    assert result.unexplained == [] and result.unlogged_copies == 0, figures
    assert sum(result.duplicates_by_cause.values()) == result.duplicates, figures
    # a crash repeats at most what its life had put and not recorded: a placement batch, or a dispatcher's batch being
    # sent and the one being removed beside it
    assert max(result.duplicates_per_crash, default=0) <= 2 * 50, result.duplicates_per_crash
    # every message arrived but those an operator cancelled with certainty
    assert result.delivered == result.messages - result.cancels_certain, figures
