"""The release schedule contract over the core's in-process planner (``release.ReleasePlanner``)."""

from __future__ import annotations

import pytest

from delayed_delivery.release import ReleasePlanner, ReleaseRates
from delayed_delivery.testing.release_contract import OpenSchedule, ReleaseScheduleContract


class TestReleasePlanner(ReleaseScheduleContract):
    @pytest.fixture
    def open_schedule(self) -> OpenSchedule:
        planners: dict[ReleaseRates, ReleasePlanner] = {}  # one schedule per rates: every handle is the same planner
        return lambda rates: planners.setdefault(rates, ReleasePlanner(rates))
