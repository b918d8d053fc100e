"""Parking: find park returns, choose the records to park, and hide them with ``ChangeMessageVisibilityBatch``
(the rules are in ``docs/requeue.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import Clock
from ...errors import DelayedDeliveryError, PermanentError, TransientError
from ...planning import SqsParkPolicy, sqs_park_ms
from ...settings import DelayedDeliverySettings
from ..brokerclock import BrokerClock
from ..sqs import MAX_BATCH_ENTRIES, QueueDirectory, QueueInfo, translate_error
from .records import HopOutcome, RecordResult, SourceQueue, Work, messages_of
from .sending import fail

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
    settings: DelayedDeliverySettings
    clock: Clock
    broker_clock: BrokerClock | None
    retention_headroom: int
    pack_bytes: int
    in_flight: dict[str, tuple[int | None, float]] = field(default_factory=dict)

    def policy(self, queue: QueueInfo) -> SqsParkPolicy:
        """The park rules for ``queue``: the settings plus its retention and visibility timeout."""
        return SqsParkPolicy(
            fifo_queue_delay=self.settings.fifo_queue_delay,
            max_native_delay=self.settings.max_native_delay,
            max_park_seconds=self.settings.max_park_seconds,
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

    def record_park_ms(self, w: Work, queue: QueueInfo) -> int:
        """The park for a whole record (an envelope parks for its soonest message); 0 when it cannot park."""
        items = messages_of(w)
        live = [i for i in items if i.reason is None and i.remaining is not None]
        if not live or len(live) != len(items):
            return 0
        policy = self.policy(queue)
        return min(sqs_park_ms(i.decision_ms, w.age_ms, policy) for i in live)

    def find_park_returns(self, work: list[Work], now_ms: int) -> None:
        """Mark park returns (case 3) and re-base their remaining delays on the broker's clock."""
        if self.broker_clock is not None:
            for w in work:
                if w.count == 1 and w.first_ms:  # this batch's own receive, stamped by the broker to the ms
                    self.broker_clock.observe_broker_ms(w.first_ms, now_ms)
        broker_now: int | None = None
        for w in work:
            if w.reason is not None or w.count <= 1:
                continue
            queue = self.source_info(w.source)
            if queue is None or not self.record_park_ms(w, queue):  # not park-eligible: a plain redelivery
                continue
            if broker_now is None:
                broker_now = self.broker_now(w.source, now_ms)
            if broker_now - w.first_ms < self.policy(queue).return_threshold_ms:
                continue
            _mark_park_return(w, broker_now)

    def broker_now(self, source: SourceQueue, now_ms: int) -> int:
        """The broker's time now (never ahead of it); the local clock when SQS has not answered lately."""
        if self.broker_clock is None:
            return now_ms
        broker = self.broker_clock.now_ms(now_ms)
        if broker is None:
            self.queue_in_flight(source)  # one request (at most once a minute) that also dates itself
            broker = self.broker_clock.now_ms()
        return now_ms if broker is None else broker

    def plan_parks(self, work: list[Work]) -> list[Work]:
        """Choose the records to park and for how long (``park_s``); the rest hop as before."""
        chosen: list[tuple[Work, int]] = []
        for w in work:
            if w.reason is not None or w.result is not None or not w.receipt_handle:
                continue
            if w.count > 1 and not w.park_return:  # case 2: a plain redelivery never parks
                continue
            if any(i.result is not None or i.applied is not None for i in messages_of(w)):
                continue
            queue = self.source_info(w.source)
            park = self.record_park_ms(w, queue) if queue is not None else 0
            if park:
                chosen.append((w, park))
        if self.pack_bytes:
            chosen = _packed_instead(chosen)
        parked: list[Work] = []
        for w, park in chosen:
            if not w.park_return and not self.may_park_more(w.source):  # only new parks add to in-flight
                continue
            w.park_s = park // 1000
            for item in w.children or ():
                item.park_s = w.park_s
            parked.append(w)
        return parked

    def may_park_more(self, source: SourceQueue) -> bool:
        """Whether the queue's in-flight count (cached a minute) is below ``park_max_in_flight``."""
        in_flight = self.queue_in_flight(source)
        return in_flight is not None and in_flight < self.settings.park_max_in_flight

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

    def park(self, parked: list[Work]) -> None:
        """Hide each parked record for its park (``ChangeMessageVisibilityBatch``).

        A change SQS refused (an entry it failed as the sender's fault, or a request it rejected: a receipt handle
        that is no longer valid, a missing permission) certainly did not happen: the record hops instead, as it
        would have without parking. A change whose outcome is unknown (a network error, throttling, a server
        error) may have happened: the record is ``FAILED`` and comes back, after its visibility timeout or its
        park, without having been copied.
        """
        by_queue: dict[str, list[Work]] = {}
        for w in parked:
            by_queue.setdefault(w.source.delay_queue, []).append(w)
        for queue, group in by_queue.items():
            info = self.source_info(group[0].source)
            for start in range(0, len(group), MAX_BATCH_ENTRIES):
                chunk = group[start : start + MAX_BATCH_ENTRIES]
                refused, unknown = self._change_visibility(queue, info, chunk)
                for i, w in enumerate(chunk):
                    _settle_park(w, refused.get(str(i)), unknown.get(str(i)))

    def _change_visibility(
        self, queue: str, info: QueueInfo | None, chunk: list[Work]
    ) -> tuple[dict[str, str], dict[str, DelayedDeliveryError]]:
        """One ``ChangeMessageVisibilityBatch``: the entries SQS refused (with why) and those with unknown outcome."""
        refused: dict[str, str] = {}
        unknown: dict[str, DelayedDeliveryError] = {}
        if info is None:
            return {str(i): f"parking in {queue!r}: the queue cannot be read" for i in range(len(chunk))}, unknown
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
        return refused, unknown


def _mark_park_return(w: Work, broker_now: int) -> None:
    """Re-base a park return's messages on the broker's time now (case 3)."""
    w.park_return = True
    w.age_ms = max(0, broker_now - w.sent_ms)
    for item in messages_of(w):
        if item.reason is not None:
            continue
        item.park_return = True
        item.age_ms = w.age_ms
        item.received_ms = broker_now
        item.remaining_ms = item.decision_ms = max(0, item.total_ms - (broker_now - item.sent_ms))
        item.remaining = math.ceil(item.remaining_ms / 1000)


def _packed_instead(chosen: list[tuple[Work, int]]) -> list[tuple[Work, int]]:
    """Leave out plain first receives that would park alone when two or more share a queue: they requeue packed.

    The envelope parks on its next receive. Park returns never switch (their decision must not depend on the
    batch they come in).
    """
    singles: dict[str, int] = {}
    for w, _ in chosen:
        if w.children is None and not w.park_return:
            singles[w.source.delay_queue] = singles.get(w.source.delay_queue, 0) + 1
    return [
        (w, park) for w, park in chosen if w.children is not None or w.park_return or singles[w.source.delay_queue] < 2
    ]


def _settle_park(w: Work, refused: str | None, unknown: DelayedDeliveryError | None) -> None:
    """Apply a visibility change's outcome to a record's messages: parked, hop instead, or ``FAILED``."""
    for item in messages_of(w):
        if refused is not None:  # not parked: it hops below, like any record that cannot park
            item.park_s = 0
            item.park_failure = refused
        elif unknown is not None:
            item.park_s = 0
            fail(item, unknown if isinstance(unknown, TransientError) else TransientError(str(unknown)))
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
    if refused is not None:
        w.park_s = 0
