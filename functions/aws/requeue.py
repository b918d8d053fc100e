"""Lambda entry point for the FIFO requeue (handler ``functions.aws.requeue.handler``).

Wire it to each ``<queue>-delay.fifo`` with an SQS event source (batch 10, ``ReportBatchItemFailures``).
Nothing is read or created at import time: the first call reads the environment (``AwsConfig.from_env``,
see ``delayed_delivery/aws/config.py``) and builds the in-package handler (``delayed_delivery.aws.requeue.handler``).
"""

from __future__ import annotations

from delayed_delivery.aws.lambda_entry import BuiltOnFirstCall
from delayed_delivery.aws.requeue.handler import build_handler

__all__ = ["handler", "reset"]

#: The Lambda handler; builds (and caches) the in-package handler from the environment on the first call.
handler = BuiltOnFirstCall(build_handler)
#: Forget the cached handler (tests change the environment between runs).
reset = handler.reset
