"""Create and check the time-bucket tier's resources on an emulator or a dev account: the S3 bucket, the ingest
queue with its ``-dlq``, and the error queue (the CDK construct ``infra/aws/buckets.py`` does the same in the cloud).

The bucket gets what the construct gives it: public access blocked, S3-managed encryption, a policy refusing plain
HTTP (only over HTTPS: on a plain-HTTP emulator such as moto server that policy would refuse every request), and
lifecycle rules for debris (incomplete uploads after 1 day, leases after 2 days). ``check_bucket_tier`` reads it
all back and explains each mismatch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ...errors import DestinationNotFoundError
from ..queues import create_queue_with
from ..retention import HOLD_RETENTION_SECONDS, Holding, retention_problem
from ..sqs import translate_error
from .config import INGEST_TIMEOUT_SECONDS, INGEST_WINDOW_SECONDS, BucketTierConfig
from .store import S3Client, translate_s3_error

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeNameType

__all__ = [
    "INGEST_MAX_RECEIVES",
    "INGEST_VISIBILITY_SECONDS",
    "RETENTION_SECONDS",
    "TierResources",
    "check_bucket_tier",
    "dlq_name",
    "ensure_bucket_tier",
]

#: Retention of the ingest queue, its DLQ and the error queue: the SQS maximum, 14 days (``aws.retention``'s rule).
RETENTION_SECONDS = HOLD_RETENTION_SECONDS
#: Receives before an ingest record moves to the DLQ.
INGEST_MAX_RECEIVES = 5
#: The ingest queue's visibility: 6x the ingest function's timeout plus its batching window (Lambda's advice).
INGEST_VISIBILITY_SECONDS = 6 * INGEST_TIMEOUT_SECONDS + INGEST_WINDOW_SECONDS
_PUBLIC_ACCESS_BLOCK = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}
_NO_CONFIGURATION = {
    "NoSuchPublicAccessBlockConfiguration",
    "ServerSideEncryptionConfigurationNotFoundError",
    "NoSuchLifecycleConfiguration",
    "NoSuchBucketPolicy",
}


@dataclass(frozen=True, slots=True)
class TierResources:
    """What ``ensure_bucket_tier`` created or found: the bucket, its prefix and the three queue URLs."""

    bucket_name: str
    prefix: str
    ingest_url: str
    ingest_dlq_url: str
    error_url: str


def dlq_name(ingest_queue: str) -> str:
    """The ingest queue's dead-letter queue: ``<ingest>-dlq``."""
    return f"{ingest_queue}-dlq"


def _lifecycle(prefix: str) -> dict[str, Any]:
    return {
        "Rules": [
            {
                "ID": "AbortIncompleteUploads",
                "Status": "Enabled",
                "Filter": {"Prefix": ""},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
            },
            {
                "ID": "ExpireLeases",
                "Status": "Enabled",
                "Filter": {"Prefix": f"{prefix}/leases/"},
                "Expiration": {"Days": 2},
            },
        ]
    }


def _tls_only(bucket: str) -> str:
    arn = f"arn:aws:s3:::{bucket}"
    statement = {
        "Sid": "DenyPlainHttp",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [arn, f"{arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def _over_tls(s3: S3Client) -> bool:
    """True when the client talks HTTPS: a TLS-only policy on a plain-HTTP emulator would refuse every request."""
    return str(s3.meta.endpoint_url).startswith("https://")


def _ensure_bucket(s3: S3Client, config: BucketTierConfig) -> None:
    """Create the bucket (or keep ours) and set its access block, encryption, TLS policy and lifecycle."""
    name = config.bucket_name
    try:
        region = s3.meta.region_name
        options = {} if region in (None, "us-east-1") else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        try:
            s3.create_bucket(Bucket=name, **options)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
        s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=_PUBLIC_ACCESS_BLOCK)
        s3.put_bucket_encryption(
            Bucket=name,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
        )
        if _over_tls(s3):
            s3.put_bucket_policy(Bucket=name, Policy=_tls_only(name))
        s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration=_lifecycle(config.prefix))
    except (ClientError, BotoCoreError) as exc:
        raise translate_s3_error(exc, f"creating the S3 bucket {name!r}", name) from exc


def ensure_bucket_tier(s3: S3Client, sqs: SQSClient, config: BucketTierConfig) -> TierResources:
    """Create (or reuse) the bucket, the ingest queue with its DLQ, and the error queue; idempotent."""
    _ensure_bucket(s3, config)
    settings = config.settings
    ingest = config.sqs_settings.bucket_ingest_queue
    retention: dict[QueueAttributeNameType, str] = {"MessageRetentionPeriod": str(RETENTION_SECONDS)}
    try:
        dlq_url = create_queue_with(sqs, dlq_name(ingest), retention)  # an existing one must match: one clear error
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": INGEST_MAX_RECEIVES})
        ingest_url = create_queue_with(
            sqs,
            ingest,
            {**retention, "VisibilityTimeout": str(INGEST_VISIBILITY_SECONDS), "RedrivePolicy": redrive},
        )
        # The same attributes as ``ensure_endpoint`` gives it, so the two can run in either order.
        error_url = create_queue_with(sqs, settings.error_queue, retention)
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"creating the time-bucket tier's queues ({ingest!r})") from exc
    return TierResources(config.bucket_name, config.prefix, ingest_url, dlq_url, error_url)


