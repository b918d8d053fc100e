"""AWS adapters (extra ``aws``): SQS sender, FIFO requeue logic, the SQS transport; local tooling is ``testing.aws``.

The names below are imported on first use (PEP 562), so ``import delayed_delivery.aws.receive`` in a consumer loads
only what parsing one message needs, not the sender, the requeue step or the time-bucket tier.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_QUEUES = frozenset({"EndpointCheck", "EndpointQueues", "check_endpoint", "ensure_endpoint"})
_REQUEUE = frozenset({"FifoRequeuer", "HopOutcome", "RecordResult"})
_SENDER = frozenset({"BatchSendResult", "DelayedSend", "SendReceipt", "SqsDelayedSender", "send_delayed"})


def __getattr__(name: str) -> object:
    """Import a public name from its module on first use."""
    if name in _SENDER:
        from . import sender

        return _keep(name, sender)
    if name in _REQUEUE:
        from . import requeue

        return _keep(name, requeue)
    if name in _QUEUES:
        from . import queues

        return _keep(name, queues)
    if name == "SqsTransport":
        from . import transport

        return _keep(name, transport)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _keep(name: str, home: ModuleType) -> object:
    """``home.name``, kept in this module's namespace so the next lookup is a plain one."""
    value: object = getattr(home, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *__all__})
