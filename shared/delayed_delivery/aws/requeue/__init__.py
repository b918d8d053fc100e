"""The FIFO-requeue step: what the Lambda on each ``<queue>-delay.fifo`` does with a batch of records.

A pipeline per batch: parse each record (``records``), plan (park returns, cancellations, parks, requeue or
forward: ``parking``, ``plan``), execute the SQS calls (``parking``, ``sending``), report one result per record.
The guarantees, packing, parking and the clock rules case by case are in ``docs/requeue.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...cancellations import CancellationCache, StoredRecord
from ...clock import Clock, SystemClock
from ...errors import ConfigurationError, DelayedDeliveryDisabledError, DelayedDeliveryError, TransientError
from ...planning import PARK_RETENTION_HEADROOM, HopAction, SqsParkPolicy
from ...settings import DelayedDeliverySettings
from ...validation import is_whole
from ..brokerclock import BrokerClock
from ..release_calendar import ReleaseCalendar
from ..settings import SqsSettings
from ..sqs import QueueDirectory, QueueInfo
from .parking import IN_FLIGHT_CACHE_S, Parking
from .plan import (
    Ledger,
    MessagePlan,
    annotate,
    applied_records,
    lookup_cancellations,
    plan_message,
    record_result,
    result_of,
)
from .records import HopOutcome, ParsedRecord, RecordResult, SourceQueue, parse_record, parse_source_arn
from .sending import Sending

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "IN_FLIGHT_CACHE_S",
    "RECORD_BUDGET_MS",
    "FifoRequeuer",
    "HopOutcome",
    "RecordResult",
    "SourceQueue",
    "failed_record",
    "parse_source_arn",
    "receive_limit",
    "received_too_often",
]


class FifoRequeuer:
    """Moves FIFO records one hop on: back to their FIFO queue, to their destination, or to the error queue."""

    def __init__(
        self,
        client: SQSClient,
        settings: DelayedDeliverySettings | None = None,
        *,
        sqs_settings: SqsSettings | None = None,
        clock: Clock | None = None,
        directory: QueueDirectory | None = None,
        cancellations: CancellationCache | None = None,
        retention_headroom: int = PARK_RETENTION_HEADROOM,
        broker_clock: BrokerClock | None = None,
        max_receive_count: int = 0,
        release: ReleaseCalendar | None = None,
    ) -> None:
        if not is_whole(retention_headroom):
            raise ConfigurationError(f"retention_headroom must be non-negative seconds, got {retention_headroom!r}")
        self.client = client
        self.settings = settings or DelayedDeliverySettings()
        self.sqs_settings = sqs_settings or SqsSettings()
        self.clock = clock or SystemClock()
        self.directory = directory or QueueDirectory(client)
        self.cancellations = cancellations
        #: A park keeps this much of the queue's retention free (an outage this long still loses nothing).
        self.retention_headroom = retention_headroom
        self.broker_clock = broker_clock
        if self.broker_clock is None and self.sqs_settings.max_park_seconds > 0:
            self.broker_clock = BrokerClock(self.clock).attach(client)
        if not is_whole(max_receive_count):
            raise ConfigurationError(f"max_receive_count must be a non-negative integer, got {max_receive_count!r}")
        #: Receives past which a record goes to the error queue (0 = no limit), park returns allowed on top.
        self.receive_limit = receive_limit(max_receive_count, self.sqs_settings.max_park_seconds)
        #: Release control: the shared calendar forwards to capped destinations take their slots from.
        self.release = release
        self._parking = Parking(
            client, self.directory, self.sqs_settings, self.clock, self.broker_clock, retention_headroom
        )

    def process(
        self, records: Sequence[Mapping[str, Any]], time_left_ms: Callable[[], int] | None = None
    ) -> list[RecordResult]:
        """Handle the ``Records`` of one SQS event; one result per record, in order.

        No record's content raises out of it: an unexpected exception in the batch makes it handle each record
        alone, and a record that raises even alone is ``FAILED`` (retried) without taking its neighbours down.
        ``time_left_ms`` (the Lambda context's remaining time) stops the record-by-record pass when less than
        ``RECORD_BUDGET_MS`` is left: the records not handled yet are ``FAILED`` and come back.
        """
        if not self.settings.enabled:
            raise DelayedDeliveryDisabledError(
                "unrestricted delayed delivery is disabled on this receiver (DELAYED_DELIVERY_ENABLED): "
                "records stay on the -delay.fifo queue"
            )
        try:
            return self._process(records)
        except (ConfigurationError, DelayedDeliveryDisabledError):
            raise
        except Exception:  # contained: each record alone, so only the one at fault fails
            outcome: list[RecordResult] = []
            for record in records:
                if time_left_ms is not None and time_left_ms() < RECORD_BUDGET_MS:
                    outcome.append(failed_record(record, TimeoutError("the invocation's time is almost up")))
                    continue
                try:
                    outcome += self._process([record])
                except ConfigurationError:
                    raise
                except Exception as exc:  # that record fails alone
                    outcome.append(failed_record(record, exc))
            return outcome

    def _process(self, records: Sequence[Mapping[str, Any]]) -> list[RecordResult]:
        """The pipeline over a batch: parse, plan, park, send, error queue, one result per record."""
        now_ms = int(self.clock.now().timestamp() * 1000)
        parsed = [parse_record(record, now_ms) for record in records]
        parking = self.sqs_settings.max_park_seconds > 0
        if parking:
            parsed = self._parking.find_park_returns(parsed, now_ms)
        if self.receive_limit:
            parsed = [received_too_often(r, self.receive_limit) for r in parsed]
        plans = self._plan(parsed, parking, now_ms)
        ledger = Ledger()
        for p in plans:
            if p.action is HopAction.DROP:
                ledger.settle(p, result_of(p.message, HopOutcome.CANCELLED, p.message.hop))
        by_record = _by_record(parsed, plans)
        parked = [
            (r, ps[0].park_s, ps)
            for r, ps in zip(parsed, by_record, strict=True)
            if ps and ps[0].action is HopAction.PARK
        ]
        for p in self._parking.park(parked, ledger):
            plans[p.index] = p
        by_record = _by_record(parsed, plans)
        self._place_releases(plans, ledger, now_ms)
        by_record = _by_record(parsed, plans)
        sending = Sending(self.client, self.directory, self.settings, self.sqs_settings, self.clock)
        sending.send_hops(plans, ledger)
        poison = [
            replace(p, message=replace(p.message, reason=ledger.poison.get(p.index, p.message.reason)))
            for p in plans
            if p.index not in ledger.results and (p.action is HopAction.ERROR_QUEUE or p.index in ledger.poison)
        ]
        if poison:
            sending.to_error_queue(poison, ledger)
        results = {i: annotate(plans[i], result) for i, result in ledger.results.items()}
        outcome = [_record_outcome(r, ps, results) for r, ps in zip(parsed, by_record, strict=True)]
        if self.cancellations is not None:
            self.cancellations.applied(applied_records(outcome, by_record, results))
        return [result for result in outcome if result is not None]

    def _plan(self, parsed: list[ParsedRecord], parking: bool, now_ms: int) -> list[MessagePlan]:
        """One plan per message of the batch, in order: cancellation records, parks, then each message's action."""
        messages = [m for r in parsed for m in r.messages]
        owners = [index for index, r in enumerate(parsed) for _ in r.messages]
        applied: list[StoredRecord | None] = [None] * len(messages)
        if self.cancellations is not None:
            applied = lookup_cancellations(self.cancellations, messages)
        blocked = [False] * len(parsed)
        for owner, record in zip(owners, applied, strict=True):
            blocked[owner] = blocked[owner] or record is not None
        parks = self._parking.plan_parks(parsed, blocked) if parking else {}
        native = self.sqs_settings.max_native_delay
        return [plan_message(i, m, applied[i], parks.get(owners[i], 0), native, now_ms) for i, m in enumerate(messages)]

    def _place_releases(self, plans: list[MessagePlan], ledger: Ledger, now_ms: int) -> None:
        """Give each forward to a capped destination its release slot (its ``DelaySeconds``), in place in ``plans``.

        No slot within the native cap (a backlog longer than that at the cap): the message is requeued instead and
        asks again after its hop. The calendar unreachable: those forwards fail and their records come back.
        """
        if self.release is None:
            return
        groups: dict[str, list[MessagePlan]] = {}
        for p in plans:
            capped = self.release.capped(p.message.source.destination)
            if p.action is HopAction.FORWARD and p.index not in ledger.results and capped:
                groups.setdefault(p.message.source.destination, []).append(p)
        for destination, group in groups.items():
            dues = [now_ms + p.message.remaining_ms for p in group]
            try:
                placements = self.release.place(destination, dues, now_ms)
            except ConfigurationError:
                raise
            except DelayedDeliveryError as exc:
                error = exc if isinstance(exc, TransientError) else TransientError(str(exc))
                for p in group:
                    ledger.fail(p, error)
                continue
            for p, where in zip(group, placements, strict=True):
                if where is None:
                    plans[p.index] = replace(p, action=HopAction.REQUEUE, hop=HopAction.REQUEUE, release_wait=True)
                else:
                    message = replace(p.message, remaining=where.delay_seconds)
                    plans[p.index] = replace(p, message=message, release_lag=where.lag)

    def park_policy(self, queue: QueueInfo) -> SqsParkPolicy:
        """The park rules for ``queue``: the settings plus its retention and visibility timeout."""
        return self._parking.policy(queue)


#: Time kept free per record in the record-by-record pass (ms): one record's sends, with retries.
RECORD_BUDGET_MS = 5_000
#: The longest a record stays on its queue (SQS's largest retention): it bounds a record's park returns.
_MAX_RETENTION_S = 14 * 24 * 3600


def receive_limit(max_receive_count: int, max_park_seconds: int) -> int:
    """Receives allowed before the error queue: ``max_receive_count`` plus one per park return a record can have.

    Each park return is a receive too, and a record is parked at most once per ``max_park_seconds`` of its
    retention (14 days at most): about 29 returns with the default 42,600 s parks.
    """
    if max_receive_count == 0:
        return 0
    returns = math.ceil(_MAX_RETENTION_S / max_park_seconds) if max_park_seconds > 0 else 0
    return max_receive_count + returns


def received_too_often(record: ParsedRecord, limit: int) -> ParsedRecord:
    """``record``, poisoned with the count when it was received more than ``limit`` times (no redrive on FIFO)."""
    if record.count <= limit:
        return record
    reason = f"received {record.count} times without success (more than {limit})"
    if record.inner is None:
        return record if record.message.reason is not None else record.poison(reason)
    inner = tuple(m if m.reason is not None else replace(m, reason=reason) for m in record.inner)
    return replace(record, inner=inner)


def failed_record(record: Mapping[str, Any], exc: Exception) -> RecordResult:
    """``FAILED`` for a record whose handling raised ``exc`` unexpectedly (the event source retries it)."""
    record_id = str(record.get("messageId", "")) if isinstance(record, Mapping) else ""
    attrs = record.get("attributes") if isinstance(record, Mapping) else None
    group = attrs.get("MessageGroupId") if isinstance(attrs, Mapping) else None
    try:
        destination = parse_source_arn(str(record.get("eventSourceARN", ""))).destination
    except ConfigurationError:
        destination = ""
    reason = f"unexpected {type(exc).__name__} while handling the record: {str(exc)[:300]}"
    return RecordResult(
        record_id,
        str(group or record_id),
        HopOutcome.FAILED,
        0,
        destination,
        reason=reason,
        error=TransientError(reason),
    )


def _by_record(parsed: list[ParsedRecord], plans: list[MessagePlan]) -> list[list[MessagePlan]]:
    """The plans grouped by the record carrying their message (plans are in message order)."""
    grouped: list[list[MessagePlan]] = []
    start = 0
    for r in parsed:
        grouped.append(plans[start : start + len(r.messages)])
        start += len(r.messages)
    return grouped


def _record_outcome(
    record: ParsedRecord, plans: list[MessagePlan], results: dict[int, RecordResult]
) -> RecordResult | None:
    """A plain record's result is its message's; an envelope's sums up its inner messages."""
    if record.inner is None:
        return results.get(plans[0].index)
    return record_result(record, tuple(results[p.index] for p in plans if p.index in results))
