"""Fixtures for the S3 time-bucket tier's tests: an S3 client on moto, compressed settings, a created bucket."""

from __future__ import annotations

from typing import Any

import pytest

from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import TierSettings
from tests.fixtures.moto import REGION

#: The S3 bucket ``tier_bucket`` creates.
TIER_BUCKET = "delayed-delivery-tier-test"


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    """A boto3 S3 client talking to the freshly reset moto server."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def sqs_settings() -> SqsSettings:
    """The bucket route to the ingest queue ``ingest``, native cap 2 s (the core settings: error queue ``errors``)."""
    return SqsSettings(max_native_delay=2, fifo_queue_delay=2, long_delay_route="buckets", bucket_ingest_queue="ingest")


@pytest.fixture
def tier_settings() -> TierSettings:
    """Compressed time: fine buckets 1 s, coarse 10 s, dispatch lead 2 s."""
    return TierSettings(bucket_fine_seconds=1, bucket_coarse_seconds=10, bucket_dispatch_lead_seconds=2)


@pytest.fixture
def tier_bucket(s3: Any) -> str:
    """The name of a freshly created S3 bucket on moto."""
    s3.create_bucket(Bucket=TIER_BUCKET)
    return TIER_BUCKET
