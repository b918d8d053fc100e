"""Lambda entry point for the time-bucket tier's timer (handler ``functions.aws.bucket_timer.handler``).

Wire it to an EventBridge schedule (every minute). Nothing is read or created at import time: the first call reads
the environment (``BucketTierConfig.from_env``, see ``delayed_delivery/aws/tier/config.py``), makes the S3, SQS
and DynamoDB clients and builds the in-package handler (``delayed_delivery.aws.tier.timer_handler``).
"""

from __future__ import annotations

import os
from typing import Any

from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.timer_handler import TimerHandler, build_timer_handler

__all__ = ["handler", "reset"]

_handler: TimerHandler | None = None


def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda handler; builds (and caches) the in-package handler from the environment on the first call."""
    global _handler
    if _handler is None:
        import boto3

        config = BucketTierConfig.from_env(os.environ)
        _handler = build_timer_handler(config, s3=boto3.client("s3"), sqs=boto3.client("sqs"))
    return _handler(event, context)


def reset() -> None:
    """Forget the cached handler (tests change the environment between runs)."""
    global _handler
    _handler = None
