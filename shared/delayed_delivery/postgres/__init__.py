"""PostgreSQL store and batch mover (extra ``postgres``): see docs/postgres.md."""

from __future__ import annotations

from .mover import DelayingTransport, MoveReport, PollSchedule, PostgresBatchMover, native_delay_seconds
from .notify import DueListener, waking
from .queue import PostgresQueueTransport, QueuedMessage
from .store import PostgresDelayedMessageStore

__all__ = [
    "DelayingTransport",
    "DueListener",
    "MoveReport",
    "PollSchedule",
    "PostgresBatchMover",
    "PostgresDelayedMessageStore",
    "PostgresQueueTransport",
    "QueuedMessage",
    "native_delay_seconds",
    "waking",
]
