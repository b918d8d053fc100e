"""``SqsTransport``: the core ``Transport`` port over SQS, for dispatchers that keep long delays in a store.

The message body (UTF-8) becomes the SQS body and each header a String message attribute (at most 10).
A message not yet due is sent with ``DelaySeconds`` = the time left, when that fits under the native cap,
so a dispatcher can hand off the last ≤900 s early. Errors are the package's own: ``TransientError``
(retry), ``DestinationNotFoundError`` / ``PermanentError`` (straight to the error queue).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ..clock import Clock, SystemClock
from ..errors import DestinationNotFoundError, InvalidMessageError, PermanentError
from ..model import DelayedMessage
from ..settings import DelayedDeliverySettings
from .sqs import MAX_ATTRIBUTES, QueueDirectory, message_size, normalize_attributes, translate_error

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["SqsTransport"]


class SqsTransport:
    """Sends due ``DelayedMessage`` values to SQS queues named by ``message.destination``."""

    def __init__(
        self,
        client: SQSClient,
        settings: DelayedDeliverySettings | None = None,
        *,
        clock: Clock | None = None,
        directory: QueueDirectory | None = None,
    ) -> None:
        self.client = client
        self.settings = settings or DelayedDeliverySettings()
        self.clock = clock or SystemClock()
        self.directory = directory or QueueDirectory(client)

    def send(self, message: DelayedMessage) -> None:
        """Deliver ``message``; raise ``TransientError`` to retry, ``PermanentError`` for the error queue."""
        left = math.ceil(message.delay_from(self.clock.now()) - 1e-9)
        if left > self.settings.max_native_delay:
            raise InvalidMessageError(
                f"message {message.message_id!r} is due in {left} s, beyond SQS's {self.settings.max_native_delay} s: "
                "only send due (or nearly due) messages"
            )
        try:
            body = message.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PermanentError(f"message {message.message_id!r}: an SQS body must be UTF-8 text") from exc
        if len(message.headers) > MAX_ATTRIBUTES:
            raise PermanentError(
                f"message {message.message_id!r} has {len(message.headers)} headers; "
                f"SQS carries at most {MAX_ATTRIBUTES}"
            )
        try:
            attributes = normalize_attributes(dict(message.headers), allow_reserved=True)
        except InvalidMessageError as exc:
            raise PermanentError(f"message {message.message_id!r}: {exc}") from exc
        queue = self.directory.get(message.destination)
        size = message_size(body, attributes)
        if size > queue.max_message_size:
            raise PermanentError(
                f"message {message.message_id!r} is {size:,} bytes; {queue.name!r} accepts at most "
                f"{queue.max_message_size:,}"
            )
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
