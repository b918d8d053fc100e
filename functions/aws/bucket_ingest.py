"""Lambda entry point for the time-bucket tier's ingest (handler ``functions.aws.bucket_ingest.handler``).

Wire it to the tier's ingest queue with an SQS event source (``ReportBatchItemFailures``, a batching window).
Nothing is read or created at import time: the first call reads the environment (``BucketTierConfig.from_env``,
see ``delayed_delivery/aws/tier/config.py``) and builds the in-package handler
(``delayed_delivery.aws.tier.ingest_handler``).
"""

from __future__ import annotations

import os
from typing import Any

from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.ingest_handler import LambdaHandler, build_ingest_handler

__all__ = ["handler", "reset"]

_handler: LambdaHandler | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda handler; builds (and caches) the in-package handler from the environment on the first call."""
    global _handler
    if _handler is None:
        _handler = build_ingest_handler(BucketTierConfig.from_env(os.environ))
    return _handler(event, context)


def reset() -> None:
    """Forget the cached handler (tests change the environment between runs)."""
    global _handler
    _handler = None
