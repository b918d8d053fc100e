"""delayed-delivery: unrestricted delayed delivery for cloud queues. This package root is stdlib-only."""

from __future__ import annotations

from .clock import Clock, ManualClock, SystemClock
from .cost import SqsCostEstimate, estimate_sqs_cost, fifo_cycle_cost
from .dispatcher import Dispatcher, DispatchReport
from .durations import format_duration, parse_duration, to_seconds
from .errors import (
    CircuitBreakerTrippedError,
    ConfigurationError,
    DelayedDeliveryDisabledError,
    DelayedDeliveryError,
    DestinationNotFoundError,
    InvalidMessageError,
    MessageIdConflictError,
    MessageInFlightError,
    PermanentError,
    TransientError,
)
from .memory import InMemoryDelayedMessageStore, InMemoryTransport
from .model import DelayedMessage, Headers
from .naming import azure_delays_table_name, sqs_delay_queue_name
from .planning import HopAction, HopDecision, SqsPlan, SqsRoute, decide_hop, plan_sqs_delay, remaining_delay
from .ports import (
    CriticalErrorCallback,
    DelayedMessageStore,
    DelayedMessageStoreWithInfrastructure,
    ReschedulableStore,
    Transport,
)
from .settings import DelayedDeliverySettings
from .sqlite_store import SqliteDelayedMessageStore

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """Import optional adapters lazily so the package root stays stdlib-only."""
    if name == "PostgresDelayedMessageStore":
        from .postgres.store import PostgresDelayedMessageStore

        return PostgresDelayedMessageStore
    raise AttributeError(f"module 'delayed_delivery' has no attribute {name!r}")


__all__ = [
    "CircuitBreakerTrippedError",
    "Clock",
    "ConfigurationError",
    "CriticalErrorCallback",
    "DelayedDeliveryDisabledError",
    "DelayedDeliveryError",
    "DelayedDeliverySettings",
    "DelayedMessage",
    "DelayedMessageStore",
    "DelayedMessageStoreWithInfrastructure",
    "DestinationNotFoundError",
    "DispatchReport",
    "Dispatcher",
    "Headers",
    "HopAction",
    "HopDecision",
    "InMemoryDelayedMessageStore",
    "InMemoryTransport",
    "InvalidMessageError",
    "ManualClock",
    "MessageIdConflictError",
    "MessageInFlightError",
    "PermanentError",
    "ReschedulableStore",
    "SqliteDelayedMessageStore",
    "SqsCostEstimate",
    "SqsPlan",
    "SqsRoute",
    "SystemClock",
    "TransientError",
    "Transport",
    "__version__",
    "azure_delays_table_name",
    "decide_hop",
    "estimate_sqs_cost",
    "fifo_cycle_cost",
    "format_duration",
    "parse_duration",
    "plan_sqs_delay",
    "remaining_delay",
    "sqs_delay_queue_name",
    "to_seconds",
]
