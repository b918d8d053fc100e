"""What the timer, its cascade and the dispatch workers share: records read fresh, the error queue, write-backs.

A ``BucketWork`` lives for one run (a timer run or a worker invocation): it reads each destination's cancel and
reschedule records afresh for every bucket, cascade group and piece (``fresh``; #31: read once per run, a cancel
made during a long cascade was missed by the same run's dispatch), refuses to go on when they cannot be read (a
certain cancel is never sent for want of a record: the bucket waits for a later run), sends what cannot be
delivered to the error queue (what the queue does not take now is written back, or its object kept under
``problems/``), writes messages back into buckets, and deletes the records applied once the objects they were read
from are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import Field, fields
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from ... import logfields as lf
from ...cancellations import Cancellation, CancellationCache, StoredRecord, is_live
from ...clock import Clock
from ...delivery import from_epoch_ms
from ...errors import DelayedDeliveryError, TransientError
from ...timebuckets.apply import BucketPlan, Found, Rejected, plan_bucket
from ...timebuckets.format import BucketMessage
from ...timebuckets.wheel import BucketKey
from .notices import BadLines, object_notice
from .store import S3BucketStore
from .timer_sqs import ErrorQueueOutcome, Notice, TimerSqs

__all__ = ["SETTLE_SECONDS", "BucketWork", "Tally"]

#: How long past the latest due time it met a record applied lives on (the ingest's longest wait is 420 s).
SETTLE_SECONDS = 3_600

_log = logging.getLogger(__name__)
R = TypeVar("R")


class Tally(Generic[R]):
    """The counts of a run while it runs, made into the run's frozen result (a dataclass of numbers) at the end."""

    def __init__(self, result_type: type[R]) -> None:
        self.result_type = result_type
        declared: tuple[Field[Any], ...] = fields(result_type)  # type: ignore[arg-type]
        self.counts: dict[str, float] = {f.name: 0 for f in declared}
        self._floats = {f.name for f in declared if f.type in ("float", float)}

    def add(self, **counts: float) -> None:
        """Add to the named counts."""
        for name, value in counts.items():
            self.counts[name] += value

    def most(self, **counts: float) -> None:
        """Keep the largest value seen of the named counts."""
        for name, value in counts.items():
            self.counts[name] = max(self.counts[name], value)

    def result(self) -> R:
        """The result so far."""
        return self.result_type(**{k: (float(v) if k in self._floats else int(v)) for k, v in self.counts.items()})


class BucketWork:
    """One run's shared steps over the store, the sends and the cancellation records."""

    def __init__(
        self,
        store: S3BucketStore,
        sqs: TimerSqs,
        clock: Clock,
        cancellations: CancellationCache | None = None,
    ) -> None:
        self.store = store
        self.sqs = sqs
        self.clock = clock
        self.cancellations = cancellations
        #: Each destination's records as read for the bucket, group or piece at hand (``fresh`` forgets them).
        self.records: dict[str, dict[str, StoredRecord]] = {}

    def fresh(self) -> None:
        """Read the records again from now on (a new bucket, cascade group or piece)."""
        self.records = {}

    def lookup(self, destination: str) -> Mapping[str, StoredRecord]:
        """The destination's records, read once per ``fresh``; ``TransientError`` when they cannot be read (reported
        through the cache's ``on_error``): what is sent without its records may be a message cancelled for certain."""
        if self.cancellations is None:
            return {}
        records = self.records.get(destination)
        if records is None:
            records = self.records[destination] = self._read(self.cancellations, destination)
        return records

    def _read(self, cache: CancellationCache, destination: str) -> dict[str, StoredRecord]:
        try:
            found = cache.store.live(destination)
        except DelayedDeliveryError as exc:
            if cache.on_error is not None:
                cache.on_error("lookup", exc)
            raise TransientError(f"the cancel and reschedule records of {destination!r} cannot be read: {exc}") from exc
        now = self.clock.now()
        return {r.message_id: r for r in found if is_live(r, now)}

    def plan(self, found: Sequence[Found]) -> BucketPlan:
        """``plan_bucket`` with this run's records; each message held for a record that cannot be used is logged."""
        plan = plan_bucket(found, self.lookup)
        for held in plan.unusable:
            _log.error(
                "a cancel or reschedule record cannot be used; its message goes to the error queue",
                extra={
                    lf.EVENT: lf.EVENT_ERROR_QUEUE,
                    lf.MESSAGE_ID: held.message.message_id,
                    lf.DESTINATION: held.message.destination,
                    lf.REASON: held.reason,
                },
            )
        return plan

    def bad_object(self, key: str, problem: str | None, bad: BadLines) -> Notice:
        """Keep a copy of an object that cannot be read whole under ``problems/`` (every raw line is kept there) and
        return its one notice (``notices.py``)."""
        return object_notice(key, self.store.set_aside(key), problem, bad)

    def report_errors(self, items: Sequence[Rejected | Notice], tally: Tally[Any]) -> list[Rejected]:
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

    def write_back(
        self,
        bucket: BucketKey | None,
        messages: Sequence[BucketMessage],
        rejected: Sequence[Rejected],
        *,
        salt: str = "",
    ) -> set[str]:
        """Write ``messages`` (and each rejected message on its own: two may share an id) back; the keys written.

        ``bucket`` None: each into ``bucket_of(due, now)``. ``salt``: a dispatch plan's name, so that nothing written
        back lands on a key of that plan, which deletes its keys once done (``S3BucketStore.write``).
        """
        now = self.clock.now()
        written: set[str] = set()
        groups = [list(messages), *([r.message] for r in rejected)]
        for group in groups:
            if not group:
                continue
            salted = {"salt": salt} if salt else {}
            if bucket is None:
                for keys in self.store.write_due(group, now, **salted).values():
                    written.update(keys)
            else:
                written.update(self.store.write(bucket, group, **salted))
        return written

    @staticmethod
    def releasable(records: Sequence[StoredRecord], written_back: Sequence[Rejected]) -> list[StoredRecord]:
        """The applied ``records`` that may go: not one whose message was written back (the error queue did not
        take it now), which must hold the message again next time."""
        kept = {(r.message.destination, r.message.message_id) for r in written_back}
        return [r for r in records if (r.endpoint, r.message_id) not in kept]

    def applied(self, records: Sequence[StoredRecord], until: Mapping[tuple[str, str], int]) -> None:
        """Settle the records applied: each lives on until ``SETTLE_SECONDS`` after the latest due time it met
        (``until``, epoch ms), so a copy of its message sent before it that arrives later (a retried write, an ingest
        redelivery) is dropped or moved too, whoever applied it first (#31); an unreadable one is deleted."""
        if self.cancellations is None or not records:
            return
        readable = [r for r in records if isinstance(r, Cancellation)]
        ends: dict[tuple[str, str], datetime] = {}
        for key, ms in until.items():
            when = from_epoch_ms(ms)
            if when is not None:
                ends[key] = when + timedelta(seconds=SETTLE_SECONDS)
        self.cancellations.settle(readable, ends)
        self.cancellations.applied([r for r in records if not isinstance(r, Cancellation)])
