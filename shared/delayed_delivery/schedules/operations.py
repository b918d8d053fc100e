"""Pause, resume and backfill on any schedule store (the commands on every route call these).

- **pause**: the schedule is marked paused first (the materializer stops writing), then its materialized, not yet
  due occurrences (nominal after now, at or before the cursor) are cancelled by id; the cursor goes back to now (or
  to the last one that could not be cancelled: a dispatcher was sending it), so nothing paused is counted twice.
- **resume**: from now: the occurrences of the paused span are counted ``skipped_paused``, not missed (Temporal's
  and EventBridge's rule); with ``catch_up`` the schedule's catch-up policy applies to the span instead.
- **backfill** ``[from, to)``: occurrences with their usual ids and content, due at once (the destination's release
  cap paces them). Those the cursor already passed are refused unless ``again``; those after the cursor are the
  timer's (it fires or records them), so backfill leaves them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .. import logfields as lf
from ..clock import utc
from ..errors import InvalidMessageError, InvalidScheduleError, MessageIdConflictError, MessageInFlightError
from .materializer import IDS_PER_LINE, occurrence_message
from .model import Schedule, ScheduleState
from .occurrences import expand, utc_text
from .ports import MessageCanceller, MessageWriter, ScheduleStore
from .recurrence import Recurrence

_log = logging.getLogger("delayed_delivery.schedules")

__all__ = [
    "MAX_BACKFILL",
    "BackfillResult",
    "MessageCanceller",
    "PauseResult",
    "ScheduleNotFoundError",
    "backfill",
    "pause",
    "resume",
]

#: The most occurrences one backfill writes.
MAX_BACKFILL = 100_000
#: Conditional writes tried before giving up on a schedule that keeps changing.
_TRIES = 5


class ScheduleNotFoundError(InvalidMessageError):
    """No schedule has this id."""


@dataclass(frozen=True, slots=True)
class PauseResult:
    """The paused schedule, the occurrences cancelled, and those left (being sent, or not found)."""

    schedule: Schedule
    cancelled: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()
    not_found: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What a backfill wrote, and what it left to the timer or found pending with other content."""

    written: tuple[str, ...] = ()
    left_to_timer: int = 0
    conflicts: tuple[str, ...] = field(default_factory=tuple)


def _update(store: ScheduleStore, schedule_id: str, change: Callable[[Schedule], Schedule | None]) -> Schedule:
    """Apply ``change`` (None: nothing to do) by conditional write, reading again when another writer got first."""
    for _ in range(_TRIES):
        current = store.get(schedule_id)
        if current is None:
            raise ScheduleNotFoundError(f"no schedule {schedule_id!r}")
        updated = change(current)
        if updated is None or store.replace(updated, current.version):
            return updated or current
    raise InvalidScheduleError(f"schedule {schedule_id!r} kept changing under {_TRIES} writes; try again")


def pause(store: ScheduleStore, canceller: MessageCanceller, schedule_id: str, now: datetime) -> PauseResult:
    """Pause, then cancel the materialized occurrences not yet due."""
    now = utc(now)

    def to_paused(s: Schedule) -> Schedule | None:
        return None if s.state is ScheduleState.PAUSED else s.next_version(state=ScheduleState.PAUSED, paused_at=now)

    paused = _update(store, schedule_id, to_paused)
    if paused.cursor is None or paused.cursor <= now:
        return PauseResult(paused)
    cancelled: list[str] = []
    in_flight: list[str] = []
    not_found: list[str] = []
    keep = now
    recurrence = paused.definition.recurrence()
    for o in expand(recurrence, now + timedelta(microseconds=1), paused.cursor + timedelta(microseconds=1),
                    schedule_id=schedule_id):  # fmt: skip
        assert o.id is not None
        try:
            (cancelled if canceller.remove(o.id) else not_found).append(o.id)
        except MessageInFlightError:
            in_flight.append(o.id)
            keep = max(keep, o.nominal)

    def rewind(s: Schedule) -> Schedule | None:
        if s.state is not ScheduleState.PAUSED or s.cursor is None or s.cursor <= keep:
            return None
        return s.next_version(cursor=keep, next_at=s.following(recurrence, keep))

    return PauseResult(_update(store, schedule_id, rewind), tuple(cancelled), tuple(in_flight), tuple(not_found))


