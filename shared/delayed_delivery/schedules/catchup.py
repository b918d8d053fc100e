"""Catch-up after downtime: which missed occurrences fire late, and which are recorded as missed.

The schedule last materialized the occurrence at ``cursor``; the timer recovers at ``R``. The missed occurrences are
those in ``(cursor, R]``. ``window`` W keeps t only if ``R - t <= W`` (inclusive); ``all`` fires every kept t (with
``limit`` L only the most recent L), ``latest`` the most recent kept one, ``skip`` none. Fired-late occurrences keep
their nominal ids and are due at once; every other missed occurrence is recorded as missed, never dropped silently.
The split streams: memory holds at most ``limit`` occurrences whatever the outage's length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from ..clock import utc
from ..durations import MAX_DELAY
from ..errors import InvalidScheduleError
from ..validation import is_whole
from .recurrence import Fire, Recurrence

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_WINDOW_SECONDS",
    "MAX_LIMIT",
    "CatchUp",
    "CatchUpPlan",
    "CatchUpPolicy",
    "plan_catch_up",
    "split_late",
]

DEFAULT_WINDOW_SECONDS = 86_400
DEFAULT_LIMIT = 1_000
#: The most occurrences one recovery fires late.
MAX_LIMIT = 100_000
#: The most missed occurrences a preview lists (``plan_catch_up``); the materializer streams instead.
MAX_PREVIEW = 1_000_000
#: The longest window: 100 years (36,525 days: one definition, ``durations.MAX_DELAY``).
MAX_WINDOW_SECONDS = int(MAX_DELAY.total_seconds())


class CatchUpPolicy(StrEnum):
    """What happens to occurrences missed while the timer was down."""

    ALL = "all"
    LATEST = "latest"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A schedule's catch-up rule: policy, window (seconds, inclusive) and limit (the most recent N)."""

    policy: CatchUpPolicy = CatchUpPolicy.ALL
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    limit: int = DEFAULT_LIMIT

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "policy", CatchUpPolicy(self.policy))
        except ValueError:
            raise InvalidScheduleError(f"catch-up policy {str(self.policy)[:20]!r}: use all, latest or skip") from None
        if not is_whole(self.window_seconds, 0, MAX_WINDOW_SECONDS):
            raise InvalidScheduleError(
                f"catch-up window must be whole seconds from 0 to 100 years, got {self.window_seconds!r}"
            )
        if not is_whole(self.limit, 1, MAX_LIMIT):
            raise InvalidScheduleError(f"catch-up limit must be from 1 to {MAX_LIMIT:,}, got {self.limit!r}")

    @property
    def keeps(self) -> int:
        """How many of the most recent kept occurrences fire."""
        return {CatchUpPolicy.ALL: self.limit, CatchUpPolicy.LATEST: 1, CatchUpPolicy.SKIP: 0}[self.policy]


@dataclass(frozen=True, slots=True)
class CatchUpPlan:
    """What the timer does on recovery: fire these late, record those as missed, then carry on with ``next``."""

    fire_late: tuple[Fire, ...]
    missed: tuple[Fire, ...]
    next: Fire | None


def split_late(
    late: Iterable[Fire], recovered: datetime, rule: CatchUp, on_missed: Callable[[Fire], None]
) -> list[Fire]:
    """Of ``late`` (the occurrences in ``(cursor, recovered]``, in order): those to fire late, in order.

    Every other one goes to ``on_missed``, in order of its nominal instant among the ones the window drops and in
    the order the limit pushes them out otherwise.
    """
    recovered = utc(recovered)
    oldest = recovered - timedelta(seconds=rule.window_seconds)
    keep = rule.keeps
    kept: deque[Fire] = deque()
    for fire in late:
        if fire.nominal < oldest or keep == 0:
            on_missed(fire)
            continue
        if len(kept) == keep:
            on_missed(kept.popleft())
        kept.append(fire)
    return list(kept)


def plan_catch_up(recurrence: Recurrence, cursor: datetime, recovered: datetime, rule: CatchUp) -> CatchUpPlan:
    """The whole plan for a preview: fire late, missed (by nominal instant), and the next occurrence after R."""
    cursor, recovered = utc(cursor), utc(recovered)
    if recovered < cursor:
        raise InvalidScheduleError(
            f"recovered {recovered.isoformat()} is before the last fired occurrence {cursor.isoformat()}"
        )
    missed: list[Fire] = []

    def record(fire: Fire) -> None:
        if len(missed) >= MAX_PREVIEW:
            raise InvalidScheduleError(
                f"more than {MAX_PREVIEW:,} occurrences were missed between {cursor.isoformat()} and "
                f"{recovered.isoformat()}: preview a shorter span"
            )
        missed.append(fire)

    fire_late = split_late(recurrence.between(cursor, recovered), recovered, rule, record)
    missed.sort(key=lambda f: f.nominal)
    return CatchUpPlan(tuple(fire_late), tuple(missed), recurrence.after(recovered))
