"""The tier's ingest step: SQS records of ingest envelopes in, one S3 object per due bucket per invocation out.

``BucketIngest.process(records)`` reads every record (``decode_ingest``), groups all good entries of the
invocation by ``bucket_of(due, now)`` and writes one object per bucket (``S3BucketStore.write``; keys derive from
the content, so a retried batch writes the same keys). Entries that cannot be read go to the error queue with the
reason. A record is reported failed (and retried by SQS) only when an object holding its entries, or the
error-queue copy of one of its bad entries, could not be written.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...clock import Clock, SystemClock
from ...errors import DelayedDeliveryError, InvalidMessageError
from ...headers import FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION
from ...settings import DelayedDeliverySettings
from ...timebuckets.format import BucketMessage
from ...timebuckets.identity import conflict_reason, first_sent, same_message
from ...timebuckets.wheel import BucketKey, bucket_of
from ..errorqueue import REDUCED_MAX_BYTES, sqs_safe
from ..sqs import QueueDirectory, send_batches
from .config import outside_reason
from .ingest_format import INGEST_ATTRIBUTE, INGEST_VERSION, BadItem, decode_ingest
from .store import S3BucketStore

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = ["BucketIngest", "IngestPoison", "IngestResult", "reported_id"]

#: Longest reason put on an error-queue copy.
_MAX_REASON = 1_024
#: Bytes kept free for the attributes when an error-queue copy is cut to fit the queue.
_ROOM = 4_096


@dataclass(frozen=True, slots=True)
class IngestPoison:
    """An entry (or a whole record) that could not be ingested, and whether its error-queue copy was sent."""

    record_id: str
    message_id: str
    reason: str
    destination: str | None = None
    sent: bool = False
    #: The entry's text as the error queue gets it (the body, or the entry's JSON when the body is unusable).
    body: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What one invocation did: objects written per bucket, messages ingested, poison, failed records."""

    records: int
    #: Distinct messages in the objects written.
    ingested: int
    #: Entries seen twice in the invocation (the same id and due time: SQS's at-least-once delivery).
    duplicates: int = 0
    written: Mapping[BucketKey, tuple[str, ...]] = field(default_factory=dict)
    poison: tuple[IngestPoison, ...] = ()
    #: Record id -> why it will be retried (its objects or its error-queue copies were not written).
    failures: Mapping[str, str] = field(default_factory=dict)

    @property
    def objects_written(self) -> int:
        """The number of S3 objects written."""
        return sum(len(keys) for keys in self.written.values())

    def batch_item_failures(self) -> list[dict[str, str]]:
        """The partial batch response's items."""
        return [{"itemIdentifier": record_id} for record_id in self.failures]


@dataclass(slots=True)
class _Batch:
    """The invocation's entries grouped by bucket, who carried them, and what could not be read."""

    #: One copy per message (id and due time) across the invocation (``identity.py``): its bucket, the message, the
    #: record carrying it.
    kept: dict[tuple[str, int], tuple[BucketKey, BucketMessage, str]] = field(default_factory=dict)
    owners: dict[BucketKey, set[str]] = field(default_factory=dict)
    poison: list[IngestPoison] = field(default_factory=list)
    duplicates: int = 0

    def groups(self) -> dict[BucketKey, list[BucketMessage]]:
        """The messages kept, by bucket."""
        grouped: dict[BucketKey, list[BucketMessage]] = {}
        for bucket, message, _ in self.kept.values():
            grouped.setdefault(bucket, []).append(message)
        return grouped

    def keep(self, bucket: BucketKey, message: BucketMessage, record_id: str) -> None:
        """Keep one copy per message (id and due time): the first sent of the same message; of different messages
        under one id and due time, the first sent, the other to the error queue with both digests (never written, so
        never replacing or replaced in silence). Other due times under one id are other messages."""
        self.owners.setdefault(bucket, set()).add(record_id)
        key = (message.message_id, message.due_at_ms)
        known = self.kept.setdefault(key, (bucket, message, record_id))
        if known[1] is message:
            return
        _, other, other_record = known
        first = first_sent(other, message)
        if first is message:
            self.kept[key] = (bucket, message, record_id)
        if same_message(other, message):
            self.duplicates += 1
            return
        loser, loser_record = (other, other_record) if first is message else (message, record_id)
        self.poison.append(_poison(loser_record, loser, conflict_reason(first, loser)))


