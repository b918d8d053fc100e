"""Count billed requests per step with botocore hooks on every client made while a ``StepCounter`` is installed.

The hooks go on boto3's default session, so every client created inside ``with counter.installed():`` (SQS, S3,
DynamoDB) reports to it; a ``scope`` callable names the step group a call belongs to (or None: not counted).
SQS is billed per 64 KiB chunk of a send's or receive's payload; a receive is split between the messages arriving
for the first time and those coming back from a park (``ApproximateReceiveCount`` > 1) by their bytes.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from delayed_delivery.aws.sqs import message_size

__all__ = ["CHUNK", "S3_FREE", "S3_TIER1", "StepCounter", "poller_scope"]

#: SQS bills each 64 KiB chunk of a payload as one request.
CHUNK = 65_536
#: S3 request classes: PUT, COPY, POST and LIST are billed at the PUT price; DELETE is free; the rest as GET.
S3_TIER1 = {"PutObject", "CopyObject", "ListObjectsV2", "ListObjects", "CreateMultipartUpload", "UploadPart"}
S3_FREE = {"DeleteObject", "DeleteObjects"}
_HOOKS = (
    ("before-parameter-build.sqs", "_sqs_params"),
    ("after-call.sqs", "_sqs_done"),
    ("before-parameter-build.s3", "_s3_params"),
    ("after-call.s3", "_s3_done"),
    ("after-call.dynamodb", "_dynamodb_done"),
    ("before-send", "_attempt"),
)


def _chunks(size: int) -> int:
    return max(1, math.ceil(size / CHUNK))


def poller_scope() -> str | None:
    """FIFO route: calls from local event-source threads are the hop path, the rest the sender (main thread)."""
    return "hop" if threading.current_thread().name.startswith("poller-") else "client"


class StepCounter:
    """Billed requests and HTTP calls per ``<scope>.<step>``, plus HTTP attempts per service (retries included)."""

    def __init__(self, scope: Callable[[], str | None]) -> None:
        self.scope = scope
        self.billed: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self._lock = threading.Lock()

    @contextmanager
    def installed(self) -> Iterator[StepCounter]:
        """Count every call of every boto3 client created (from the default session) inside the block."""
        import boto3

        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        events = boto3.DEFAULT_SESSION.events  # every boto3.client() made from now on copies these handlers
        handlers = [(event, getattr(self, name)) for event, name in _HOOKS]
        for event, handler in handlers:
            events.register(event, handler)
        try:
            yield self
        finally:
            for event, handler in handlers:
                events.unregister(event, handler)

    def add(self, step: str, billed: float, calls: int = 1) -> None:
        """Record ``billed`` requests (and ``calls`` HTTP calls) for ``step`` in the current scope."""
        scope = self.scope()
        if scope is None:
            return
        with self._lock:
            self.billed[f"{scope}.{step}"] += billed
            self.calls[f"{scope}.{step}"] += calls

    def _attempt(self, **kwargs: Any) -> None:
        service = str(kwargs.get("event_name", "")).split(".")[1:2]
        if self.scope() is not None and service:
            with self._lock:
                self.attempts[service[0]] += 1

    def _sqs_params(self, params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        operation = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
        fifo = str(params.get("QueueUrl", "")).endswith(".fifo")
        if operation in ("SendMessage", "SendMessageBatch"):
            entries = params.get("Entries") or [params]
            size = sum(message_size(str(e.get("MessageBody", "")), e.get("MessageAttributes") or {}) for e in entries)
            context["dd_step"] = ("send_fifo" if fifo else "send", _chunks(size))
        elif operation.startswith("ChangeMessageVisibility"):
            context["dd_step"] = ("visibility", 1)
        elif operation.startswith("DeleteMessage"):
            context["dd_step"] = ("delete_fifo" if fifo else "delete", 1)
        elif operation == "ReceiveMessage":
            context["dd_step"] = ("receive_fifo" if fifo else "receive", 0)
        else:
            context["dd_step"] = ("lookup", 1)

    def _sqs_done(self, parsed: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        step, billed = context.get("dd_step", ("lookup", 1))
        if not step.startswith("receive"):
            self.add(step, billed)
            return
        messages = parsed.get("Messages") or []
        if not messages:
            self.add(f"{step}_empty", 1)
            return
        sizes = [message_size(m.get("Body", ""), m.get("MessageAttributes") or {}) for m in messages]
        total = _chunks(sum(sizes))
        back = sum(s for s, m in zip(sizes, messages, strict=True) if _receive_count(m) > 1)
        share = back / max(1, sum(sizes))
        if back:
            self.add(f"{step}_return", total * share, 0)
        if share < 1:
            self.add(step, total * (1 - share), 0)
        self.add(f"{step}_calls", 0)

    def _s3_params(self, params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        lease = "/leases/" in str(params.get("Key", ""))
        context["dd_s3"] = "s3_lease_" if lease else "s3_"
        body = params.get("Body")
        size = len(body) if isinstance(body, bytes | bytearray) else _buffer_size(body)
        scope = self.scope()
        if size and not lease and scope is not None:
            with self._lock:
                self.bytes[f"{scope}.s3_put_bytes"] += size

    def _s3_done(self, context: dict[str, Any], **kwargs: Any) -> None:
        operation = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
        self.add(f"{context.get('dd_s3', 's3_')}{operation}", 0.0 if operation in S3_FREE else 1.0)

    def _dynamodb_done(self, **kwargs: Any) -> None:
        operation = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
        self.add(f"dynamodb_{operation}", 1.0)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Billed requests and calls per step, and HTTP attempts per service."""
        with self._lock:
            return {
                "billed": dict(self.billed),
                "calls": dict(self.calls),
                "attempts": dict(self.attempts),
                "bytes": dict(self.bytes),
            }


def _receive_count(message: dict[str, Any]) -> int:
    try:
        return int((message.get("Attributes") or {}).get("ApproximateReceiveCount", "1"))
    except ValueError:
        return 1


def _buffer_size(body: object) -> int:
    """Bytes of a body botocore has already wrapped in a ``BytesIO`` (0 when it is something else)."""
    getbuffer = getattr(body, "getbuffer", None)
    return int(getbuffer().nbytes) if callable(getbuffer) else 0
