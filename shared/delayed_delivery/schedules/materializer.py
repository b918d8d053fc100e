"""The materializer: occurrences due within the lead become ordinary delayed messages, exactly once each.

One pass over the due schedules (``ScheduleStore.due(now + lead)``); for each:
1. occurrences after the cursor and at or before now were missed (the timer was down): catch-up decides which fire
   late (due at once, nominal ids) and which are recorded as missed;
2. occurrences in ``(now, now + lead]`` are written with their fire time (nominal + jitter);
3. then the cursor advances by a conditional write on ``version``, with the counters.

A crash between 2 and 3 writes the same ids and content again: a no-op while they are pending (the id policy). A
second timer loses the conditional write and changes nothing. The cursor, not the store, forbids re-firing an
occurrence that was delivered meanwhile. Work is bounded: at most ``max_per_schedule`` upcoming messages a schedule
a pass (the cursor then stops at the last written, so the next pass goes on), plus what catch-up fires late (at most
its limit, decided once).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .. import headers as hdr
from .. import logfields as lf
from ..clock import Clock, SystemClock
from ..errors import InvalidScheduleError, MessageIdConflictError
from ..model import DelayedMessage
from .catchup import split_late
from .model import Schedule, ScheduleState
from .occurrences import Occurrence, occurrence_of, utc_text
from .ports import MessageCanceller, MessageWriter, OccurrenceSink, ScheduleStore
from .recurrence import Fire, Recurrence

__all__ = [
    "MAX_LEAD_SECONDS",
    "MaterializeReport",
    "Materializer",
    "Plan",
    "count_failure",
    "fire_time",
    "keep_for",
    "log_decided",
    "occurrence_message",
]

_log = logging.getLogger("delayed_delivery.schedules")

#: The longest lead: occurrences are written at most 15 minutes ahead (SQS's DelaySeconds reaches 900 s).
MAX_LEAD_SECONDS = 900
#: Ids listed on one log line.
IDS_PER_LINE = 100
#: How long past its catch-up window an occurrence sink remembers a written occurrence (clocks of timers differ).
KEEP_MARGIN = timedelta(hours=1)


@dataclass(slots=True)
class MaterializeReport:
    """What one pass did."""

    schedules: int = 0
    written: int = 0
    fired_late: int = 0
    missed: int = 0
    already_pending: int = 0
    lost_races: int = 0
    failures: int = 0
    #: Occurrences written whose instant daylight saving decided (shifted, clamped, a fold's pass, after a skip).
    dst_adjusted: int = 0
    #: Per occurrence written: its id (ordered by schedule, then nominal instant).
    ids: list[str] = field(default_factory=list)
    missed_ids: list[str] = field(default_factory=list)
    #: The pass stopped before the end of what was due (``keep_going`` said no).
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """One schedule's decisions in one pass: what to write, what was missed, and the version to store after."""

    schedule: Schedule
    #: The occurrences to write, in order: the late ones catch-up keeps, then those ahead.
    occurrences: tuple[Occurrence, ...]
    #: How many of ``occurrences`` fire late (they come first).
    late: int
    missed: int
    #: The first ``IDS_PER_LINE`` missed occurrence ids (for the log line).
    missed_ids: tuple[str, ...]
    #: ``schedule.next_version`` with the cursor, ``next_at`` and counters after this pass.
    updated: Schedule
    #: Occurrences decided whose instant daylight saving decided.
    dst_adjusted: int
    #: When the first occurrence after the new cursor fires (jitter included), if the pass computed it (None: it
    #: did not, or none is left; ``fire_time`` computes it).
    next_fire_at: datetime | None = None


def occurrence_message(schedule: Schedule, occurrence: Occurrence) -> DelayedMessage:
    """The delayed message of an occurrence: same id and content every time it is computed."""
    assert occurrence.id is not None
    t = schedule.template
    return DelayedMessage(
        message_id=occurrence.id,
        destination=t.destination,
        body=t.body,
        due_at=occurrence.fire_at,
        headers={**t.headers, hdr.SCHEDULE_ID: schedule.schedule_id, hdr.OCCURRENCE: utc_text(occurrence.nominal)},
    )


