"""Receive helpers for Azure Storage Queue consumers: a queue message as a ``DeliveredMessage``; its lateness.

Fields and how far to trust them: docs/receiving.md.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from opentelemetry import metrics

from ..clock import Clock, SystemClock, utc
from ..delivery import DELIVERY_HEADER, DeliveredMessage, DeliveryInfo, consumed_fields, decode_delivery
from ..errors import InvalidMessageError
from .storage_queue import MAX_QUEUE_MESSAGE_BYTES, Envelope, decode_envelope
from .telemetry import LOGGER_NAME

__all__ = ["CONSUMER_LATENESS_HISTOGRAM", "ConsumerMetrics", "delivered_from_queue_message", "observe_lateness"]

#: The OpenTelemetry histogram (seconds) ``observe_lateness`` records.
CONSUMER_LATENESS_HISTOGRAM = "delayed_delivery.consumer_lateness"
#: Fields set by the broker on Azure (the receive time is the consumer's clock: Storage Queues do not stamp it).
_AZURE_TRUSTED = ("body", "broker_sent_at")

_log = logging.getLogger("delayed_delivery.consumer")


def delivered_from_queue_message(
    message: Any, *, destination: str | None = None, clock: Clock | None = None
) -> DeliveredMessage:
    """An azure-storage-queue ``QueueMessage`` or an Azure Functions queue-trigger ``QueueMessage``.

    A message this package did not write is returned as it is: its text as the body, its queue id, no due time.
    """
    received = (clock or SystemClock()).now()
    if callable(getattr(message, "get_body", None)):  # azure.functions binding
        raw: Any = message.get_body()
        queue_id, inserted = getattr(message, "id", None), getattr(message, "insertion_time", None)
    else:  # azure.storage.queue
        raw = getattr(message, "content", None)
        queue_id, inserted = getattr(message, "id", None), getattr(message, "inserted_on", None)
    text = raw.encode("utf-8") if isinstance(raw, str) else raw if isinstance(raw, bytes) else b""
    envelope = _envelope(text)
    broker_sent = utc(inserted) if isinstance(inserted, datetime) else None
    if envelope is None:
        delivered = DeliveredMessage.build(
            fallback_id=str(queue_id or ""),
            body=text,
            headers={},
            info=DeliveryInfo(),
            received_at=received,
            cloud="azure",
            destination=destination,
            broker_sent_at=broker_sent,
        )
    else:
        delivered = DeliveredMessage.build(
            fallback_id=envelope.message_id,
            body=envelope.body,
            headers=envelope.headers,
            info=decode_delivery(envelope.headers.get(DELIVERY_HEADER)),
            received_at=received,
            cloud="azure",
            destination=destination,
            broker_sent_at=broker_sent,
        )
    return replace(delivered, trusted=_AZURE_TRUSTED)


def _envelope(text: bytes) -> Envelope | None:
    """Our envelope in ``text`` (or in its base64, as a Functions host may pass it), else ``None``."""
    if len(text) > 2 * MAX_QUEUE_MESSAGE_BYTES:
        return None
    try:
        return decode_envelope(text)
    except InvalidMessageError:
        pass
    try:
        return decode_envelope(base64.b64decode(text, validate=True))
    except (InvalidMessageError, binascii.Error, ValueError):
        return None


class ConsumerMetrics:
    """The consumer's OpenTelemetry histogram ``delayed_delivery.consumer_lateness`` (seconds)."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(LOGGER_NAME)
        self.lateness = meter.create_histogram(CONSUMER_LATENESS_HISTOGRAM, unit="s")


def observe_lateness(
    delivered: DeliveredMessage, metrics: ConsumerMetrics | None = None, logger: logging.Logger | None = None
) -> float | None:
    """Record the lateness in the histogram (with ``destination``) and log one ``consumed`` line; returns it."""
    lateness = delivered.lateness_s
    if lateness is not None:
        (metrics or ConsumerMetrics()).lateness.record(lateness, {"destination": delivered.destination or ""})
    (logger or _log).info("consumed", extra=consumed_fields(delivered))
    return lateness
