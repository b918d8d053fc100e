"""``ensure_bucket_tier`` and ``check_bucket_tier`` on moto: the bucket locked down with its lifecycle, the ingest
queue redriving to its ``-dlq``, the error queue; idempotent; every gap named."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.provision import (
    INGEST_MAX_RECEIVES,
    RETENTION_SECONDS,
    check_bucket_tier,
    ensure_bucket_tier,
)
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

BUCKET = "tier-provision"


@pytest.fixture
def config(
    settings: DelayedDeliverySettings, sqs_settings: SqsSettings, tier_settings: TierSettings
) -> BucketTierConfig:
    return BucketTierConfig(
        bucket_name=BUCKET, prefix="dd/tier", settings=settings, sqs_settings=sqs_settings, tier_settings=tier_settings
    )


def _attributes(sqs: SQSClient, url: str) -> dict[str, str]:
    return dict(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"])


def test_ensure_creates_a_locked_down_bucket_and_the_queues(s3: Any, sqs: SQSClient, config: BucketTierConfig) -> None:
    made = ensure_bucket_tier(s3, sqs, config)
    assert (made.bucket_name, made.prefix) == (BUCKET, "dd/tier")
    block = s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"]
    assert block == dict.fromkeys(_BLOCKS, True)
    [rule] = s3.get_bucket_encryption(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    with pytest.raises(s3.exceptions.ClientError, match="NoSuchBucketPolicy"):
        s3.get_bucket_policy(Bucket=BUCKET)  # plain HTTP (moto server): a TLS-only policy would refuse it all
    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]}
    assert rules["AbortIncompleteUploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert rules["ExpireLeases"]["Filter"] == {"Prefix": "dd/tier/leases/"}
    assert rules["ExpireLeases"]["Expiration"]["Days"] == 2
    assert made.ingest_url.endswith("/ingest") and made.ingest_dlq_url.endswith("/ingest-dlq")
    assert made.error_url.endswith("/errors")
    ingest = _attributes(sqs, made.ingest_url)
    dlq_arn = _attributes(sqs, made.ingest_dlq_url)["QueueArn"]
    assert json.loads(ingest["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": INGEST_MAX_RECEIVES,
    }
    assert int(ingest["MessageRetentionPeriod"]) == RETENTION_SECONDS
    assert int(ingest["VisibilityTimeout"]) >= 6 * 60
    assert check_bucket_tier(s3, sqs, config) == []
    S3BucketStore.from_config(s3, config).check()  # the store finds its bucket


def test_ensure_is_idempotent_and_agrees_with_ensure_endpoint(
    s3: Any, sqs: SQSClient, config: BucketTierConfig
) -> None:
    ensure_endpoint(sqs, "orders", config.settings)  # the same error queue, made first by the endpoint
    first = ensure_bucket_tier(s3, sqs, config)
    s3.put_object(Bucket=BUCKET, Key="dd/tier/fine/x.jsonl.gz", Body=b"kept")
    assert ensure_bucket_tier(s3, sqs, config) == first
    assert s3.get_object(Bucket=BUCKET, Key="dd/tier/fine/x.jsonl.gz")["Body"].read() == b"kept"
    ensure_endpoint(sqs, "orders", config.settings)
    assert check_bucket_tier(s3, sqs, config) == []


def test_check_names_every_gap_of_a_bare_bucket_and_missing_queues(
    s3: Any, sqs: SQSClient, config: BucketTierConfig
) -> None:
    bare_bucket(s3, BUCKET)
    problems = check_bucket_tier(s3, sqs, config)
    text = "\n".join(problems)
    expected = [
        "public access is not fully blocked",
        "aborting incomplete multipart uploads",
        "expiring the lease objects under 'dd/tier/leases/'",
        "error queue 'errors' does not exist",
        "ingest dead-letter queue 'ingest-dlq' does not exist",
        "ingest queue 'ingest' does not exist",
    ]
    if _unencrypted(s3, BUCKET):  # moto; AWS (and LocalStack) encrypt every bucket, which no call can undo
        expected.append("no default encryption")
    for problem in expected:
        assert problem in text, (problem, problems)
    assert len(problems) == len(expected)
    assert not any("TLS" in p for p in problems)  # not asked of a plain-HTTP endpoint


def bare_bucket(s3: Any, name: str) -> None:
    """A bucket with public access not blocked: AWS blocks it on a new bucket (since 2023), so unblock it."""
    s3.create_bucket(Bucket=name)
    s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=dict.fromkeys(_BLOCKS, False))


def _unencrypted(s3: Any, name: str) -> bool:
    try:
        s3.get_bucket_encryption(Bucket=name)
    except s3.exceptions.ClientError:
        return True
    return False


_BLOCKS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


class _OverHttps:
    """The moto client, presented as one that talks HTTPS (as against AWS)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.meta = SimpleNamespace(endpoint_url="https://s3.us-east-1.amazonaws.com", region_name="us-east-1")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_over_https_the_bucket_refuses_plain_http_and_check_asks_for_it(
    s3: Any, sqs: SQSClient, config: BucketTierConfig
) -> None:
    s3.create_bucket(Bucket=BUCKET)
    assert any("no policy denying requests without TLS" in p for p in check_bucket_tier(_OverHttps(s3), sqs, config))
    ensure_bucket_tier(_OverHttps(s3), sqs, config)
    [deny] = json.loads(s3.get_bucket_policy(Bucket=BUCKET)["Policy"])["Statement"]
    assert (deny["Effect"], deny["Action"]) == ("Deny", "s3:*")
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]
    assert check_bucket_tier(_OverHttps(s3), sqs, config) == []
    with pytest.raises(s3.exceptions.ClientError, match=r"Forbidden|AccessDenied"):
        s3.put_object(Bucket=BUCKET, Key="dd/tier/fine/x", Body=b"x")  # this client speaks plain HTTP


def test_check_explains_a_wrong_ingest_queue(s3: Any, sqs: SQSClient, config: BucketTierConfig) -> None:
    made = ensure_bucket_tier(s3, sqs, config)
    sqs.delete_queue(QueueUrl=made.ingest_url)
    other = sqs.create_queue(QueueName="elsewhere")["QueueUrl"]
    other_arn = _attributes(sqs, other)["QueueArn"]
    sqs.create_queue(
        QueueName="ingest",
        Attributes={
            "MessageRetentionPeriod": "3600",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": other_arn, "maxReceiveCount": 5}),
        },
    )
    problems = check_bucket_tier(s3, sqs, config)
    assert any("redrives to" in p and "not to 'ingest-dlq'" in p for p in problems), problems
    assert any("MessageRetentionPeriod below" in p for p in problems), problems
    assert len(problems) == 2


def test_a_missing_bucket_is_a_problem_and_a_bad_name_a_configuration_error(
    s3: Any, sqs: SQSClient, config: BucketTierConfig
) -> None:
    problems = check_bucket_tier(s3, sqs, config)
    assert any(f"S3 bucket {BUCKET!r} does not exist" in p for p in problems), problems
    with pytest.raises(ConfigurationError, match="not an S3 bucket name"):
        BucketTierConfig(bucket_name="Not_A_Bucket")
