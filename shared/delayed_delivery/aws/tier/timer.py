"""The tier's timer: each run cascades due coarse buckets into fine ones, then dispatches the ready fine buckets.

One timer per bucket (``BucketLeases``). Within a bucket every message id is sent once; cancel and reschedule records
are applied; what cannot be delivered goes to the error queue with a reason; what failed for a passing reason is
written again before the objects it came from are deleted, so a crash at any step repeats work, never loses it.
The design and the crash behaviour are in docs/buckets.md.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from ... import logfields as lf
from ...cancellations import CancellationCache
from ...clock import Clock
from ...delivery import epoch_ms
from ...errors import ConfigurationError, DelayedDeliveryError
from ...settings import DelayedDeliverySettings
from ...timebuckets.apply import Found
from ...timebuckets.format import MAX_DECODED_BYTES, MAX_OBJECT_MESSAGES, BucketMessage, read_line
from ...timebuckets.plans import MAX_PLAN_OBJECTS, DispatchPlan, DispatchTask
from ...timebuckets.wheel import COARSE, FINE, MAX_DELAY_SECONDS, BucketKey, cascade_window, dispatch_window
from ..release_calendar import ReleaseCalendar
from .config import TierSettings
from .held import HeldArea
from .lease import DEFAULT_LEASE_SECONDS, BucketLeases
from .notices import BadLines
from .plan_store import PlanStore, TaskQueue
from .store import ObjectMissingError, S3BucketStore, StoredObject
from .timer_cascade import Cascade
from .timer_sqs import Notice, TimerSqs
from .timer_work import BucketWork, Tally
from .worker import DEFAULT_WORKER_LEASE_SECONDS, PartitionWorker

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["DEADLINE_MARGIN_SECONDS", "MAX_STRAYS_PER_LISTING", "STALL_SECONDS", "BucketTimer", "TimerResult"]

#: A run starts no new bucket when fewer seconds than this are left before its deadline.
DEADLINE_MARGIN_SECONDS = 10.0
#: The most keys that are not bucket object keys one listing sets aside (the rest: later runs).
MAX_STRAYS_PER_LISTING = 100
#: A planned partition no worker recorded progress on for this long (and nobody holds) is enqueued again.
STALL_SECONDS = DEFAULT_WORKER_LEASE_SECONDS + 60
#: Messages assumed in an object whose key carries no count (a v1 key), for sizing a plan.
_V1_GUESS = 1_000
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TimerResult:
    """What one timer run did."""

    cascaded_objects: int = 0
    cascaded_messages: int = 0
    dispatched: int = 0
    duplicates_skipped: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    to_error_queue: int = 0
    kept_for_retry: int = 0
    oldest_overdue_seconds: float = 0.0
    buckets_skipped_leased: int = 0
    #: Buckets left for a later run: an S3 or SQS failure, or the deadline near.
    buckets_failed: int = 0
    buckets_left_for_deadline: int = 0
    #: Error-queue entries refused even in reduced form (logged with their reason, then dropped).
    dropped: int = 0
    #: Keys under a level that are not bucket object keys, moved under ``problems/`` (logged).
    strays_set_aside: int = 0
    #: Messages a destination refused (access denied, its key): retried until ``bucket_refused_retry_seconds`` past
    #: their due time (counted in ``kept_for_retry`` too), then given up to the error queue (``refused_given_up``).
    refused: int = 0
    refused_given_up: int = 0
    #: Release control (``release_rates``): messages held for want of a release slot within 900 s (met this run),
    #: and the most seconds a slot added to a message sent.
    release_held: int = 0
    release_lag_max_seconds: float = 0.0
    #: Release control: messages written into their destination's held area (``held.py``), sent from it, and
    #: written back into it (what was left of an object the calendar placed in part: a run's rewrites, #31).
    held_written: int = 0
    held_released: int = 0
    held_rewritten: int = 0
    #: Ready buckets too big to send at once: planned, their partitions handed to the dispatch workers.
    buckets_planned: int = 0
    #: Dispatch tasks enqueued (new plans, and partitions no worker went on with for ``STALL_SECONDS``).
    tasks_enqueued: int = 0
    #: Plans every partition of which is done: their objects deleted, then the plan.
    plans_finished: int = 0
    #: Buckets listed small that held more bytes than the timer sends itself once read: planned instead.
    inline_over_bound: int = 0


def _by_bucket(objects: Iterable[StoredObject]) -> Iterator[tuple[BucketKey, list[StoredObject]]]:
    for bucket, group in itertools.groupby(objects, key=lambda o: o.bucket):
        yield bucket, list(group)


def _collect(strays: list[str], key: str) -> None:
    if len(strays) < MAX_STRAYS_PER_LISTING:
        strays.append(key)


class BucketTimer:
    """Cascade then dispatch; ``run`` is one timer invocation (EventBridge, every minute)."""

    def __init__(
        self,
        store: S3BucketStore,
        sqs_client: SQSClient,
        settings: DelayedDeliverySettings,
        clock: Clock,
        *,
        cancellations: CancellationCache | None = None,
        owner: str,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        margin_seconds: float = DEADLINE_MARGIN_SECONDS,
        tier: TierSettings | None = None,
        queue: TaskQueue | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        destinations: Collection[str] | None = None,
        release: ReleaseCalendar | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.cancellations = cancellations
        #: Every tier setting the timer reads (send phase, refused retry, cascade group, ...): one place.
        self.tier = tier = tier or TierSettings()
        #: Where plans' tasks go; None: the timer sends its plans' pieces itself, after the small buckets.
        self.queue = queue
        self.owner = owner
        self.sqs_client = sqs_client
        self.plans = PlanStore(store)
        #: The queues the tier may deliver to (None: any): a message for another goes to the error queue.
        self.destinations = frozenset(destinations) if destinations is not None else None
        self.sqs = TimerSqs.for_tier(sqs_client, settings, clock, tier, destinations=self.destinations, release=release)
        self.leases = BucketLeases(store, clock, owner, lease_seconds)
        #: Where messages a release cap holds wait, per destination, until the calendar has room (#31).
        self.held = HeldArea(store, release.rates if release is not None else None)
        self.margin_seconds = margin_seconds
        #: ``bucket_cascade_group_bytes``, as an attribute: tests shrink it below the setting's 1 MiB floor.
        self.cascade_group_bytes = tier.bucket_cascade_group_bytes
        self.monotonic = monotonic
        #: Partitions of plans met in this run, sent by the timer itself when there is no dispatch queue.
        self._local: list[DispatchTask] = []
        self._lease_ends = datetime.max.replace(tzinfo=UTC)
        self._work = BucketWork(store, self.sqs, clock, cancellations)

    def run(self, deadline: float | None = None) -> TimerResult:
        """Cascade, then dispatch, starting no bucket once ``deadline`` (a ``time.monotonic`` value) is near."""
        tally = Tally(TimerResult)
        self._work = BucketWork(self.store, self.sqs, self.clock, self.cancellations)
        self._local = []
        self._cascade(deadline, tally)
        self._release_held(deadline, tally)  # before the ready buckets: the oldest messages take the first slots
        self._dispatch(deadline, tally)
        self._work_plans_here(deadline, tally)
        return tally.result()

    def _time_left(self, deadline: float | None) -> bool:
        return deadline is None or self.monotonic() < deadline - self.margin_seconds

    def _cascade(self, deadline: float | None, tally: Tally[TimerResult]) -> None:
        target = cascade_window(self.clock.now(), self.store.levels)
        strays: list[str] = []
        ready = list(self.store.objects(COARSE, until=target.start, on_stray=partial(_collect, strays)))
        self._set_aside_strays(strays, deadline, tally)
        for bucket, objects in _by_bucket(ready):
            self._leased(bucket, deadline, tally, partial(self._cascade_bucket, objects, deadline, tally))

    def _dispatch(self, deadline: float | None, tally: Tally[TimerResult]) -> None:
        now = self.clock.now()
        window = dispatch_window(now, levels=self.store.levels)
        strays: list[str] = []
        ready = list(self.store.objects(FINE, until=window.last.start, on_stray=partial(_collect, strays)))
        self._set_aside_strays(strays, deadline, tally)
        if ready:
            overdue = (now - ready[0].bucket.end(self.store.levels)).total_seconds()
            tally.most(oldest_overdue_seconds=max(0.0, overdue))
        for bucket, objects in _by_bucket(ready):
            self._leased(bucket, deadline, tally, partial(self._dispatch_bucket, bucket, objects, tally))

    def _leased(
        self, bucket: BucketKey, deadline: float | None, tally: Tally[TimerResult], work: Callable[[], None]
    ) -> None:
        """Do ``work`` on ``bucket`` under its lease; a failure leaves the bucket to a later run."""
        if not self._time_left(deadline):
            tally.add(buckets_left_for_deadline=1)
            return
        lease = self.leases.acquire(bucket)
        if lease is None:
            tally.add(buckets_skipped_leased=1)
            return
        self._lease_ends = lease.expires_at - timedelta(seconds=self.leases.seconds / 4)  # stop with room to spare
        self._work.fresh()  # the records as they are now, for this bucket (#31)
        try:
            work()
        except ConfigurationError:
            raise
        except DelayedDeliveryError as exc:
            tally.add(buckets_failed=1)
            _log.warning(
                "bucket left for a later run",
                extra={lf.EVENT: lf.EVENT_RETRY, "bucket": f"{bucket.level}/{bucket.iso}", lf.REASON: str(exc)},
            )
        except Exception as exc:  # a bug met in one bucket: the other buckets still go out
            tally.add(buckets_failed=1)
            _log.exception(
                "bucket left for a later run after an unexpected failure",
                extra={lf.EVENT: lf.EVENT_RETRY, "bucket": f"{bucket.level}/{bucket.iso}", lf.REASON: repr(exc)[:1024]},
            )
        finally:
            try:
                self.leases.release(lease)
            except DelayedDeliveryError as exc:  # it expires on its own
                _log.warning("lease not released", extra={lf.EVENT: lf.EVENT_RETRY, lf.REASON: str(exc)})

    def _read(
        self, objects: Sequence[StoredObject], bound: int, most: int
    ) -> tuple[list[Found], list[Notice], list[str]] | None:
        """The messages of ``objects``, notices for what cannot be read, and the keys read (gone ones left out);
        None as soon as the lines read pass ``bound`` bytes or the messages ``most`` (nothing is sent or set aside)."""
        found: list[Found] = []
        notices: list[Notice] = []
        keys: list[str] = []
        bad_objects: list[tuple[str, str | None, BadLines]] = []
        size = 0
        for stored in objects:
            try:
                stream = self.store.open(stored.key)
            except ObjectMissingError:
                continue  # deleted by another run since the listing
            header = stream.open()
            version = header.version if header is not None else 0
            bad = BadLines()
            for raw in stream.lines():
                size += raw.size
                if size > bound:
                    return None
                item = read_line(raw, version)
                if isinstance(item, BucketMessage):
                    found.append(Found(item, stored.key))
                    if len(found) > most:
                        return None
                else:
                    bad.add(item)
            keys.append(stored.key)
            if bad.count or stream.problem is not None:  # one notice per object (#23), its lines kept aside
                bad_objects.append((stored.key, stream.problem, bad))
        notices += [self._work.bad_object(key, problem, bad) for key, problem, bad in bad_objects]
        return found, notices, keys

    def _set_aside_strays(self, keys: Sequence[str], deadline: float | None, tally: Tally[TimerResult]) -> None:
        """Move keys the tier cannot name (not bucket object keys) under ``problems/``, logged; failures: next run."""
        for key in keys:
            if not self._time_left(deadline):
                return
            try:
                copy = self.store.set_aside(key)
                self.store.delete([key])
            except ConfigurationError:
                raise
            except DelayedDeliveryError as exc:
                _log.warning("stray key not set aside", extra={lf.EVENT: lf.EVENT_RETRY, lf.REASON: str(exc)})
                continue
            tally.add(strays_set_aside=1)
            _log.error(
                "a key under the tier's prefix is not a bucket object key; it is kept under problems/",
                extra={lf.EVENT: lf.EVENT_ERROR_QUEUE, "object": copy, lf.REASON: f"not a bucket object key: {key}"},
            )

    def _cascade_bucket(
        self, objects: Sequence[StoredObject], deadline: float | None, tally: Tally[TimerResult]
    ) -> None:
        """Split a coarse bucket into fine buckets, a group bounded by bytes at a time (``timer_cascade.py``)."""

        def may_go_on() -> bool:
            return self._time_left(deadline) and self.clock.now() < self._lease_ends

        if not Cascade(self._work, tally, self.cascade_group_bytes, may_go_on).run(objects):
            tally.add(buckets_left_for_deadline=1)  # the rest: a later run

    def _dispatch_bucket(self, bucket: BucketKey, objects: Sequence[StoredObject], tally: Tally[TimerResult]) -> None:
        """Send a small ready bucket at once; plan a big one (or look after its plan) for the workers.

        A bucket with a plan is the workers' until the plan is done, whatever is listed beside its objects (a late
        ingest, a write-back, an operator's rewrite): sent inline, those would go out beside the plan's objects and
        the plan would never be looked after again (#31).
        """
        tier = self.tier
        plan = self.plans.read_plan(bucket)
        if plan is not None:
            self._look_after(plan, tally)
            return
        if sum(o.size for o in objects) <= tier.bucket_inline_max_bytes:  # the listed bytes; the counts only size plans
            read = self._read(objects, tier.bucket_inline_max_bytes, tier.bucket_inline_max_messages)
            if read is not None:
                self._send_inline(bucket, *read, tally)
                return
            tally.add(inline_over_bound=1)  # small as listed, more once read: planned instead
        listed = sum(o.count if o.count is not None else _V1_GUESS for o in objects)
        self._fan_out(bucket, objects, listed, tally)

    def _send_inline(
        self,
        bucket: BucketKey,
        found: list[Found],
        notices: list[Notice],
        keys: list[str],
        tally: Tally[TimerResult],
    ) -> None:
        """Send a ready fine bucket; write back what failed for a passing reason, then delete the objects read."""
        work = self._work
        plan = work.plan(found)
        window = dispatch_window(self.clock.now(), levels=self.store.levels)
        horizon = window.now + timedelta(seconds=MAX_DELAY_SECONDS)
        misplaced = [m for m in plan.keep if m.due_at > horizon]  # in a bucket it is not due in: move it
        sent = self.sqs.dispatch([m for m in plan.keep if m.due_at <= horizon], window)
        rewrite = work.report_errors([*plan.conflicts, *plan.unusable, *sent.rejected, *notices], tally)
        written = work.write_back(bucket, sent.retry, rewrite)
        written |= work.write_back(None, [*plan.moved, *misplaced], ())
        tally.add(held_written=self.held.hold(sent.held, self.clock.now()))
        self.store.delete([key for key in keys if key not in written])  # a rewrite may reuse a key: keep it
        work.applied(work.releasable(plan.applied, rewrite), plan.applied_until)
        tally.add(
            dispatched=len(sent.sent),
            duplicates_skipped=plan.duplicates,
            cancelled=plan.cancelled,
            rescheduled=len(plan.moved),
            kept_for_retry=len(sent.retry) + len(rewrite) + len(misplaced),
            refused=sent.refused,
            refused_given_up=sent.refused_given_up,
            release_held=sent.release_held,
        )
        tally.most(release_lag_max_seconds=max(sent.release_lags, default=0.0))

    def _release_held(self, deadline: float | None, tally: Tally[TimerResult]) -> None:
        """Send what the held areas hold, each destination's oldest object first, stopping at the first object the
        calendar cannot place whole: the objects after it are not read (a run's work is what it can release)."""
        if self.sqs.release is None:
            return
        for destination in self.held.destinations():
            store = self.held.store_for(destination)
            for stored in store.objects(FINE):
                released = [False]
                self._leased(
                    stored.bucket, deadline, tally, partial(self._release_object, store, stored, released, tally)
                )
                if not released[0]:
                    break

    def _release_object(
        self, store: S3BucketStore, stored: StoredObject, released: list[bool], tally: Tally[TimerResult]
    ) -> None:
        """Send one held object's messages the calendar places; write back the rest (unless it is all of them)."""
        read = self._read([stored], MAX_DECODED_BYTES, MAX_OBJECT_MESSAGES)
        if read is None or not read[2]:
            released[0] = read is not None  # gone since the listing: go on with the next
            return
        found, notices, _ = read
        work = self._work
        plan = work.plan(found)
        sent = self.sqs.dispatch(plan.keep, dispatch_window(self.clock.now(), levels=self.store.levels))
        rewrite = work.report_errors([*plan.conflicts, *plan.unusable, *sent.rejected, *notices], tally)
        rest = [*sent.held, *sent.retry, *(r.message for r in rewrite)]
        if len(rest) < len(found):  # something went (sent, cancelled, moved, to the error queue): rewrite the rest
            written: set[str] = set()
            for group in ([*sent.held, *sent.retry], *([r.message] for r in rewrite)):
                if group:
                    written.update(store.write(stored.bucket, group))
            work.write_back(None, plan.moved, ())
            if stored.key not in written:
                store.delete([stored.key])
            work.applied(work.releasable(plan.applied, rewrite), plan.applied_until)
            tally.add(held_rewritten=len(rest))
        released[0] = not rest
        tally.add(
            dispatched=len(sent.sent),
            held_released=len(sent.sent),
            cancelled=plan.cancelled,
            rescheduled=len(plan.moved),
            kept_for_retry=len(sent.retry) + len(rewrite),
            refused=sent.refused,
            refused_given_up=sent.refused_given_up,
            release_held=sent.release_held,
        )
        tally.most(release_lag_max_seconds=max(sent.release_lags, default=0.0))

    def _fan_out(
        self, bucket: BucketKey, objects: Sequence[StoredObject], listed: int, tally: Tally[TimerResult]
    ) -> None:
        """Plan a big bucket once and hand its partitions out; later runs look after the plan until it is done."""
        now_ms = epoch_ms(self.clock.now())
        names = tuple(o.key.rsplit("/", 1)[1] for o in objects[:MAX_PLAN_OBJECTS])
        made = DispatchPlan(bucket, now_ms, self.tier.partitions(listed), names)
        if self.plans.create_plan(made):
            tally.add(buckets_planned=1)
            self._hand_out(made, range(made.partitions), tally)
            return
        plan = self.plans.read_plan(bucket)  # another timer planned it first
        if plan is not None:
            self._look_after(plan, tally)

    def _look_after(self, plan: DispatchPlan, tally: Tally[TimerResult]) -> None:
        """Finish a plan every partition of which is done (its objects deleted, then the plan); hand out again the
        partitions nobody went on with for ``STALL_SECONDS``."""
        now_ms = epoch_ms(self.clock.now())
        stored = [self.plans.read_progress(plan, k) for k in range(plan.partitions)]
        if all(s.progress is not None and s.progress.done for s in stored):
            self.store.delete(plan.keys(self.store.prefix))
            self.plans.delete_plan(plan)
            tally.add(plans_finished=1)
            return
        stalled = []
        for k, state in enumerate(stored):
            progress = state.progress
            if progress is not None and (progress.done or progress.lease_until_ms > now_ms):
                continue
            last = max(plan.created_ms, progress.updated_ms if progress is not None else 0)
            if self.queue is None or now_ms - last >= STALL_SECONDS * 1000:
                stalled.append(k)
        self._hand_out(plan, stalled, tally)

    def _hand_out(self, plan: DispatchPlan, partitions: Iterable[int], tally: Tally[TimerResult]) -> None:
        tasks = [DispatchTask(plan.bucket, plan.created_ms, k, plan.partitions) for k in partitions]
        if self.queue is None:
            self._local.extend(tasks)
            return
        self.queue.send(tasks)
        tally.add(tasks_enqueued=len(tasks))

    def _work_plans_here(self, deadline: float | None, tally: Tally[TimerResult]) -> None:
        """Without a dispatch queue: send the partitions of the plans met, after the small buckets, while time lasts."""
        if not self._local:
            return
        worker = PartitionWorker(
            self.store,
            self.sqs_client,
            self.settings,
            self.clock,
            tier=self.tier,
            owner=self.owner,
            cancellations=self.cancellations,
            lease_seconds=self.leases.seconds,
            margin_seconds=self.margin_seconds,
            monotonic=self.monotonic,
            destinations=self.destinations,
            release=self.sqs.release,
        )
        for task in self._local:
            if not self._time_left(deadline):
                return
            result = worker.run(task, deadline)
            tally.add(
                dispatched=result.dispatched,
                duplicates_skipped=result.duplicates_skipped,
                cancelled=result.cancelled,
                rescheduled=result.rescheduled,
                to_error_queue=result.to_error_queue,
                kept_for_retry=result.kept_for_retry,
                dropped=result.dropped,
                refused=result.refused,
                refused_given_up=result.refused_given_up,
                release_held=result.release_held,
                held_written=result.held_written,
            )
            tally.most(release_lag_max_seconds=result.release_lag_max_seconds)