def resume(store: ScheduleStore, schedule_id: str, now: datetime, *, catch_up: bool = False) -> Schedule:
    """Resume from ``now`` (the paused span counted ``skipped_paused``), or with the catch-up policy."""
    now = utc(now)

    decided: list[tuple[Schedule, int]] = []  # the version the write replaced and what it recorded missed

    def to_active(s: Schedule) -> Schedule | None:
        decided.clear()
        if s.state is ScheduleState.ACTIVE:
            return None
        if catch_up:
            return s.next_version(state=ScheduleState.ACTIVE, paused_at=None)
        recurrence = s.definition.recurrence()
        # due before the pause but never written (the timer was down): missed, never silent; after it: paused
        missed = _count(recurrence, s, s.paused_at) if s.paused_at is not None else 0
        skipped = _count(recurrence, s, now) - missed
        if skipped + missed == 0:
            return s.next_version(state=ScheduleState.ACTIVE, paused_at=None)
        decided.append((s, missed))
        return s.next_version(
            state=ScheduleState.ACTIVE,
            paused_at=None,
            cursor=now,
            next_at=s.following(recurrence, now),
            skipped_paused=s.skipped_paused + skipped,
            missed=s.missed + missed,
        )

    resumed = _update(store, schedule_id, to_active)
    for replaced, missed in decided:
        if missed:
            _log_missed_before_pause(replaced, missed)
    return resumed


def _log_missed_before_pause(s: Schedule, count: int) -> None:
    """The ``schedule_missed`` line for occurrences a resume recorded as missed (the first ``IDS_PER_LINE`` ids)."""
    begin = s.definition.start if s.cursor is None else s.cursor + timedelta(microseconds=1)
    assert s.paused_at is not None
    fires = s.definition.recurrence().fires(begin, s.paused_at + timedelta(microseconds=1))
    ids = [f"{s.schedule_id}@{utc_text(f.nominal)}" for _, f in zip(range(IDS_PER_LINE), fires, strict=False)]
    _log.warning(
        "occurrences due before the pause were never written (the timer was down), recorded as missed",
        extra={lf.EVENT: lf.EVENT_SCHEDULE_MISSED, lf.SCHEDULE_ID: s.schedule_id, lf.COUNT: count,
               lf.OCCURRENCE_IDS: ids},
    )  # fmt: skip


def _count(recurrence: Recurrence, s: Schedule, now: datetime) -> int:
    """Occurrences after the cursor (from start when None), at or before ``now``, before the end."""
    begin = s.definition.start if s.cursor is None else s.cursor + timedelta(microseconds=1)
    end = now + timedelta(microseconds=1)
    if s.definition.end is not None:
        end = min(end, s.definition.end)
    return sum(1 for _ in recurrence.fires(begin, end)) if begin < end else 0


def backfill(
    store: ScheduleStore,
    writer: MessageWriter,
    schedule_id: str,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    again: bool = False,
) -> BackfillResult:
    """Write the occurrences in ``[start, end)`` (``end`` at most now) that the timer will not."""
    start, end, now = utc(start), utc(end), utc(now)
    if end > now:
        raise InvalidScheduleError(f"backfill covers the past: its end {end.isoformat()} is after now")
    if end <= start:
        raise InvalidScheduleError("backfill needs --from before --to")
    schedule = store.get(schedule_id)
    if schedule is None:
        raise ScheduleNotFoundError(f"no schedule {schedule_id!r}")
    d = schedule.definition
    occurrences = []
    left = 0
    for o in expand(d.recurrence(), start, end, schedule_id=schedule_id, max_jitter=d.jitter_seconds):
        if o.nominal >= d.start and (schedule.cursor is None or o.nominal > schedule.cursor):
            left += 1  # the timer's: it fires it or records it as missed
            continue
        occurrences.append(o)
        if len(occurrences) > MAX_BACKFILL:
            raise InvalidScheduleError(f"backfill writes at most {MAX_BACKFILL:,} occurrences: narrow the span")
    passed = [o for o in occurrences if o.nominal >= d.start]
    if passed and not again:
        raise InvalidScheduleError(
            f"{len(passed):,} occurrence(s) in the span were already fired or recorded (at or before the cursor "
            f"{schedule.cursor.isoformat() if schedule.cursor else '-'}): pass again to send them once more"
        )
    written: list[str] = []
    conflicts: list[str] = []
    for o in occurrences:
        assert o.id is not None
        try:
            writer.store(occurrence_message(schedule, o))
            written.append(o.id)
        except MessageIdConflictError:
            conflicts.append(o.id)
    return BackfillResult(tuple(written), left, tuple(conflicts))
