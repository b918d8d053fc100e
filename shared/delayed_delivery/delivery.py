"""What a consumer receives: ``DeliveredMessage`` and the ``DelayedDelivery.Delivery`` header (docs/receiving.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from . import logfields as lf
from .headers import HEADER_PREFIX, is_reserved
from .headers import OCCURRENCE as OCCURRENCE_HEADER
from .headers import SCHEDULE_ID as SCHEDULE_ID_HEADER
from .validation import is_whole

__all__ = [
    "BROKER_FIELDS",
    "DELIVERY_HEADER",
    "MAX_DELIVERY_CHARS",
    "ROUTES",
    "DeliveredMessage",
    "DeliveryInfo",
    "consumed_fields",
    "decode_delivery",
    "encode_delivery",
    "epoch_ms",
    "from_epoch_ms",
    "longest_delivery",
    "occurrence_of",
    "user_headers",
]

#: The header (SQS message attribute, Azure envelope header) our senders write at the last hand-over.
DELIVERY_HEADER = HEADER_PREFIX + "Delivery"
#: Longest header value written or read: any id of up to 128 characters fits, percent-escaped (12 a character at
#: most), beside the longest times, hops and route. (Until #23 it was 512 and a long non-ASCII id was left out.)
MAX_DELIVERY_CHARS = 2048
#: The routes a message can take.
ROUTES = frozenset({"native", "fifo", "envelope", "table", "store", "buckets"})
#: Fields of a ``DeliveredMessage`` set by the broker: a sender cannot forge them.
BROKER_FIELDS = ("body", "received_at", "broker_sent_at")

_VERSION = "v1"
_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_INT = re.compile(r"^\d{1,15}$")
_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
#: Longest schedule id an occurrence header may name (``schedules.occurrences.MAX_SCHEDULE_ID_LENGTH``).
_MAX_SCHEDULE_ID = 100


@dataclass(frozen=True, slots=True)
class DeliveryInfo:
    """The fields of one ``DelayedDelivery.Delivery`` value; ``None`` where absent or unreadable."""

    message_id: str | None = None
    due_ms: int | None = None
    sent_ms: int | None = None
    hops: int | None = None
    route: str | None = None


def epoch_ms(when: datetime) -> int:
    """``when`` (aware) as epoch milliseconds."""
    return round(when.timestamp() * 1000)


def from_epoch_ms(ms: int | None) -> datetime | None:
    """Epoch milliseconds as an aware UTC datetime (``None`` stays ``None``)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def encode_delivery(
    *, message_id: str | None, due_ms: int | None, sent_ms: int | None = None, hops: int = 0, route: str
) -> str:
    """The header value, e.g. ``v1;id=a%3Bb;due=…;sent=…;hops=2;route=fifo``; the id is left out past 512 chars."""
    parts = [_VERSION]
    for key, value in (("due", due_ms), ("sent", sent_ms), ("hops", hops)):
        if is_whole(value, 0, _MAX_MS):
            parts.append(f"{key}={value}")
    parts.append(f"route={route if route in ROUTES else 'unknown'}")
    if message_id:
        with_id = [parts[0], f"id={quote(message_id, safe='')}", *parts[1:]]
        text = ";".join(with_id)
        if len(text) <= MAX_DELIVERY_CHARS:
            return text
    return ";".join(parts)


def longest_delivery(message_id: str) -> str:
    """The longest header value any route may write for ``message_id``: what a sender keeps room for."""
    route = max(sorted(ROUTES), key=len)
    return encode_delivery(message_id=message_id, due_ms=_MAX_MS, sent_ms=_MAX_MS, hops=_MAX_MS, route=route)


def decode_delivery(value: object) -> DeliveryInfo:
    """Read a header value; total: anything malformed gives ``None`` fields, never an exception."""
    if not isinstance(value, str) or len(value) > MAX_DELIVERY_CHARS:
        return DeliveryInfo()
    parts = value.split(";")
    if parts[0] != _VERSION:
        return DeliveryInfo()
    found: dict[str, str] = {}
    for part in parts[1:]:
        key, sep, text = part.partition("=")
        if sep and key not in found:
            found[key] = text
    message_id: str | None = None
    if found.get("id"):
        try:
            message_id = unquote(found["id"], errors="strict") or None
        except UnicodeDecodeError:
            message_id = None
    route = found.get("route")
    return DeliveryInfo(
        message_id=message_id,
        due_ms=_int(found.get("due")),
        sent_ms=_int(found.get("sent")),
        hops=_int(found.get("hops")),
        route=route if route in ROUTES else None,
    )


def _int(text: str | None) -> int | None:
    if text is None or not _INT.match(text):
        return None
    value = int(text)
    return value if value <= _MAX_MS else None


