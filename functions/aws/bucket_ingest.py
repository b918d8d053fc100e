"""Lambda entry point for the time-bucket tier's ingest (handler ``functions.aws.bucket_ingest.handler``).

Wire it to the tier's ingest queue with an SQS event source (``ReportBatchItemFailures``, a batching window).
Nothing is read or created at import time: the first call reads the environment (``BucketTierConfig.from_env``,
see ``delayed_delivery/aws/tier/config.py``) and builds the in-package handler
(``delayed_delivery.aws.tier.ingest_handler``).
"""

from __future__ import annotations

from delayed_delivery.aws.lambda_entry import BuiltOnFirstCall
from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler

__all__ = ["handler", "reset"]

#: The Lambda handler; builds (and caches) the in-package handler from the environment on the first call.
handler = BuiltOnFirstCall(build_ingest_handler)
#: Forget the cached handler (tests change the environment between runs).
reset = handler.reset