def check_bucket_tier(s3: S3Client, sqs: SQSClient, config: BucketTierConfig) -> list[str]:
    """What is missing or wrong in the tier's bucket and queues, one sentence each (empty: ready)."""
    problems = _check_bucket(s3, config)
    problems += _check_queues(sqs, config)
    return problems


def _s3_read(s3: S3Client, call: str, name: str) -> dict[str, Any] | None:
    """``s3.<call>(Bucket=name)``, or ``None`` when that configuration is not set."""
    try:
        reply: dict[str, Any] = getattr(s3, call)(Bucket=name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in _NO_CONFIGURATION:
            return None
        raise translate_s3_error(exc, f"check bucket {name}", name) from exc
    except BotoCoreError as exc:
        raise translate_s3_error(exc, f"check bucket {name}", name) from exc
    return reply


def _check_bucket(s3: S3Client, config: BucketTierConfig) -> list[str]:
    name = config.bucket_name
    try:
        s3.head_bucket(Bucket=name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchBucket", "NotFound"}:
            return [
                f"S3 bucket {name!r} does not exist: run `delayed-delivery aws create --buckets` or deploy infra/aws"
            ]
        raise translate_s3_error(exc, f"check bucket {name}", name) from exc
    except BotoCoreError as exc:
        raise translate_s3_error(exc, f"check bucket {name}", name) from exc
    problems = []
    block = (_s3_read(s3, "get_public_access_block", name) or {}).get("PublicAccessBlockConfiguration", {})
    if any(block.get(k) is not True for k in _PUBLIC_ACCESS_BLOCK):
        problems.append(
            f"S3 bucket {name!r}: public access is not fully blocked (set all four BlockPublicAccess flags)"
        )
    if _s3_read(s3, "get_bucket_encryption", name) is None:
        problems.append(f"S3 bucket {name!r}: no default encryption (set SSE-S3 or SSE-KMS)")
    policy = (_s3_read(s3, "get_bucket_policy", name) or {}).get("Policy", "")
    if _over_tls(s3) and "aws:SecureTransport" not in policy:
        problems.append(f"S3 bucket {name!r}: no policy denying requests without TLS (aws:SecureTransport false)")
    rules = (_s3_read(s3, "get_bucket_lifecycle_configuration", name) or {}).get("Rules", [])
    if not any(r.get("AbortIncompleteMultipartUpload") and r.get("Status") == "Enabled" for r in rules):
        problems.append(f"S3 bucket {name!r}: no lifecycle rule aborting incomplete multipart uploads")
    leases = f"{config.prefix}/leases/"
    if not any(r.get("Expiration") and (r.get("Filter") or {}).get("Prefix", r.get("Prefix")) == leases for r in rules):
        problems.append(f"S3 bucket {name!r}: no lifecycle rule expiring the lease objects under {leases!r}")
    return problems


def _attributes(sqs: SQSClient, name: str) -> dict[str, str] | None:
    """The queue's attributes, or ``None`` when it does not exist."""
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return {str(k): v for k, v in attributes.items()}
    except (ClientError, BotoCoreError) as exc:
        error = translate_error(exc, name)
        if isinstance(error, DestinationNotFoundError):
            return None
        raise error from exc


def _check_queues(sqs: SQSClient, config: BucketTierConfig) -> list[str]:
    settings = config.settings
    ingest = config.sqs_settings.bucket_ingest_queue
    dlq = dlq_name(ingest)
    problems = []
    error_attributes = _attributes(sqs, settings.error_queue)
    if error_attributes is None:
        problems.append(f"error queue {settings.error_queue!r} does not exist")
    dlq_attributes = _attributes(sqs, dlq)
    if dlq_attributes is None:
        problems.append(f"ingest dead-letter queue {dlq!r} does not exist")
    for kind, name, found in (
        (Holding.ERROR, settings.error_queue, error_attributes),
        (Holding.INGEST_DLQ, dlq, dlq_attributes),
    ):
        said = retention_problem(kind, name, int(found.get("MessageRetentionPeriod", "0"))) if found else None
        problems += [said] if said else []
    attributes = _attributes(sqs, ingest)
    if attributes is None:
        return [*problems, f"ingest queue {ingest!r} does not exist: run `delayed-delivery aws create --buckets`"]
    if attributes.get("FifoQueue", "false").lower() == "true":
        problems.append(f"ingest queue {ingest!r} is a FIFO queue: use a standard queue")
    redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
    target = str(redrive.get("deadLetterTargetArn", ""))
    if not redrive:
        problems.append(
            f"ingest queue {ingest!r} has no redrive policy: records failing every retry are never set aside"
        )
    elif dlq_attributes is not None and target != dlq_attributes.get("QueueArn"):
        problems.append(f"ingest queue {ingest!r} redrives to {target!r}, not to {dlq!r}")
    said = retention_problem(Holding.INGEST, ingest, int(attributes.get("MessageRetentionPeriod", "0")))
    return [*problems, *([said] if said else [])]
