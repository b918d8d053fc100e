"""The release schedule contract over the schedule every shard of an Azure table books from (a blob, on Azurite)."""

from __future__ import annotations

from typing import Any

import pytest

from delayed_delivery.azure.release_state import SharedBlobReleaseState
from delayed_delivery.release import SharedStateSchedule
from delayed_delivery.testing.release_contract import OpenSchedule, ReleaseScheduleContract
from tests.azure.conftest import new_name
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


class TestSharedBlobReleaseState(ReleaseScheduleContract):
    @pytest.fixture
    def open_schedule(self, azurite: Azurite) -> OpenSchedule:
        from azure.storage.blob import BlobServiceClient

        container: Any = BlobServiceClient.from_connection_string(azurite.connection_string).create_container(
            new_name()
        )
        return lambda rates: SharedStateSchedule(SharedBlobReleaseState(container, 4), rates)