class _Missed:
    """Missed occurrences of one schedule: counted, the first ``IDS_PER_LINE`` ids kept for the log line."""

    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        self.count = 0
        self.ids: list[str] = []
        self.last: datetime | None = None

    def __call__(self, fire: Fire) -> None:
        self.count += 1
        if len(self.ids) < IDS_PER_LINE:
            self.ids.append(f"{self.schedule_id}@{utc_text(fire.nominal)}")
        self.last = fire.nominal if self.last is None else max(self.last, fire.nominal)


class Materializer:
    """Writes due occurrences of the schedules in ``schedules`` to ``messages`` (a store or a dispatcher)."""

    def __init__(
        self,
        schedules: ScheduleStore,
        messages: MessageWriter,
        *,
        clock: Clock | None = None,
        lead_seconds: float = 300.0,
        max_per_schedule: int = 1000,
        schedules_per_pass: int = 1000,
        canceller: MessageCanceller | None = None,
    ) -> None:
        # canceller: where what a pass wrote is cancelled when it lost its cursor write to a pause or a delete
        # (default: ``messages`` itself when it is a store, or a dispatcher's store)
        if not 0 <= lead_seconds <= MAX_LEAD_SECONDS:
            raise InvalidScheduleError(f"the lead must be from 0 to {MAX_LEAD_SECONDS} s, got {lead_seconds!r}")
        if max_per_schedule < 1 or schedules_per_pass < 1:
            raise InvalidScheduleError("max_per_schedule and schedules_per_pass must be at least 1")
        self.schedules = schedules
        self.messages = messages
        self.clock = clock or SystemClock()
        self.lead = timedelta(seconds=lead_seconds)
        self.max_per_schedule = max_per_schedule
        self.schedules_per_pass = schedules_per_pass
        found = messages if isinstance(messages, MessageCanceller) else getattr(messages, "store_port", None)
        self.canceller: MessageCanceller | None = canceller or (found if isinstance(found, MessageCanceller) else None)

    def run_once(
        self, now: datetime | None = None, *, keep_going: Callable[[], bool] | None = None
    ) -> MaterializeReport:
        """One pass over the schedules due by ``now + lead``; ``keep_going`` False stops it before the next schedule
        (a lease lost: what is left is the next holder's)."""
        at = now if now is not None else self.clock.now()
        report = MaterializeReport()
        for schedule in self.schedules.due(at + self.lead, self.schedules_per_pass):
            if keep_going is not None and not keep_going():
                report.stopped = True
                break
            report.schedules += 1
            try:
                self.materialize(schedule, at, report)
            except Exception as exc:  # one schedule's failure never stops the others; its cursor stays
                count_failure(report, schedule.schedule_id, exc)
        return report

    def plan(self, schedule: Schedule, now: datetime, *, until: datetime | None = None, by_fire: bool = False) -> Plan:
        """What one pass decides for ``schedule`` at ``now``: the occurrences to write and the next version.

        Occurrences at or before ``now`` go through catch-up; those after it up to ``until`` (default ``now + lead``;
        by nominal instant, or with ``by_fire`` by fire time, jitter included) are written, at most
        ``max_per_schedule`` of them. Nothing is written or stored here (the AWS timer commits plans its own way).
        """
        definition = schedule.definition
        recurrence = definition.recurrence()
        missed = _Missed(schedule.schedule_id)
        bound = until if until is not None else now + self.lead
        # one walk from the cursor: the occurrences up to now go through catch-up, the walk goes on with the rest
        stream = self._after_cursor(schedule, recurrence, None if by_fire else max(bound, now))
        first_ahead: list[Fire] = []

        def up_to_now() -> Iterator[Fire]:
            for fire in stream:
                if fire.nominal > now:
                    first_ahead.append(fire)
                    return
                yield fire

        late = split_late(up_to_now(), now, definition.catch_up, missed)
        ahead = itertools.chain(first_ahead, stream)
        fires: list[Fire] = list(late)  # at most the catch-up limit
        nxt = next(ahead, None)
        occurrences: list[Occurrence] = []
        for i, fire in enumerate(fires):
            following = fires[i + 1] if i + 1 < len(fires) else nxt
            occurrences.append(self._occurrence(schedule, fire, following, recurrence))
        next_fire: Occurrence | None = None
        while nxt is not None:
            following = next(ahead, None)
            occurrence = self._occurrence(schedule, nxt, following, recurrence)
            if len(occurrences) >= self.max_per_schedule or (by_fire and occurrence.fire_at > bound):
                next_fire = occurrence  # the cursor stops before it
                break
            occurrences.append(occurrence)
            fires.append(nxt)
            nxt = following
        updated = _next_version(schedule, recurrence, fires, len(occurrences), missed, nxt, by_fire=by_fire)
        adjusted = sum(1 for f in fires if f.note is not None)
        return Plan(
            schedule,
            tuple(occurrences),
            len(late),
            missed.count,
            tuple(missed.ids),
            updated,
            adjusted,
            next_fire.fire_at if next_fire is not None else None,
        )

    def materialize(self, schedule: Schedule, now: datetime, report: MaterializeReport) -> bool:
        """Write one schedule's due occurrences and advance its cursor; False when another writer won."""
        plan = self.plan(schedule, now)
        written = self._write(schedule, plan.occurrences, report)
        return self.settle(plan, written, self.schedules.replace(plan.updated, schedule.version), report)

    def settle(self, plan: Plan, written: Sequence[str], landed: bool, report: MaterializeReport) -> bool:
        """Count a plan whose occurrences ``written`` were written and whose cursor write ``landed`` (or lost to
        another writer: what it wrote is cancelled if the schedule is now paused or gone); ``landed``."""
        schedule = plan.schedule
        if not landed:
            report.lost_races += 1
            _log.info(
                "another writer changed this schedule first (a second timer: the same messages; a pause or a "
                "delete: what this pass wrote is cancelled)",
                extra={lf.EVENT: lf.EVENT_SCHEDULE_RACE_LOST, lf.SCHEDULE_ID: schedule.schedule_id},
            )
            self._withdraw(schedule.schedule_id, written)
            return False
        report.ids.extend(written)
        report.written += len(written)
        report.fired_late += plan.late
        report.dst_adjusted += plan.dst_adjusted
        log_decided(plan, report)
        return True

    def _after_cursor(
        self, schedule: Schedule, recurrence: Recurrence, until: datetime | None, after: datetime | None = None
    ) -> Iterator[Fire]:
        """Occurrences after the cursor (and after ``after``), at or before ``until`` (None: any), before the end."""
        begin = schedule.definition.start
        for bound in (schedule.cursor, after):
            if bound is not None and bound + timedelta(microseconds=1) > begin:
                begin = bound + timedelta(microseconds=1)
        stop = None if until is None else until + timedelta(microseconds=1)
        if schedule.definition.end is not None:
            stop = schedule.definition.end if stop is None else min(stop, schedule.definition.end)
        if stop is not None and stop <= begin:
            return iter(())
        return recurrence.fires(begin, stop)

    def _withdraw(self, schedule_id: str, written: Sequence[str]) -> None:
        """After a lost cursor write: if the schedule is now paused or gone, cancel what this pass wrote."""
        current = self.schedules.get(schedule_id)
        if (current is not None and current.state is not ScheduleState.PAUSED) or self.canceller is None:
            return
        for message_id in written:
            try:
                self.canceller.remove(message_id)
            except Exception as exc:  # being sent right now: it fires; nothing else to do
                _log.warning(
                    "could not cancel an occurrence written while the schedule was paused or deleted",
                    extra={lf.EVENT: lf.EVENT_SCHEDULE_FAILED, lf.MESSAGE_ID: message_id, lf.REASON: repr(exc)},
                )

    @staticmethod
    def _occurrence(schedule: Schedule, fire: Fire, following: Fire | None, recurrence: Recurrence) -> Occurrence:
        """``fire`` as an occurrence of ``schedule`` (``following``: the next one, for the jitter's cap)."""
        if following is None:
            following = recurrence.after(fire.nominal)
        return occurrence_of(fire, following, schedule.schedule_id, schedule.definition.jitter_seconds)

    def _write(self, schedule: Schedule, occurrences: Sequence[Occurrence], report: MaterializeReport) -> list[str]:
        """Write each occurrence (their ids); an id pending with other content (an edited schedule) is left."""
        written: list[str] = []
        sink = self.messages if isinstance(self.messages, OccurrenceSink) else None
        keep = keep_for(schedule)
        for occurrence in occurrences:
            try:
                message = occurrence_message(schedule, occurrence)
                if sink is not None:
                    sink.store_occurrence(message, occurrence.nominal + keep)
                else:
                    self.messages.store(message)
            except MessageIdConflictError:
                report.already_pending += 1
                continue
            assert occurrence.id is not None
            written.append(occurrence.id)
        return written


