"""boto3 clients for the commands: quick to give up, with a region for local emulators when none is configured."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from delayed_delivery.app.routes.base import LOCAL_REGION
from delayed_delivery.errors import ConfigurationError

__all__ = ["FAIL_FAST", "cli_client", "cli_region"]

#: Client settings of every command: an endpoint that is down or silent fails within seconds, not minutes.
FAIL_FAST: dict[str, Any] = {
    "connect_timeout": 2,
    "read_timeout": 2,
    "retries": {"max_attempts": 2, "mode": "standard"},
}
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def cli_region(endpoint_url: str | None, region: str | None, *, local: bool = False) -> str | None:
    """``region``, else boto's configured one (None: boto finds it), else us-east-1 for a local endpoint."""
    import boto3

    if region is not None or boto3.session.Session().region_name is not None:
        return region
    host = urlparse(endpoint_url).hostname if endpoint_url else None
    if not (local or host in _LOOPBACK):
        raise ConfigurationError("no AWS region: give --region or set AWS_DEFAULT_REGION")
    return LOCAL_REGION  # moto server and other local emulators take any region


def cli_client(
    service: str, endpoint_url: str | None, region: str | None, *, local: bool = False, path_style: bool = False
) -> Any:
    """A boto3 client for a command: quick to give up, us-east-1 on a local endpoint, S3 path-style if asked."""
    import boto3
    from botocore.config import Config

    key = "testing" if local and not os.environ.get("AWS_ACCESS_KEY_ID") else None
    style: dict[str, Any] = {"s3": {"addressing_style": "path"}} if path_style else {}
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint_url,
        region_name=cli_region(endpoint_url, region, local=local),
        aws_access_key_id=key,
        aws_secret_access_key=key,
        config=Config(**FAIL_FAST, **style),
    )
