"""The time-bucket tier in ``delayed-delivery aws create`` and ``aws check``: its options and the two steps."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from delayed_delivery.app.routes.aws_clients import cli_client
from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import (
    BUCKET_NAME_ENV,
    BUCKET_PREFIX_ENV,
    DEFAULT_PREFIX,
    BucketTierConfig,
    TierSettings,
)

__all__ = [
    "DEFAULT_BUCKET",
    "BucketName",
    "BucketPrefix",
    "BucketsFlag",
    "check_tier",
    "create_tier",
    "has_tier",
    "tier_config",
]

#: The bucket ``aws create --buckets`` makes when neither --bucket-name nor DELAYED_DELIVERY_BUCKET_NAME names one.
DEFAULT_BUCKET = "delayed-delivery-buckets"

BucketsFlag = Annotated[
    bool | None,
    typer.Option(
        "--buckets/--no-buckets",
        help="Include the S3 time-bucket tier (bucket, ingest queue and its -dlq). Default: on when "
        "DELAYED_DELIVERY_LONG_DELAY_ROUTE is auto (the default) or buckets; under auto, check looks at the tier "
        "only when its ingest queue exists (auto sends through the -delay.fifo queue without it).",
        show_default=False,
    ),
]
BucketName = Annotated[
    str | None,
    typer.Option(
        "--bucket-name",
        envvar=BUCKET_NAME_ENV,
        help=f"The tier's S3 bucket (default {DEFAULT_BUCKET}).",
        show_default=False,
    ),
]
BucketPrefix = Annotated[
    str | None,
    typer.Option(
        "--bucket-prefix",
        envvar=BUCKET_PREFIX_ENV,
        help=f"Key prefix of the tier's objects (default {DEFAULT_PREFIX}).",
    ),
]


def tier_config(
    enabled: bool | None, bucket_name: str | None, prefix: str | None, config: AwsConfig
) -> BucketTierConfig | None:
    """The tier's configuration when it is included (``--buckets``, or the route says so), else ``None``."""
    if enabled is None:
        enabled = config.sqs_settings.long_delay_route != "fifo"
    if not enabled:
        return None
    return BucketTierConfig(
        bucket_name=(bucket_name or "").strip() or DEFAULT_BUCKET,
        prefix=(prefix or "").strip() or DEFAULT_PREFIX,
        settings=config.settings,
        sqs_settings=config.sqs_settings,
        tier_settings=TierSettings.from_env(os.environ),
    )


def has_tier(sqs: Any, sqs_settings: SqsSettings) -> bool:
    """Whether the tier's ingest queue exists (``aws create`` or the CDK made it); ``auto`` needs it for the tier.

    A queue SQS denies or does not know counts as absent; an unreachable endpoint is its one translated error."""
    from botocore.exceptions import BotoCoreError, ClientError

    from delayed_delivery.aws.sqs import translate_error

    name = sqs_settings.bucket_ingest_queue
    try:
        sqs.get_queue_url(QueueName=name)
    except ClientError:
        return False
    except BotoCoreError as exc:
        raise translate_error(exc, f"the time-bucket tier's ingest queue {name!r}") from exc
    return True


def _clients(endpoint_url: str | None, region: str | None, local: bool) -> tuple[Any, Any]:
    """S3 and SQS clients; moto serves S3 on the SQS port, AWS_ENDPOINT_URL_S3 splits them."""
    s3 = cli_client("s3", os.environ.get("AWS_ENDPOINT_URL_S3") or endpoint_url, region, local=local)
    return s3, cli_client("sqs", endpoint_url, region, local=local)


def create_tier(
    config: BucketTierConfig, endpoint_url: str | None, region: str | None, local: bool = False
) -> dict[str, str]:
    """Create the bucket, the ingest queue and its DLQ, and the error queue; what was made, for the JSON output."""
    from delayed_delivery.aws.tier.provision import ensure_bucket_tier

    made = ensure_bucket_tier(*_clients(endpoint_url, region, local), config)
    return {
        "bucket": made.bucket_name,
        "bucket_prefix": made.prefix,
        "ingest": made.ingest_url,
        "ingest_dlq": made.ingest_dlq_url,
    }


def check_tier(
    config: BucketTierConfig, endpoint_url: str | None, region: str | None, local: bool = False
) -> list[str]:
    """The tier's problems (empty: ready)."""
    from delayed_delivery.aws.tier.provision import check_bucket_tier

    return check_bucket_tier(*_clients(endpoint_url, region, local), config)
