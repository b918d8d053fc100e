"""Lambda entry point for the FIFO requeue (handler ``functions.aws.requeue.handler``).

Wire it to each ``<queue>-delay.fifo`` with an SQS event source (batch 10, ``ReportBatchItemFailures``).
Nothing is read or created at import time: the first call reads the environment (``AwsConfig.from_env``,
see ``delayed_delivery/aws/config.py``) and builds the in-package handler (``delayed_delivery.aws.requeue.handler``).
"""

from __future__ import annotations

import os
from typing import Any

from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.requeue.handler import LambdaHandler, build_handler

__all__ = ["handler", "reset"]

_handler: LambdaHandler | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda handler; builds (and caches) the in-package handler from the environment on the first call."""
    global _handler
    if _handler is None:
        _handler = build_handler(AwsConfig.from_env(os.environ))
    return _handler(event, context)


def reset() -> None:
    """Forget the cached handler (tests change the environment between runs)."""
    global _handler
    _handler = None
