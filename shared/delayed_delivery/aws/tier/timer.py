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
from ...errors import ConfigurationError, DelayedDeliveryError
from ...settings import DelayedDeliverySettings
from ...timebuckets.wheel import COARSE, FINE, MAX_DELAY_SECONDS, BucketKey, cascade_window, dispatch_window
from .config import DEFAULT_REFUSED_RETRY_SECONDS, DEFAULT_SEND_PHASE_MS
from .lease import DEFAULT_LEASE_SECONDS, BucketLeases
from .notices import BadLines
from .store import ObjectMissingError, S3BucketStore, StoredObject
from .timer_cascade import DEFAULT_GROUP_BYTES, Cascade
from .timer_plan import Found
from .timer_sqs import Notice, TimerSqs
from .timer_work import BucketWork, Tally

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["DEADLINE_MARGIN_SECONDS", "MAX_STRAYS_PER_LISTING", "BucketTimer", "TimerResult"]

#: A run starts no new bucket when fewer seconds than this are left before its deadline.
DEADLINE_MARGIN_SECONDS = 10.0
#: The most keys that are not bucket object keys one listing sets aside (the rest: later runs).
MAX_STRAYS_PER_LISTING = 100
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
        cascade_group_bytes: int = DEFAULT_GROUP_BYTES,
        monotonic: Callable[[], float] = time.monotonic,
        send_phase_ms: int = DEFAULT_SEND_PHASE_MS,
        refused_retry_seconds: int = DEFAULT_REFUSED_RETRY_SECONDS,
        destinations: Collection[str] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.cancellations = cancellations
        self.sqs = TimerSqs(
            sqs_client,
            settings,
            clock,
            send_phase_ms=send_phase_ms,
            refused_retry_seconds=refused_retry_seconds,
            destinations=destinations,
        )
        self.leases = BucketLeases(store, clock, owner, lease_seconds)
        self.margin_seconds = margin_seconds
        self.cascade_group_bytes = cascade_group_bytes
        self.monotonic = monotonic
        self._lease_ends = datetime.max.replace(tzinfo=UTC)
        self._work = BucketWork(store, self.sqs, clock, cancellations)

    def run(self, deadline: float | None = None) -> TimerResult:
        """Cascade, then dispatch, starting no bucket once ``deadline`` (a ``time.monotonic`` value) is near."""
        tally = Tally(TimerResult)
        self._work = BucketWork(self.store, self.sqs, self.clock, self.cancellations)  # records fresh each run
        self._cascade(deadline, tally)
        self._dispatch(deadline, tally)
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

    def _read(self, objects: Sequence[StoredObject]) -> tuple[list[Found], list[Notice], list[str]]:
        """The messages of ``objects``, notices for what cannot be read, and the keys read (gone ones left out)."""
        found: list[Found] = []
        notices: list[Notice] = []
        keys: list[str] = []
        for stored in objects:
            try:
                contents = self.store.read(stored.key)
            except ObjectMissingError:
                continue  # deleted by another run since the listing
            keys.append(stored.key)
            found.extend(Found(message, stored.key) for message in contents.messages)
            if contents.poison or contents.problem is not None:  # one notice per object (#23), its lines kept aside
                notices.append(self._work.bad_object(stored.key, contents.problem, BadLines.of(contents.poison)))
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
        """Send a ready fine bucket; write back what failed for a passing reason, then delete the objects read."""
        work = self._work
        found, notices, keys = self._read(objects)
        plan = work.plan(found)
        window = dispatch_window(self.clock.now(), levels=self.store.levels)
        horizon = window.now + timedelta(seconds=MAX_DELAY_SECONDS)
        misplaced = [m for m in plan.keep if m.due_at > horizon]  # in a bucket it is not due in: move it
        sent = self.sqs.dispatch([m for m in plan.keep if m.due_at <= horizon], window)
        rewrite = work.report_errors([*plan.conflicts, *plan.unusable, *sent.rejected, *notices], tally)
        written = work.write_back(bucket, sent.retry, rewrite)
        written |= work.write_back(None, [*plan.moved, *misplaced], ())
        self.store.delete([key for key in keys if key not in written])  # a rewrite may reuse a key: keep it
        work.applied(work.releasable(plan.applied, rewrite))
        tally.add(
            dispatched=len(sent.sent),
            duplicates_skipped=plan.duplicates,
            cancelled=plan.cancelled,
            rescheduled=len(plan.moved),
            kept_for_retry=len(sent.retry) + len(rewrite) + len(misplaced),
            refused=sent.refused,
            refused_given_up=sent.refused_given_up,
        )
