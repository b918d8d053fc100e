"""One dispatcher call as it goes (``dispatch_due`` or ``run``): its report, its bounds and when to fetch next.

The bounds are the budget's deadline, ``keep_going`` (e.g. a lease still held) and, within the budget, how many
messages the time left covers at the time per message measured so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .clock import Clock
from .outcomes import DispatchReport

__all__ = ["DispatchRun"]


@dataclass(slots=True)
class DispatchRun:
    """One ``dispatch_due`` (or ``run``) call as it goes: its report, bounds and when to fetch next."""

    report: DispatchReport
    deadline: datetime | None
    keep_going: Callable[[], bool] | None
    wait_for_due: bool
    ahead: timedelta
    may_send: bool = True  # False once ``keep_going`` said no: nothing more is sent
    poll_at: datetime | None = None  # None: fetch at once
    within: bool = False  # the deadline bounds sends too, and no batch is fetched that the time left cannot cover

    def sends_go_on(self, clock: Clock) -> bool:
        """Whether a send may start now (``keep_going``, and the deadline when it bounds sends)."""
        if self.keep_going is not None and not self.keep_going():
            return False
        return not self.within or self.deadline is None or clock.now() < self.deadline

    def fetch_limit(self, now: datetime, batch_size: int, per_message: float) -> int:
        """How many messages the next fetch may take: a batch, or (within the budget) what the time left covers at
        ``per_message`` seconds each (0: not measured yet, a whole batch)."""
        if not self.within or self.deadline is None or per_message <= 0:
            return batch_size
        return max(0, min(batch_size, int((self.deadline - now).total_seconds() / per_message)))

    def bounded(self, seconds: float, clock: Clock) -> float:
        """``seconds``, cut to the time left before the deadline."""
        if self.deadline is None:
            return seconds
        return max(0.0, min(seconds, (self.deadline - clock.now()).total_seconds()))
