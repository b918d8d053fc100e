"""The broker's clock as seen from the requeue function: a lower bound taken from SQS's own ``Date`` headers.

A parked FIFO record comes back with the broker timestamps of the receive *before* its park, so how much time
has passed since then cannot come from the record. The function's own clock could say, but a clock that runs
ahead would then deliver every parked message early by its lead, and one that lags by more than a park would
throw away the time parked (the cycle-forever failure ``planning.remaining_delay`` already guards hops against).
Every SQS response carries a ``Date`` header written by the service (whole seconds, truncated). If a response
dated ``D`` arrives when the local clock reads ``t``, the broker's clock was at least ``D`` at local ``t``:
``D − t`` is a lower bound of the offset between the two clocks. ``BrokerClock`` keeps the largest such bound of
the recent responses (it tightens towards the true offset as responses arrive just after a second turns) and
adds it to the local clock. The result never runs ahead of the broker (so an elapsed time computed from it never
makes a message early), whatever the local clock's offset, and lags it by less than a second plus the response
latency. A broker timestamp known to lie in the past, such as the ``ApproximateFirstReceiveTimestamp`` of a
record received for the first time in the batch at hand, is a bound too, to the millisecond
(``observe_broker_ms``). With no recent bound it reports ``None`` and the caller falls back to the local clock.

Assumption: the clock that dates SQS's responses is the clock that stamps ``SentTimestamp`` and
``ApproximateFirstReceiveTimestamp`` (both are the service's; AWS keeps its fleet synchronised).
"""

from __future__ import annotations

import threading
from collections import deque
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from ..clock import Clock, SystemClock

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["BrokerClock"]

#: How long an offset bound stays usable (a local clock stepped by NTP makes older bounds wrong).
DEFAULT_WINDOW_S = 900.0
#: How many recent bounds are kept.
_KEEP = 64


class BrokerClock:
    """The broker's time, never ahead of it, from the ``Date`` headers of a boto3 SQS client's responses."""

    def __init__(self, clock: Clock | None = None, *, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.clock = clock or SystemClock()
        self.window_ms = int(window_s * 1000)
        self._bounds: deque[tuple[int, int]] = deque(maxlen=_KEEP)  # (local ms when seen, offset lower bound ms)
        self._lock = threading.Lock()

    def attach(self, client: SQSClient) -> BrokerClock:
        """Read the ``Date`` header of every response ``client`` receives; returns ``self`` so it chains."""
        events = getattr(getattr(client, "meta", None), "events", None)
        if events is not None:
            events.register("after-call.sqs", self._after_call)
        return self

    def _after_call(self, http_response: Any = None, **_: Any) -> None:
        headers = getattr(http_response, "headers", None)
        if headers is not None:
            self.observe(headers.get("Date") or headers.get("date"))

    def observe(self, date_header: str | None, local_ms: int | None = None) -> None:
        """Record one response's ``Date`` (RFC 7231), received at ``local_ms`` (default: now on the local clock)."""
        if not date_header:
            return
        try:
            dated = parsedate_to_datetime(date_header)
        except (TypeError, ValueError):
            return
        if dated.tzinfo is None:
            return
        received = self._local_ms() if local_ms is None else local_ms
        with self._lock:
            self._bounds.append((received, int(dated.timestamp()) * 1000 - received))

    def observe_broker_ms(self, broker_ms: int, local_ms: int | None = None) -> None:
        """Record a broker timestamp known to be past (e.g. a first receive's ``ApproximateFirstReceiveTimestamp``)."""
        received = self._local_ms() if local_ms is None else local_ms
        with self._lock:
            self._bounds.append((received, broker_ms - received))

    def offset_ms(self, local_ms: int | None = None) -> int | None:
        """The largest recent lower bound of (broker − local) in ms, or None when no response was seen lately."""
        now = self._local_ms() if local_ms is None else local_ms
        with self._lock:
            recent = [bound for seen, bound in self._bounds if 0 <= now - seen <= self.window_ms]
        return max(recent) if recent else None

    def now_ms(self, local_ms: int | None = None) -> int | None:
        """The broker's time (ms since the epoch, never ahead of it), or None when not calibrated."""
        now = self._local_ms() if local_ms is None else local_ms
        offset = self.offset_ms(now)
        return None if offset is None else now + offset

    def _local_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)
