"""A dispatch worker: sends one partition of a planned fine bucket, a piece at a time, recording its progress.

The worker reads the plan, takes the partition (its progress object, written only over the version it read), and
streams the plan's objects in order, keeping only its partition's lines (ids hashed: ``partition_of``). Every id is
admitted once (``Seen``: the first copy in plan order wins; the same message again is a duplicate skipped, a
different one goes to the error queue). When a piece's lines reach ``bucket_piece_bytes``, the piece is sent
(records applied, ``DelaySeconds`` for the rest), what failed for a passing reason is written back into the bucket,
and the progress is recorded: the next line, the counts, the lease renewed. Near its deadline the worker records
where it is, lets the partition go and enqueues the task again; a kill repeats at most the piece in hand. What the
partition met is kept after every piece (``worker_seen``: a snapshot on hand-over, else a delta), so a worker that
starts again, or a later plan of the bucket, meets it again without sending it.
The design is in docs/buckets.md ("Bursts").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from ... import logfields as lf
from ...cancellations import CancellationCache
from ...clock import Clock
from ...delivery import epoch_ms
from ...settings import DelayedDeliverySettings
from ...timebuckets.apply import Admission, Found, Rejected, Seen
from ...timebuckets.format import BucketMessage, BucketStream, PoisonEntry, read_line
from ...timebuckets.plans import (
    DispatchPlan,
    DispatchTask,
    PartitionProgress,
    PieceCounts,
    line_partition,
)
from ...timebuckets.wheel import MAX_DELAY_SECONDS, DispatchWindow, dispatch_window
from ..release_calendar import ReleaseCalendar
from ..sqs import MAX_BATCH_ENTRIES
from .config import TierSettings
from .held import HeldArea
from .notices import BadLines
from .plan_store import PlanStore, TaskQueue
from .store import ObjectMissingError, S3BucketStore
from .timer_sqs import DispatchOutcome, Notice, TimerSqs
from .timer_work import BucketWork, Tally
from .worker_seen import PartitionSeen

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["DEFAULT_WORKER_LEASE_SECONDS", "PartitionWorker", "WorkerResult"]

#: How long a partition stays with its worker without a new progress record (each piece renews it).
DEFAULT_WORKER_LEASE_SECONDS = 120.0
#: A worker starts no new piece when fewer seconds than this are left before its deadline.
WORKER_MARGIN_SECONDS = 15.0
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """What one worker invocation did for one task."""

    dispatched: int = 0
    duplicates_skipped: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    to_error_queue: int = 0
    kept_for_retry: int = 0
    dropped: int = 0
    pieces: int = 0
    objects_read: int = 0
    #: Lines looked at, every partition's (a worker reads the whole bucket for its share).
    lines_read: int = 0
    #: Lines read again to rebuild the ids met before the progress (after a restart), from the snapshot on.
    lines_reread: int = 0
    #: Seen snapshots read (this partition's, and earlier plans' of the bucket) and written (#31).
    snapshots_read: int = 0
    snapshots_written: int = 0
    #: Deltas (what a piece met, written after it) read and written (#31).
    deltas_read: int = 0
    deltas_written: int = 0
    #: Messages an earlier plan of the bucket (lost, or expired) handed on: met, so not sent again.
    inherited: int = 0
    #: 1: the partition is done; 1: stopped near the deadline (the task enqueued again).
    finished: int = 0
    continued: int = 0
    #: 1: nothing to do (the plan is gone or another, the partition done or held by another worker).
    skipped: int = 0
    #: 1: another worker took the partition over (this one stopped; at most its last piece is sent twice).
    lost_partition: int = 0
    seen_overflow: int = 0  # ids not remembered: the partition met more than ``Seen``'s limit
    #: Refused by their destination (access denied, its key): written back (``kept_for_retry``) until
    #: ``bucket_refused_retry_seconds`` past due, then to the error queue (``refused_given_up``).
    refused: int = 0
    refused_given_up: int = 0
    #: Release control: held for want of a slot within 900 s (into the held area: ``held_written``), the most lag.
    release_held: int = 0
    release_lag_max_seconds: float = 0.0
    held_written: int = 0


@dataclass(slots=True)
class _Piece:
    found: list[Found] = field(default_factory=list)
    conflicts: list[Rejected] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    duplicates: int = 0
    size: int = 0
    #: After the piece: the next line is after ``line`` of object ``object``.
    object: int = 0
    line: int = 0

    @property
    def empty(self) -> bool:
        return not (self.found or self.conflicts or self.notices or self.duplicates)


class PartitionWorker:
    """Sends partitions of planned buckets (one ``run`` per task)."""

    def __init__(
        self,
        store: S3BucketStore,
        sqs_client: SQSClient,
        settings: DelayedDeliverySettings,
        clock: Clock,
        *,
        tier: TierSettings,
        owner: str,
        cancellations: CancellationCache | None = None,
        queue: TaskQueue | None = None,
        lease_seconds: float = DEFAULT_WORKER_LEASE_SECONDS,
        margin_seconds: float = WORKER_MARGIN_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        destinations: Collection[str] | None = None,
        release: ReleaseCalendar | None = None,
    ) -> None:
        self.store = store
        self.plans = PlanStore(store)
        #: Where messages a release cap holds wait (#31).
        self.held = HeldArea(store, release.rates if release is not None else None)
        self.clock = clock
        self.tier = tier
        self.owner = owner
        self.cancellations = cancellations
        self.queue = queue
        self.lease_seconds = lease_seconds
        self.margin_seconds = margin_seconds
        self.monotonic = monotonic
        self.sqs = TimerSqs.for_tier(
            sqs_client, settings, clock, tier, waves=False, destinations=destinations, release=release
        )

    def run(self, task: DispatchTask, deadline: float | None = None) -> WorkerResult:
        """Go on with ``task``'s partition until it is done or ``deadline`` (``time.monotonic``) is near."""
        tally = Tally(WorkerResult)
        plan = self.plans.read_plan(task.bucket)
        same = plan is not None and (plan.created_ms, plan.partitions) == (task.plan_ms, task.partitions)
        claimed = self._claim(plan, task.partition) if plan is not None and same else None
        if plan is None or claimed is None:
            tally.add(skipped=1)
            return tally.result()
        work = BucketWork(self.store, self.sqs, self.clock, self.cancellations)
        _Run(self, plan, task, claimed[0], claimed[1], work, tally, deadline).go()
        return tally.result()

    def time_left(self, deadline: float | None) -> bool:
        """Whether a new piece may start."""
        return deadline is None or self.monotonic() < deadline - self.margin_seconds

    def _claim(self, plan: DispatchPlan, partition: int) -> tuple[PartitionProgress, str] | None:
        """Take the partition: its progress and the ETag to write over; None when done or held by another."""
        stored = self.plans.read_progress(plan, partition)
        now_ms = epoch_ms(self.clock.now())
        current = stored.progress
        if current is not None and (current.done or current.held_by_other(self.owner, now_ms)):
            return None
        base = current or PartitionProgress(plan.bucket, plan.created_ms, partition, plan.partitions)
        claimed = replace(
            base, owner=self.owner, lease_until_ms=now_ms + int(self.lease_seconds * 1000), updated_ms=now_ms
        )
        etag = self.plans.write_progress(claimed, stored.etag)
        return None if etag is None else (claimed, etag)


