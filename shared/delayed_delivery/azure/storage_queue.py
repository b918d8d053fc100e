"""Send delayed messages to Azure Storage Queues (the dispatcher's ``Transport``).

Wire format: every message (sent natively or by the dispatcher) is one JSON text envelope,
``{"v": 1, "id": …, "headers": {…}, "body": base64}``, ASCII only, at most 64 KiB (the queue's limit),
so a receiver reads both routes the same way (``decode_envelope``).

Errors: a missing queue raises ``DestinationNotFoundError``; other 4xx ``PermanentError`` (that message
goes to the error queue); throttling, 5xx and network failures ``TransientError``.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import ExponentialRetry, QueueClient, QueueServiceClient

from ..delivery import DELIVERY_HEADER, encode_delivery, epoch_ms
from ..errors import DestinationNotFoundError, InvalidMessageError
from ..headers import FAILURE_REASON
from ..jsonbounds import headers_from_json, loads_bounded
from ..model import DelayedMessage, Headers
from ..naming import validate_azure_queue_name
from .run_budget import RunBudget, SendBound
from .sdk_errors import translate

__all__ = [
    "MAX_NATIVE_DELAY_SECONDS",
    "MAX_QUEUE_MESSAGE_BYTES",
    "BudgetedRetry",
    "Envelope",
    "StorageQueueTransport",
    "decode_envelope",
    "encode_envelope",
]

#: Put Message's longest visibility timeout: 7 days.
MAX_NATIVE_DELAY_SECONDS = 7 * 24 * 3600
#: Largest queue message.
MAX_QUEUE_MESSAGE_BYTES = 64 * 1024
#: Time-to-live of natively delayed messages: never expire (always outlasts the visibility timeout).
NEVER_EXPIRE = -1


@dataclass(frozen=True, slots=True)
class Envelope:
    """A received message: id, headers and body."""

    message_id: str
    headers: Mapping[str, str]
    body: bytes


def encode_envelope(message: DelayedMessage) -> str:
    """The queue text for ``message``; ``InvalidMessageError`` when it exceeds 64 KiB."""
    text = json.dumps(
        {
            "v": 1,
            "id": message.message_id,
            "headers": dict(message.headers),
            "body": base64.b64encode(message.body).decode("ascii"),
        },
        ensure_ascii=True,
        separators=(",", ":"),
    )
    if len(text) > MAX_QUEUE_MESSAGE_BYTES:
        raise InvalidMessageError(
            f"message {message.message_id!r} is {len(text)} bytes as a queue message; Azure Storage Queues "
            f"take at most {MAX_QUEUE_MESSAGE_BYTES} (keep the body under about 48 KiB, or store it in a blob "
            "and send a reference)"
        )
    return text


def decode_envelope(text: str | bytes) -> Envelope:
    """Read a queue message written by this package."""
    try:
        data = loads_bounded(text, what="queue message", max_chars=MAX_QUEUE_MESSAGE_BYTES, max_depth=2)
        headers = headers_from_json(data.get("headers") or {})
        return Envelope(str(data["id"]), Headers(headers), base64.b64decode(data["body"]))
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise InvalidMessageError(f"not a delayed-delivery envelope: {exc}") from exc


def _with_delivery(message: DelayedMessage, route: str, sent_at: datetime | None) -> str:
    """The queue text of ``message`` with the delivery header, or without it when that would not fit (encoded once
    when it fits)."""
    value = encode_delivery(
        message_id=message.message_id,
        due_ms=epoch_ms(message.due_at),
        sent_ms=epoch_ms(sent_at) if sent_at is not None else None,
        hops=0 if route == "native" else message.failure_count,
        route=route,
    )
    try:
        return encode_envelope(message.with_headers({DELIVERY_HEADER: value}))
    except InvalidMessageError:
        return encode_envelope(message)


class StorageQueueTransport:
    """``Transport`` that puts each message on the Storage Queue named by its destination."""

    def __init__(
        self,
        service: QueueServiceClient,
        *,
        route: str = "store",
        bound: SendBound | None = None,
        budget: RunBudget | None = None,
    ) -> None:
        self.service = service
        #: The route named in the delivery header of what the dispatcher sends (``table`` or ``store``).
        self.route = route
        #: How long one put may take, its retries included (None: the client's own timeouts and retries). ``budget``
        #: is what the service client's ``BudgetedRetry`` reads; each put is bounded there.
        self.bound = bound
        self._budget = budget if bound is not None else None
        self._queues: dict[str, QueueClient] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_connection_string(cls, connection_string: str) -> StorageQueueTransport:
        """A transport on the account of ``connection_string``."""
        return cls(QueueServiceClient.from_connection_string(connection_string))

    def queue(self, name: str) -> QueueClient:
        """A cached client for queue ``name`` (validated)."""
        with self._lock:
            client = self._queues.get(name)
            if client is None:
                validate_azure_queue_name(name)
                client = self._queues[name] = self.service.get_queue_client(name)
            return client

    def create_queue(self, name: str) -> None:
        """Create queue ``name`` if missing."""
        try:
            self.queue(name).create_queue()
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code != 403:  # 403: the identity may only send (Message Sender); Bicep made the queue
                raise translate(exc, f"creating queue {name}") from exc
        except AzureError as exc:
            raise translate(exc, f"creating queue {name}") from exc

    @property
    def max_delay_seconds(self) -> int:
        """The longest a queue hides a message it is sent (Put Message's visibility timeout: 7 days)."""
        return MAX_NATIVE_DELAY_SECONDS

    @property
    def send_timeout(self) -> float:
        """The longest one put takes, its retries included (0: not bounded here)."""
        return self.bound.send_timeout if self._budget is not None and self.bound is not None else 0.0

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        """Put ``message`` on its queue, invisible for ``delay_seconds`` (release control places it at its slot)."""
        self.send(message, visibility_timeout=delay_seconds)

    def send(
        self,
        message: DelayedMessage,
        *,
        visibility_timeout: int = 0,
        route: str | None = None,
        sent_at: datetime | None = None,
    ) -> None:
        """Put ``message`` on its destination queue, invisible for ``visibility_timeout`` seconds.

        The queue text carries the delivery header for the consumer (``route``, default ``self.route``), left out
        of error-queue copies and when it would not fit.
        """
        self.place(message, visibility_timeout, route=route, sent_at=sent_at)

    def place(
        self,
        message: DelayedMessage,
        visibility_timeout: int,
        *,
        route: str | None = None,
        sent_at: datetime | None = None,
    ) -> tuple[str, str]:
        """``send``, answering the queue message's id and pop receipt (what deletes or updates it while hidden)."""
        if FAILURE_REASON in message.headers:
            text = encode_envelope(message)
        else:
            text = _with_delivery(message, route or self.route, sent_at)
        if not 0 <= visibility_timeout <= MAX_NATIVE_DELAY_SECONDS:
            raise InvalidMessageError(
                f"visibility timeout {visibility_timeout} s is outside 0..{MAX_NATIVE_DELAY_SECONDS} s"
            )
        queue = self.queue(message.destination)
        try:
            hide = visibility_timeout or None
            if self._budget is None or self.bound is None:
                sent = queue.send_message(text, visibility_timeout=hide, time_to_live=NEVER_EXPIRE)
            else:  # ends within ``send_timeout``: the service gives up when we do, and no retry starts that cannot end
                with self._budget.send_within(self.bound.send_timeout, self.bound.attempt):
                    timeout = self.bound.server_timeout
                    sent = queue.send_message(text, visibility_timeout=hide, time_to_live=NEVER_EXPIRE, timeout=timeout)
        except ResourceNotFoundError as exc:
            raise DestinationNotFoundError(f"queue {message.destination!r} does not exist") from exc
        except AzureError as exc:
            raise translate(exc, f"sending to queue {message.destination!r}") from exc
        return str(sent.id), str(sent.pop_receipt)

    def rehide(
        self,
        message: DelayedMessage,
        queue_message_id: str,
        pop_receipt: str,
        visibility_timeout: int,
        *,
        sent_at: datetime,
    ) -> str | None:
        """Update a placed, unreceived message to ``message`` (its new due time), hidden for ``visibility_timeout``
        seconds: its new pop receipt, or None when it is gone or was received (the receipt no longer matches)."""
        text = _with_delivery(message, self.route, sent_at)
        try:
            updated = self.queue(message.destination).update_message(
                queue_message_id, pop_receipt, content=text, visibility_timeout=visibility_timeout
            )
        except (ResourceNotFoundError, HttpResponseError) as exc:
            if isinstance(exc, ResourceNotFoundError) or exc.status_code in (400, 404):
                return None
            raise translate(exc, f"updating a placed message on queue {message.destination!r}") from exc
        except AzureError as exc:
            raise translate(exc, f"updating a placed message on queue {message.destination!r}") from exc
        return str(updated.pop_receipt)

    def revoke(self, destination: str, queue_message_id: str, pop_receipt: str) -> bool:
        """Delete a message this process placed and nobody has received (its pop receipt still valid); False when
        it is gone or was received (a receive changes the pop receipt)."""
        try:
            self.queue(destination).delete_message(queue_message_id, pop_receipt)
        except (ResourceNotFoundError, HttpResponseError) as exc:
            if isinstance(exc, ResourceNotFoundError) or exc.status_code in (400, 404):
                return False
            raise translate(exc, f"deleting a placed message from queue {destination!r}") from exc
        except AzureError as exc:
            raise translate(exc, f"deleting a placed message from queue {destination!r}") from exc
        return True


class BudgetedRetry(ExponentialRetry):
    """The SDK's exponential retry, each back-off capped by the run's time left and by its send's (``RunBudget``): no
    retry once the run is over, nor one whose attempt could not end within its send's bound."""

    def __init__(self, budget: RunBudget, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.budget = budget

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        """The SDK's back-off, capped by the time left in the run and before the send's last attempt must start."""
        backoff = float(super().get_backoff_time(settings))
        for left in (self.budget.left(), self.budget.retry_room()):
            if left is not None:
                backoff = max(0.0, min(backoff, left))
        return backoff

    def increment(self, settings: dict[str, Any], request: Any, response: Any = None, error: Any = None) -> bool:
        """Whether to retry: never once the run is over or when another attempt could not end within the send's
        bound; else as the SDK decides."""
        left, room = self.budget.left(), self.budget.retry_room()
        if (left is not None and left <= 0) or (room is not None and room < 0):
            return False
        return bool(super().increment(settings, request, response=response, error=error))