def keep_for(schedule: Schedule) -> timedelta:
    """How long past its nominal instant an occurrence of ``schedule`` is remembered by a sink: a re-plan can write
    it again until catch-up would drop it (the window), plus clock skew."""
    return timedelta(seconds=schedule.definition.catch_up.window_seconds) + KEEP_MARGIN


def count_failure(report: MaterializeReport, schedule_id: str, exc: Exception) -> None:
    """Count and log a schedule whose pass failed (its cursor stays; tried again next pass)."""
    report.failures += 1
    _log.warning(
        "materializing a schedule failed; it is tried again next pass",
        extra={lf.EVENT: lf.EVENT_SCHEDULE_FAILED, lf.SCHEDULE_ID: schedule_id, lf.REASON: repr(exc)},
    )


def _next_version(
    schedule: Schedule,
    recurrence: Recurrence,
    fires: Sequence[Fire],
    fired: int,
    missed: _Missed,
    nxt: Fire | None,
    *,
    by_fire: bool,
) -> Schedule:
    """The schedule after a plan: its cursor past what was decided (fired or missed), the next occurrence after it
    (``nxt``, the first one not chosen), the counts moved on by ``fired`` and what was missed."""
    decided = [f.nominal for f in fires[-1:]] + ([missed.last] if missed.last else [])
    cursor = max(decided) if decided else schedule.cursor
    if nxt is not None:  # the first occurrence after the cursor (not chosen)
        next_at: datetime | None = nxt.nominal
    elif by_fire:  # the walk was bounded by the end only: none is left
        next_at = None
    else:
        next_at = schedule.following(recurrence, cursor)
    return schedule.next_version(
        cursor=cursor,
        next_at=next_at,
        fired=schedule.fired + fired,
        missed=schedule.missed + missed.count,
        last_fired=fires[-1].nominal if fires else schedule.last_fired,
    )


