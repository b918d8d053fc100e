"""delayed-delivery: unrestricted delayed delivery for cloud queues. This package root is stdlib-only.

The names below are imported on first use (PEP 562), so importing one module of the package (a Lambda handler's,
a consumer's receive helper) loads that module and what it imports, not the dispatcher, the stores and the cost
model too; a deploy asset holds only what its entry points import (``assets``).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_CLOCK = frozenset({"Clock", "ManualClock", "SystemClock"})
_COST = frozenset({"SqsCostEstimate", "estimate_sqs_cost", "fifo_cycle_cost"})
_DISPATCHER = frozenset({"Dispatcher", "DispatchReport"})
_DURATIONS = frozenset({"format_duration", "parse_duration", "to_seconds"})
_ERRORS = frozenset(
    {
        "CircuitBreakerTrippedError",
        "ConfigurationError",
        "DelayedDeliveryDisabledError",
        "DelayedDeliveryError",
        "DestinationNotFoundError",
        "InvalidMessageError",
        "MessageIdConflictError",
        "MessageInFlightError",
        "PermanentError",
        "TransientError",
    }
)
_MEMORY = frozenset({"InMemoryDelayedMessageStore", "InMemoryTransport"})
_MODEL = frozenset({"DelayedMessage", "Headers"})
_NAMING = frozenset({"azure_delays_table_name", "sqs_delay_queue_name"})
_PLANNING = frozenset(
    {"HopAction", "HopDecision", "SqsPlan", "SqsRoute", "decide_hop", "plan_sqs_delay", "remaining_delay"}
)
_PORTS = frozenset(
    {
        "CriticalErrorCallback",
        "DelayedMessageStore",
        "DelayedMessageStoreWithInfrastructure",
        "ReschedulableStore",
        "Transport",
    }
)
_SETTINGS = frozenset({"DelayedDeliverySettings"})
_SQLITE_STORE = frozenset({"SqliteDelayedMessageStore"})


def __getattr__(name: str) -> object:
    """Import a public name from its module on first use; the PostgreSQL store only when asked for (extra)."""
    if name in _CLOCK:
        from . import clock

        return _keep(name, clock)
    if name in _COST:
        from . import cost

        return _keep(name, cost)
    if name in _DISPATCHER:
        from . import dispatcher

        return _keep(name, dispatcher)
    if name in _DURATIONS:
        from . import durations

        return _keep(name, durations)
    if name in _ERRORS:
        from . import errors

        return _keep(name, errors)
    if name in _MEMORY:
        from . import memory

        return _keep(name, memory)
    if name in _MODEL:
        from . import model

        return _keep(name, model)
    if name in _NAMING:
        from . import naming

        return _keep(name, naming)
    if name in _PLANNING:
        from . import planning

        return _keep(name, planning)
    if name in _PORTS:
        from . import ports

        return _keep(name, ports)
    if name in _SETTINGS:
        from . import settings

        return _keep(name, settings)
    if name in _SQLITE_STORE:
        from . import sqlite_store

        return _keep(name, sqlite_store)
    if name == "PostgresDelayedMessageStore":
        from .postgres import store

        return _keep(name, store)
    raise AttributeError(f"module 'delayed_delivery' has no attribute {name!r}")


def _keep(name: str, home: ModuleType) -> object:
    """``home.name``, kept in this module's namespace so the next lookup is a plain one."""
    value: object = getattr(home, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *__all__})


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
