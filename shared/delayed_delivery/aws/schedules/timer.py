"""The every-minute schedule timer: per shard, the due pages within the lead become SQS sends, exactly once each.

A run takes each shard's lease (``lease.py``; shards side by side, ``shard_threads`` at a time) and makes one *pass*:

1. The pass plans with ``now`` (or, when the last pass on the shard did not finish, with that pass's ``now``: it is
   replayed as planned) and records it with its first batch, before its first send (an idle pass writes only its
   lease). Its horizon is the end of the minute holding
   ``now + lead``: it reads the due pages of earlier minutes only (``sk < horizon``), in key order, and consumes
   them in *batches* of at most ``BATCH_ENTRIES`` entries, each journaled in the lease item before its first send.
2. Per batch: the rows of its entries (eventually consistent, the ``rev`` checked; strongly consistent in a
   replay). For each live entry the core materializer's ``plan`` decides: missed occurrences (catch-up, for those
   at or before ``now``) and the occurrences firing before the horizon. They are sent (``sends.py``).
3. A schedule not fully sent (throttled, refused, no release slot) or ended has its row written (``rev + 1``, the
   cursor just before the first occurrence not sent, and a fresh entry): the next pass sends the rest. Every other
   entry is written, advanced, into one new page per minute its next occurrence fires in (keys made from the
   batch: a replay writes the same pages), the batch is journaled written, then its pages are deleted.
4. ``finish`` marks the pass done and frees the lease.

Exactly one message per occurrence: the lease keeps a second timer off the shard, and the replay of an unfinished
batch writes the same pages (or, once written, only deletes the consumed ones). A crash between a send and the
batch's writes sends the same occurrence again (same id, same content) when the batch is replayed: SQS keeps no id
for a delayed message, so the destination receives it twice and the receive helpers' effectively-once handling,
keyed on the message id, drops the second (docs/schedules.md, "On AWS"). A pass replayed after a long stop sends
what it planned (at most the lead's worth of occurrences) before catch-up applies to the rest.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ... import logfields as lf
from ...clock import Clock
from ...errors import ConfigurationError, InvalidScheduleError
from ...schedules.materializer import MAX_LEAD_SECONDS, Materializer, Plan, fire_time
from ...schedules.model import ScheduleState
from ...schedules.occurrences import utc_text
from .layout import (
    MAX_PAGE_ENTRIES,
    SHARDS,
    DuePage,
    Entry,
    Row,
    entry_of,
    merged,
    micros,
    minute_key,
    minute_of_key,
    page_item,
)
from .lease import Held
from .sends import Fate, OccurrenceSender, Outgoing, SendOutcome
from .store import DynamoDbScheduleStore

__all__ = ["MAX_TIMER_LEAD_SECONDS", "ScheduleTimer", "TimerResult"]

_log = logging.getLogger("delayed_delivery.schedules.aws")

#: The longest lead: an occurrence fires before the end of the minute holding ``now + lead``, so at most
#: ``lead + 60 s`` after its send, within SQS's 900 s.
MAX_TIMER_LEAD_SECONDS = MAX_LEAD_SECONDS - 60
#: Where unreadable entries are set aside: a minute no pass reaches (kept and counted, never dropped).
QUARANTINE_MINUTE = "999999999999"
#: How long an entry whose schedule cannot be planned (an unreadable row) waits before it is tried again.
RETRY_LATER = timedelta(hours=1)
_MICRO = timedelta(microseconds=1)


@dataclass(slots=True)
class TimerResult:
    """What one run did (summed over its shards)."""

    shards: int = 0
    shards_idle: int = 0
    shards_skipped_leased: int = 0
    passes_replayed: int = 0
    passes_unfinished: int = 0
    pages: int = 0
    schedules: int = 0
    fired: int = 0
    fired_late: int = 0
    missed: int = 0
    skipped_paused: int = 0
    dst_adjusted: int = 0
    stale_entries: int = 0
    ended: int = 0
    retried: int = 0
    to_error_queue: int = 0
    refused: int = 0
    release_held: int = 0
    failures: int = 0
    unreadable: int = 0
    lateness_max_seconds: float = 0.0
    release_lag_max_seconds: float = 0.0
    #: Per occurrence sent, its lateness in seconds (kept only when ``ScheduleTimer.keep_lateness``).
    lateness: list[float] = field(default_factory=list)

    def add(self, other: TimerResult) -> None:
        """Count ``other`` in."""
        for name in self.__dataclass_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if name.endswith("_max_seconds"):
                setattr(self, name, max(mine, theirs))
            elif isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, name, mine + theirs)


class ScheduleTimer:
    """One timer: the store, the sender, the clock, the lead and how the shards are worked."""

    def __init__(
        self,
        store: DynamoDbScheduleStore,
        sender: OccurrenceSender,
        clock: Clock,
        *,
        lead_seconds: float = 300.0,
        margin_seconds: float = 20.0,
        shard_threads: int = 4,
        max_per_schedule: int = 1000,
        owner: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        keep_lateness: bool = False,
    ) -> None:
        if not 0 <= lead_seconds <= MAX_TIMER_LEAD_SECONDS:
            raise ConfigurationError(
                f"the schedule timer's lead is 0 to {MAX_TIMER_LEAD_SECONDS} s, got {lead_seconds}"
            )
        self.store = store
        self.sender = sender
        self.clock = clock
        self.lead = timedelta(seconds=lead_seconds)
        self.margin = margin_seconds
        self.shard_threads = max(1, shard_threads)
        self.owner = owner or f"timer-{uuid.uuid4().hex}"
        self.monotonic = monotonic
        self.keep_lateness = keep_lateness
        self.planner = Materializer(store, _NoWrites(), clock=clock, lead_seconds=min(lead_seconds, MAX_LEAD_SECONDS),
                                    max_per_schedule=max_per_schedule)  # fmt: skip

    def run(self, deadline: float | None = None, shards: range | None = None) -> TimerResult:
        """One pass over every shard (``deadline``: a ``monotonic`` value to stop taking pages at)."""
        result = TimerResult()
        lock = threading.Lock()

        def one(shard: int) -> None:
            got = self.run_shard(shard, deadline)
            with lock:
                result.add(got)

        todo = list(shards if shards is not None else range(SHARDS))
        if self.shard_threads == 1:
            for shard in todo:
                one(shard)
        else:
            with ThreadPoolExecutor(max_workers=min(self.shard_threads, len(todo)), thread_name_prefix="dd-sh") as p:
                list(p.map(one, todo))
        return result

    def run_shard(self, shard: int, deadline: float | None = None) -> TimerResult:
        """One pass over one shard, under its lease (skipped when another timer holds it; nothing due and the last
        pass finished: two reads and no write, not even the lease)."""
        result = TimerResult(shards=1)
        soon = minute_of_key(minute_key(self.clock.now() + self.lead)) + timedelta(minutes=1)
        if not self.store.leases.unfinished(shard) and not self.store.any_page(shard, minute_key(soon)):
            result.shards_idle = 1
            return result
        held = self.store.leases.acquire(shard, self.owner)
        if held is None:
            result.shards_skipped_leased = 1
            return result
        now = held.unfinished or self.clock.now()
        horizon = minute_of_key(minute_key(now + self.lead)) + timedelta(minutes=1)
        begun = held.unfinished is not None  # a replayed pass is recorded already; a new one with its first batch
        try:
            if held.unfinished is not None:
                result.passes_replayed = 1
                self._replay(held, now, horizon, result)
            for batch in _batches(self.store.pages(shard, minute_key(horizon))):
                if self._out_of_time(held, deadline):
                    result.passes_unfinished = 1
                    break
                self._batch(held, batch, now, horizon, result, consistent=False, begin=None if begun else now)
                begun = True
        except Exception as exc:  # the pass is left unfinished: the next timer replays it as planned
            result.failures += 1
            _log.warning(
                "a schedule timer pass failed; the next run replays it",
                extra={lf.EVENT: lf.EVENT_SCHEDULE_FAILED, "shard": shard, lf.REASON: repr(exc)[:500]},
            )
            self._quietly(self.store.leases.release, held)
            return result
        self._quietly(self.store.leases.finish, held)
        return result

    def _replay(self, held: Held, now: datetime, horizon: datetime, result: TimerResult) -> None:
        """The unfinished pass's batch: deleted when its entries were written, else processed again as planned."""
        if not held.batch:
            return
        if held.batch_written:
            for sk in held.batch:
                self.store.delete_page(held.shard, sk)
            return
        wanted = set(held.batch)
        pages = [p for p in self.store.pages(held.shard) if p.sk in wanted]
        if pages:
            self._batch(held, pages, now, horizon, result, consistent=True, journaled=True)

    def _out_of_time(self, held: Held, deadline: float | None) -> bool:
        if deadline is not None and self.monotonic() >= deadline - self.margin:
            return True
        return held.left(self.clock.now()) < self.margin

    @staticmethod
    def _quietly(step: Callable[[Held], None], held: Held) -> None:
        try:
            step(held)
        except Exception as exc:  # the lease expired meanwhile: the next holder takes over
            _log.warning("the schedule shard lease could not be updated", extra={lf.REASON: repr(exc)[:300]})

    # -- one batch --------------------------------------------------------------------------------------------

    def _batch(
        self,
        held: Held,
        pages: list[DuePage],
        now: datetime,
        horizon: datetime,
        result: TimerResult,
        *,
        consistent: bool,
        journaled: bool = False,
        begin: datetime | None = None,
    ) -> None:
        """Journal, plan, send, settle, write the advanced entries into their pages, delete the batch's pages."""
        if not journaled:
            self.store.leases.journal(held, [p.sk for p in pages], begin)
        result.pages += len(pages)
        entries = _newest_entries(pages)
        carried: dict[str, dict[str, Entry]] = {}  # target minute key -> entries
        plans = self._plans(entries, self._rows(entries, consistent, result), now, horizon, result, carried)
        outgoing = [Outgoing(o, plan.schedule) for plan, _ in plans for o in plan.occurrences]
        outcome = self.sender.send(outgoing) if outgoing else None
        for plan, row in plans:
            decided = self._decided(plan, outcome.fates if outcome else {})
            result.schedules += 1
            self._count(plan, decided, result)
            if decided < len(plan.occurrences) or plan.updated.next_at is None:
                self._settle(plan, row, decided, result)
            else:
                carried.setdefault(self._target(plan), {})[plan.schedule.schedule_id] = entry_of(plan.updated, row.rev)
        if outcome is not None:
            self._measured(outcome, result, self.keep_lateness)
        self._write_pages(held, pages, now, carried, result)

    def _plans(
        self,
        entries: dict[str, Entry],
        rows: dict[str, Any],
        now: datetime,
        horizon: datetime,
        result: TimerResult,
        carried: dict[str, dict[str, Entry]],
    ) -> list[tuple[Plan, Row]]:
        """Plan each entry whose schedule row is current and active; a stale one is dropped, one that cannot be
        planned is carried to a page an hour later."""
        plans: list[tuple[Plan, Row]] = []
        for sid, entry in entries.items():
            row = rows.get(sid)
            if row is None or (isinstance(row, Row) and (row.rev != entry.rev or row.schedule.state is not
                                                          ScheduleState.ACTIVE)):  # fmt: skip
                result.stale_entries += 1
                continue
            try:
                if isinstance(row, InvalidScheduleError):
                    raise row
                plan = self.planner.plan(merged(row, entry), now, until=horizon - _MICRO, by_fire=True)
            except Exception as exc:  # this schedule cannot be planned: its entry waits and is tried again
                result.failures += 1
                _log.warning(
                    "a schedule could not be planned; its entry is kept and tried again in an hour",
                    extra={lf.EVENT: lf.EVENT_SCHEDULE_FAILED, lf.SCHEDULE_ID: sid, lf.REASON: repr(exc)[:500]},
                )
                carried.setdefault(minute_key(horizon + RETRY_LATER), {})[sid] = entry
                continue
            plans.append((plan, row))
            result.skipped_paused += entry.skipped_report
        return plans

    def _write_pages(
        self, held: Held, pages: list[DuePage], now: datetime, carried: dict[str, dict[str, Entry]], result: TimerResult
    ) -> None:
        """Write the carried entries into their minutes' pages (unreadable ones set aside), then delete the batch's."""
        tag = hashlib.sha256(f"{held.shard}/{micros(now)}/{pages[0].sk}".encode()).hexdigest()[:16]
        items = [page_item(held.shard, f"{minute}#m.{tag}", 0, moved) for minute, moved in sorted(carried.items())]
        unreadable = {f"{p.sk}/{sid}": value for p in pages for sid, value in p.unreadable.items()}
        if unreadable:
            result.unreadable += len(unreadable)
            _log.warning(
                "unreadable due entries set aside (kept, never read by a pass)",
                extra={lf.EVENT: lf.EVENT_SCHEDULE_FAILED, lf.COUNT: len(unreadable)},
            )
            items.append(page_item(held.shard, f"{QUARANTINE_MINUTE}#x.{tag}", 0, {}, unreadable))
        self.store.put_pages(items)
        self.store.leases.written(held)
        for page in pages:
            self.store.delete_page(held.shard, page.sk)

    def _rows(self, entries: dict[str, Entry], consistent: bool, result: TimerResult) -> dict[str, Any]:
        """The rows of ``entries``; read again strongly consistent where an eventually consistent read was behind
        (missing, or an older ``rev`` than the entry's)."""
        rows: dict[str, Any] = dict(self.store.rows(entries, consistent=consistent))
        if not consistent:
            behind = [sid for sid, e in entries.items() if not isinstance(rows.get(sid), InvalidScheduleError)
                      and (rows.get(sid) is None or rows[sid].rev < e.rev)]  # fmt: skip
            if behind:
                rows.update(self.store.rows(behind, consistent=True))
        return rows

    @staticmethod
    def _measured(outcome: SendOutcome, result: TimerResult, keep: bool) -> None:
        result.retried += sum(1 for f in outcome.fates.values() if f is Fate.RETRY)
        result.to_error_queue += outcome.to_error_queue
        result.refused += outcome.refused
        result.release_held += outcome.release_held
        result.lateness_max_seconds = max([result.lateness_max_seconds, *outcome.lateness])
        result.release_lag_max_seconds = max([result.release_lag_max_seconds, *outcome.release_lags])
        if keep:
            result.lateness.extend(outcome.lateness)

    @staticmethod
    def _decided(plan: Plan, fates: dict[str, Fate]) -> int:
        """How many of the plan's occurrences, from the first, were sent or given to the error queue."""
        for n, o in enumerate(plan.occurrences):
            assert o.id is not None
            if fates.get(o.id) not in (Fate.SENT, Fate.REJECTED):
                return n
        return len(plan.occurrences)

    @staticmethod
    def _target(plan: Plan) -> str:
        """The minute key of the page the advanced entry goes to: when its next occurrence fires."""
        nxt = plan.updated.next_at
        assert nxt is not None
        return minute_key(plan.next_fire_at or fire_time(plan.updated, nxt))

    def _settle(self, plan: Plan, row: Row, decided: int, result: TimerResult) -> None:
        """Write the row of a schedule not fully sent (its cursor just before the first occurrence not sent) or
        ended: ``rev + 1`` makes the entry just written stale."""
        schedule = plan.updated
        if decided < len(plan.occurrences):
            first = plan.occurrences[decided]
            schedule = replace(
                schedule,
                cursor=first.nominal - _MICRO,
                next_at=first.nominal,
                fired=plan.schedule.fired + decided,
                last_fired=plan.occurrences[decided - 1].nominal if decided else plan.schedule.last_fired,
            )
        else:
            result.ended += 1
        try:
            written = self.store.write_row(schedule, row.rev)
        except Exception as exc:  # the entry just written carries the schedule on; its sends repeat
            written = False
            _log.warning("a schedule's row could not be written", extra={lf.SCHEDULE_ID: schedule.schedule_id,
                                                                         lf.REASON: repr(exc)[:300]})  # fmt: skip
        if not written:
            result.failures += 1

    @staticmethod
    def _count(plan: Plan, decided: int, result: TimerResult) -> None:
        sent = plan.occurrences[:decided]
        result.fired += len(sent)
        result.fired_late += min(plan.late, decided)
        result.missed += plan.missed
        result.dst_adjusted += plan.dst_adjusted
        if plan.missed:
            _log.warning(
                "occurrences missed while the timer was down, recorded as missed (catch-up policy)",
                extra={
                    lf.EVENT: lf.EVENT_SCHEDULE_MISSED,
                    lf.SCHEDULE_ID: plan.schedule.schedule_id,
                    lf.COUNT: plan.missed,
                    lf.OCCURRENCE_IDS: list(plan.missed_ids),
                },
            )
        if sent:
            _log.debug(
                "occurrences sent",
                extra={
                    lf.EVENT: lf.EVENT_SCHEDULE_MATERIALIZED,
                    lf.SCHEDULE_ID: plan.schedule.schedule_id,
                    lf.COUNT: len(sent),
                    lf.CURSOR: utc_text(sent[-1].nominal),
                },
            )