def user_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """``headers`` without the product's own (``DelayedDelivery.*``)."""
    return {k: v for k, v in headers.items() if not is_reserved(k)}


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """One received delayed message, whichever route carried it; ``None`` marks what the message does not tell.

    ``message_id``, ``due_at``, ``sent_at``, ``hops`` and ``route`` come from the ``DelayedDelivery.Delivery``
    header: trustworthy only as far as the queue's send permissions are. ``BROKER_FIELDS`` are set by the broker.
    """

    message_id: str
    body: bytes
    headers: Mapping[str, Any]
    due_at: datetime | None
    sent_at: datetime | None
    hops: int | None
    route: str | None
    received_at: datetime | None
    cloud: str
    destination: str | None = None
    broker_sent_at: datetime | None = None
    trusted: tuple[str, ...] = field(default=BROKER_FIELDS)
    #: A recurring schedule's occurrence: its schedule and nominal instant (``None`` for any other message).
    schedule_id: str | None = None
    occurrence_at: datetime | None = None

    @property
    def lateness_s(self) -> float | None:
        """Received − due in seconds (negative when early by the clocks'), ``None`` when either is unknown."""
        if self.due_at is None or self.received_at is None:
            return None
        return (self.received_at - self.due_at).total_seconds()

    @property
    def delay_s(self) -> float | None:
        """Due − sent in seconds (the delay asked for), ``None`` when either is unknown."""
        if self.due_at is None or self.sent_at is None:
            return None
        return (self.due_at - self.sent_at).total_seconds()

    @classmethod
    def build(
        cls,
        *,
        fallback_id: str,
        body: bytes,
        headers: Mapping[str, Any],
        info: DeliveryInfo,
        received_at: datetime | None,
        cloud: str,
        destination: str | None = None,
        broker_sent_at: datetime | None = None,
    ) -> DeliveredMessage:
        """A delivered message from a decoded header, ``fallback_id`` standing in for a missing id."""
        message_id = info.message_id or fallback_id
        schedule_id, occurrence_at = occurrence_of(message_id, headers)
        return cls(
            message_id=message_id,
            body=body,
            headers=user_headers(headers),
            due_at=from_epoch_ms(info.due_ms),
            sent_at=from_epoch_ms(info.sent_ms),
            hops=info.hops,
            route=info.route,
            received_at=received_at,
            cloud=cloud,
            destination=destination,
            broker_sent_at=broker_sent_at,
            schedule_id=schedule_id,
            occurrence_at=occurrence_at,
        )


def _text(value: Any) -> str | None:
    """A header's text: a plain string (Azure envelope) or an SQS string attribute (``StringValue``)."""
    if isinstance(value, Mapping):
        value = value.get("StringValue")
    return value if isinstance(value, str) else None


def occurrence_of(message_id: str, headers: Mapping[str, Any]) -> tuple[str | None, datetime | None]:
    """The schedule id and nominal instant when the message is a recurring occurrence, else ``(None, None)``.

    An occurrence carries ``DelayedDelivery.ScheduleId`` and ``DelayedDelivery.Occurrence`` (the nominal instant,
    ``YYYY-MM-DDThh:mm:ssZ``) and its id is ``<schedule-id>@<nominal instant>``; anything else is not one.
    """
    schedule_id, nominal = _text(headers.get(SCHEDULE_ID_HEADER)), _text(headers.get(OCCURRENCE_HEADER))
    if not schedule_id or not nominal or len(schedule_id) > _MAX_SCHEDULE_ID or not _INSTANT.match(nominal):
        return None, None
    if message_id != f"{schedule_id}@{nominal}":
        return None, None
    try:
        return schedule_id, datetime.fromisoformat(nominal).astimezone(UTC)
    except ValueError:
        return None, None


def consumed_fields(delivered: DeliveredMessage) -> dict[str, Any]:
    """The fixed keys of the ``consumed`` log line (``delayed-delivery report`` reads them)."""
    lateness = delivered.lateness_s
    delay = delivered.delay_s
    return {
        lf.EVENT: lf.EVENT_CONSUMED,
        lf.CLOUD: delivered.cloud,
        lf.DESTINATION: delivered.destination,
        lf.MESSAGE_ID: delivered.message_id,
        lf.DUE_AT: delivered.due_at.isoformat() if delivered.due_at is not None else None,
        lf.SENT_AT: delivered.sent_at.isoformat() if delivered.sent_at is not None else None,
        lf.HOP: delivered.hops,
        lf.ROUTE: delivered.route,
        lf.CONSUMER_LATENESS_S: round(lateness, 3) if lateness is not None else None,
        lf.DELAY_S: round(delay, 3) if delay is not None else None,
        lf.SCHEDULE_ID: delivered.schedule_id,
        lf.OCCURRENCE: (
            delivered.occurrence_at.strftime("%Y-%m-%dT%H:%M:%SZ") if delivered.occurrence_at is not None else None
        ),
    }
