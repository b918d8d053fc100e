"""An in-memory schedule store: a first-class fake for tests, demos and authors of other stores."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from ..clock import utc
from .model import Schedule, ScheduleState
from .ports import ScheduleExistsError, ScheduleStore

__all__ = ["InMemoryScheduleStore"]


class InMemoryScheduleStore(ScheduleStore):
    """Schedules in a dict behind a lock."""

    def __init__(self) -> None:
        self._rows: dict[str, Schedule] = {}
        self._lock = threading.Lock()

    def create(self, schedule: Schedule) -> None:
        """Keep a new schedule; refuse a taken id."""
        with self._lock:
            if schedule.schedule_id in self._rows:
                raise ScheduleExistsError(f"schedule {schedule.schedule_id!r} exists already")
            self._rows[schedule.schedule_id] = schedule

    def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or None."""
        with self._lock:
            return self._rows.get(schedule_id)

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        """The conditional write."""
        if schedule.version != expected_version + 1:
            raise ValueError(f"a write after version {expected_version} stores version {expected_version + 1}")
        with self._lock:
            stored = self._rows.get(schedule.schedule_id)
            if stored is None or stored.version != expected_version:
                return False
            self._rows[schedule.schedule_id] = schedule
            return True

    def due(self, horizon: datetime, limit: int) -> Sequence[Schedule]:
        """Active schedules with ``next_at`` at or before ``horizon``, earliest first."""
        horizon = utc(horizon)
        with self._lock:
            found = [
                s
                for s in self._rows.values()
                if s.state is ScheduleState.ACTIVE and s.next_at is not None and s.next_at <= horizon
            ]
        found.sort(key=lambda s: (s.next_at, s.schedule_id))
        return found[: max(0, limit)]

    def delete(self, schedule_id: str) -> bool:
        """Forget a schedule."""
        with self._lock:
            return self._rows.pop(schedule_id, None) is not None

    def list(self, after: str | None = None, limit: int = 100) -> Sequence[Schedule]:
        """Schedules in id order after ``after``."""
        with self._lock:
            ids = sorted(i for i in self._rows if after is None or i > after)[: max(0, limit)]
            return [self._rows[i] for i in ids]
