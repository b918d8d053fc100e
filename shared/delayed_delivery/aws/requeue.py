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
once the SQS record carrying the message has not ``FAILED``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

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
from ..planning import HopAction, decide_hop, remaining_delay_ms
from ..settings import DelayedDeliverySettings
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
from .sqs import MAX_ATTRIBUTES, QueueDirectory, QueueInfo, attributes_from_record, message_size, send_batches

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = ["FifoRequeuer", "HopOutcome", "RecordResult", "SourceQueue", "parse_source_arn"]

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
    ) -> None:
        if isinstance(pack_bytes, bool) or not isinstance(pack_bytes, int) or pack_bytes < 0:
            raise ConfigurationError(f"pack_bytes must be a non-negative integer (0 = off), got {pack_bytes!r}")
        self.client = client
        self.settings = settings or DelayedDeliverySettings()
        self.clock = clock or SystemClock()
        self.directory = directory or QueueDirectory(client)
        self.pack_bytes = pack_bytes
        self.cancellations = cancellations

    def process(self, records: Sequence[Mapping[str, Any]]) -> list[RecordResult]:
        """Handle the ``Records`` of one SQS event; one result per record, in order."""
        if not self.settings.enabled:
            raise DelayedDeliveryDisabledError(
                "unrestricted delayed delivery is disabled on this receiver (DELAYED_DELIVERY_ENABLED): "
                "records stay on the -delay.fifo queue"
            )
        now_ms = int(self.clock.now().timestamp() * 1000)
        work = [self._parse(record, now_ms) for record in records]
        items = [item for w in work for item in (w.children if w.children is not None else [w])]
        if self.cancellations is not None:
            self._check_cancellations(self.cancellations, items, now_ms)
        requeue: dict[str, list[_Work]] = {}
        forward: dict[str, list[_Work]] = {}
        for w in items:
            if w.reason is not None or w.remaining is None or w.result is not None:
                continue
            decision = decide_hop(math.ceil(w.decision_ms / 1000), self.settings.max_native_delay)
            target = requeue if decision.action is HopAction.REQUEUE else forward
            target.setdefault(w.source.delay_queue if target is requeue else w.source.destination, []).append(w)
        for queue, group in requeue.items():
            self._send(queue, group, HopOutcome.REQUEUED)
        for queue, group in forward.items():
            self._send(queue, group, HopOutcome.FORWARDED)
        poison = [w for w in items if w.result is None and w.reason is not None]
        if poison:
            self._to_error_queue(poison)
        for w in items:
            if w.applied is not None and w.result is not None:
                w.result = replace(w.result, cancellation=w.applied)
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
            w.remaining_ms = max(0, due_ms - now_ms)
            w.decision_ms = max(0, due_ms - w.received_ms)
            w.remaining = math.ceil(w.remaining_ms / 1000)

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
        children: list[_Work] = []
        for entry in entries:
            if isinstance(entry, BadItem):
                child = _Work(work.record_id, entry.message_id, 0, entry.body, {}, work.source, reason=entry.reason)
                children.append(child)
                continue
            child = _Work(work.record_id, entry.message_id, entry.hop, entry.body, dict(entry.attributes), work.source)
            child.received_ms = first
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


def _unpacked(w: _Work) -> RecordResult:
    """One result for an envelope record: ``FAILED`` (retry it all) when any inner message failed."""
    assert w.children is not None
    inner = tuple(c.result for c in w.children if c.result is not None)
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