class BucketIngest:
    """Writes the entries of ingest records into bucket objects (clients injected; nothing called at construction)."""

    def __init__(
        self,
        store: S3BucketStore,
        sqs_client: SQSClient,
        settings: DelayedDeliverySettings,
        clock: Clock | None = None,
        *,
        directory: QueueDirectory | None = None,
        destinations: Collection[str] | None = None,
    ) -> None:
        self.store = store
        self.sqs = sqs_client
        self.settings = settings
        self.clock = clock or SystemClock()
        self.directory = directory or QueueDirectory(sqs_client)
        #: The queues the tier may deliver to (``None``: any): an entry for another is refused, to the error queue.
        self.destinations = frozenset(destinations) if destinations is not None else None

    def process(self, records: Sequence[Mapping[str, Any]]) -> IngestResult:
        """Ingest one invocation's records; raises only on a bug, never on what a record holds."""
        now = self.clock.now()
        batch = _Batch()
        for index, record in enumerate(records):
            self._add(batch, reported_id(record, index), _items(record), now)
        failures: dict[str, str] = {}
        written: dict[BucketKey, tuple[str, ...]] = {}
        ingested = 0
        for bucket, messages in sorted(batch.groups().items()):
            try:
                written[bucket] = tuple(self.store.write(bucket, messages))
                ingested += len(messages)
            except DelayedDeliveryError as exc:
                for record_id in sorted(batch.owners[bucket]):
                    failures.setdefault(record_id, f"bucket {bucket.level} {bucket.iso} not written: {exc}")
        held = [p for p in batch.poison if p.record_id in failures]  # sent when the retried record is read again
        poison = self._send_poison([p for p in batch.poison if p.record_id not in failures], now, failures) + held
        return IngestResult(len(records), ingested, batch.duplicates, written, tuple(poison), failures)

    def _add(self, batch: _Batch, record_id: str, items: list[BucketMessage | BadItem], now: datetime) -> None:
        for item in items:
            if isinstance(item, BadItem):
                batch.poison.append(
                    IngestPoison(record_id, item.message_id, item.reason, item.destination, body=item.body)
                )
                continue
            if self.destinations is not None and item.destination not in self.destinations:
                batch.poison.append(_poison(record_id, item, outside_reason(item.destination)))
                continue
            try:
                bucket = bucket_of(item.due_at, now, self.store.levels)
            except InvalidMessageError as exc:
                batch.poison.append(_poison(record_id, item, str(exc)))
                continue
            batch.keep(bucket, item, record_id)

    def _send_poison(self, poison: list[IngestPoison], now: datetime, failures: dict[str, str]) -> list[IngestPoison]:
        """Send each poison entry to the error queue; a refused one fails its record (retried)."""
        if not poison:
            return []
        queue = self.settings.error_queue
        try:
            info = self.directory.get(queue)
        except DelayedDeliveryError as exc:
            for p in poison:
                failures.setdefault(p.record_id, f"error queue {queue!r}: {exc}")
            return poison
        entries = [_error_entry(str(n), p, now, info.max_message_size) for n, p in enumerate(poison)]
        results = send_batches(self.sqs, info.url, entries, what=f"sending to the error queue {queue!r}")
        out: list[IngestPoison] = []
        for entry, p in zip(entries, poison, strict=True):
            error = results[entry["Id"]].error
            if error is not None:
                failures.setdefault(p.record_id, f"error queue {queue!r} refused entry {p.message_id!r}: {error}")
            out.append(replace(p, sent=error is None))
        return out


def _poison(record_id: str, message: BucketMessage, reason: str) -> IngestPoison:
    body = message.body.decode("utf-8", "replace")
    return IngestPoison(record_id, message.message_id, reason, message.destination, body=body)


def reported_id(record: Any, index: int) -> str:
    """The id a record is reported by: its ``messageId``, or ``record-<index>`` without one."""
    value = record.get("messageId") if isinstance(record, Mapping) else None
    return value if isinstance(value, str) and value else f"record-{index}"


def _items(record: Any) -> list[BucketMessage | BadItem]:
    """The record's entries, or one ``BadItem`` when the record is not an ingest envelope of a known version."""
    if not isinstance(record, Mapping):
        return [BadItem("ingest-record", sqs_safe(repr(record))[:_MAX_REASON], "not an SQS record")]
    body = record.get("body")
    attributes = record.get("messageAttributes")
    marker = attributes.get(INGEST_ATTRIBUTE) if isinstance(attributes, Mapping) else None
    version = None
    if isinstance(marker, Mapping):
        version = marker.get("stringValue", marker.get("StringValue"))
    if version != str(INGEST_VERSION):
        text = body if isinstance(body, str) else repr(body)
        found = "missing" if version is None else f"{str(version)[:20]!r}"
        reason = f"not an ingest envelope: attribute {INGEST_ATTRIBUTE} is {found}, this reader knows {INGEST_VERSION}"
        return [BadItem("ingest-record", text, reason)]
    if not isinstance(body, str):
        return [BadItem("ingest-record", repr(body)[:_MAX_REASON], "the record has no text body")]
    return decode_ingest(body)


def _error_entry(
    entry_id: str, poison: IngestPoison, now: datetime, max_size: int = REDUCED_MAX_BYTES + _ROOM
) -> SendMessageBatchRequestEntryTypeDef:
    """The error-queue copy: the entry's text (escaped where SQS refuses it, cut to fit) and the reason."""
    body = sqs_safe(poison.body) or "(empty)"
    raw = body.encode("utf-8")
    reason = poison.reason
    keep = max(1, min(REDUCED_MAX_BYTES, max_size - _ROOM))  # the error queue's own limit, less room for headers
    if len(raw) > keep:
        body = raw[:keep].decode("utf-8", "ignore")
        reason += f" (body cut to its first {keep:,} bytes of {len(raw):,})"
    attributes: dict[str, MessageAttributeValueTypeDef] = {
        FAILURE_REASON: {"DataType": "String", "StringValue": sqs_safe(f"{poison.message_id}: {reason}")[:_MAX_REASON]},
        FAILED_AT: {"DataType": "String", "StringValue": now.isoformat()},
    }
    if poison.destination:
        attributes[ORIGINAL_DESTINATION] = {"DataType": "String", "StringValue": poison.destination}
    return {"Id": entry_id, "MessageBody": body, "MessageAttributes": attributes}
