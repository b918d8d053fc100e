"""Circuit breakers: repeated failures over time, and a failure-rate breaker for recovery."""

from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import datetime

from . import logfields as lf
from .clock import Clock
from .errors import CircuitBreakerTrippedError
from .ports import CriticalErrorCallback

__all__ = ["FailureRateCircuitBreaker", "RepeatedFailuresCircuitBreaker"]

_log = logging.getLogger("delayed_delivery.breaker")


class RepeatedFailuresCircuitBreaker:
    """Arms on the first failure, trips once failures have lasted ``time_to_trigger`` seconds, resets on success."""

    def __init__(
        self,
        name: str,
        time_to_trigger: float,
        clock: Clock,
        on_trip: CriticalErrorCallback,
        *,
        armed_delay: float = 1.0,
        tripped_delay: float = 10.0,
    ) -> None:
        self.name = name
        self.time_to_trigger = time_to_trigger
        self._clock = clock
        self._on_trip = on_trip
        self._armed_delay = armed_delay
        self._tripped_delay = tripped_delay
        self._armed_since: datetime | None = None
        self._tripped = False
        self._lock = threading.Lock()
        self.trips = 0

    @property
    def armed(self) -> bool:
        """True while failures are being counted."""
        return self._armed_since is not None

    @property
    def tripped(self) -> bool:
        """True after the breaker tripped and before the next success."""
        return self._tripped

    @property
    def failure_delay(self) -> float:
        """How long the caller should pause after a failure."""
        return self._tripped_delay if self._tripped else self._armed_delay

    def success(self) -> None:
        """Record a success: disarm and reset."""
        if self._armed_since is None:
            return
        with self._lock:
            self._armed_since, self._tripped = None, False
        _log.info(
            "circuit breaker %s recovered",
            self.name,
            extra={lf.EVENT: lf.EVENT_BREAKER, lf.BREAKER: self.name, lf.BREAKER_STATE: "closed"},
        )

    def failure(self, error: BaseException) -> None:
        """Record a failure; trip (calling the critical-error callback once) past the configured time."""
        now = self._clock.now()
        with self._lock:
            if self._armed_since is None:
                self._armed_since = now
                _log.warning(
                    "circuit breaker %s armed: %r",
                    self.name,
                    error,
                    extra={lf.EVENT: lf.EVENT_BREAKER, lf.BREAKER: self.name, lf.BREAKER_STATE: "armed"},
                )
            failing_for = (now - self._armed_since).total_seconds()
            trip = not self._tripped and failing_for >= self.time_to_trigger
            if trip:
                self._tripped = True
                self.trips += 1
        if trip:
            tripped = CircuitBreakerTrippedError(self.name, failing_for, error)
            _log.error(
                "%s",
                tripped,
                extra={lf.EVENT: lf.EVENT_BREAKER, lf.BREAKER: self.name, lf.BREAKER_STATE: "tripped"},
            )
            self._on_trip(tripped)


class FailureRateCircuitBreaker:
    """Trips when more than ``max_per_second`` × ``window`` failures happen within ``window`` seconds."""

    def __init__(
        self, name: str, max_per_second: float, window: float, clock: Clock, on_trip: CriticalErrorCallback
    ) -> None:
        self.name = name
        self.threshold = max_per_second * window
        self.window = window
        self._clock = clock
        self._on_trip = on_trip
        self._events: deque[datetime] = deque()
        self._tripped = False
        self._lock = threading.Lock()
        self.trips = 0

    @property
    def tripped(self) -> bool:
        """True while the failure rate stays above the threshold after tripping."""
        return self._tripped

    def record(self, error: BaseException | None = None) -> None:
        """Count one failure now."""
        now = self._clock.now()
        with self._lock:
            self._events.append(now)
            while self._events and (now - self._events[0]).total_seconds() > self.window:
                self._events.popleft()
            count = len(self._events)
            trip = not self._tripped and count > self.threshold
            if trip:
                self._tripped = True
                self.trips += 1
            elif self._tripped and count <= self.threshold:
                self._tripped = False
        if trip:
            tripped = CircuitBreakerTrippedError(self.name, self.window, error)
            _log.error(
                "%s (%d failed deliveries in %.0f s)",
                tripped,
                count,
                self.window,
                extra={lf.EVENT: lf.EVENT_BREAKER, lf.BREAKER: self.name, lf.BREAKER_STATE: "tripped"},
            )
            self._on_trip(tripped)