class _NoWrites:
    """The materializer is used to plan only; it never writes through this."""

    def store(self, message: Any) -> None:
        raise AssertionError("the schedule timer plans with the materializer and sends itself")


#: The most entries one batch consumes (so each minute's new page from a batch holds at most as many), and pages.
BATCH_ENTRIES = MAX_PAGE_ENTRIES
BATCH_PAGES = 100


def _newest_entries(pages: list[DuePage]) -> dict[str, Entry]:
    """Each schedule's newest entry (by revision, then version) across a batch's pages."""
    entries: dict[str, Entry] = {}
    for page in pages:
        for sid, entry in page.entries.items():
            current = entries.get(sid)
            if current is None or (entry.rev, entry.version) > (current.rev, current.version):
                entries[sid] = entry
    return entries


def _batches(pages: Iterator[DuePage]) -> Iterator[list[DuePage]]:
    """Consecutive due pages in batches of at most ``BATCH_ENTRIES`` entries and ``BATCH_PAGES`` pages (a page
    larger than that alone)."""
    batch: list[DuePage] = []
    count = 0
    for page in pages:
        size = len(page.entries) + len(page.unreadable)
        if batch and (count + size > BATCH_ENTRIES or len(batch) >= BATCH_PAGES):
            yield batch
            batch, count = [], 0
        batch.append(page)
        count += size
    if batch:
        yield batch