def fire_time(schedule: Schedule, nominal: datetime) -> datetime:
    """When the occurrence of ``schedule`` at ``nominal`` fires: nominal plus its jitter (capped by the next one)."""
    recurrence = schedule.definition.recurrence()
    jitter = schedule.definition.jitter_seconds
    if not jitter:
        return nominal
    following = recurrence.after(nominal)
    return occurrence_of(Fire(nominal, nominal), following, schedule.schedule_id, jitter).fire_at


def log_decided(plan: Plan, report: MaterializeReport) -> None:
    """Count a committed plan's missed occurrences in ``report`` and log them (ids) and what was written."""
    schedule_id = plan.schedule.schedule_id
    if plan.missed:
        report.missed += plan.missed
        report.missed_ids.extend(plan.missed_ids)
        _log.warning(
            "occurrences missed while the timer was down, recorded as missed (catch-up policy)",
            extra={
                lf.EVENT: lf.EVENT_SCHEDULE_MISSED,
                lf.SCHEDULE_ID: schedule_id,
                lf.COUNT: plan.missed,
                lf.OCCURRENCE_IDS: list(plan.missed_ids),
            },
        )
    if plan.occurrences:
        cursor = plan.updated.cursor
        _log.info(
            "occurrences written as delayed messages",
            extra={
                lf.EVENT: lf.EVENT_SCHEDULE_MATERIALIZED,
                lf.SCHEDULE_ID: schedule_id,
                lf.COUNT: len(plan.occurrences),
                lf.CURSOR: utc_text(cursor) if cursor else None,
            },
        )
