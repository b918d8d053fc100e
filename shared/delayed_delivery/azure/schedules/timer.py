"""The Azure schedule timer: each shard of the schedules table, under its blob lease, through the core materializer.

Every minute (``function_host``), for each of the 16 shards (4 side by side): take the lease on the blob
``schedules-NN`` in the delays container (one timer at a time works on a shard; a shard leased elsewhere is skipped
this run), then run the core ``Materializer`` over the shard's due schedules, writing each occurrence due within the
lead as a row of the endpoint's **delays table** under its occurrence id. The dispatcher sends it when due, as any
delayed message: release caps, retries and the error queue apply, and ``pending`` and ``cancel`` see it.

Exactly once per occurrence id: the rows are written first, each occurrence with a marker row beside it in one
transaction (``occurrence_rows``), then the schedule's cursor moves by a conditional write (its row's ETag). A timer
killed between the two leaves the cursor where it was: the next pass plans the same ids again and finds their markers,
a no-op whether each is still pending or was sent in between. Two timers never work on a shard together while the
lease holds; a holder that lost it stops before its next schedule, and a frozen one that wakes past its lease finds
the markers too and loses its cursor write. Each run sweeps the expired markers of one delays-table partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from ... import logfields as lf
from ...clock import Clock, SystemClock
from ...schedules.materializer import Materializer, MaterializeReport
from ...schedules.ports import MessageWriter
from ..blob_lease import BlobLease
from . import rows
from .config import AzureScheduleConfig
from .occurrence_rows import OccurrenceRows
from .store import TableScheduleStore

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

    from ..runner import AzureDispatcherHost

__all__ = ["AzureScheduleTimer", "ScheduleMetrics", "ScheduleRun", "schedule_lease_name", "timer_for_host"]

_log = logging.getLogger("delayed_delivery.azure.schedules")
_EVENT = "schedule_timer_run"


def schedule_lease_name(shard: int) -> str:
    """The blob whose lease guards schedule shard ``shard`` (beside the dispatcher's ``shard-NNN``)."""
    return f"schedules-{shard:02d}"


@dataclass(slots=True)
class ScheduleRun:
    """What one timer run did over every shard."""

    shards_done: int = 0
    shards_skipped_leased: int = 0
    shards_stopped: int = 0
    schedules: int = 0
    fired: int = 0
    fired_late: int = 0
    missed: int = 0
    already_pending: int = 0
    lost_races: int = 0
    failures: int = 0
    dst_adjusted: int = 0
    markers_swept: int = 0
    ids: list[str] = field(default_factory=list)

    def add(self, report: MaterializeReport) -> None:
        """Count one shard pass."""
        self.schedules += report.schedules
        self.fired += report.written
        self.fired_late += report.fired_late
        self.missed += report.missed
        self.already_pending += report.already_pending
        self.lost_races += report.lost_races
        self.failures += report.failures
        self.dst_adjusted += report.dst_adjusted
        self.ids.extend(report.ids)

    def merge(self, other: ScheduleRun) -> None:
        """Add another shard's run."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self) -> dict[str, int]:
        """The counts (for the log line and the metrics)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ids"}


class ScheduleMetrics:
    """OpenTelemetry counters of the schedule timer (Application Insights customMetrics)."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("delayed_delivery")
        self.counters = {
            name: meter.create_counter(f"delayed_delivery.schedule.{name}", unit="{occurrence}")
            for name in ("fired", "fired_late", "missed", "dst_adjusted", "failures", "shards_skipped_leased")
        }

    def record(self, run: ScheduleRun) -> None:
        """Add one run's counts."""
        summary = run.summary()
        for name, counter in self.counters.items():
            counter.add(summary[name])


class AzureScheduleTimer:
    """Materializes the schedules of ``schedules`` into ``messages`` (the delays table), one leased shard at a time."""

    def __init__(
        self,
        schedules: TableScheduleStore,
        messages: MessageWriter,
        container: ContainerClient,
        *,
        clock: Clock | None = None,
        lead_seconds: float = 300.0,
        lease_seconds: int = 30,
        schedules_per_pass: int = 1000,
        budget_seconds: float = 50.0,
        shard_threads: int = 4,
        renew_every: float | None = None,
        metrics_sink: ScheduleMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.schedules = schedules
        self.messages = messages
        self.container = container
        self.clock = clock or SystemClock()
        self.lead_seconds = lead_seconds
        self.lease_seconds = lease_seconds
        self.schedules_per_pass = schedules_per_pass
        self.budget_seconds = budget_seconds
        self.shard_threads = max(1, min(rows.SHARDS, shard_threads))
        self.renew_every = renew_every
        self.metrics = metrics_sink
        self._monotonic = monotonic
        #: Where occurrence markers are swept (the delays table the timer writes to, when it writes markers).
        self.markers = messages if isinstance(messages, OccurrenceRows) else None

    def lease(self, shard: int) -> BlobLease:
        """A fresh lease object for schedule shard ``shard``."""
        return BlobLease(self.container, shard, duration=self.lease_seconds, renew_every=self.renew_every,
                         blob_name=schedule_lease_name(shard))  # fmt: skip

    def materializer(self, shard: int) -> Materializer:
        """The core materializer over one shard's schedules."""
        return Materializer(
            self.schedules.for_shards([shard]),
            self.messages,
            clock=self.clock,
            lead_seconds=self.lead_seconds,
            schedules_per_pass=self.schedules_per_pass,
        )

    def run(self) -> ScheduleRun:
        """One run: every shard whose lease is free (``shard_threads`` side by side), until what is due is written or
        the budget ends."""
        deadline = self._monotonic() + self.budget_seconds
        result = ScheduleRun()
        with ThreadPoolExecutor(max_workers=self.shard_threads, thread_name_prefix="schedule-shard") as pool:
            for part in pool.map(lambda shard: self.run_shard(shard, deadline), range(rows.SHARDS)):
                result.merge(part)
        if self.markers is not None:
            now = self.clock.now()
            result.markers_swept = self.markers.sweep(now, int(now.timestamp()) // 60)
        if self.metrics is not None:
            self.metrics.record(result)
        _log.info("schedule timer run", extra={lf.CLOUD: "azure", lf.EVENT: _EVENT, **result.summary()})
        return result

    def run_shard(self, shard: int, deadline: float) -> ScheduleRun:
        """Hold ``shard``'s lease and materialize its due schedules (a full pass again while one filled its limit)."""
        result = ScheduleRun()
        try:
            lease = self.lease(shard)
            if not lease.try_acquire():
                result.shards_skipped_leased += 1
                return result
        except Exception as exc:  # one shard's failure never stops the others; it is tried again next run
            return _shard_failed(result, shard, exc)
        try:
            materializer = self.materializer(shard)
            while True:
                report = materializer.run_once(self.clock.now(), keep_going=lease.keep_going)
                result.add(report)
                if report.stopped:
                    result.shards_stopped += 1
                    return result
                if report.schedules < self.schedules_per_pass or self._monotonic() >= deadline:
                    break
            result.shards_done += 1
            return result
        except Exception as exc:  # reading the shard's due schedules failed (throttled, table gone)
            return _shard_failed(result, shard, exc)
        finally:
            lease.release()


def _shard_failed(result: ScheduleRun, shard: int, exc: Exception) -> ScheduleRun:
    """Count and log a shard the run could not work on (the ``schedule-failures`` alert reads the line)."""
    result.failures += 1
    _log.warning(
        "a schedule shard failed; it is tried again next run",
        extra={lf.CLOUD: "azure", lf.EVENT: lf.EVENT_SCHEDULE_FAILED, lf.SHARD: shard, lf.REASON: repr(exc)},
    )
    return result


#: Schedules tables this process has made sure exist.
_made: set[str] = set()


def timer_for_host(host: AzureDispatcherHost, env: Mapping[str, str], **kwargs: Any) -> AzureScheduleTimer:
    """The schedule timer beside a dispatcher host: its delays table (the shard count it records), its container;
    the schedules table is created on first use in this process (a 403: provisioned, fine)."""
    host.adopt_table_shards()
    config = AzureScheduleConfig.from_env(env, host.config.table_name)
    schedules = TableScheduleStore(host.clients.tables.get_table_client(config.table_name))
    if config.table_name not in _made:
        schedules.setup_infrastructure()
        _made.add(config.table_name)
    return AzureScheduleTimer(
        schedules,
        OccurrenceRows(host.store),
        host.container,
        clock=host.clock,
        lead_seconds=config.lead_seconds,
        lease_seconds=host.config.lease_seconds,
        **kwargs,
    )
