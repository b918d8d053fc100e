"""The clock port: every component asks it for the time instead of reading the system clock."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "utc"]


def utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime; refuse naive datetimes."""
    from .errors import InvalidMessageError

    if not isinstance(value, datetime):
        raise InvalidMessageError(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidMessageError(
            f"naive datetime {value.isoformat()} is ambiguous: pass a timezone-aware datetime (e.g. tzinfo=UTC)"
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31 23:00 at -05:00 is after the last datetime in UTC
        raise InvalidMessageError(f"{value.isoformat()} is outside the datetime range once in UTC") from None


@runtime_checkable
class Clock(Protocol):
    """Source of time and of waiting."""

    def now(self) -> datetime:
        """Current time as an aware UTC datetime."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds pass; True when the event was set."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """Current wall-clock time in UTC."""
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait for real."""
        return event.wait(max(0.0, timeout))


class ManualClock:
    """A clock that only moves when told to; sleeping and waiting advance it instantly."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = utc(start) if start is not None else datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def now(self) -> datetime:
        """The manual time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Move time forward by ``seconds`` (or timedelta keywords) and return the new time."""
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError("a manual clock only moves forward")
        with self._lock:
            self._now += step
            return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (forward or backward, to model clock faults)."""
        with self._lock:
            self._now = utc(when)

    def sleep(self, seconds: float) -> None:
        """Advance instead of sleeping."""
        self.slept.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Return at once if the event is set; otherwise advance by ``timeout``."""
        if event.is_set():
            return True
        self.sleep(timeout)
        return event.is_set()
