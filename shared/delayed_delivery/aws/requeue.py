"""The FIFO-requeue step: what the Lambda on each ``<queue>-delay.fifo`` does with a batch of records.

For each record the remaining delay comes from the broker timestamps (the seed's clock-drift rules,
kept to the millisecond by ``remaining_delay_ms`` so whole-second rounding cannot add up over thousands
of hops; the final native ``DelaySeconds`` is rounded up, never early). More than ``max_native_delay``
left → re-send to the same FIFO queue with the remaining delay and deduplication id ``<id>:<hop+1>``;
otherwise → send to the destination with ``DelaySeconds`` = remaining. Sends are batched per target queue.

Guarantees:

* The destination is the queue that owns the FIFO queue the record came from (its event source ARN,
  ``orders-delay.fifo`` → ``orders``), never anything in the message, so nobody can use the function
  to post into arbitrary queues.
* Poison records (missing or malformed control attribute, destination gone, body too large for the
  destination) go to ``settings.error_queue`` with ``DelayedDelivery.FailureReason`` (and, when there is
  room among the 10 attributes, ``OriginalDestination`` and ``FailedAt``). They are never retried in a loop.
* Only transient failures (throttling, network, the error queue unreachable) come back as ``FAILED``;
  the event source makes those records visible again. On a redelivery the requeue-or-forward decision is
  recomputed from broker times alone, so it is the same as the first time and a repeated requeue (same
  ``<id>:<hop>``) is dropped by FIFO deduplication within its 5-minute window. The final hand-over to the
  standard destination queue can still repeat (at-least-once, as in the seed).

Packing (``pack_bytes`` > 0, the default 64 KiB): when a batch requeues two or more messages to the same
FIFO queue, they travel in envelopes (``packing.py``) of at most ``pack_bytes``, one FIFO request for many
messages. An envelope record is unpacked: each inner message gets its own remaining delay from its packed
remainder and the envelope's broker timestamps, then is re-packed, forwarded with its own ``DelaySeconds``
or, when unreadable, sent alone to the error queue. An envelope that cannot be read at all goes to the error
queue whole. When any send for a record fails transiently the whole record is reported ``FAILED`` and
redelivered: a re-pack of the same messages on the same hop repeats its deduplication id; a batch grouped
differently on redelivery can repeat inner messages (at-least-once, like the final hand-over).

Cancellation (``cancellations`` given, see ``delayed_delivery.cancellations``): before deciding, every message
of the batch (inner messages too) is checked against its endpoint's live records, read once per cache period.
A cancelled message is dropped (``CANCELLED``); a rescheduled one gets the remaining delay to its new due time
(decided from the broker's first-receive time, so a redelivery decides the same). Applied records are deleted
once the SQS record carrying the message has not ``FAILED``. A message with an applied record is never parked:
the hop that applies the record also carries the new plan, so the record can go.

Parking (``settings.max_park_seconds`` > 0, the default 42,600 s): a record, plain or envelope, with far to go
is not re-sent every hop. ``ChangeMessageVisibilityBatch`` hides it on its own ``-delay.fifo`` queue for a park
of up to ``max_park_seconds`` and it is reported ``PARKED`` (a batch item failure for the event source, which
therefore does not delete it); SQS makes it visible again by itself. A park costs its share of one receive and
one visibility change, instead of ``park / fifo_queue_delay`` hops. The park length (whole seconds,
``planning.sqs_park_ms``): the time to the due time minus one hop and a margin (half the native cap), split
evenly over as few parks as ``max_park_seconds`` allows, so the last park comes back with about one hop and the
margin left. It is cut so
that the message's age plus the park, one hop and the margin stay ``retention_headroom`` (the seed's 4 days,
so an outage of that long still loses nothing) inside the queue's ``MessageRetentionPeriod``; no park at all
when that leaves less than ``MIN_PARK_HOPS`` hops or twice the return threshold below. New parks also stop
while the queue holds ``settings.park_max_in_flight`` messages or more in flight (read at most once a minute;
FIFO queues stall at 120,000 in flight). When SQS refuses the visibility change (so it certainly did not
happen: an invalid receipt handle, a missing permission), the record hops instead, as it would without parking.
When the outcome is unknown (network error, throttling, server error), the record is ``FAILED`` instead: it comes
back after the queue's visibility timeout as a plain redelivery (or after its park, if the change did happen), never
copied. Nothing is deleted that was neither re-sent nor forwarded. Several plain records that would park on a
first receive are packed into an envelope instead (one send for many; the envelope parks on its next receive).

The clock rules with parking, case by case (``V`` = the queue's visibility timeout, ``T`` = ``V`` + one hop; a
record is *park-eligible* when its broker timestamps alone, as on a first receive, allow a park; every park is
at least ``2 T`` long):

1. **First receive** (``ApproximateReceiveCount`` = 1): broker times are exact. Park when eligible (and not
   better packed, and no cancellation record applies, and the in-flight cap allows); otherwise requeue or forward
   as always.
2. **Plain redelivery** (receive count > 1, and either not park-eligible or less than ``T`` since the broker's
   first receive): an earlier receive failed, lost its delete or lost its visibility change. Decided exactly as
   before, from broker times alone (the same requeue id, which FIFO deduplicates), and **never parked** (whether
   to park depends on the batch and the in-flight cap, which can change between deliveries, and a park after a
   requeue whose delete was lost would leave two copies). A lost visibility change therefore costs one hop.
3. **Park return** (receive count > 1, park-eligible, ``T`` or more since the first receive): the record was
   parked (or an outage held it longer than ``T``). ``ApproximateFirstReceiveTimestamp`` is from before the
   park, so the broker-only rule would see no time pass and park it again forever. Elapsed time comes from the
   broker's clock instead (``BrokerClock``: the ``Date`` headers of SQS's responses and the first-receive stamps
   of the batch, never ahead of the broker; the local clock when it has no reading from the last 15 minutes).
   Still far to go → park again (the in-flight cap is not asked: a re-park adds nothing in flight). Otherwise →
   **requeue**, never forward, with the remaining delay and ``<id>:<hop+1>``: the next receive is then a first
   receive with exact broker times, and the last park left about one hop plus the margin, so this costs a hop,
   not lateness. If that requeue's delete is lost, the redelivery is again a park return with less time left,
   so it decides requeue again (park or requeue only ever moves from park to requeue as time passes), with the
   same id: FIFO drops the copy.

A parked record is always a park return when it comes back (``T`` since the first receive, by a clock that
lags the broker by under a second), and a redelivery within ``T`` is always plain. A rescheduled message on a
park return is planned from the same broker clock and may be forwarded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ..cancellations import Cancellation, CancellationCache, CancellationKind
from ..clock import Clock, SystemClock
from ..errors import (
    ConfigurationError,
    DelayedDeliveryDisabledError,
    DelayedDeliveryError,
    DestinationNotFoundError,
    InvalidMessageError,
    PermanentError,
    TransientError,
)
from ..headers import DELAY_SECONDS_ATTRIBUTE, FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION
from ..naming import sqs_input_queue_name
from ..planning import PARK_RETENTION_HEADROOM, HopAction, SqsParkPolicy, decide_hop, remaining_delay_ms, sqs_park_ms
from ..settings import DelayedDeliverySettings
from .brokerclock import BrokerClock
from .packing import (
    DEFAULT_PACK_BYTES,
    ENVELOPE_ATTRIBUTE,
    BadItem,
    PackedMessage,
    decode_envelope,
    envelope_attributes,
    envelope_body,
    envelope_id,
    pack,
)
from .sender import deduplication_id, hop_of
from .sqs import (
    MAX_ATTRIBUTES,
    MAX_BATCH_ENTRIES,
    QueueDirectory,
    QueueInfo,
    attributes_from_record,
    message_size,
    send_batches,
    translate_error,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        ChangeMessageVisibilityBatchRequestEntryTypeDef,
        MessageAttributeValueTypeDef,
        SendMessageBatchRequestEntryTypeDef,
    )

__all__ = [
    "IN_FLIGHT_CACHE_S",
    "FifoRequeuer",
    "HopOutcome",
    "RecordResult",
    "SourceQueue",
    "parse_source_arn",
]

#: How long the in-flight count of a queue (``ApproximateNumberOfMessagesNotVisible``) is reused.
IN_FLIGHT_CACHE_S = 60.0

#: The control attribute: seconds left, whole (as the sender writes it) or with up to 3 decimals (after a hop).
_SECONDS = re.compile(r"^\d{1,12}(\.\d{1,3})?$")


class HopOutcome(StrEnum):
    """What happened to one FIFO record."""

    REQUEUED = "requeued"
    FORWARDED = "forwarded"
    ERROR_QUEUE = "error_queue"
    FAILED = "failed"
    UNPACKED = "unpacked"
    CANCELLED = "cancelled"
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class SourceQueue:
    """The FIFO queue a record came from and the input queue that owns it."""

    arn: str
    region: str
    account: str
    delay_queue: str
    destination: str


@dataclass(frozen=True, slots=True)
class RecordResult:
    """The outcome for one record; ``record_id`` is the SQS message id the event source reports failures by."""

    record_id: str
    message_id: str
    outcome: HopOutcome
    hop: int
    destination: str
    remaining_delay_s: int | None = None
    reason: str | None = None
    error: DelayedDeliveryError | None = None
    inner: tuple[RecordResult, ...] = ()
    envelope_id: str | None = None
    cancellation: Cancellation | None = None
    park_s: int | None = None

    def per_message(self) -> tuple[RecordResult, ...]:
        """The results per message: an envelope's inner ones, else this one."""
        return self.inner or (self,)


