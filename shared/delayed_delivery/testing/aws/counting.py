"""Count SQS requests as they leave a boto3 client (``before-send`` hook): cost measured, not estimated.

SQS bills every 64 KiB chunk of a request's payload as one request, so a send or receive carrying more
than 64 KiB of messages costs more than one: ``billed`` adds those extra chunks to the HTTP request count.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from ...aws.sqs import message_size

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["BILLING_CHUNK", "RequestCounter"]

#: Each 64 KiB chunk of a payload is billed as one request.
BILLING_CHUNK = 65_536


class RequestCounter:
    """Counts every HTTP request (retries included, as SQS bills them) per operation, plus empty receives."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.empty_receives = 0
        self.received_messages = 0
        self.extra_billed_chunks = 0
        self._lock = threading.Lock()

    def attach(self, client: SQSClient) -> RequestCounter:
        """Start counting ``client``'s requests; returns ``self`` so it chains."""
        client.meta.events.register("before-send.sqs.*", self._before_send)
        client.meta.events.register("after-call.sqs.ReceiveMessage", self._after_receive)
        client.meta.events.register("before-parameter-build.sqs.SendMessage", self._before_send_message)
        client.meta.events.register("before-parameter-build.sqs.SendMessageBatch", self._before_send_batch)
        return self

    def _add_payload(self, size: int) -> None:
        extra = max(0, math.ceil(size / BILLING_CHUNK) - 1)
        if extra:
            with self._lock:
                self.extra_billed_chunks += extra

    def _before_send_message(self, **kwargs: Any) -> None:
        params = kwargs.get("params") or {}
        self._add_payload(message_size(str(params.get("MessageBody", "")), params.get("MessageAttributes") or {}))

    def _before_send_batch(self, **kwargs: Any) -> None:
        entries = (kwargs.get("params") or {}).get("Entries") or []
        self._add_payload(
            sum(message_size(str(e.get("MessageBody", "")), e.get("MessageAttributes") or {}) for e in entries)
        )

    def _before_send(self, **kwargs: Any) -> None:
        operation = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
        with self._lock:
            self.requests[operation] += 1

    def _after_receive(self, **kwargs: Any) -> None:
        parsed = kwargs.get("parsed") or {}
        messages = parsed.get("Messages", [])
        count = len(messages)
        self._add_payload(sum(message_size(m.get("Body", ""), m.get("MessageAttributes") or {}) for m in messages))
        with self._lock:
            self.received_messages += count
            if count == 0:
                self.empty_receives += 1

    @property
    def total(self) -> int:
        """All requests so far."""
        with self._lock:
            return sum(self.requests.values())

    @property
    def billed(self) -> int:
        """Requests as SQS bills them: every HTTP request plus one per extra 64 KiB chunk of payload."""
        with self._lock:
            return sum(self.requests.values()) + self.extra_billed_chunks

    def snapshot(self) -> dict[str, int]:
        """Requests per operation."""
        with self._lock:
            return dict(self.requests)

    def reset(self) -> None:
        """Start again from zero."""
        with self._lock:
            self.requests.clear()
            self.empty_receives = 0
            self.received_messages = 0
            self.extra_billed_chunks = 0
