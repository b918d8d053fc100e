"""The FIFO-requeue step: what the Lambda on each ``<queue>-delay.fifo`` does with a batch of records.

A pipeline per batch: parse each record (``records``), plan (park returns, cancellations, parks, requeue or
forward: ``parking``, ``plan``), execute the SQS calls (``parking``, ``sending``), report one result per record.
The guarantees, packing, parking and the clock rules case by case are in ``docs/requeue.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...cancellations import CancellationCache
from ...clock import Clock, SystemClock
from ...errors import ConfigurationError, DelayedDeliveryDisabledError
from ...planning import PARK_RETENTION_HEADROOM, SqsParkPolicy
from ...settings import DelayedDeliverySettings
from ..brokerclock import BrokerClock
from ..packing import DEFAULT_PACK_BYTES
from ..sqs import QueueDirectory, QueueInfo
from .parking import IN_FLIGHT_CACHE_S, Parking
from .plan import annotate, applied_records, apply_cancellations, route, unpacked
from .records import HopOutcome, RecordResult, SourceQueue, messages_of, parse_record, parse_source_arn
from .sending import Sending

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "IN_FLIGHT_CACHE_S",
    "FifoRequeuer",
    "HopOutcome",
    "RecordResult",
    "SourceQueue",
    "parse_source_arn",
]


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
        self._parking = Parking(
            client, self.directory, self.settings, self.clock, self.broker_clock, retention_headroom, pack_bytes
        )

    def process(self, records: Sequence[Mapping[str, Any]]) -> list[RecordResult]:
        """Handle the ``Records`` of one SQS event; one result per record, in order."""
        if not self.settings.enabled:
            raise DelayedDeliveryDisabledError(
                "unrestricted delayed delivery is disabled on this receiver (DELAYED_DELIVERY_ENABLED): "
                "records stay on the -delay.fifo queue"
            )
        now_ms = int(self.clock.now().timestamp() * 1000)
        work = [parse_record(record, now_ms) for record in records]
        parking = self.settings.max_park_seconds > 0
        if parking:
            self._parking.find_park_returns(work, now_ms)
        items = [item for w in work for item in messages_of(w)]
        if self.cancellations is not None:
            apply_cancellations(self.cancellations, items, now_ms)
        if parking:
            self._parking.park(self._parking.plan_parks(work))
        requeue, forward = route(items, self.settings.max_native_delay)
        sending = Sending(self.client, self.directory, self.settings, self.clock, self.pack_bytes)
        for queue, group in requeue.items():
            sending.send(queue, group, HopOutcome.REQUEUED)
        for queue, group in forward.items():
            sending.send(queue, group, HopOutcome.FORWARDED)
        poison = [w for w in items if w.result is None and w.reason is not None]
        if poison:
            sending.to_error_queue(poison)
        annotate(items)
        for w in work:
            if w.children is not None:
                w.result = unpacked(w)
        if self.cancellations is not None:
            self.cancellations.applied(applied_records(work))
        return [w.result for w in work if w.result is not None]

    def park_policy(self, queue: QueueInfo) -> SqsParkPolicy:
        """The park rules for ``queue``: the settings plus its retention and visibility timeout."""
        return self._parking.policy(queue)
