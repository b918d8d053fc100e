"""The time left in a dispatcher host's run, which caps the queue client's retry back-offs (``BudgetedRetry``).

The queue SDK waits 15 s before its first retry of a 503 (then 18, 24 s): inside a timer run of 50 s that alone
could carry a run past its budget. While a run is on, every back-off is capped by the time left, and nothing is
retried once it is over (the dispatcher counts the failure and the row is sent by a later run).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["RunBudget"]


class RunBudget:
    """When the current run ends (on a monotonic clock), or None outside a run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: float | None = None
        self._monotonic: Callable[[], float] = time.monotonic

    def start(self, ends_at: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        """A run is on until ``ends_at`` (on ``monotonic``)."""
        with self._lock:
            self._ends, self._monotonic = ends_at, monotonic

    def end(self) -> None:
        """The run is over: back-offs are the SDK's again."""
        with self._lock:
            self._ends = None

    def left(self) -> float | None:
        """Seconds left in the run (≤ 0 once over), or None outside a run."""
        with self._lock:
            ends, monotonic = self._ends, self._monotonic
        return None if ends is None else ends - monotonic()
