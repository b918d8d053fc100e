"""AWS adapters (extra ``aws``): SQS sender, FIFO requeue logic, the SQS transport and local test tooling."""

from __future__ import annotations

from .counting import RequestCounter
from .poller import LocalEventSourcePoller, LocalLambdaContext
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
    "LocalEventSourcePoller",
    "LocalLambdaContext",
    "RecordResult",
    "RequestCounter",
    "SendReceipt",
    "SqsDelayedSender",
    "SqsTransport",
    "check_endpoint",
    "ensure_endpoint",
    "send_delayed",
]
