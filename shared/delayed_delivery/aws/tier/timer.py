"""The tier's timer: each run cascades due coarse buckets into fine ones, then dispatches the ready fine buckets.

One timer per bucket (``BucketLeases``). Within a bucket every message id is sent once; cancel and reschedule records
are applied; what cannot be delivered goes to the error queue with a reason; what failed for a passing reason is
written again before the objects it came from are deleted, so a crash at any step repeats work, never loses it.
The design and the crash behaviour are in docs/buckets.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from ... import logfields as lf
from ...cancellations import Cancellation, CancellationCache
from ...clock import Clock
from ...errors import ConfigurationError, DelayedDeliveryError
from ...settings import DelayedDeliverySettings
from ...timebuckets.format import BucketMessage, PoisonEntry
from ...timebuckets.wheel import COARSE, FINE, MAX_DELAY_SECONDS, BucketKey, cascade_window, dispatch_window
from .lease import DEFAULT_LEASE_SECONDS, BucketLeases
from .store import ObjectMissingError, S3BucketStore, StoredObject
from .timer_plan import BucketPlan, Found, Rejected, plan_bucket
from .timer_sqs import ErrorQueueOutcome, Notice, TimerSqs

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["CASCADE_GROUP_MESSAGES", "DEADLINE_MARGIN_SECONDS", "MAX_STRAYS_PER_LISTING", "BucketTimer", "TimerResult"]

#: How many messages of a coarse bucket are read, merged and written into fine buckets at a time (bounds memory).
CASCADE_GROUP_MESSAGES = 100_000
#: A run starts no new bucket when fewer seconds than this are left before its deadline.
DEADLINE_MARGIN_SECONDS = 10.0
#: The most keys that are not bucket object keys one listing sets aside (the rest: later runs).
MAX_STRAYS_PER_LISTING = 100
#: Messages assumed in an object whose key carries no count (a v1 key), for grouping.
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


class _Tally:
    """The counts of a run while it runs."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {f.name: 0 for f in fields(TimerResult)}

    def add(self, **counts: float) -> None:
        for name, value in counts.items():
            self.counts[name] += value

    def result(self) -> TimerResult:
        counts = dict(self.counts)
        overdue = float(counts.pop("oldest_overdue_seconds"))
        return TimerResult(**{k: int(v) for k, v in counts.items()}, oldest_overdue_seconds=overdue)


def _by_bucket(objects: Iterable[StoredObject]) -> Iterator[tuple[BucketKey, list[StoredObject]]]:
    for bucket, group in itertools.groupby(objects, key=lambda o: o.bucket):
        yield bucket, list(group)


def _groups(objects: Sequence[StoredObject], limit: int) -> Iterator[list[StoredObject]]:
    """Consecutive objects holding about ``limit`` messages together (by the counts in their keys)."""
    group: list[StoredObject] = []
    held = 0
    for stored in objects:
        count = stored.count if stored.count is not None else _V1_GUESS
        if group and held + count > limit:
            yield group
            group, held = [], 0
        group.append(stored)
        held += count
    if group:
        yield group


def _collect(strays: list[str], key: str) -> None:
    if len(strays) < MAX_STRAYS_PER_LISTING:
        strays.append(key)


def _json(document: Mapping[str, object]) -> str:
    return json.dumps(document, ensure_ascii=True, separators=(",", ":"))


def _notice(document: Mapping[str, object], reason: str, key: str) -> Notice:
    return Notice(_json(document), reason, key=key)


