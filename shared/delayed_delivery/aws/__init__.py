"""AWS adapters (extra ``aws``): SQS sender, FIFO requeue logic, the SQS transport; local tooling is ``testing.aws``."""

from __future__ import annotations

from .queues import EndpointCheck, EndpointQueues, check_endpoint, ensure_endpoint
from .requeue import FifoRequeuer, HopOutcome, RecordResult
from .sender import BatchSendResult, DelayedSend, SendReceipt, SqsDelayedSender, send_delayed
from .transport import SqsTransport

__all__ = [
    "BatchSendResult",
    "DelayedSend",
    "EndpointCheck",
    "EndpointQueues",
    "FifoRequeuer",
    "HopOutcome",
    "RecordResult",
    "SendReceipt",
    "SqsDelayedSender",
    "SqsTransport",
    "check_endpoint",
    "ensure_endpoint",
    "send_delayed",
]
