"""Wake-ups across processes: a thread that ``LISTEN``s on the store's channel on its own connection.

``PostgresDelayedMessageStore.store`` sends ``NOTIFY <channel>, '<due epoch µs>'`` when a new
message is due before every other one. The listener calls each subscriber with that due time
(e.g. ``Dispatcher.notify`` or an ``Event.set``). After its connection drops it reconnects with
backoff and calls subscribers with ``None`` ("something may have been missed: look again").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg
from psycopg import sql

from .. import logfields as lf
from ..errors import DelayedDeliveryError
from .connection import ConnectionSet, validate_identifier

__all__ = ["DueListener", "parse_due_payload", "waking"]

_log = logging.getLogger("delayed_delivery.postgres.notify")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: A subscriber gets the announced due time, or None after a reconnect.
Subscriber = Callable[[datetime | None], None]


def parse_due_payload(payload: str) -> datetime | None:
    """The due time carried by a NOTIFY payload (epoch microseconds), or None when unreadable."""
    try:
        return _EPOCH + timedelta(microseconds=int(payload))
    except (ValueError, OverflowError):
        return None


def waking(dispatcher: _Notifiable) -> Subscriber:
    """A subscriber that wakes a core ``Dispatcher`` (a reconnect wakes it unconditionally)."""

    def on_due(due_at: datetime | None) -> None:
        dispatcher.notify(due_at if due_at is not None else _EPOCH)

    return on_due


class _Notifiable(Protocol):
    def notify(self, due_at: datetime) -> None: ...


class DueListener:
    """Listens on one channel in a daemon thread and fans notifications out to subscribers."""

    def __init__(self, conninfo: str, channel: str, *, poll_interval: float = 1.0, max_backoff: float = 30.0) -> None:
        self.channel = validate_identifier("notify channel", channel)
        self._db = ConnectionSet(
            conninfo, what=f"notify channel {channel!r}", connect_timeout=10.0, statement_timeout=30.0
        )
        self._poll = poll_interval
        self._max_backoff = max_backoff
        self._subscribers: list[Subscriber] = []
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, callback: Subscriber) -> None:
        """Call ``callback`` for every notification from now on."""
        self._subscribers.append(callback)

    def start(self, timeout: float = 10.0) -> DueListener:
        """Start the thread and wait until ``LISTEN`` is in effect (or ``timeout``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"listen-{self.channel}", daemon=True)
            self._thread.start()
        self._listening.wait(timeout)
        return self

    @property
    def listening(self) -> bool:
        """True while the listening connection is up."""
        return self._listening.is_set()

    def stop(self) -> None:
        """Stop the thread and close the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._poll + 5)
        self._db.close()

    def __enter__(self) -> DueListener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _listen(self) -> psycopg.Connection[Any] | None:
        """A new connection listening on the channel, or None (logged) when the database is unreachable."""
        try:
            conn = self._db.connect()
        except DelayedDeliveryError as exc:
            _log.warning("cannot listen for due-time notifications: %r", exc, extra={lf.REASON: repr(exc)})
            return None
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except psycopg.Error as exc:
            conn.close()
            _log.warning("cannot listen for due-time notifications: %r", exc, extra={lf.REASON: repr(exc)})
            return None
        return conn

    def _run(self) -> None:
        backoff = 0.5
        first = True
        while not self._stop.is_set():
            conn = self._listen()
            if conn is None:
                self._stop.wait(backoff)
                backoff = min(self._max_backoff, backoff * 2)
                continue
            backoff = 0.5
            self._listening.set()
            if not first:
                self._fan_out(None)  # notifications sent while we were away are lost: look again
            first = False
            try:
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=self._poll):
                        self._fan_out(parse_due_payload(note.payload))
            except psycopg.Error as exc:
                _log.warning("listening connection lost: %r", exc, extra={lf.REASON: repr(exc)})
            finally:
                self._listening.clear()
                conn.close()

    def _fan_out(self, due_at: datetime | None) -> None:
        for callback in list(self._subscribers):
            try:
                callback(due_at)
            except Exception as exc:  # a subscriber must not kill the listener
                _log.error("due-time subscriber failed: %r", exc, extra={lf.REASON: repr(exc)})