def parse_source_arn(arn: str) -> SourceQueue:
    """Split ``arn:aws:sqs:<region>:<account>:<queue>-delay.fifo``; raises ``ConfigurationError`` otherwise."""
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs":
        raise ConfigurationError(f"event source {arn!r} is not an SQS queue ARN")
    try:
        destination = sqs_input_queue_name(parts[5])
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"event source {arn!r}: the requeue function must be triggered by a <queue>-delay.fifo queue ({exc})"
        ) from exc
    return SourceQueue(arn, parts[3], parts[4], parts[5], destination)


@dataclass(slots=True)
class _Work:
    record_id: str
    message_id: str
    hop: int
    body: str
    attributes: dict[str, MessageAttributeValueTypeDef]
    source: SourceQueue
    remaining: int | None = None
    remaining_ms: int = 0
    decision_ms: int = 0
    reason: str | None = None
    result: RecordResult | None = None
    children: list[_Work] | None = None
    received_ms: int = 0
    applied: Cancellation | None = None
    total_ms: int = 0
    sent_ms: int = 0
    first_ms: int = 0
    count: int = 1
    age_ms: int = 0
    receipt_handle: str = ""
    park_return: bool = False
    park_s: int = 0
    park_failure: str | None = None


class FifoRequeuer:
    """Moves FIFO records one hop on: back to their FIFO queue, to their destination, or to the error queue."""

    def __init__(
        self,
        client: SQSClient,
        settings: DelayedDeliverySettings | None = None,
        *,
        clock: Clock | None = None,
        directory: QueueDirectory | None = None,
        pack_bytes: int = DEFAULT_PACK_BYTES,
        cancellations: CancellationCache | None = None,
        retention_headroom: int = PARK_RETENTION_HEADROOM,
        broker_clock: BrokerClock | None = None,
    ) -> None:
        if isinstance(pack_bytes, bool) or not isinstance(pack_bytes, int) or pack_bytes < 0:
            raise ConfigurationError(f"pack_bytes must be a non-negative integer (0 = off), got {pack_bytes!r}")
        if isinstance(retention_headroom, bool) or not isinstance(retention_headroom, int) or retention_headroom < 0:
            raise ConfigurationError(f"retention_headroom must be non-negative seconds, got {retention_headroom!r}")
        self.client = client
        self.settings = settings or DelayedDeliverySettings()
        self.clock = clock or SystemClock()
        self.directory = directory or QueueDirectory(client)
        self.pack_bytes = pack_bytes
        self.cancellations = cancellations
        #: A park keeps this much of the queue's retention free (an outage this long still loses nothing).
        self.retention_headroom = retention_headroom
        self.broker_clock = broker_clock
        if self.broker_clock is None and self.settings.max_park_seconds > 0:
            self.broker_clock = BrokerClock(self.clock).attach(client)
        self._in_flight: dict[str, tuple[int | None, float]] = {}

    def process(self, records: Sequence[Mapping[str, Any]]) -> list[RecordResult]:
        """Handle the ``Records`` of one SQS event; one result per record, in order."""
        if not self.settings.enabled:
            raise DelayedDeliveryDisabledError(
                "unrestricted delayed delivery is disabled on this receiver (DELAYED_DELIVERY_ENABLED): "
                "records stay on the -delay.fifo queue"
            )
        now_ms = int(self.clock.now().timestamp() * 1000)
        work = [self._parse(record, now_ms) for record in records]
        parking = self.settings.max_park_seconds > 0
        if parking:
            self._find_park_returns(work, now_ms)
        items = [item for w in work for item in (w.children if w.children is not None else [w])]
        if self.cancellations is not None:
            self._check_cancellations(self.cancellations, items, now_ms)
        if parking:
            self._park(self._plan_parks(work))
        requeue: dict[str, list[_Work]] = {}
        forward: dict[str, list[_Work]] = {}
        for w in items:
            if w.reason is not None or w.remaining is None or w.result is not None or w.park_s:
                continue
            decision = decide_hop(math.ceil(w.decision_ms / 1000), self.settings.max_native_delay)
            # A park return is requeued, never forwarded (see the module docstring, case 3).
            back = w.park_return and w.applied is None
            target = requeue if back or decision.action is HopAction.REQUEUE else forward
            target.setdefault(w.source.delay_queue if target is requeue else w.source.destination, []).append(w)
        for queue, group in requeue.items():
            self._send(queue, group, HopOutcome.REQUEUED)
        for queue, group in forward.items():
            self._send(queue, group, HopOutcome.FORWARDED)
        poison = [w for w in items if w.result is None and w.reason is not None]
        if poison:
            self._to_error_queue(poison)
        _annotate(items)
        for w in work:
            if w.children is not None:
                w.result = _unpacked(w)
        if self.cancellations is not None:
            self.cancellations.applied(
                [
                    c.applied
                    for w in work
                    if w.result is not None and w.result.outcome is not HopOutcome.FAILED
                    for c in (w.children if w.children is not None else [w])
                    if c.applied is not None and c.result is not None and c.result.outcome is not HopOutcome.FAILED
                ]
            )
        return [w.result for w in work if w.result is not None]

    @staticmethod
    def _check_cancellations(cache: CancellationCache, items: list[_Work], now_ms: int) -> None:
        """Drop cancelled messages and re-plan rescheduled ones (one cached lookup per endpoint)."""
        live = [w for w in items if w.reason is None and w.remaining is not None]
        records = {endpoint: cache.lookup(endpoint) for endpoint in {w.source.destination for w in live}}
        for w in live:
            record = records[w.source.destination].get(w.message_id)
            if record is None:
                continue
            w.applied = record
            if record.kind is CancellationKind.CANCEL:
                w.result = RecordResult(
                    w.record_id, w.message_id, HopOutcome.CANCELLED, w.hop, w.source.destination, w.remaining
                )
                continue
            assert record.due_at is not None
            due_ms = int(record.due_at.timestamp() * 1000)
            # On a park return ``received_ms`` is the broker's time now (case 3), for the decision and the remainder.
            w.remaining_ms = max(0, due_ms - (w.received_ms if w.park_return else now_ms))
            w.decision_ms = max(0, due_ms - w.received_ms)
            w.remaining = math.ceil(w.remaining_ms / 1000)

    def park_policy(self, queue: QueueInfo) -> SqsParkPolicy:
        """The park rules for ``queue``: the settings plus its retention and visibility timeout."""
        return SqsParkPolicy(
            fifo_queue_delay=self.settings.fifo_queue_delay,
            max_native_delay=self.settings.max_native_delay,
            max_park_seconds=self.settings.max_park_seconds,
            retention_seconds=queue.retention_seconds,
            visibility_timeout=queue.visibility_timeout,
            retention_headroom=self.retention_headroom,
        )

    def _source_info(self, source: SourceQueue) -> QueueInfo | None:
        """The source ``-delay.fifo`` queue's URL and attributes (cached), or None when they cannot be read."""
        try:
            return self.directory.get(source.delay_queue)
        except DelayedDeliveryError:
            return None

    def _record_park_ms(self, w: _Work, queue: QueueInfo) -> int:
        """The park for a whole record (an envelope parks for its soonest message); 0 when it cannot park."""
        items = w.children if w.children is not None else [w]
        live = [i for i in items if i.reason is None and i.remaining is not None]
        if not live or len(live) != len(items):
            return 0
        policy = self.park_policy(queue)
        return min(sqs_park_ms(i.decision_ms, w.age_ms, policy) for i in live)

    def _find_park_returns(self, work: list[_Work], now_ms: int) -> None:
        """Mark park returns (case 3) and re-base their remaining delays on the broker's clock."""
        if self.broker_clock is not None:
            for w in work:
                if w.count == 1 and w.first_ms:  # this batch's own receive, stamped by the broker to the ms
                    self.broker_clock.observe_broker_ms(w.first_ms, now_ms)
        broker_now: int | None = None
        for w in work:
            if w.reason is not None or w.count <= 1:
                continue
            queue = self._source_info(w.source)
            if queue is None or not self._record_park_ms(w, queue):  # not park-eligible: a plain redelivery
                continue
            if broker_now is None:
                broker_now = self._broker_now(w.source, now_ms)
            if broker_now - w.first_ms < self.park_policy(queue).return_threshold_ms:
                continue
            w.park_return = True
            w.age_ms = max(0, broker_now - w.sent_ms)
            for item in w.children if w.children is not None else [w]:
                if item.reason is not None:
                    continue
                item.park_return = True
                item.age_ms = w.age_ms
                item.received_ms = broker_now
                item.remaining_ms = item.decision_ms = max(0, item.total_ms - (broker_now - item.sent_ms))
                item.remaining = math.ceil(item.remaining_ms / 1000)

    def _broker_now(self, source: SourceQueue, now_ms: int) -> int:
        """The broker's time now (never ahead of it); the local clock when SQS has not answered lately."""
        if self.broker_clock is None:
            return now_ms
        broker = self.broker_clock.now_ms(now_ms)
        if broker is None:
            self._queue_in_flight(source)  # one request (at most once a minute) that also dates itself
            broker = self.broker_clock.now_ms()
        return now_ms if broker is None else broker

    def _plan_parks(self, work: list[_Work]) -> list[_Work]:
        """Choose the records to park and for how long (``park_s``); the rest hop as before."""
        chosen: list[tuple[_Work, int]] = []
        for w in work:
            if w.reason is not None or w.result is not None or not w.receipt_handle:
                continue
            if w.count > 1 and not w.park_return:  # case 2: a plain redelivery never parks
                continue
            items = w.children if w.children is not None else [w]
            if any(i.result is not None or i.applied is not None for i in items):
                continue
            queue = self._source_info(w.source)
            park = self._record_park_ms(w, queue) if queue is not None else 0
            if park:
                chosen.append((w, park))
        if self.pack_bytes:
            # Plain first receives that would park alone travel better in one envelope: requeue them packed
            # (the envelope parks on its next receive). Park returns never switch (their decision must not depend
            # on the batch they come in).
            singles: dict[str, int] = {}
            for w, _ in chosen:
                if w.children is None and not w.park_return:
                    singles[w.source.delay_queue] = singles.get(w.source.delay_queue, 0) + 1
            chosen = [
                (w, park)
                for w, park in chosen
                if w.children is not None or w.park_return or singles[w.source.delay_queue] < 2
            ]
        parked: list[_Work] = []
        for w, park in chosen:
            if not w.park_return and not self._may_park_more(w.source):  # only new parks add to in-flight
                continue
            w.park_s = park // 1000
            for item in w.children or ():
                item.park_s = w.park_s
            parked.append(w)
        return parked

    def _may_park_more(self, source: SourceQueue) -> bool:
        """Whether the queue's in-flight count (cached a minute) is below ``park_max_in_flight``."""
        in_flight = self._queue_in_flight(source)
        return in_flight is not None and in_flight < self.settings.park_max_in_flight

    def _queue_in_flight(self, source: SourceQueue) -> int | None:
        """``ApproximateNumberOfMessagesNotVisible`` of the source queue, read at most once a minute (None: unknown)."""
        now = self.clock.now().timestamp()
        cached = self._in_flight.get(source.delay_queue)
        if cached is not None and 0 <= now - cached[1] < IN_FLIGHT_CACHE_S:
            return cached[0]
        value: int | None = None
        queue = self._source_info(source)
        if queue is not None:
            try:
                attrs = self.client.get_queue_attributes(
                    QueueUrl=queue.url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
                )
                value = int(attrs.get("Attributes", {})["ApproximateNumberOfMessagesNotVisible"])
            except (ClientError, BotoCoreError, KeyError, ValueError, TypeError):
                value = None  # unknown: no new parks until the next reading
        self._in_flight[source.delay_queue] = (value, now)
        return value

    def _park(self, parked: list[_Work]) -> None:
        """Hide each parked record for its park (``ChangeMessageVisibilityBatch``).

        A change SQS refused (an entry it failed as the sender's fault, or a request it rejected: a receipt handle
        that is no longer valid, a missing permission) certainly did not happen: the record hops instead, as it
        would have without parking. A change whose outcome is unknown (a network error, throttling, a server
        error) may have happened: the record is ``FAILED`` and comes back, after its visibility timeout or its
        park, without having been copied.
        """
        by_queue: dict[str, list[_Work]] = {}
        for w in parked:
            by_queue.setdefault(w.source.delay_queue, []).append(w)
        for queue, group in by_queue.items():
            info = self._source_info(group[0].source)
            for start in range(0, len(group), MAX_BATCH_ENTRIES):
                chunk = group[start : start + MAX_BATCH_ENTRIES]
                refused: dict[str, str] = {}
                unknown: dict[str, DelayedDeliveryError] = {}
                if info is None:
                    refused = {str(i): f"parking in {queue!r}: the queue cannot be read" for i in range(len(chunk))}
                else:
                    entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
                        {"Id": str(i), "ReceiptHandle": w.receipt_handle, "VisibilityTimeout": w.park_s}
                        for i, w in enumerate(chunk)
                    ]
                    try:
                        reply = self.client.change_message_visibility_batch(QueueUrl=info.url, Entries=entries)
                    except (ClientError, BotoCoreError) as exc:
                        problem = translate_error(exc, f"parking in {queue!r}")
                        if isinstance(problem, PermanentError):
                            refused = {e["Id"]: str(problem) for e in entries}
                        else:
                            unknown = {e["Id"]: problem for e in entries}
                    else:
                        for failed in reply.get("Failed", []):
                            text = f"parking in {queue!r}: {failed.get('Code', '')}: {failed.get('Message', '')}"
                            if failed.get("SenderFault"):
                                refused[failed["Id"]] = text
                            else:
                                unknown[failed["Id"]] = TransientError(text)
                for i, w in enumerate(chunk):
                    for item in w.children if w.children is not None else [w]:
                        if str(i) in refused:  # not parked: it hops below, like any record that cannot park
                            item.park_s = 0
                            item.park_failure = refused[str(i)]
                        elif str(i) in unknown:
                            item.park_s = 0
                            error = unknown[str(i)]
                            self._fail(item, error if isinstance(error, TransientError) else TransientError(str(error)))
                        else:
                            item.result = RecordResult(
                                item.record_id,
                                item.message_id,
                                HopOutcome.PARKED,
                                item.hop,
                                item.source.destination,
                                item.remaining,
                                park_s=w.park_s,
                            )
                    if str(i) in refused:
                        w.park_s = 0

    def _parse(self, record: Mapping[str, Any], now_ms: int) -> _Work:
        """Read one record; problems with the message itself become a poison reason, not an exception."""
        source = parse_source_arn(str(record.get("eventSourceARN", "")))
        attrs = record.get("attributes") or {}
        record_id = str(record.get("messageId", ""))
        message_id = str(attrs.get("MessageGroupId") or record_id)
        work = _Work(
            record_id=record_id,
            message_id=message_id,
            hop=hop_of(attrs.get("MessageDeduplicationId")),
            body=str(record.get("body", "")),
            attributes={},
            source=source,
            receipt_handle=str(record.get("receiptHandle") or ""),
        )
        try:
            attributes = attributes_from_record(record.get("messageAttributes") or {})
        except InvalidMessageError as exc:
            work.reason = f"malformed message attributes: {exc}"
            return work
        marker = attributes.pop(ENVELOPE_ATTRIBUTE, None)
        if marker is not None:
            work.attributes = attributes
            return self._parse_envelope(work, marker, attrs, now_ms)
        control = attributes.pop(DELAY_SECONDS_ATTRIBUTE, None)
        work.attributes = attributes
        if control is None:
            work.reason = f"missing control attribute {DELAY_SECONDS_ATTRIBUTE}"
            return work
        text = control.get("StringValue", "")
        if not control["DataType"].startswith(("Number", "String")) or not _SECONDS.match(text):
            work.reason = f"malformed control attribute {DELAY_SECONDS_ATTRIBUTE}={text!r}: expected seconds"
            return work
        try:
            total_ms = _to_ms(text)
            sent, first = int(attrs["SentTimestamp"]), int(attrs["ApproximateFirstReceiveTimestamp"])
            count = int(attrs["ApproximateReceiveCount"])
            work.received_ms = first
            work.total_ms, work.sent_ms, work.first_ms, work.count = total_ms, sent, first, count
            work.age_ms = max(0, first - sent)
            work.remaining_ms = remaining_delay_ms(total_ms, sent, first, count, now_ms)
            # The hop decision uses broker times only (as on the first receive), so a redelivery repeats the
            # same decision and its re-send carries the same deduplication id: FIFO drops it as a duplicate.
            work.decision_ms = remaining_delay_ms(total_ms, sent, first, 1, now_ms)
        except (KeyError, ValueError, TypeError, InvalidMessageError) as exc:
            work.reason = f"missing or malformed broker timestamps: {exc!r}"
            return work
        work.remaining = math.ceil(work.remaining_ms / 1000)
        return work

    def _parse_envelope(
        self, work: _Work, marker: MessageAttributeValueTypeDef, attrs: Mapping[str, Any], now_ms: int
    ) -> _Work:
        """Unpack an envelope record into one child per inner message (a bad entry gets a reason alone)."""
        if marker.get("StringValue") != envelope_attributes()[ENVELOPE_ATTRIBUTE].get("StringValue"):
            work.reason = f"malformed envelope: unknown format {marker.get('StringValue')!r}"
            return work
        try:
            sent, first = int(attrs["SentTimestamp"]), int(attrs["ApproximateFirstReceiveTimestamp"])
            count = int(attrs["ApproximateReceiveCount"])
            entries = decode_envelope(work.body)
        except (KeyError, ValueError, TypeError) as exc:
            work.reason = (
                str(exc) if isinstance(exc, InvalidMessageError) else f"missing or malformed broker timestamps: {exc!r}"
            )
            return work
        work.sent_ms, work.first_ms, work.count, work.age_ms = sent, first, count, max(0, first - sent)
        children: list[_Work] = []
        for entry in entries:
            if isinstance(entry, BadItem):
                child = _Work(work.record_id, entry.message_id, 0, entry.body, {}, work.source, reason=entry.reason)
                children.append(child)
                continue
            child = _Work(work.record_id, entry.message_id, entry.hop, entry.body, dict(entry.attributes), work.source)
            child.received_ms = first
            child.total_ms, child.sent_ms, child.first_ms, child.count = entry.remaining_ms, sent, first, count
            child.age_ms = work.age_ms
            try:
                child.remaining_ms = remaining_delay_ms(entry.remaining_ms, sent, first, count, now_ms)
                child.decision_ms = remaining_delay_ms(entry.remaining_ms, sent, first, 1, now_ms)
            except InvalidMessageError as exc:
                child.reason = f"malformed envelope entry {entry.message_id!r}: {exc}"
            child.remaining = math.ceil(child.remaining_ms / 1000)
            children.append(child)
        work.children = children
        return work

    def _send_packed(self, queue: str, info: QueueInfo, items: list[_Work]) -> list[_Work]:
        """Requeue ``items`` in envelopes; returns the ones to send on their own (too big, or alone in a bin)."""
        owner: dict[int, _Work] = {}
        messages: list[PackedMessage] = []
        for w in items:
            m = PackedMessage(w.message_id, w.hop + 1, w.remaining_ms, w.body, w.attributes)
            owner[id(m)] = w
            messages.append(m)
        envelopes, alone = pack(messages, min(self.pack_bytes, info.max_message_size))
        if not envelopes:
            return items
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        for index, envelope in enumerate(envelopes):
            eid = envelope_id(envelope)
            entries.append(
                {
                    "Id": str(index),
                    "MessageBody": envelope_body(envelope),
                    "MessageAttributes": envelope_attributes(),
                    "MessageGroupId": eid,
                    "MessageDeduplicationId": eid,
                }
            )
        results = send_batches(self.client, info.url, entries, what=f"envelope to {queue!r}")
        for entry, envelope in zip(entries, envelopes, strict=True):
            result = results[entry["Id"]]
            for m in envelope:
                w = owner[id(m)]
                if result.error is None:
                    w.result = RecordResult(
                        w.record_id,
                        w.message_id,
                        HopOutcome.REQUEUED,
                        w.hop + 1,
                        w.source.destination,
                        w.remaining,
                        envelope_id=entry["MessageDeduplicationId"],
                    )
                elif isinstance(result.error, DestinationNotFoundError):
                    self.directory.forget(queue)
                    w.reason = f"destination gone: {result.error}"
                elif isinstance(result.error, PermanentError):
                    w.reason = f"{queue!r} refused the envelope: {result.error}"
                else:
                    self._fail(w, result.error)
        return [owner[id(m)] for m in alone]

    def _send(self, queue: str, items: list[_Work], outcome: HopOutcome) -> None:
        """Send one hop for ``items`` to ``queue`` in batches; poison ones get a reason instead of a result."""
        try:
            info = self.directory.get(queue)
        except DestinationNotFoundError as exc:
            for w in items:
                w.reason = f"destination gone: {exc}"
            return
        except DelayedDeliveryError as exc:
            for w in items:
                self._fail(w, exc)
            return
        if outcome is HopOutcome.REQUEUED and self.pack_bytes and len(items) >= 2:
            items = self._send_packed(queue, info, items)
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        sendable: list[_Work] = []
        for index, w in enumerate(items):
            assert w.remaining is not None
            entry: SendMessageBatchRequestEntryTypeDef = {"Id": str(index), "MessageBody": w.body}
            if outcome is HopOutcome.REQUEUED:
                entry["MessageAttributes"] = {
                    **w.attributes,
                    DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": _seconds_text(w.remaining_ms)},
                }
                entry["MessageGroupId"] = w.message_id
                entry["MessageDeduplicationId"] = deduplication_id(w.message_id, w.hop + 1)
            else:
                if w.attributes:
                    entry["MessageAttributes"] = w.attributes
                entry["DelaySeconds"] = min(w.remaining, self.settings.max_native_delay)  # a skewed local clock
            size = message_size(w.body, entry.get("MessageAttributes", {}))
            if size > info.max_message_size:
                w.reason = f"body too large: {size:,} bytes, {queue!r} accepts at most {info.max_message_size:,}"
                continue
            entries.append(entry)
            sendable.append(w)
        results = send_batches(self.client, info.url, entries, what=f"{outcome.value} to {queue!r}")
        for entry, w in zip(entries, sendable, strict=True):
            result = results[entry["Id"]]
            if result.error is None:
                w.result = RecordResult(
                    w.record_id, w.message_id, outcome, w.hop + 1, w.source.destination, w.remaining
                )
            elif isinstance(result.error, DestinationNotFoundError):
                self.directory.forget(queue)
                w.reason = f"destination gone: {result.error}"
            elif isinstance(result.error, PermanentError):
                w.reason = f"{queue!r} refused the message: {result.error}"
            else:
                self._fail(w, result.error)

    def _to_error_queue(self, items: list[_Work]) -> None:
        """Send poison records to the error queue with the reason headers."""
        try:
            info = self.directory.get(self.settings.error_queue)
        except DelayedDeliveryError as exc:
            error = exc if isinstance(exc, TransientError) else TransientError(f"error queue unusable: {exc}")
            for w in items:
                self._fail(w, error)
            return
        failed_at = self.clock.now().isoformat()
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        for index, w in enumerate(items):
            entries.append(
                {
                    "Id": str(index),
                    "MessageBody": w.body or "(empty body)",
                    "MessageAttributes": _error_attributes(w, failed_at),
                }
            )
        results = send_batches(self.client, info.url, entries, what=f"error queue {info.name!r}")
        # A poison record's own attributes may be what SQS refuses: send those again with only our headers,
        # so a bad record reaches the error queue instead of coming back forever.
        refused = [
            (entry, w)
            for entry, w in zip(entries, items, strict=True)
            if results[entry["Id"]].error is not None
            and not isinstance(results[entry["Id"]].error, TransientError)
            and w.attributes
        ]
        if refused:
            bare: list[SendMessageBatchRequestEntryTypeDef] = [
                {
                    "Id": f"bare-{entry['Id']}",
                    "MessageBody": entry["MessageBody"],
                    "MessageAttributes": _error_attributes(w, failed_at, keep_user_attributes=False),
                }
                for entry, w in refused
            ]
            retried = send_batches(self.client, info.url, bare, what=f"error queue {info.name!r}")
            for entry, again in zip((e for e, _ in refused), bare, strict=True):
                results[entry["Id"]] = retried[again["Id"]]
        for entry, w in zip(entries, items, strict=True):
            result = results[entry["Id"]]
            if result.error is None:
                w.result = RecordResult(
                    w.record_id,
                    w.message_id,
                    HopOutcome.ERROR_QUEUE,
                    w.hop,
                    w.source.destination,
                    w.remaining,
                    w.reason,
                )
            else:
                self._fail(w, result.error)

    @staticmethod
    def _fail(w: _Work, error: DelayedDeliveryError) -> None:
        w.result = RecordResult(
            w.record_id, w.message_id, HopOutcome.FAILED, w.hop, w.source.destination, w.remaining, str(error), error
        )


