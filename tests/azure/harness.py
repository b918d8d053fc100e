"""A small stand-in for the Functions host: find a timer in an app's registry and fire it; read queues."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import azure.functions as func
from azure.functions.timer import TimerRequest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.storage_queue import Envelope, StorageQueueTransport, decode_envelope
from delayed_delivery.model import DelayedMessage

#: id(app) -> (the app, kept alive so its id is never reused by a later app, its functions by name)
_registries: dict[int, tuple[Any, dict[str, Any]]] = {}


def functions_of(module: ModuleType) -> dict[str, Any]:
    """The app's functions by name; ``get_functions()`` may run only once per app, so it is cached."""
    app = module.app
    if id(app) not in _registries:
        _registries[id(app)] = (app, {f.get_function_name(): f for f in app.get_functions()})
    return _registries[id(app)][1]


def timer_schedule(module: ModuleType, name: str) -> str:
    """The NCRONTAB schedule of timer function ``name``."""
    (binding,) = [b for b in functions_of(module)[name].get_bindings() if b.type == "timerTrigger"]
    return str(binding.schedule)


def fire_timer(module: ModuleType, name: str, *, past_due: bool = False) -> Any:
    """Call timer function ``name`` as the host would, with a TimerRequest."""
    user_function: Callable[[func.TimerRequest], Any] = functions_of(module)[name].get_user_function()
    return user_function(TimerRequest(past_due=past_due))


def drain(queues: QueueServiceClient, name: str) -> list[Envelope]:
    """Every message now visible on queue ``name`` (hidden for 5 minutes, so each is read once)."""
    client = queues.get_queue_client(name)
    out: list[Envelope] = []
    while True:
        batch = list(client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300))
        if not batch:
            return out
        out.extend(decode_envelope(m.content) for m in batch)


def drain_until(queues: QueueServiceClient, name: str, expect: int, timeout: float = 30.0) -> list[Envelope]:
    """What becomes visible on queue ``name`` until ``expect`` came or ``timeout`` passed (a poll, not a sleep)."""
    out: list[Envelope] = []
    deadline = time.monotonic() + timeout
    while True:
        out += drain(queues, name)
        if len(out) >= expect or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


class RecordingTransport:
    """Wraps a transport and records when each message was sent (wall clock, UTC)."""

    def __init__(self, inner: StorageQueueTransport, fail: Callable[[DelayedMessage], Exception | None] | None = None):
        self.inner = inner
        self.fail = fail
        self.sent: list[tuple[DelayedMessage, datetime]] = []
        self._lock = threading.Lock()

    def send(self, message: DelayedMessage) -> None:
        """Send, or raise what ``fail`` returns for this message."""
        if self.fail is not None and (exc := self.fail(message)) is not None:
            raise exc
        self.inner.send(message)
        with self._lock:
            self.sent.append((message, datetime.now(UTC)))
