"""The Azure timer's materializer: the core materializer's decisions, written in entity-group transactions.

A pass plans the due schedules (``Materializer.plan``) in chunks of ``CHUNK`` (99: three cursor transactions of 33;
fewer when their occurrences reach ``CHUNK_BYTES``). For each chunk it writes all their occurrences (rows and markers
of one delays-table partition together, 33 occurrences a transaction: ``OccurrenceRows.store_occurrences``), and
only then moves their cursors (33 schedules a transaction per schedules partition, each conditional on its row's
ETag: ``TableScheduleStore.replace_many``). The order is the core's: every occurrence of a schedule is written before
its cursor moves. So a crash between any two transactions leaves cursors at most where they were: the next pass
plans the same ids, finds their markers (its transaction fails and its occurrences are written one by one, each a
no-op) and moves the cursors. A cursor transaction that fails (a second timer's write, a pause, a delete) changes
nothing; its schedules are written one by one, and the one that lost counts a lost race as the core does (what it
wrote is cancelled when the schedule is now paused or gone). A writer without ``store_occurrences`` is written one
at a time. A lease lost stops the pass before its next schedule; what it planned and did not write is left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from ...errors import MessageIdConflictError
from ...model import DelayedMessage
from ...schedules.materializer import (
    Materializer,
    MaterializeReport,
    Plan,
    count_failure,
    keep_for,
    occurrence_message,
)
from ...schedules.model import Schedule

__all__ = ["CHUNK", "CHUNK_BYTES", "BatchedMaterializer", "OccurrenceBatchSink"]

#: Schedules planned and written together (three cursor transactions of 33).
CHUNK = 99
#: Or fewer, when their occurrences' bodies reach this many bytes (memory bounded by bytes, not by count).
CHUNK_BYTES = 8 * 1024 * 1024
#: Bytes counted per occurrence besides its body (id, headers, rows).
_MESSAGE_OVERHEAD = 2048


@runtime_checkable
class OccurrenceBatchSink(Protocol):
    """A writer of many occurrences at once, each at most once (``OccurrenceRows.store_occurrences``)."""

    def store_occurrences(self, items: Sequence[tuple[DelayedMessage, datetime]]) -> list[Exception | None]:
        """Keep each ``(message, keep_until)`` unless written before; per item None or its error."""
        ...


@runtime_checkable
class _ManyReplacer(Protocol):
    def replace_many(self, writes: Sequence[tuple[Schedule, int]]) -> list[bool | Exception]: ...


class BatchedMaterializer(Materializer):
    """``Materializer`` whose pass writes in chunks of schedules (module docstring)."""

    def run_once(
        self, now: datetime | None = None, *, keep_going: Callable[[], bool] | None = None
    ) -> MaterializeReport:
        """One pass over the schedules due by ``now + lead``, written ``CHUNK`` schedules (or ``CHUNK_BYTES`` of
        occurrences) at a time; ``keep_going`` False stops it before the next schedule (a lease lost: what is left,
        planned or not, is the next holder's)."""
        at = now if now is not None else self.clock.now()
        report = MaterializeReport()
        plans: list[Plan] = []
        size = 0
        for schedule in self.schedules.due(at + self.lead, self.schedules_per_pass):
            if keep_going is not None and not keep_going():
                report.stopped = True
                return report
            report.schedules += 1
            try:
                plan = self.plan(schedule, at)
            except Exception as exc:  # one schedule's failure never stops the others; its cursor stays
                count_failure(report, schedule.schedule_id, exc)
                continue
            plans.append(plan)
            size += len(plan.occurrences) * (len(schedule.template.body) + _MESSAGE_OVERHEAD)
            if len(plans) >= CHUNK or size >= CHUNK_BYTES:
                self._commit(plans, report)
                plans, size = [], 0
        self._commit(plans, report)
        return report

    def _commit(self, plans: Sequence[Plan], report: MaterializeReport) -> None:
        """Write every planned occurrence, then the cursors of the schedules whose occurrences were all kept."""
        written = self._write_plans(plans, report)
        ready = [(plan, ids) for plan, ids in zip(plans, written, strict=True) if ids is not None]
        for (plan, ids), landed in zip(ready, self._replace_all([plan for plan, _ in ready]), strict=True):
            if isinstance(landed, Exception):
                count_failure(report, plan.schedule.schedule_id, landed)
            else:
                self.settle(plan, ids, landed, report)

    def _write_plans(self, plans: Sequence[Plan], report: MaterializeReport) -> list[list[str] | None]:
        """Write the plans' occurrences; per plan the ids written, or None when one could not be (counted)."""
        sink = self.messages
        if not isinstance(sink, OccurrenceBatchSink):
            return [self._write_one(plan, report) for plan in plans]
        items: list[tuple[DelayedMessage, datetime]] = []
        owner: list[int] = []
        for n, plan in enumerate(plans):
            keep = keep_for(plan.schedule)
            for occurrence in plan.occurrences:
                items.append((occurrence_message(plan.schedule, occurrence), occurrence.nominal + keep))
                owner.append(n)
        out: list[list[str] | None] = [[] for _ in plans]
        for n, (message, _), error in zip(owner, items, sink.store_occurrences(items), strict=True):
            ids = out[n]
            if error is None:
                if ids is not None:
                    ids.append(message.message_id)
            elif isinstance(error, MessageIdConflictError):
                report.already_pending += 1  # pending with other content (an edited schedule): left
            elif ids is not None:
                out[n] = None
                count_failure(report, plans[n].schedule.schedule_id, error)
        return out

    def _write_one(self, plan: Plan, report: MaterializeReport) -> list[str] | None:
        try:
            return self._write(plan.schedule, plan.occurrences, report)
        except Exception as exc:  # this schedule's cursor stays
            count_failure(report, plan.schedule.schedule_id, exc)
            return None

    def _replace_all(self, plans: Sequence[Plan]) -> list[bool | Exception]:
        """Each plan's conditional cursor write (in few transactions when the store can)."""
        writes = [(plan.updated, plan.schedule.version) for plan in plans]
        if not writes:
            return []
        if isinstance(self.schedules, _ManyReplacer):
            return self.schedules.replace_many(writes)
        out: list[bool | Exception] = []
        for schedule, expected in writes:
            try:
                out.append(self.schedules.replace(schedule, expected))
            except Exception as exc:  # this schedule only
                out.append(exc)
        return out
