"""Ports: what the dispatcher needs from a store and a transport."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from .errors import CircuitBreakerTrippedError
from .model import DelayedMessage

__all__ = [
    "BatchRemovingStore",
    "CriticalErrorCallback",
    "DelayedMessageStore",
    "DelayedMessageStoreWithInfrastructure",
    "InspectableStore",
    "ReschedulableStore",
    "Transport",
]

#: Called once when a circuit breaker trips; the host decides whether to stop or alert.
CriticalErrorCallback = Callable[[CircuitBreakerTrippedError], None]


@runtime_checkable
class DelayedMessageStore(Protocol):
    """Where delayed messages wait until due (the seed's IDelayedMessageStore, plus batch claims)."""

    def store(self, message: DelayedMessage) -> None:
        """Persist ``message``; storing the same id again replaces it."""
        ...

    def remove(self, message_id: str) -> bool:
        """Delete a message; False when it was already gone."""
        ...

    def increment_failure_count(self, message_id: str) -> bool:
        """Count one failed delivery and release its claim; False when the message is gone."""
        ...

    def next_due(self) -> datetime | None:
        """Earliest time at which some message can be fetched, or None when the store is empty."""
        ...

    def fetch_next_due(self, at: datetime) -> DelayedMessage | None:
        """Claim the earliest message due at ``at``, or return None (default: ``fetch_due(at, 1)``)."""
        found = self.fetch_due(at, 1)
        return found[0] if found else None

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Claim up to ``limit`` messages due at ``at``, earliest first; no two callers get the same one."""
        ...


@runtime_checkable
class DelayedMessageStoreWithInfrastructure(DelayedMessageStore, Protocol):
    """A store that can create its own tables."""

    def setup_infrastructure(self) -> None:
        """Create tables, indexes or containers if missing; safe to call repeatedly."""
        ...


@runtime_checkable
class ReschedulableStore(Protocol):
    """A store that can move a message's due time (used for retry backoff and by operators)."""

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        """Set a new due time and release any claim; False when the message is gone."""
        ...


@runtime_checkable
class BatchRemovingStore(Protocol):
    """A store that removes many messages in one round trip (e.g. one table transaction)."""

    def remove_many(self, message_ids: Sequence[str]) -> Sequence[bool]:
        """Delete each message; one flag per id, False when that message was already gone."""
        ...


@runtime_checkable
class InspectableStore(Protocol):
    """A store operators can look into: backlog by time bucket and single messages."""

    def backlog(self, bucket_seconds: int) -> Sequence[tuple[datetime, int]]:
        """Pending message counts per due-time bucket (bucket start, count), earliest first."""
        ...

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, or None."""
        ...

    def earliest_due(self) -> datetime | None:
        """The earliest due time of any pending message, claimed or not."""
        ...

    def __len__(self) -> int:
        """How many messages are pending."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Sends a due message to its destination queue."""

    def send(self, message: DelayedMessage) -> None:
        """Deliver ``message.body`` and ``message.headers`` to ``message.destination``.

        Raise ``TransientError`` for failures worth retrying and ``PermanentError``
        (e.g. ``DestinationNotFoundError``) for ones that are not.
        """
        ...
