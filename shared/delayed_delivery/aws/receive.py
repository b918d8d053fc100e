"""Receive helpers for SQS consumers: a Lambda record or a boto3 message as a ``DeliveredMessage``; its lateness.

Fields and how far to trust them: docs/receiving.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..clock import Clock, SystemClock
from ..delivery import DELIVERY_HEADER, DeliveredMessage, consumed_fields, decode_delivery, from_epoch_ms
from ..errors import InvalidMessageError
from .sqs import attributes_from_record

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger, Metrics

__all__ = ["CONSUMER_LATENESS_METRIC", "delivered_from_boto3", "delivered_from_sqs_record", "observe_lateness"]

#: The EMF metric (seconds) ``observe_lateness`` adds.
CONSUMER_LATENESS_METRIC = "ConsumerLateness"

_log = logging.getLogger("delayed_delivery.consumer")


def delivered_from_sqs_record(record: Mapping[str, Any] | Any, *, clock: Clock | None = None) -> DeliveredMessage:
    """A Lambda SQS event record (a dict or Powertools' ``SQSRecord``) as a ``DeliveredMessage``."""
    raw: Mapping[str, Any] = getattr(record, "raw_event", record)
    arn = str(raw.get("eventSourceARN") or "")
    destination = arn.rsplit(":", 1)[-1] or None
    return _delivered(
        sqs_id=str(raw.get("messageId") or ""),
        body=raw.get("body"),
        broker=raw.get("attributes") or {},
        attributes=raw.get("messageAttributes") or {},
        destination=destination,
        clock=clock,
    )


def delivered_from_boto3(
    message: Mapping[str, Any], *, destination: str | None = None, clock: Clock | None = None
) -> DeliveredMessage:
    """A ``receive_message`` message (``AttributeNames=["All"]``, ``MessageAttributeNames=["All"]``)."""
    return _delivered(
        sqs_id=str(message.get("MessageId") or ""),
        body=message.get("Body"),
        broker=message.get("Attributes") or {},
        attributes=message.get("MessageAttributes") or {},
        destination=destination,
        clock=clock,
    )


def _delivered(
    *,
    sqs_id: str,
    body: Any,
    broker: Mapping[str, Any],
    attributes: Mapping[str, Any],
    destination: str | None,
    clock: Clock | None,
) -> DeliveredMessage:
    try:
        typed: Mapping[str, Any] = attributes_from_record(attributes)
    except InvalidMessageError:
        typed = {}
    header = typed.get(DELIVERY_HEADER) or {}
    info = decode_delivery(header.get("StringValue"))
    received = from_epoch_ms(_ms(broker.get("ApproximateFirstReceiveTimestamp")))
    return DeliveredMessage.build(
        fallback_id=sqs_id,
        body=body.encode("utf-8") if isinstance(body, str) else b"",
        headers=typed,
        info=info,
        received_at=received or (clock or SystemClock()).now(),
        cloud="aws",
        destination=destination,
        broker_sent_at=from_epoch_ms(_ms(broker.get("SentTimestamp"))),
    )


def _ms(value: Any) -> int | None:
    text = str(value) if value is not None else ""
    return int(text) if text.isdigit() and len(text) <= 15 else None


def observe_lateness(
    delivered: DeliveredMessage, metrics: Metrics | None = None, logger: Logger | logging.Logger | None = None
) -> float | None:
    """Add ``ConsumerLateness`` (s) to ``metrics`` and log one ``consumed`` line; returns the lateness."""
    lateness = delivered.lateness_s
    if metrics is not None and lateness is not None:
        # The unit by name: importing Powertools is the caller's (a consumer parsing messages never pays for it).
        metrics.add_metric(name=CONSUMER_LATENESS_METRIC, unit="Seconds", value=lateness)
    (logger or _log).info("consumed", extra=consumed_fields(delivered))
    return lateness
