"""The release schedule contract over the ``-delay.fifo`` route's DynamoDB release calendar (on moto server)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

from delayed_delivery.aws.release_calendar import ReleaseCalendar, ensure_release_table
from delayed_delivery.testing.release_contract import OpenSchedule, ReleaseScheduleContract
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

pytestmark = pytest.mark.moto


def _client(endpoint: str) -> DynamoDBClient:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=5, read_timeout=30, retries={"total_max_attempts": 3}),
    )


class TestReleaseCalendar(ReleaseScheduleContract):
    granularity = 1.0  # whole seconds: a second holds its share of the rate, wherever in it they land

    @pytest.fixture
    def open_schedule(self, dynamodb_endpoint: str) -> OpenSchedule:
        table = f"release-{time.monotonic_ns()}"
        ensure_release_table(_client(dynamodb_endpoint), table)
        return lambda rates: ReleaseCalendar(_client(dynamodb_endpoint), table, rates)
