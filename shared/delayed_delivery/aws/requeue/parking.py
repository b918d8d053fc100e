"""Parking: find park returns, choose the records to park, and hide them with ``ChangeMessageVisibilityBatch``
(the rules are in ``docs/requeue.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import Clock
from ...errors import DelayedDeliveryError, PermanentError, TransientError
from ...planning import SqsParkPolicy, sqs_park_ms
from ..brokerclock import BrokerClock
from ..settings import SqsSettings
from ..sqs import MAX_BATCH_ENTRIES, QueueDirectory, QueueInfo, translate_error
from .plan import Ledger, MessagePlan, result_of
from .records import HopOutcome, ParsedMessage, ParsedRecord, SourceQueue

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import ChangeMessageVisibilityBatchRequestEntryTypeDef

__all__ = ["IN_FLIGHT_CACHE_S", "Parking"]

#: How long the in-flight count of a queue (``ApproximateNumberOfMessagesNotVisible``) is reused.
IN_FLIGHT_CACHE_S = 60.0


@dataclass(slots=True)
class Parking:
    """The park decisions and visibility changes of one requeuer (it keeps the in-flight counts it read)."""

    client: SQSClient
    directory: QueueDirectory
    sqs_settings: SqsSettings
    clock: Clock
    broker_clock: BrokerClock | None
    retention_headroom: int
    in_flight: dict[str, tuple[int | None, float]] = field(default_factory=dict)

    def policy(self, queue: QueueInfo) -> SqsParkPolicy:
        """The park rules for ``queue``: the settings plus its retention and visibility timeout."""
        return SqsParkPolicy(
            fifo_queue_delay=self.sqs_settings.fifo_queue_delay,
            max_native_delay=self.sqs_settings.max_native_delay,
            max_park_seconds=self.sqs_settings.max_park_seconds,
            retention_seconds=queue.retention_seconds,
            visibility_timeout=queue.visibility_timeout,
            retention_headroom=self.retention_headroom,
        )

    def source_info(self, source: SourceQueue) -> QueueInfo | None:
        """The source ``-delay.fifo`` queue's URL and attributes (cached), or None when they cannot be read."""
        try:
            return self.directory.get(source.delay_queue)
        except DelayedDeliveryError:
            return None

    def record_park_ms(self, record: ParsedRecord, queue: QueueInfo) -> int:
        """The park for a whole record (an envelope parks for its soonest message); 0 when it cannot park."""
        items = record.messages
        live = [i for i in items if i.live]
        if not live or len(live) != len(items):
            return 0
        policy = self.policy(queue)
        return min(sqs_park_ms(i.decision_ms, record.age_ms, policy) for i in live)

    def find_park_returns(self, records: list[ParsedRecord], now_ms: int) -> list[ParsedRecord]:
        """Mark park returns (case 3) and re-base their remaining delays on the broker's clock."""
        if self.broker_clock is not None:
            for r in records:
                if r.times is not None and r.times.count == 1 and r.times.first_ms:  # this batch's own receive
                    self.broker_clock.observe_broker_ms(r.times.first_ms, now_ms)
        broker_now: int | None = None
        found = list(records)
        for index, r in enumerate(records):
            if r.message.reason is not None or r.count <= 1 or r.times is None:
                continue
            queue = self.source_info(r.message.source)
            if queue is None or not self.record_park_ms(r, queue):  # not park-eligible: a plain redelivery
                continue
            if broker_now is None:
                broker_now = self.broker_now(r.message.source, now_ms)
            if broker_now - r.times.first_ms < self.policy(queue).return_threshold_ms:
                continue
            found[index] = park_return(r, broker_now)
        return found

    def broker_now(self, source: SourceQueue, now_ms: int) -> int:
        """The broker's time now (never ahead of it); the local clock when SQS has not answered lately."""
        if self.broker_clock is None:
            return now_ms
        broker = self.broker_clock.now_ms(now_ms)
        if broker is None:
            self.queue_in_flight(source)  # one request (at most once a minute) that also dates itself
            broker = self.broker_clock.now_ms()
        return now_ms if broker is None else broker

    def plan_parks(self, records: list[ParsedRecord], blocked: list[bool]) -> dict[int, int]:
        """Choose the records to park (by index) and for how long (whole seconds); the rest hop as before.

        ``blocked``: per record, whether a cancellation record applies to one of its messages (no park then).
        """
        chosen: list[tuple[int, ParsedRecord, int]] = []
        for index, r in enumerate(records):
            if r.message.reason is not None or blocked[index] or not r.receipt_handle:
                continue
            if r.count > 1 and not r.park_return:  # case 2: a plain redelivery never parks
                continue
            queue = self.source_info(r.message.source)
            park = self.record_park_ms(r, queue) if queue is not None else 0
            if park:
                chosen.append((index, r, park))
        if self.sqs_settings.pack_bytes:
            chosen = _packed_instead(chosen)
        parks: dict[int, int] = {}
        for index, r, park in chosen:
            if not r.park_return and not self.may_park_more(r.message.source):  # only new parks add to in-flight
                continue
            parks[index] = park // 1000
        return parks

    def may_park_more(self, source: SourceQueue) -> bool:
        """Whether the queue's in-flight count (cached a minute) is below ``park_max_in_flight``."""
        in_flight = self.queue_in_flight(source)
        return in_flight is not None and in_flight < self.sqs_settings.park_max_in_flight

    def queue_in_flight(self, source: SourceQueue) -> int | None:
        """``ApproximateNumberOfMessagesNotVisible`` of the source queue, read at most once a minute (None: unknown)."""
        now = self.clock.now().timestamp()
        cached = self.in_flight.get(source.delay_queue)
        if cached is not None and 0 <= now - cached[1] < IN_FLIGHT_CACHE_S:
            return cached[0]
        value: int | None = None
        queue = self.source_info(source)
        if queue is not None:
            try:
                attrs = self.client.get_queue_attributes(
                    QueueUrl=queue.url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
                )
                value = int(attrs.get("Attributes", {})["ApproximateNumberOfMessagesNotVisible"])
            except (ClientError, BotoCoreError, KeyError, ValueError, TypeError):
                value = None  # unknown: no new parks until the next reading
        self.in_flight[source.delay_queue] = (value, now)
        return value

    def park(self, parked: list[tuple[ParsedRecord, int, list[MessagePlan]]], ledger: Ledger) -> list[MessagePlan]:
        """Hide each parked record for its park (``ChangeMessageVisibilityBatch``); returns the plans that hop instead.

        A change SQS refused (an entry it failed as the sender's fault, or a request it rejected: a receipt handle
        that is no longer valid, a missing permission) certainly did not happen: the record hops instead, as it
        would have without parking. A change whose outcome is unknown (a network error, throttling, a server
        error) may have happened: the record is ``FAILED`` and comes back, after its visibility timeout or its
        park, without having been copied.
        """
        by_queue: dict[str, list[tuple[ParsedRecord, int, list[MessagePlan]]]] = {}
        for item in parked:
            by_queue.setdefault(item[0].message.source.delay_queue, []).append(item)
        hop_instead: list[MessagePlan] = []
        for queue, group in by_queue.items():
            info = self.source_info(group[0][0].message.source)
            for start in range(0, len(group), MAX_BATCH_ENTRIES):
                chunk = group[start : start + MAX_BATCH_ENTRIES]
                refused, unknown = self._change_visibility(queue, info, [(r.receipt_handle, s) for r, s, _ in chunk])
                for i, (_, park_s, plans) in enumerate(chunk):
                    hop_instead += _settle_park(plans, park_s, refused.get(str(i)), unknown.get(str(i)), ledger)
        return hop_instead

    def _change_visibility(
        self, queue: str, info: QueueInfo | None, chunk: list[tuple[str, int]]
    ) -> tuple[dict[str, str], dict[str, DelayedDeliveryError]]:
        """One ``ChangeMessageVisibilityBatch``: the entries SQS refused (with why) and those with unknown outcome."""
        refused: dict[str, str] = {}
        unknown: dict[str, DelayedDeliveryError] = {}
        if info is None:
            return {str(i): f"parking in {queue!r}: the queue cannot be read" for i in range(len(chunk))}, unknown
        entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
            {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": park_s}
            for i, (handle, park_s) in enumerate(chunk)
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
        return refused, unknown


def park_return(record: ParsedRecord, broker_now: int) -> ParsedRecord:
    """The record as a park return (case 3): its live messages re-based on the broker's time now."""
    assert record.times is not None
    sent_ms = record.times.sent_ms
    messages = tuple(m if m.reason is not None else _rebased(m, broker_now, sent_ms) for m in record.messages)
    rebased = replace(record, park_return=True, age_ms=max(0, broker_now - sent_ms))
    return replace(rebased, inner=messages) if record.inner is not None else replace(rebased, message=messages[0])


def _rebased(message: ParsedMessage, broker_now: int, sent_ms: int) -> ParsedMessage:
    """A park return's message with its remaining delay by the broker's clock (the decision uses the same)."""
    left = max(0, message.total_ms - (broker_now - sent_ms))
    return replace(
        message,
        park_return=True,
        received_ms=broker_now,
        remaining_ms=left,
        decision_ms=left,
        remaining=math.ceil(left / 1000),
    )


def _packed_instead(chosen: list[tuple[int, ParsedRecord, int]]) -> list[tuple[int, ParsedRecord, int]]:
    """Leave out plain first receives that would park alone when two or more share a queue: they requeue packed.

    The envelope parks on its next receive. Park returns never switch (their decision must not depend on the
    batch they come in).
    """
    singles: dict[str, int] = {}
    for _, r, _ in chosen:
        if r.inner is None and not r.park_return:
            queue = r.message.source.delay_queue
            singles[queue] = singles.get(queue, 0) + 1
    return [
        (i, r, park)
        for i, r, park in chosen
        if r.inner is not None or r.park_return or singles[r.message.source.delay_queue] < 2
    ]


def _settle_park(
    plans: list[MessagePlan], park_s: int, refused: str | None, unknown: DelayedDeliveryError | None, ledger: Ledger
) -> list[MessagePlan]:
    """Apply a visibility change's outcome to a record's messages: parked, ``FAILED``, or (returned) hop instead."""
    if refused is not None:  # not parked: it hops, like any record that cannot park
        return [replace(p, action=p.hop, park_s=0, park_failure=refused) for p in plans]
    for p in plans:
        if unknown is not None:
            ledger.fail(p, unknown if isinstance(unknown, TransientError) else TransientError(str(unknown)))
        else:
            ledger.settle(p, result_of(p.message, HopOutcome.PARKED, p.message.hop, park_s=park_s))
    return []
