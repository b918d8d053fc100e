"""The sender's bucket leg: long delays routed to the time-bucket tier travel packed to its ingest queue.

``SqsDelayedSender`` asks ``BucketSendLeg.takes(delay)`` for every delay past the native cap (``long_delay_route``:
``buckets`` always, ``auto`` when ``cost.choose_long_delay_route`` says so and the tier is deployed) and hands the
leg the checked messages.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ... import logfields as lf
from ...clock import Clock
from ...cost import MeasuredFigures, choose_long_delay_route, load_measured_figures
from ...delivery import epoch_ms
from ...envsettings import env_name
from ...errors import ConfigurationError, DestinationNotFoundError, DestinationRefusedError, InvalidMessageError
from ...timebuckets.cost import BucketCounts
from ...timebuckets.format import BucketMessage
from ..settings import SqsSettings
from ..sqs import EntryResult, QueueDirectory, QueueInfo, message_size, send_batches
from .ingest_format import DEFAULT_INGEST_BYTES, encode_ingest, ingest_attributes, pack_ingest

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = ["TIER_RECHECK_SECONDS", "BucketSend", "BucketSendLeg"]

_log = logging.getLogger(__name__)
#: Under ``auto``, how long a sender goes on taking the FIFO route after finding no tier before it looks again.
TIER_RECHECK_SECONDS = 300


@dataclass(frozen=True, slots=True)
class BucketSend:
    """One checked message for the tier: its delay in whole seconds from the moment it is sent."""

    message_id: str
    destination: str
    body: str
    attributes: Mapping[str, MessageAttributeValueTypeDef]
    delay_seconds: int


class BucketSendLeg:
    """Packs bucket-routed messages into ingest envelopes (up to 64 KiB) and sends them in batches of 10."""

    def __init__(
        self,
        client: SQSClient,
        sqs_settings: SqsSettings,
        directory: QueueDirectory,
        clock: Clock,
        *,
        pack_bytes: int = DEFAULT_INGEST_BYTES,
    ) -> None:
        self.client = client
        self.sqs_settings = sqs_settings
        self.directory = directory
        self.clock = clock
        self.pack_bytes = pack_bytes or DEFAULT_INGEST_BYTES
        self._priced: tuple[MeasuredFigures, BucketCounts] | None = None
        #: Under ``auto``: no tier found, so the FIFO route is taken until then.
        self._absent_until: datetime | None = None

    def takes(self, delay_seconds: int) -> bool:
        """Whether a delay past the native cap goes to the tier under ``long_delay_route`` (``auto``: when cheaper at
        the traffic of ``auto_traffic_per_minute`` and the tier is deployed)."""
        route = self.sqs_settings.long_delay_route
        if route != "auto":
            return route == "buckets"
        if self._priced is None:
            measured = load_measured_figures()
            self._priced = (measured, measured.bucket_counts(self.sqs_settings.auto_traffic_per_minute))
        measured, counts = self._priced
        chosen = choose_long_delay_route(
            delay_seconds, measured, counts, max_native_delay=self.sqs_settings.max_native_delay
        )
        return chosen == "buckets" and self._deployed()

    def _deployed(self) -> bool:
        """Whether the tier's ingest queue is there for this sender; when it is missing (or this sender may not see
        it) ``auto`` takes the FIFO route, logged once, and looks again after ``TIER_RECHECK_SECONDS``."""
        now = self.clock.now()
        if self._absent_until is not None and now < self._absent_until:
            return False
        name = self.sqs_settings.bucket_ingest_queue
        try:
            self.directory.get(name)
        except (DestinationNotFoundError, DestinationRefusedError, ConfigurationError) as exc:
            if self._absent_until is None:
                _log.warning(
                    "long_delay_route auto: the time-bucket tier's ingest queue is not there, long delays take the "
                    "-delay.fifo route",
                    extra={lf.EVENT: lf.EVENT_ROUTE_FALLBACK, lf.DESTINATION: name, lf.REASON: str(exc)[:512]},
                )
            self._absent_until = now + timedelta(seconds=TIER_RECHECK_SECONDS)
            return False
        self._absent_until = None
        return True

    def ingest_queue(self) -> QueueInfo:
        """The ingest queue (cached); ``ConfigurationError`` naming the setting when it does not exist."""
        name = self.sqs_settings.bucket_ingest_queue
        try:
            return self.directory.get(name)
        except DestinationNotFoundError as exc:
            raise ConfigurationError(
                f"the time-bucket tier's ingest queue {name!r} does not exist (setting bucket_ingest_queue, "
                f"{env_name('bucket_ingest_queue')}): create the tier with `delayed-delivery aws create` or its CDK "
                "construct, or set long_delay_route=fifo"
            ) from exc

    def check(self, message: BucketSend) -> QueueInfo:
        """The ingest queue, once ``message`` is known to fit an envelope of its own there."""
        queue = self.ingest_queue()
        size = message_size(encode_ingest([self._message(message, 0)]), ingest_attributes())
        if size > queue.max_message_size:
            raise InvalidMessageError(
                f"message is {size:,} bytes in its ingest envelope but the ingest queue {queue.name!r} accepts at "
                f"most {queue.max_message_size:,} (its MaximumMessageSize)"
            )
        return queue

    def send(self, messages: Sequence[BucketSend]) -> dict[str, EntryResult]:
        """Send checked messages, due ``delay_seconds`` after now; one result per message id (its envelope's)."""
        queue = self.ingest_queue()
        now_ms = epoch_ms(self.clock.now())
        envelopes = pack_ingest(
            [self._message(m, now_ms) for m in messages], min(self.pack_bytes, queue.max_message_size)
        )
        entries: list[SendMessageBatchRequestEntryTypeDef] = [
            {"Id": f"i{index}", "MessageBody": encode_ingest(envelope), "MessageAttributes": ingest_attributes()}
            for index, envelope in enumerate(envelopes)
        ]
        sent = send_batches(self.client, queue.url, entries, what=f"sending to the ingest queue {queue.name!r}")
        results: dict[str, EntryResult] = {}
        for entry, envelope in zip(entries, envelopes, strict=True):
            result = sent[entry["Id"]]
            for message in envelope:
                results[message.message_id] = EntryResult(message.message_id, result.sqs_message_id, result.error)
        if any(isinstance(r.error, DestinationNotFoundError) for r in results.values()):
            self.directory.forget(queue.name)
        return results

    @staticmethod
    def _message(message: BucketSend, now_ms: int) -> BucketMessage:
        return BucketMessage(
            message.message_id,
            message.destination,
            message.body.encode("utf-8"),
            now_ms + message.delay_seconds * 1000,
            message.attributes,
            sent_at_ms=now_ms,
        )