class _Run:
    """One worker's pass over one partition."""

    def __init__(
        self,
        worker: PartitionWorker,
        plan: DispatchPlan,
        task: DispatchTask,
        progress: PartitionProgress,
        etag: str,
        work: BucketWork,
        tally: Tally[WorkerResult],
        deadline: float | None,
    ) -> None:
        self.worker = worker
        self.plan = plan
        self.task = task
        self.progress = progress
        self.etag = etag
        self.work = work
        self.tally = tally
        self.deadline = deadline
        self.keys = plan.keys(worker.store.prefix)
        self.kept = PartitionSeen(worker.plans, plan, task.partition, tally)
        self.seen = self.kept.seen
        self.partition = task.partition
        self.lines_read = 0
        #: Where the whole snapshot on S3 stands (a hand-over while restoring writes one only past it).
        self.restored = (0, 0)

    def go(self) -> None:
        """Restore what was met (a snapshot, then the lines after it), then send piece by piece from the progress on."""
        start_object, start_line = self.progress.object, self.progress.line
        if not self._restore(start_object, start_line):
            return
        piece = _Piece(object=start_object, line=start_line)
        for index, stream in self._streams(start_object):
            if not self.worker.time_left(self.deadline):
                self._commit(piece, keep=False)
                return
            if stream is None:  # gone since the plan (moved by an operator): nothing left to read in it
                piece.object, piece.line = index + 1, 0
                continue
            header = stream.open()
            version = header.version if header is not None else 0
            self.tally.add(objects_read=1)
            bad = BadLines()  # this partition's unreadable lines of the object: one notice after its last line
            skip = start_line if index == start_object else 0
            for raw in stream.lines():
                if raw.number <= skip:
                    continue
                self.lines_read += 1
                piece.object, piece.line = index, raw.number
                if line_partition(raw, self.plan.partitions, index) != self.partition:
                    continue
                self._take(piece, read_line(raw, version), self.keys[index], bad)
                piece.size += raw.size
                if piece.size >= self.worker.tier.bucket_piece_bytes:
                    if not self.worker.time_left(self.deadline):
                        self._commit(piece, keep=False)
                        return
                    if not self._commit(piece):
                        return
                    piece = _Piece(object=piece.object, line=piece.line)
            problem = stream.problem if index % self.plan.partitions == self.partition else None  # told once
            if bad.count or problem is not None:
                piece.notices.append(self.work.bad_object(self.keys[index], problem, bad))
            piece.object, piece.line = index + 1, 0
        if self._commit(piece, done=True):
            self.tally.add(finished=1)

    def _streams(self, first: int) -> Iterator[tuple[int, BucketStream | None]]:
        """The plan's objects from ``first`` on, each opened while the one before is read (one ahead)."""
        if first >= len(self.keys):
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dd-prefetch") as pool:
            ahead: Future[BucketStream | None] = pool.submit(self._open, first)
            for index in range(first, len(self.keys)):
                current = ahead
                if index + 1 < len(self.keys):
                    ahead = pool.submit(self._open, index + 1)
                yield index, current.result()

    def _open(self, index: int) -> BucketStream | None:
        try:
            return self.worker.store.open(self.keys[index])
        except ObjectMissingError:
            return None

    def _restore(self, last_object: int, last_line: int) -> bool:
        """Meet again what the partition met before its progress (read, not sent), so no message is sent twice: what
        earlier plans of the bucket handed on, this partition's snapshot and deltas, then the lines after the last of
        them; kept as a whole snapshot when that took more than the snapshot. False when the deadline came first (the
        place reached is kept as a snapshot, the partition let go)."""
        last = (last_object, last_line)
        kept = self.kept
        start = kept.restore(last, lambda: self.worker.time_left(self.deadline))
        self.restored = kept.base
        if kept.cut:  # the deadline came while loading deltas: keep what they hold as a snapshot, let go
            return self._hand_over_restoring(start)
        if not self._rebuild(start, last):
            return False
        if self.restored < last:
            # Caught up by deltas or lines read again: all of it in one snapshot before anything is sent. The next
            # restart reads one object, not the chain again (a kill in every invocation, a brownout, would make it
            # longer each time until loading it took a whole invocation); and a partition under way before the
            # workers wrote deltas is covered from here, should its plan be lost.
            kept.snapshot(last, done=False)
            self.restored = last
        return True

    def _rebuild(self, start: tuple[int, int], last: tuple[int, int]) -> bool:
        """Meet again the partition's lines from ``start`` up to ``last`` (read, not sent), stopping for the deadline:
        then the place reached is kept as a snapshot and the partition let go for the next worker (False)."""
        if start >= last:
            return True
        reached = start
        for index, stream in self._streams(start[0]):
            if index > last[0] or (index == last[0] and last[1] == 0):
                return True
            if stream is None:
                reached = (index + 1, 0)
                continue
            header = stream.open()
            version = header.version if header is not None else 0
            skip = start[1] if index == start[0] else 0
            size = 0
            for raw in stream.lines():
                if raw.number <= skip:
                    continue
                if index == last[0] and raw.number > last[1]:
                    return True
                size += raw.size
                if size >= self.worker.tier.bucket_piece_bytes:  # the deadline, looked at every piece's worth read
                    size = 0
                    if not self.worker.time_left(self.deadline):
                        return self._hand_over_restoring(reached)  # up to the line before this one
                reached = (index, raw.number)
                if line_partition(raw, self.plan.partitions, index) != self.partition:
                    continue
                self.tally.add(lines_reread=1)
                item = read_line(raw, version)
                if isinstance(item, BucketMessage):
                    self.seen.admit(item)
            reached = (index + 1, 0)
            if not self.worker.time_left(self.deadline) and reached < last:
                return self._hand_over_restoring(reached)
        return True

    def _hand_over_restoring(self, reached: tuple[int, int]) -> bool:
        """The deadline came while restoring: keep what was met up to ``reached``, let the partition go, enqueue the
        task again. Always False (nothing is sent in this invocation)."""
        if reached > self.restored:
            self.kept.snapshot(reached, done=False)
        position = (self.progress.object, self.progress.line)
        if self._record(*position, PieceCounts(), done=False, keep=False):
            self.tally.add(continued=1)
            if self.worker.queue is not None:
                self.worker.queue.send([self.task])
        return False

    def _take(self, piece: _Piece, item: BucketMessage | PoisonEntry, key: str, bad: BadLines) -> None:
        """Admit one line of the partition into the piece."""
        if not isinstance(item, BucketMessage):
            bad.add(item)
            return
        admission, first = self.seen.admit(item)
        if admission is Admission.NEW:
            piece.found.append(Found(item, key))
        elif admission is Admission.SAME:
            piece.duplicates += 1
        else:
            piece.conflicts.append(Rejected(item, Seen.reason(item, first, key), key))

    def _commit(self, piece: _Piece, *, done: bool = False, keep: bool = True) -> bool:
        """Send the piece, write back what waits, record the progress; False when the partition was taken over.

        ``keep`` False (near the deadline): the partition is let go and the task enqueued again.
        """
        work, tally = self.work, self.tally
        tally.add(lines_read=self.lines_read)
        self.lines_read = 0
        errors_before = tally.counts["to_error_queue"]
        work.fresh()  # the records as they are now, for this piece (#31)
        plan = work.plan(piece.found)  # ids are already unique: applies the records
        window = dispatch_window(self.worker.clock.now(), levels=self.worker.store.levels)
        horizon = window.now + timedelta(seconds=MAX_DELAY_SECONDS)
        misplaced = [m for m in plan.keep if m.due_at > horizon]
        sent = self._send([m for m in plan.keep if m.due_at <= horizon], window)
        if sent is None:
            return False
        rewrite = work.report_errors([*piece.conflicts, *plan.unusable, *sent.rejected, *piece.notices], tally)
        # Beside the plan's objects (salted keys: never one of them, which the finished plan deletes), sent once the
        # plan is done, as late objects are.
        salt = self.plan.name
        work.write_back(self.plan.bucket, sent.retry, rewrite, salt=salt)
        work.write_back(None, [*plan.moved, *misplaced], (), salt=salt)
        self.seen.written_back([*sent.retry, *(r.message for r in rewrite)])
        tally.add(held_written=self.worker.held.hold(sent.held, self.worker.clock.now()))
        counts = PieceCounts(
            sent=len(sent.sent),
            duplicates=piece.duplicates + plan.duplicates,
            cancelled=plan.cancelled,
            rescheduled=len(plan.moved),
            to_error_queue=int(tally.counts["to_error_queue"] - errors_before),
            kept_for_retry=len(sent.retry) + len(rewrite) + len(misplaced),
            pieces=0 if piece.empty else 1,
        )
        tally.add(
            dispatched=counts.sent,
            duplicates_skipped=counts.duplicates,
            cancelled=counts.cancelled,
            rescheduled=counts.rescheduled,
            kept_for_retry=counts.kept_for_retry,
            pieces=counts.pieces,
            refused=sent.refused,
            refused_given_up=sent.refused_given_up,
            release_held=sent.release_held,
        )
        tally.most(seen_overflow=self.seen.overflow, release_lag_max_seconds=max(sent.release_lags, default=0.0))
        # The next worker (or a later plan, if this one is lost) starts from here without reading the lines again:
        # a whole snapshot on hand-over, else the delta of this piece (#31).
        if done or not keep:
            self.kept.snapshot((piece.object, piece.line), done=done)
        else:
            self.kept.delta((piece.object, piece.line))
        if not self._record(piece.object, piece.line, counts, done=done, keep=keep):
            return False
        work.applied(work.releasable(plan.applied, rewrite), plan.applied_until)
        if not keep and not done:
            tally.add(continued=1)
            if self.worker.queue is not None:
                self.worker.queue.send([self.task])
        return True

    def _send(self, messages: list[BucketMessage], window: DispatchWindow) -> DispatchOutcome | None:
        """Send a piece in rounds of ``bucket_send_threads`` batches, renewing the partition's lease between rounds
        once half of it has passed (a slow SQS must not hand a partition still being sent to another worker); None
        when another worker took the partition over (the rest is left to it)."""
        outcome = DispatchOutcome()
        ordered = sorted(messages, key=lambda m: m.destination)  # stable: whole batches per destination
        size = MAX_BATCH_ENTRIES * self.worker.tier.bucket_send_threads
        for start in range(0, len(ordered), size):
            if start and not self._keep_lease():
                return None
            outcome.add(self.work.sqs.dispatch(ordered[start : start + size], window))
        return outcome

    def _keep_lease(self) -> bool:
        """Renew the lease (the progress written again where it is) when half of it has passed; False when lost."""
        now_ms = epoch_ms(self.worker.clock.now())
        if now_ms < self.progress.lease_until_ms - self.worker.lease_seconds * 500:
            return True
        return self._record(self.progress.object, self.progress.line, PieceCounts(), done=False, keep=True)

    def _record(self, obj: int, line: int, counts: PieceCounts, *, done: bool, keep: bool) -> bool:
        """Write the progress (kept: the lease renewed; else let go); False when another worker wrote first."""
        now_ms = epoch_ms(self.worker.clock.now())
        lease = now_ms + int(self.worker.lease_seconds * 1000) if keep and not done else 0
        progress = replace(
            self.progress,
            object=obj,
            line=line,
            done=done,
            owner=self.worker.owner if keep and not done else "",
            lease_until_ms=lease,
            updated_ms=now_ms,
            counts=self.progress.counts.plus(counts),
        )
        etag = self.worker.plans.write_progress(progress, self.etag)
        if etag is None:
            self.tally.add(lost_partition=1)
            _log.warning(
                "another worker took the partition over; this one stops",
                extra={lf.EVENT: lf.EVENT_RETRY, "bucket": self.plan.bucket.iso, "partition": self.partition},
            )
            return False
        self.progress, self.etag = progress, etag
        return True