def _line_notice(key: str, entry: PoisonEntry) -> Notice:
    """The notice for a line that cannot be read: its reason and the line itself, cut and ASCII-escaped.

    Bytes that are not UTF-8 appear as surrogate escapes (``\\udcff``); the reduced form (sent if the error queue
    refuses the whole notice) leaves the line out.
    """
    reason = f"line {entry.line} of {key} cannot be read: {entry.reason}"
    document = {"format": "delayed-delivery-bucket-line/1", "object": key, "line": entry.line}
    reduced = {**document, "id": entry.message_id, "reason": entry.reason}
    raw = entry.raw.decode("utf-8", "surrogateescape")
    whole = {**reduced, "raw": raw, "raw_bytes": entry.raw_size, "truncated": entry.raw_size > len(entry.raw)}
    return Notice(_json(whole), reason, key=key, reduced=_json(reduced))


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
        cascade_group_messages: int = CASCADE_GROUP_MESSAGES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.cancellations = cancellations
        self.sqs = TimerSqs(sqs_client, settings, clock)
        self.leases = BucketLeases(store, clock, owner, lease_seconds)
        self.margin_seconds = margin_seconds
        self.cascade_group_messages = cascade_group_messages
        self.monotonic = monotonic
        self._lease_ends = datetime.max.replace(tzinfo=UTC)
        #: Each destination's records as read in this run (read at most once per run, fresh for every run).
        self._records: dict[str, dict[str, Cancellation]] = {}

    def run(self, deadline: float | None = None) -> TimerResult:
        """Cascade, then dispatch, starting no bucket once ``deadline`` (a ``time.monotonic`` value) is near."""
        tally = _Tally()
        self._records = {}
        try:
            self._cascade(deadline, tally)
            self._dispatch(deadline, tally)
        finally:
            self._records = {}
        return tally.result()

    def _time_left(self, deadline: float | None) -> bool:
        return deadline is None or self.monotonic() < deadline - self.margin_seconds

    def _lookup(self, destination: str) -> Mapping[str, Cancellation]:
        """The destination's records, read once per run (a failed read: none, reported by the cache, once)."""
        if self.cancellations is None:
            return {}
        records = self._records.get(destination)
        if records is None:
            records = self._records[destination] = dict(self.cancellations.lookup(destination))
        return records

    def _cascade(self, deadline: float | None, tally: _Tally) -> None:
        target = cascade_window(self.clock.now(), self.store.levels)
        strays: list[str] = []
        ready = list(self.store.objects(COARSE, until=target.start, on_stray=partial(_collect, strays)))
        self._set_aside_strays(strays, deadline, tally)
        for bucket, objects in _by_bucket(ready):
            self._leased(bucket, deadline, tally, partial(self._cascade_bucket, bucket, objects, deadline, tally))

    def _dispatch(self, deadline: float | None, tally: _Tally) -> None:
        now = self.clock.now()
        window = dispatch_window(now, levels=self.store.levels)
        strays: list[str] = []
        ready = list(self.store.objects(FINE, until=window.last.start, on_stray=partial(_collect, strays)))
        self._set_aside_strays(strays, deadline, tally)
        if ready:
            overdue = (now - ready[0].bucket.end(self.store.levels)).total_seconds()
            tally.counts["oldest_overdue_seconds"] = max(0.0, overdue)
        for bucket, objects in _by_bucket(ready):
            self._leased(bucket, deadline, tally, partial(self._dispatch_bucket, bucket, objects, tally))

    def _leased(self, bucket: BucketKey, deadline: float | None, tally: _Tally, work: Callable[[], None]) -> None:
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
            notices.extend(_line_notice(stored.key, entry) for entry in contents.poison)
            if contents.problem is not None:
                copy = self.store.set_aside(stored.key)
                reason = f"bucket object {stored.key} is damaged: {contents.problem}; a copy is kept at {copy}"
                document = {"format": "delayed-delivery-bucket-object/1", "object": stored.key, "copy": copy}
                notices.append(_notice({**document, "problem": contents.problem}, reason, stored.key))
        return found, notices, keys

    def _set_aside_strays(self, keys: Sequence[str], deadline: float | None, tally: _Tally) -> None:
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

    def _report_errors(self, items: Sequence[Rejected | Notice], tally: _Tally) -> list[Rejected]:
        """Send ``items`` to the error queue; returns the messages it did not take now, to be written back.

        A notice it did not take leaves a copy of its object under ``problems/`` (the raw line is kept there).
        """
        outcome: ErrorQueueOutcome = self.sqs.to_error_queue(items)
        tally.add(to_error_queue=outcome.sent, dropped=len(outcome.dropped))
        for item in outcome.dropped:
            _log.error(
                "dropped: the error queue refused it, even reduced",
                extra={lf.EVENT: lf.EVENT_ERROR_QUEUE, lf.REASON: item.reason},
            )
        for key in sorted({item.key for item in outcome.retry if isinstance(item, Notice)}):
            copy = self.store.set_aside(key)
            _log.error(
                "the error queue did not take a notice; the object is kept under problems/",
                extra={lf.EVENT: lf.EVENT_ERROR_QUEUE, "object": copy, lf.REASON: "error queue unavailable"},
            )
        return [item for item in outcome.retry if isinstance(item, Rejected)]

    def _write_back(
        self, bucket: BucketKey | None, messages: Sequence[BucketMessage], rejected: Sequence[Rejected]
    ) -> set[str]:
        """Write ``messages`` (and each rejected message on its own: two may share an id) back; the keys written."""
        now = self.clock.now()
        written: set[str] = set()
        groups = [list(messages), *([r.message] for r in rejected)]
        for group in groups:
            if not group:
                continue
            if bucket is None:
                for keys in self.store.write_due(group, now).values():
                    written.update(keys)
            else:
                written.update(self.store.write(bucket, group))
        return written

    def _cascade_bucket(
        self, bucket: BucketKey, objects: Sequence[StoredObject], deadline: float | None, tally: _Tally
    ) -> None:
        """Split a coarse bucket into fine buckets, a group of objects at a time, deleting each group once written."""
        for group in _groups(objects, self.cascade_group_messages):
            if not self._time_left(deadline) or self.clock.now() >= self._lease_ends:  # the rest: a later run
                tally.add(buckets_left_for_deadline=1)
                return
            found, notices, keys = self._read(group)
            plan = plan_bucket(found, self._lookup)
            rewrite = self._report_errors([*plan.conflicts, *notices], tally)
            self._write_back(None, [*plan.keep, *plan.moved], rewrite)
            self.store.delete(keys)
            self._applied(plan)
            tally.add(
                cascaded_objects=len(keys),
                cascaded_messages=len(plan.keep) + len(plan.moved),
                duplicates_skipped=plan.duplicates,
                cancelled=plan.cancelled,
                rescheduled=len(plan.moved),
                kept_for_retry=len(rewrite),
            )

    def _dispatch_bucket(self, bucket: BucketKey, objects: Sequence[StoredObject], tally: _Tally) -> None:
        """Send a ready fine bucket; write back what failed for a passing reason, then delete the objects read."""
        found, notices, keys = self._read(objects)
        plan = plan_bucket(found, self._lookup)
        window = dispatch_window(self.clock.now(), levels=self.store.levels)
        horizon = window.now + timedelta(seconds=MAX_DELAY_SECONDS)
        misplaced = [m for m in plan.keep if m.due_at > horizon]  # in a bucket it is not due in: move it
        sent = self.sqs.dispatch([m for m in plan.keep if m.due_at <= horizon], window)
        rewrite = self._report_errors([*plan.conflicts, *sent.rejected, *notices], tally)
        written = self._write_back(bucket, sent.retry, rewrite)
        written |= self._write_back(None, [*plan.moved, *misplaced], ())
        self.store.delete([key for key in keys if key not in written])  # a rewrite may reuse a key: keep it
        self._applied(plan)
        tally.add(
            dispatched=len(sent.sent),
            duplicates_skipped=plan.duplicates,
            cancelled=plan.cancelled,
            rescheduled=len(plan.moved),
            kept_for_retry=len(sent.retry) + len(rewrite) + len(misplaced),
        )

    def _applied(self, plan: BucketPlan) -> None:
        """Delete the records applied, from the store and from this run's records."""
        if self.cancellations is None or not plan.applied:
            return
        for record in plan.applied:
            held = self._records.get(record.endpoint, {})
            if held.get(record.message_id) == record:
                del held[record.message_id]
        self.cancellations.applied(plan.applied)