def _annotate(items: list[_Work]) -> None:
    """Add the applied cancellation record, and why a park was refused, to each message's result."""
    for w in items:
        if w.applied is not None and w.result is not None:
            w.result = replace(w.result, cancellation=w.applied)
        if w.park_failure is not None and w.result is not None and w.result.reason is None:
            w.result = replace(w.result, reason=f"hopped instead of parking: {w.park_failure}")


def _unpacked(w: _Work) -> RecordResult:
    """One result for an envelope record: ``FAILED`` (retry it all) when any inner message failed."""
    assert w.children is not None
    inner = tuple(c.result for c in w.children if c.result is not None)
    if inner and len(inner) == len(w.children) and all(r.outcome is HopOutcome.PARKED for r in inner):
        return RecordResult(
            w.record_id,
            w.message_id,
            HopOutcome.PARKED,
            w.hop,
            w.source.destination,
            inner=inner,
            park_s=inner[0].park_s,
        )
    failed = [r for r in inner if r.outcome is HopOutcome.FAILED]
    if failed or len(inner) != len(w.children):
        error = failed[0].error if failed and failed[0].error else TransientError("an inner message has no outcome")
        reason = f"{len(failed)} of {len(w.children)} inner messages failed: {error}"
        return RecordResult(
            w.record_id, w.message_id, HopOutcome.FAILED, w.hop, w.source.destination, None, reason, error, inner
        )
    return RecordResult(w.record_id, w.message_id, HopOutcome.UNPACKED, w.hop, w.source.destination, inner=inner)


