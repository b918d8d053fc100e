"""Parse: one SQS record (plain or envelope) into an immutable parsed record, its broker times read once."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ...cancellations import StoredRecord
from ...errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError
from ...headers import DELAY_SECONDS_ATTRIBUTE
from ...naming import sqs_input_queue_name
from ...planning import remaining_delay_ms
from ..fifo_ids import hop_of, sent_of
from ..packing import ENVELOPE_ATTRIBUTE, BadItem, decode_envelope, envelope_attributes
from ..sqs import attributes_from_record

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

__all__ = [
    "BrokerTimes",
    "HopOutcome",
    "ParsedMessage",
    "ParsedRecord",
    "RecordResult",
    "SourceQueue",
    "parse_record",
    "parse_source_arn",
    "seconds_text",
    "to_ms",
]

#: The control attribute: seconds left, whole (as the sender writes it) or with up to 3 decimals (after a hop).
_SECONDS = re.compile(r"^\d{1,12}(\.\d{1,3})?$")


class HopOutcome(StrEnum):
    """What happened to one FIFO record (the plan for its message was a ``planning.HopAction``).

    Kept apart from ``HopAction`` because a result is not a plan: a send can fail (``FAILED``, retried) and an
    envelope record sums up its messages (``UNPACKED``); the values are what ``aws requeue --local`` and the demo print.
    """

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
    cancellation: StoredRecord | None = None
    park_s: int | None = None
    #: Forwarded to a capped destination: the seconds release control added (its slot after its due time).
    release_lag_s: float | None = None
    #: Requeued because its destination had no release slot within the native cap (a backlog longer than that).
    release_wait: bool = False

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


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """One message to move (a plain record, or one inside an envelope) with its remaining delay, or a poison reason."""

    record_id: str
    message_id: str
    hop: int
    body: str
    attributes: Mapping[str, MessageAttributeValueTypeDef]
    source: SourceQueue
    total_ms: int = 0
    remaining_ms: int = 0
    decision_ms: int = 0
    received_ms: int = 0
    remaining: int | None = None
    park_return: bool = False
    reason: str | None = None
    #: When the message was first sent (epoch ms; the broker's clock), ``None`` when unknown: it binds
    #: cancellation records to the messages sent before them (docs/identity.md).
    sent_ms: int | None = None

    @property
    def live(self) -> bool:
        """Whether it can move on (no poison reason, a remaining delay)."""
        return self.reason is None and self.remaining is not None

    def timed(self, total_ms: int, times: BrokerTimes, now_ms: int) -> ParsedMessage:
        """With the remaining delay of ``total_ms`` (written at ``times.sent_ms``); raises ``InvalidMessageError``."""
        remaining_ms = remaining_delay_ms(total_ms, times.sent_ms, times.first_ms, times.count, now_ms)
        # The hop decision uses broker times only (as on the first receive), so a redelivery repeats the
        # same decision and its re-send carries the same deduplication id: FIFO drops it as a duplicate.
        decision_ms = remaining_delay_ms(total_ms, times.sent_ms, times.first_ms, 1, now_ms)
        return replace(
            self,
            total_ms=total_ms,
            remaining_ms=remaining_ms,
            decision_ms=decision_ms,
            received_ms=times.first_ms,
            remaining=math.ceil(remaining_ms / 1000),
        )


@dataclass(frozen=True, slots=True)
class ParsedRecord:
    """One SQS record as read: the record itself, its broker times and, for an envelope, its inner messages."""

    message: ParsedMessage
    receipt_handle: str = ""
    times: BrokerTimes | None = None
    age_ms: int = 0
    park_return: bool = False
    inner: tuple[ParsedMessage, ...] | None = None

    @property
    def messages(self) -> tuple[ParsedMessage, ...]:
        """The messages it carries: an envelope's inner ones, else the record's own."""
        return self.inner if self.inner is not None else (self.message,)

    @property
    def count(self) -> int:
        """``ApproximateReceiveCount`` (1 when the broker times could not be read)."""
        return self.times.count if self.times is not None else 1

    def poison(self, reason: str) -> ParsedRecord:
        """The same record with a poison reason."""
        return replace(self, message=replace(self.message, reason=reason))


def parse_record(record: Mapping[str, Any], now_ms: int) -> ParsedRecord:
    """Read one record; problems with the message itself become a poison reason, not an exception."""
    attrs = record.get("attributes") or {}
    record_id = str(record.get("messageId", ""))
    message_id = str(attrs.get("MessageGroupId") or record_id)
    dedup = attrs.get("MessageDeduplicationId")
    message = ParsedMessage(
        record_id=record_id,
        message_id=message_id,
        hop=hop_of(dedup),
        body=str(record.get("body", "")),
        attributes={},
        source=parse_source_arn(str(record.get("eventSourceARN", ""))),
        sent_ms=sent_of(dedup, message_id),
    )
    parsed = ParsedRecord(message, receipt_handle=str(record.get("receiptHandle") or ""))
    try:
        attributes = attributes_from_record(record.get("messageAttributes") or {})
    except InvalidMessageError as exc:
        return parsed.poison(f"malformed message attributes: {exc}")
    marker = attributes.pop(ENVELOPE_ATTRIBUTE, None)
    control = attributes.pop(DELAY_SECONDS_ATTRIBUTE, None) if marker is None else None
    parsed = replace(parsed, message=replace(message, attributes=attributes))
    if marker is not None:
        return _parse_envelope(parsed, marker, attrs, now_ms)
    if control is None:
        return parsed.poison(f"missing control attribute {DELAY_SECONDS_ATTRIBUTE}")
    text = control.get("StringValue", "")
    if not control["DataType"].startswith(("Number", "String")) or not _SECONDS.match(text):
        return parsed.poison(f"malformed control attribute {DELAY_SECONDS_ATTRIBUTE}={text!r}: expected seconds")
    try:
        total_ms, times = to_ms(text), BrokerTimes.of(attrs)
    except (KeyError, ValueError, TypeError) as exc:
        return parsed.poison(f"missing or malformed broker timestamps: {exc!r}")
    parsed = replace(parsed, times=times, age_ms=times.age_ms)
    if parsed.message.hop == 0:  # the sender's own record: the broker stamped its first send
        parsed = replace(parsed, message=replace(parsed.message, sent_ms=times.sent_ms))
    try:
        return replace(parsed, message=parsed.message.timed(total_ms, times, now_ms))
    except InvalidMessageError as exc:
        return parsed.poison(f"missing or malformed broker timestamps: {exc!r}")


def _parse_envelope(
    parsed: ParsedRecord, marker: MessageAttributeValueTypeDef, attrs: Mapping[str, Any], now_ms: int
) -> ParsedRecord:
    """Unpack an envelope record into one inner message per entry (a bad entry gets a reason alone)."""
    if marker.get("StringValue") != envelope_attributes()[ENVELOPE_ATTRIBUTE].get("StringValue"):
        return parsed.poison(f"malformed envelope: unknown format {marker.get('StringValue')!r}")
    try:
        times = BrokerTimes.of(attrs)
        entries = decode_envelope(parsed.message.body)
    except (KeyError, ValueError, TypeError) as exc:
        return parsed.poison(
            str(exc) if isinstance(exc, InvalidMessageError) else f"missing or malformed broker timestamps: {exc!r}"
        )
    record = parsed.message
    inner: list[ParsedMessage] = []
    for entry in entries:
        if isinstance(entry, BadItem):
            inner.append(
                ParsedMessage(record.record_id, entry.message_id, 0, entry.body, {}, record.source, reason=entry.reason)
            )
            continue
        message = ParsedMessage(
            record.record_id,
            entry.message_id,
            entry.hop,
            entry.body,
            dict(entry.attributes),
            record.source,
            sent_ms=times.sent_ms if entry.hop == 0 else entry.sent_ms,
        )
        try:
            inner.append(message.timed(entry.remaining_ms, times, now_ms))
        except InvalidMessageError as exc:
            inner.append(replace(message, remaining=0, reason=f"malformed envelope entry {entry.message_id!r}: {exc}"))
    return replace(parsed, times=times, age_ms=times.age_ms, inner=tuple(inner))


def to_ms(seconds: str) -> int:
    """``"1799.123"`` → 1799123 (exact decimal arithmetic, no float rounding)."""
    whole, _, fraction = seconds.partition(".")
    return int(whole) * 1000 + int((fraction + "000")[:3])


def seconds_text(ms: int) -> str:
    """1799123 → ``"1799.123"``; whole seconds stay integers."""
    whole, rest = divmod(ms, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}"
