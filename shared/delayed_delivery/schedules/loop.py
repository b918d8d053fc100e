"""Schedules inside a dispatcher's loop (SQLite, or any store the core ``Dispatcher`` serves).

The loop alternates a materializer pass with dispatching until the next pass: occurrences are written through the
dispatcher (``Dispatcher.store``, which wakes its loop when one is due sooner than it knew), and the dispatcher sends
them when due with its retries, error queue and release caps. Nothing in the dispatcher changes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..dispatcher import Dispatcher, DispatchReport
from .materializer import Materializer, MaterializeReport

__all__ = ["LoopReport", "run_with_schedules", "tick"]


@dataclass(slots=True)
class LoopReport:
    """What the loop did, as counts (a loop runs for months: no per-message lists are kept)."""

    passes: int = 0
    written: int = 0
    fired_late: int = 0
    missed: int = 0
    already_pending: int = 0
    lost_races: int = 0
    failures: int = 0
    dst_adjusted: int = 0
    dispatched: int = 0
    moved_to_error_queue: int = 0

    def add(self, materialized: MaterializeReport, dispatched: DispatchReport) -> None:
        """Count one pass and the dispatching after it."""
        self.passes += 1
        for name in ("written", "fired_late", "missed", "already_pending", "lost_races", "failures", "dst_adjusted"):
            setattr(self, name, getattr(self, name) + getattr(materialized, name))
        self.dispatched += dispatched.dispatched
        self.moved_to_error_queue += dispatched.moved_to_error_queue


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
