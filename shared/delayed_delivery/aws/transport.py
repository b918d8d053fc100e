"""``SqsTransport``: the core ``Transport`` port over SQS, for dispatchers that keep long delays in a store.

The message body (UTF-8) becomes the SQS body and each header a String message attribute (at most 10).
A message not yet due is sent with ``DelaySeconds`` = the time left, when that fits under the native cap,
so a dispatcher can hand off the last ≤900 s early. Errors are the package's own: ``TransientError``
(retry), ``DestinationNotFoundError`` / ``PermanentError`` (straight to the error queue).

A body that is not UTF-8 cannot be an SQS body: its delivery fails permanently. The error-queue copy
(recognised by its ``DelayedDelivery.FailureReason`` header) must always fit, or the message could go
nowhere and be retried forever: its body travels as base64 with ``DelayedDelivery.BodyEncoding: base64``,
and user headers SQS would refuse (invalid, or past the 10-attribute limit) are dropped, named in the reason;
a body bigger than the error queue takes (e.g. 2 MB stored for an SQS destination) is cut to fit, the reason
giving its size.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from .. import headers as hdr
from ..clock import Clock, SystemClock
from ..delivery import DELIVERY_HEADER, encode_delivery, epoch_ms
from ..errors import DestinationNotFoundError, InvalidMessageError, PermanentError
from ..model import DelayedMessage
from .settings import SqsSettings
from .sqs import MAX_ATTRIBUTES, NOT_SQS_TEXT, QueueDirectory, message_size, normalize_attributes, translate_error

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

__all__ = ["SqsTransport"]


class SqsTransport:
    """Sends due ``DelayedMessage`` values to SQS queues named by ``message.destination``."""

    def __init__(
        self,
        client: SQSClient,
        sqs_settings: SqsSettings | None = None,
        *,
        clock: Clock | None = None,
        directory: QueueDirectory | None = None,
    ) -> None:
        self.client = client
        self.sqs_settings = sqs_settings or SqsSettings()
        self.clock = clock or SystemClock()
        self.directory = directory or QueueDirectory(client)

    def send(self, message: DelayedMessage) -> None:
        """Deliver ``message``; raise ``TransientError`` to retry, ``PermanentError`` for the error queue."""
        left = math.ceil(message.delay_from(self.clock.now()) - 1e-9)
        if left > self.sqs_settings.max_native_delay:
            raise InvalidMessageError(
                f"message {message.message_id!r} is due in {left} s, "
                f"beyond SQS's {self.sqs_settings.max_native_delay} s: "
                "only send due (or nearly due) messages"
            )
        if hdr.FAILURE_REASON in message.headers:
            body, attributes = _error_queue_copy(message)
        else:
            body, attributes = _body_and_attributes(message)
        queue = self.directory.get(message.destination)
        size = message_size(body, attributes)
        if size > queue.max_message_size and hdr.FAILURE_REASON in message.headers:
            body, attributes = _fit(body, attributes, queue.max_message_size)
            size = message_size(body, attributes)
        if size > queue.max_message_size:
            raise PermanentError(
                f"message {message.message_id!r} is {size:,} bytes; {queue.name!r} accepts at most "
                f"{queue.max_message_size:,}"
            )
        if hdr.FAILURE_REASON not in message.headers:
            attributes = _with_delivery(message, body, attributes, queue.max_message_size)
        try:
            if attributes:
                self.client.send_message(
                    QueueUrl=queue.url, MessageBody=body, DelaySeconds=max(0, left), MessageAttributes=attributes
                )
            else:
                self.client.send_message(QueueUrl=queue.url, MessageBody=body, DelaySeconds=max(0, left))
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"sending {message.message_id!r} to {queue.name!r}")
            if isinstance(error, DestinationNotFoundError):
                self.directory.forget(queue.name)
            raise error from exc


def _body_and_attributes(message: DelayedMessage) -> tuple[str, dict[str, MessageAttributeValueTypeDef]]:
    try:
        body = message.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PermanentError(f"message {message.message_id!r}: an SQS body must be UTF-8 text") from exc
    if NOT_SQS_TEXT.search(body):
        raise PermanentError(f"message {message.message_id!r}: the body holds characters SQS refuses")
    if len(message.headers) > MAX_ATTRIBUTES:
        raise PermanentError(
            f"message {message.message_id!r} has {len(message.headers)} headers; SQS carries at most {MAX_ATTRIBUTES}"
        )
    try:
        attributes = normalize_attributes(dict(message.headers), allow_reserved=True)
    except InvalidMessageError as exc:
        raise PermanentError(f"message {message.message_id!r}: {exc}") from exc
    return body, attributes


def _with_delivery(
    message: DelayedMessage, body: str, attributes: dict[str, MessageAttributeValueTypeDef], limit: int
) -> dict[str, MessageAttributeValueTypeDef]:
    """``attributes`` plus the delivery header (store route), left out when no slot or byte is free."""
    if len(attributes) >= MAX_ATTRIBUTES:
        return attributes
    value = encode_delivery(
        message_id=message.message_id, due_ms=epoch_ms(message.due_at), hops=message.failure_count, route="store"
    )
    with_header: dict[str, MessageAttributeValueTypeDef] = {
        **attributes,
        DELIVERY_HEADER: {"DataType": "String", "StringValue": value},
    }
    return with_header if message_size(body, with_header) <= limit else attributes


def _error_queue_copy(message: DelayedMessage) -> tuple[str, dict[str, MessageAttributeValueTypeDef]]:
    """Body and attributes for an error-queue copy: never refused for its content (base64 body, headers dropped)."""
    notes: list[str] = []
    product = {k: v for k, v in message.headers.items() if k.startswith(hdr.HEADER_PREFIX)}
    try:
        body = message.body.decode("utf-8")
        text = NOT_SQS_TEXT.search(body) is None
    except UnicodeDecodeError:
        text = False
    if not text:
        body = base64.b64encode(message.body).decode("ascii")
        product[hdr.BODY_ENCODING] = "base64"
        notes.append("body was not text SQS accepts: it is base64 here")
    attributes = _valid(product)
    dropped: list[str] = [k for k in product if k not in attributes]
    for name, value in message.headers.items():
        if name in product:
            continue
        one = _valid({name: value})
        if not one or len(attributes) >= MAX_ATTRIBUTES:
            dropped.append(name)
            continue
        attributes.update(one)
    if dropped:
        notes.append(f"dropped headers SQS would refuse: {', '.join(repr(d[:64]) for d in dropped[:5])}")
    if notes:
        reason = str(message.headers.get(hdr.FAILURE_REASON, ""))
        attributes[hdr.FAILURE_REASON] = {"DataType": "String", "StringValue": f"{reason} ({'; '.join(notes)})"}
    return body, attributes


def _fit(
    body: str, attributes: dict[str, MessageAttributeValueTypeDef], limit: int
) -> tuple[str, dict[str, MessageAttributeValueTypeDef]]:
    """An error-queue copy too big for its queue: the body cut to fit, the reason saying so (never retried forever)."""
    raw = body.encode("utf-8")
    current = attributes.get(hdr.FAILURE_REASON)
    reason = str(current.get("StringValue", "")) if current is not None else ""
    note = f" (body of {len(raw):,} bytes cut to fit the error queue's {limit:,}-byte limit)"
    attributes = {**attributes, hdr.FAILURE_REASON: {"DataType": "String", "StringValue": f"{reason}{note}"}}
    room = max(1, limit - message_size("", attributes))
    return raw[:room].decode("utf-8", "ignore") or "-", attributes


def _valid(headers: Mapping[str, Any]) -> dict[str, MessageAttributeValueTypeDef]:
    """The headers SQS would accept, one by one (an invalid one is left out)."""
    out: dict[str, MessageAttributeValueTypeDef] = {}
    for name, value in headers.items():
        try:
            out.update(normalize_attributes({name: value}, allow_reserved=True))
        except InvalidMessageError:
            continue
    return out