def _to_ms(seconds: str) -> int:
    """``"1799.123"`` → 1799123 (exact decimal arithmetic, no float rounding)."""
    whole, _, fraction = seconds.partition(".")
    return int(whole) * 1000 + int((fraction + "000")[:3])


def _seconds_text(ms: int) -> str:
    """1799123 → ``"1799.123"``; whole seconds stay integers."""
    whole, rest = divmod(ms, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}"


_ATTRIBUTE_NAME = re.compile(r"^(?!\.)(?!.*\.\.)(?!.*\.$)(?!(?i:aws\.|amazon\.))[A-Za-z0-9_.-]{1,256}$")


def _valid_attribute_name(name: str) -> bool:
    """Whether SQS accepts ``name`` as a message attribute name."""
    return bool(_ATTRIBUTE_NAME.match(name))


def _error_attributes(
    w: _Work, failed_at: str, *, keep_user_attributes: bool = True
) -> dict[str, MessageAttributeValueTypeDef]:
    """The user's attributes plus the reason headers, within SQS's 10-attribute limit (reason first)."""
    reason = w.reason or "unknown"
    if not keep_user_attributes:
        reason = f"{reason} (the record's own attributes were refused and dropped)"
    headers: list[tuple[str, str]] = [
        (FAILURE_REASON, reason[:1024]),
        (ORIGINAL_DESTINATION, w.source.destination),
        (FAILED_AT, failed_at),
    ]
    attributes = {k: v for k, v in w.attributes.items() if _valid_attribute_name(k)} if keep_user_attributes else {}
    if keep_user_attributes and len(attributes) < len(w.attributes):
        headers[0] = (FAILURE_REASON, f"{reason} (attributes with names SQS refuses were dropped)"[:1024])
    while len(attributes) >= MAX_ATTRIBUTES:
        attributes.popitem()
    for name, value in headers:
        if len(attributes) < MAX_ATTRIBUTES:
            attributes[name] = {"DataType": "String", "StringValue": value}
    return attributes
