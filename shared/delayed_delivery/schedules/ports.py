"""The schedule store port, and where occurrences are written (any store, or a dispatcher that notifies its loop)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..errors import InvalidMessageError
from ..model import DelayedMessage
from .model import Schedule

__all__ = ["MessageCanceller", "MessageWriter", "OccurrenceSink", "ScheduleExistsError", "ScheduleStore"]


class ScheduleExistsError(InvalidMessageError):
    """A schedule with this id exists already."""


@runtime_checkable
class ScheduleStore(Protocol):
    """Where schedules live; every change is a conditional write on ``version``."""

    def create(self, schedule: Schedule) -> None:
        """Keep a new schedule; ``ScheduleExistsError`` when the id is taken."""
        ...

    def get(self, schedule_id: str) -> Schedule | None:
        """The schedule with this id, or None."""
        ...

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        """Store ``schedule`` (its version is ``expected_version + 1``) only if the stored one has
        ``expected_version``; False when another writer got there first (or the schedule is gone)."""
        ...

    def due(self, horizon: datetime, limit: int) -> Sequence[Schedule]:
        """Up to ``limit`` active schedules whose ``next_at`` is at or before ``horizon``, earliest first."""
        ...

    def delete(self, schedule_id: str) -> bool:
        """Forget a schedule; False when it was gone."""
        ...

    def list(self, after: str | None = None, limit: int = 100) -> Sequence[Schedule]:
        """Schedules in id order, after the id ``after`` (paging), at most ``limit``."""
        ...


@runtime_checkable
class MessageWriter(Protocol):
    """Takes an occurrence as a delayed message: a store, or a ``Dispatcher`` (which also wakes its loop)."""

    def store(self, message: DelayedMessage) -> None:
        """Keep ``message``; the same message again is a no-op (the id policy)."""
        ...


@runtime_checkable
class OccurrenceSink(Protocol):
    """A writer that also remembers written occurrences: writing one again is a no-op even after it was sent."""

    def store_occurrence(self, message: DelayedMessage, keep_until: datetime) -> None:
        """Keep ``message`` unless this occurrence id was written before (remembered at least until ``keep_until``)."""
        ...


@runtime_checkable
class MessageCanceller(Protocol):
    """Cancels a waiting message by id (every store's operator cancel)."""

    def remove(self, message_id: str) -> bool:
        """Delete it; False when gone; ``MessageInFlightError`` while a dispatcher sends it."""
        ...
