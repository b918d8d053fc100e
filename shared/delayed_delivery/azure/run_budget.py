"""The time left in a dispatcher host's run and in each send, which caps the queue client's retries (``BudgetedRetry``).

The queue SDK waits 15 s before its first retry of a 503 (then 18, 24 s): inside a timer run of 50 s that alone
could carry a run past its budget. While a run is on, every back-off is capped by the time left, and nothing is
retried once it is over (the dispatcher counts the failure and the row is sent by a later run).

A send has its own bound (``send_within``, the transport's ``send_timeout``): a retry starts only while a whole attempt
(connection and read timeouts) still fits before it, so a put ends, done or failed, within the claim it was started
under (the dispatcher starts none its claim cannot outlast).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["RunBudget", "SendBound"]


@dataclass(frozen=True, slots=True)
class SendBound:
    """How long a queue put may take: each attempt (its connection and read timeouts) and the whole send."""

    send_timeout: float
    connect_timeout: float
    read_timeout: float

    @property
    def attempt(self) -> float:
        """The longest one attempt takes (connecting, then waiting for the answer)."""
        return self.connect_timeout + self.read_timeout

    @property
    def server_timeout(self) -> int:
        """The timeout the service itself applies to a put (whole seconds, 1 to 30): it gives up when we do."""
        return max(1, min(30, int(self.read_timeout)))


class RunBudget:
    """When the current run ends (on a monotonic clock), or None outside a run; and the current thread's send."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: float | None = None
        self._monotonic: Callable[[], float] = time.monotonic
        self._send = threading.local()

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

    @contextmanager
    def send_within(self, seconds: float, attempt: float) -> Iterator[None]:
        """This thread's calls inside the block form one send that must end within ``seconds`` (real time); each of
        its attempts may take ``attempt`` seconds (the connection and read timeouts)."""
        self._send.ends, self._send.attempt = time.monotonic() + seconds, attempt
        try:
            yield
        finally:
            self._send.ends = None

    def retry_room(self) -> float | None:
        """Seconds this thread's send may still wait before one more attempt (< 0: no attempt fits), or None outside
        a send."""
        ends = getattr(self._send, "ends", None)
        return None if ends is None else ends - time.monotonic() - self._send.attempt
