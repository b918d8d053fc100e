"""Lambda entry point for the time-bucket tier's dispatch workers (handler ``functions.aws.bucket_dispatch.handler``).

Wire it to the tier's dispatch queue with an SQS event source (batch size 1, ``ReportBatchItemFailures``,
``MaximumConcurrency`` = the dispatch concurrency). Nothing is read or created at import time: the first call reads
the environment (``BucketTierConfig.from_env``, see ``delayed_delivery/aws/tier/config.py``) and builds the
in-package handler (``delayed_delivery.aws.tier.worker_handler``).
"""

from __future__ import annotations

from delayed_delivery.aws.lambda_entry import BuiltOnFirstCall
from delayed_delivery.aws.tier.worker_handler import build_dispatch_handler

__all__ = ["handler", "reset"]

#: The Lambda handler; builds (and caches) the in-package handler from the environment on the first call.
handler = BuiltOnFirstCall(build_dispatch_handler)
#: Forget the cached handler (tests change the environment between runs).
reset = handler.reset
