"""Schedules inside a dispatcher's loop (SQLite, or any store the core ``Dispatcher`` serves).

The loop alternates a materializer pass with dispatching until the next pass: occurrences are written through the
dispatcher (``Dispatcher.store``, which wakes its loop when one is due sooner than it knew), and the dispatcher sends
them when due with its retries, error queue and release caps. Nothing in the dispatcher changes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..dispatcher import Dispatcher, DispatchReport
from .materializer import Materializer, MaterializeReport

__all__ = ["LoopReport", "run_with_schedules", "tick"]


@dataclass(slots=True)
class LoopReport:
    """What the loop did: the materializer passes and the dispatching, summed."""

    passes: int = 0
    materialized: MaterializeReport = field(default_factory=MaterializeReport)
    dispatched: DispatchReport = field(default_factory=DispatchReport)

    def add(self, materialized: MaterializeReport, dispatched: DispatchReport) -> None:
        """Count one pass and the dispatching after it."""
        self.passes += 1
        m = self.materialized
        m.schedules += materialized.schedules
        m.written += materialized.written
        m.fired_late += materialized.fired_late
        m.missed += materialized.missed
        m.already_pending += materialized.already_pending
        m.lost_races += materialized.lost_races
        m.failures += materialized.failures
        m.dst_adjusted += materialized.dst_adjusted
        m.ids.extend(materialized.ids)
        m.missed_ids.extend(materialized.missed_ids)
        self.dispatched.merge(dispatched)


def tick(dispatcher: Dispatcher, materializer: Materializer, report: LoopReport | None = None) -> LoopReport:
    """One materializer pass, then dispatch what is due now (a timer's run; tests with a manual clock)."""
    report = report if report is not None else LoopReport()
    report.add(materializer.run_once(), dispatcher.dispatch_due())
    return report


def run_with_schedules(
    dispatcher: Dispatcher, materializer: Materializer, stop: threading.Event, *, pass_every: float = 60.0
) -> LoopReport:
    """Until ``stop``: a materializer pass every ``pass_every`` seconds, dispatching in between.

    Keep ``pass_every`` at most the materializer's lead, so each occurrence is written before it is due.
    """
    if pass_every <= 0:
        raise ValueError("pass_every must be positive")
    report = LoopReport()
    while not stop.is_set():
        written = materializer.run_once()
        sent = dispatcher.dispatch_due(pass_every, wait_for_due=True, keep_going=lambda: not stop.is_set())
        report.add(written, sent)
    return report
