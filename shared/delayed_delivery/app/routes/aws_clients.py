"""boto3 clients for the commands: quick to give up, with a region for local emulators when none is configured."""

from __future__ import annotations

import os
from functools import cache
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


def _on_this_machine(endpoint_url: str | None, local: bool) -> bool:
    """Whether the endpoint is an emulator here (``--local``, or a loopback URL)."""
    host = urlparse(endpoint_url).hostname if endpoint_url else None
    return local or host in _LOOPBACK


@cache
def _known_regions() -> frozenset[str]:
    """The regions AWS has for SQS, from botocore's endpoint data (parsed once a process: it is large)."""
    import boto3

    session = boto3.session.Session()
    return frozenset(r for p in session.get_available_partitions() for r in session.get_available_regions("sqs", p))


def cli_region(endpoint_url: str | None, region: str | None, *, local: bool = False) -> str | None:
    """``region``, else boto's configured one (None: boto finds it), else us-east-1 for a local endpoint.

    On an emulator here a region AWS does not have is refused in one line (moto answers it with a 500 page).
    """
    import boto3

    session = boto3.session.Session()
    if region is not None and _on_this_machine(endpoint_url, local):
        known = _known_regions()
        if known and region not in known:
            raise ConfigurationError(
                f"unknown AWS region {region!r}: the emulators serve the regions AWS has (e.g. {LOCAL_REGION}, "
                "eu-west-1); give one of those to --region or AWS_DEFAULT_REGION"
            )
    if region is not None or session.region_name is not None:
        return region
    if not _on_this_machine(endpoint_url, local):
        raise ConfigurationError("no AWS region: give --region or set AWS_DEFAULT_REGION")
    return LOCAL_REGION  # moto server and other local emulators take any region


def cli_client(
    service: str, endpoint_url: str | None, region: str | None, *, local: bool = False, path_style: bool = False
) -> Any:
    """A boto3 client for a command: quick to give up, us-east-1 on a local endpoint, S3 path-style if asked.

    On an emulator here (``--local`` or a loopback ``--endpoint-url``) without AWS credentials in the environment it
    uses the dummy ``testing`` ones, as emulators take any.
    """
    import boto3
    from botocore.config import Config

    dummy = _on_this_machine(endpoint_url, local) and not os.environ.get("AWS_ACCESS_KEY_ID")
    key = "testing" if dummy else None
    style: dict[str, Any] = {"s3": {"addressing_style": "path"}} if path_style else {}
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint_url,
        region_name=cli_region(endpoint_url, region, local=local),
        aws_access_key_id=key,
        aws_secret_access_key=key,
        config=Config(**FAIL_FAST, **style),
    )
