"""Parse: one SQS record (plain or envelope) into the work item the requeue step carries through its pipeline."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ...cancellations import Cancellation
from ...errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError
from ...headers import DELAY_SECONDS_ATTRIBUTE
from ...naming import sqs_input_queue_name
from ...planning import remaining_delay_ms
from ..packing import ENVELOPE_ATTRIBUTE, BadItem, decode_envelope, envelope_attributes
from ..sender import hop_of
from ..sqs import attributes_from_record

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

__all__ = [
    "BrokerTimes",
    "HopOutcome",
    "RecordResult",
    "SourceQueue",
    "Work",
    "messages_of",
    "parse_record",
    "parse_source_arn",
    "seconds_text",
    "to_ms",
]

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


@dataclass(frozen=True, slots=True)
class BrokerTimes:
    """The broker's stamps on a record: sent, first received (epoch ms) and the receive count."""

    sent_ms: int
    first_ms: int
    count: int

    @property
    def age_ms(self) -> int:
        """How long the record had waited when the broker first handed it out."""
        return max(0, self.first_ms - self.sent_ms)

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> BrokerTimes:
        """Read ``SentTimestamp``, ``ApproximateFirstReceiveTimestamp`` and ``ApproximateReceiveCount``."""
        sent, first = int(attrs["SentTimestamp"]), int(attrs["ApproximateFirstReceiveTimestamp"])
        return cls(sent, first, int(attrs["ApproximateReceiveCount"]))


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
class Work:
    """One record (or one message inside an envelope record) on its way through the requeue step."""

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
    children: list[Work] | None = None
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

    def set_times(self, total_ms: int, times: BrokerTimes, now_ms: int) -> None:
        """Take the remaining delay from ``total_ms`` (written at ``times.sent_ms``) and the broker times."""
        self.received_ms = times.first_ms
        self.total_ms, self.sent_ms, self.first_ms, self.count = total_ms, times.sent_ms, times.first_ms, times.count
        self.age_ms = times.age_ms
        self.remaining_ms = remaining_delay_ms(total_ms, times.sent_ms, times.first_ms, times.count, now_ms)
        # The hop decision uses broker times only (as on the first receive), so a redelivery repeats the
        # same decision and its re-send carries the same deduplication id: FIFO drops it as a duplicate.
        self.decision_ms = remaining_delay_ms(total_ms, times.sent_ms, times.first_ms, 1, now_ms)


def messages_of(w: Work) -> list[Work]:
    """The messages a record carries: an envelope's inner ones, else the record itself."""
    return w.children if w.children is not None else [w]


def parse_record(record: Mapping[str, Any], now_ms: int) -> Work:
    """Read one record; problems with the message itself become a poison reason, not an exception."""
    source = parse_source_arn(str(record.get("eventSourceARN", "")))
    attrs = record.get("attributes") or {}
    record_id = str(record.get("messageId", ""))
    message_id = str(attrs.get("MessageGroupId") or record_id)
    work = Work(
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
        return _parse_envelope(work, marker, attrs, now_ms)
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
        work.set_times(to_ms(text), BrokerTimes.of(attrs), now_ms)
    except (KeyError, ValueError, TypeError, InvalidMessageError) as exc:
        work.reason = f"missing or malformed broker timestamps: {exc!r}"
        return work
    work.remaining = math.ceil(work.remaining_ms / 1000)
    return work


def _parse_envelope(work: Work, marker: MessageAttributeValueTypeDef, attrs: Mapping[str, Any], now_ms: int) -> Work:
    """Unpack an envelope record into one child per inner message (a bad entry gets a reason alone)."""
    if marker.get("StringValue") != envelope_attributes()[ENVELOPE_ATTRIBUTE].get("StringValue"):
        work.reason = f"malformed envelope: unknown format {marker.get('StringValue')!r}"
        return work
    try:
        times = BrokerTimes.of(attrs)
        entries = decode_envelope(work.body)
    except (KeyError, ValueError, TypeError) as exc:
        work.reason = (
            str(exc) if isinstance(exc, InvalidMessageError) else f"missing or malformed broker timestamps: {exc!r}"
        )
        return work
    work.sent_ms, work.first_ms, work.count, work.age_ms = times.sent_ms, times.first_ms, times.count, times.age_ms
    children: list[Work] = []
    for entry in entries:
        if isinstance(entry, BadItem):
            children.append(Work(work.record_id, entry.message_id, 0, entry.body, {}, work.source, reason=entry.reason))
            continue
        child = Work(work.record_id, entry.message_id, entry.hop, entry.body, dict(entry.attributes), work.source)
        try:
            child.set_times(entry.remaining_ms, times, now_ms)
        except InvalidMessageError as exc:
            child.reason = f"malformed envelope entry {entry.message_id!r}: {exc}"
        child.remaining = math.ceil(child.remaining_ms / 1000)
        children.append(child)
    work.children = children
    return work


def to_ms(seconds: str) -> int:
    """``"1799.123"`` → 1799123 (exact decimal arithmetic, no float rounding)."""
    whole, _, fraction = seconds.partition(".")
    return int(whole) * 1000 + int((fraction + "000")[:3])


def seconds_text(ms: int) -> str:
    """1799123 → ``"1799.123"``; whole seconds stay integers."""
    whole, rest = divmod(ms, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}"
