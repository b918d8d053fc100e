"""Fixtures for the AWS schedules tests: the schedules table on moto server, a manual clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

TABLE = "schedules-test"


def schedule_dynamodb(endpoint_url: str) -> DynamoDBClient:
    """A DynamoDB client on moto with room for a loaded machine (moto answers transactions slowly under load)."""
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=5, read_timeout=60, retries={"mode": "standard", "max_attempts": 3}),
    )


@pytest.fixture
def schedule_db(moto_endpoint: str) -> DynamoDBClient:
    """DynamoDB on the freshly reset moto server."""
    return schedule_dynamodb(moto_endpoint)


@pytest.fixture
def schedule_store(schedule_db: DynamoDBClient) -> DynamoDbScheduleStore:
    """An empty schedules table on moto."""
    store = DynamoDbScheduleStore(schedule_db, TABLE)
    store.setup_infrastructure()
    return store
