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

Metrics, as the AWS timer's: besides the counts, ``lateness`` (the most an occurrence written this run was late: the
time its row was written past its fire time, 0 when written ahead; an occurrence written again after a kill counts
from the second write) and ``skipped_paused`` (the occurrences a resume counted skipped while paused, reported by the
run that next moves the schedule's cursor, once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from ... import logfields as lf
from ...clock import Clock, SystemClock
from ...model import DelayedMessage
from ...schedules.materializer import Materializer, MaterializeReport
from ...schedules.ports import MessageCanceller, MessageWriter, OccurrenceSink
from ..blob_lease import BlobLease
from . import rows
from .batched import BatchedMaterializer, OccurrenceBatchSink
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
    skipped_paused: int = 0
    markers_swept: int = 0
    #: The most an occurrence written was late (seconds; 0 when none was).
    lateness_max_seconds: float = 0.0
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
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(mine, theirs) if f.name.endswith("_max_seconds") else mine + theirs)

    def summary(self) -> dict[str, float]:
        """The counts (for the log line and the metrics)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ids"}


class ScheduleMetrics:
    """OpenTelemetry metrics of the schedule timer (Application Insights customMetrics): counters, and
    ``delayed_delivery.schedule.lateness`` (histogram, seconds: each run's ``lateness_max_seconds``)."""

    COUNTERS = ("fired", "fired_late", "missed", "skipped_paused", "dst_adjusted", "failures", "shards_skipped_leased")

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("delayed_delivery")
        self.counters = {
            name: meter.create_counter(f"delayed_delivery.schedule.{name}", unit="{occurrence}")
            for name in self.COUNTERS
        }
        self.lateness = meter.create_histogram("delayed_delivery.schedule.lateness", unit="s")

    def record(self, run: ScheduleRun) -> None:
        """Add one run's counts and its lateness."""
        summary = run.summary()
        for name, counter in self.counters.items():
            counter.add(int(summary[name]))
        self.lateness.record(run.lateness_max_seconds)


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
        """The core materializer over one shard's schedules (the view reports resumed spans, the writer notes
        lateness: ``_counted``)."""
        return BatchedMaterializer(
            self.schedules.for_shards([shard], reports_skipped=True),
            _Noting(self.messages, self.clock),
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
                _counted(materializer, report, result)
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


class _Noting:
    """The timer's writer: writes through ``inner`` and notes how late each occurrence was written (seconds)."""

    def __init__(self, inner: MessageWriter, clock: Clock) -> None:
        self.inner = inner
        self.clock = clock
        self.late: dict[str, float] = {}
        #: Where the materializer cancels what a lost cursor write left (as it finds it on ``inner``).
        self.store_port = inner if isinstance(inner, MessageCanceller) else getattr(inner, "store_port", None)

    def store(self, message: DelayedMessage) -> None:
        """Keep ``message`` (through ``inner``)."""
        self.inner.store(message)
        self._note(message)

    def store_occurrence(self, message: DelayedMessage, keep_until: datetime) -> None:
        """Keep the occurrence once (``inner``'s markers, or its id rule when it keeps none)."""
        if isinstance(self.inner, OccurrenceSink):
            self.inner.store_occurrence(message, keep_until)
        else:
            self.inner.store(message)
        self._note(message)

    def store_occurrences(self, items: Sequence[tuple[DelayedMessage, datetime]]) -> list[Exception | None]:
        """Keep each occurrence once (in transactions when ``inner`` can, else one at a time); per item None or its
        error."""
        if isinstance(self.inner, OccurrenceBatchSink):
            out = self.inner.store_occurrences(items)
        else:
            out = [_one(self.store_occurrence, message, keep) for message, keep in items]
            return out  # noted one by one
        for (message, _), error in zip(items, out, strict=True):
            if error is None:
                self._note(message)
        return out

    def _note(self, message: DelayedMessage) -> None:
        self.late[message.message_id] = max(0.0, (self.clock.now() - message.due_at).total_seconds())


def _one(
    write: Callable[[DelayedMessage, datetime], None], message: DelayedMessage, keep: datetime
) -> Exception | None:
    try:
        write(message, keep)
    except Exception as exc:  # this occurrence only
        return exc
    return None


def _counted(materializer: Materializer, report: MaterializeReport, result: ScheduleRun) -> None:
    """Add a pass's lateness (of the occurrences whose cursor write landed) and the resumed spans it reported."""
    writer, view = materializer.messages, materializer.schedules
    if isinstance(writer, _Noting):
        late = [writer.late[i] for i in report.ids if i in writer.late]
        result.lateness_max_seconds = max([result.lateness_max_seconds, *late])
        writer.late.clear()
    if isinstance(view, TableScheduleStore):
        result.skipped_paused += view.skipped_reported
        view.skipped_reported = 0


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
