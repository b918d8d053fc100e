"""Count SQS requests as they leave a boto3 client (``before-send`` hook): cost measured, not estimated."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["RequestCounter"]


class RequestCounter:
    """Counts every HTTP request (retries included, as SQS bills them) per operation, plus empty receives."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.empty_receives = 0
        self.received_messages = 0
        self._lock = threading.Lock()

    def attach(self, client: SQSClient) -> RequestCounter:
        """Start counting ``client``'s requests; returns ``self`` so it chains."""
        client.meta.events.register("before-send.sqs.*", self._before_send)
        client.meta.events.register("after-call.sqs.ReceiveMessage", self._after_receive)
        return self

    def _before_send(self, **kwargs: Any) -> None:
        operation = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
        with self._lock:
            self.requests[operation] += 1

    def _after_receive(self, **kwargs: Any) -> None:
        parsed = kwargs.get("parsed") or {}
        count = len(parsed.get("Messages", []))
        with self._lock:
            self.received_messages += count
            if count == 0:
                self.empty_receives += 1

    @property
    def total(self) -> int:
        """All requests so far."""
        with self._lock:
            return sum(self.requests.values())

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
