"""The SQL store route (``--store sqlite:///…|postgresql://…``): every operation exact, on the store's rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import ClassVar

from delayed_delivery.app.routes.base import (
    CancelRequest,
    CancelResult,
    Capability,
    PendingReport,
    RescheduleRequest,
    RescheduleResult,
    SendResult,
    UsageError,
    backlog_report,
    resolve_due,
)
from delayed_delivery.app.stores import open_store
from delayed_delivery.clock import SystemClock
from delayed_delivery.durations import new_due_time
from delayed_delivery.errors import ConfigurationError, DelayedDeliveryError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import DelayedMessageStore, InspectableStore, ReschedulableStore
from delayed_delivery.redact import redact

__all__ = ["StoreOperatorRoute"]

#: Seconds a PostgreSQL connection of a command may take: a database that is down fails quickly.
_CONNECT_TIMEOUT = 3.0


class StoreOperatorRoute:
    """A SQL store opened from its URL on first use (so option mistakes are reported before any connection)."""

    name = "store"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._opened: DelayedMessageStore | None = None

    @property
    def store(self) -> DelayedMessageStore:
        """The store, opened on first use."""
        if self._opened is None:
            if not self.url:
                raise UsageError("give a route: --store URL (SQL) or --cloud aws|azure (add --local for the emulators)")
            with self.errors():
                self._opened = open_store(self.url, connect_timeout=_CONNECT_TIMEOUT)
        return self._opened

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Turn a database driver's error (a file SQLite cannot use, a foreign table) into a one-line error."""
        try:
            yield
        except DelayedDeliveryError:
            raise
        except sqlite3.Error as exc:
            table = str(getattr(self._opened, "table", "delayed_messages"))
            raise ConfigurationError(_sqlite_problem(redact(self.url or ""), table, exc)) from exc
        except Exception as exc:
            if type(exc).__module__.partition(".")[0] != "psycopg":
                raise
            text = " ".join(str(exc).split())
            raise ConfigurationError(redact(f"PostgreSQL store {self.url}: {text}")) from exc

    def send(
        self,
        to: str,
        body: bytes,
        due: datetime,
        *,
        headers: Mapping[str, str],
        message_id: str | None = None,
        delay: str | None = None,
        cancellable: bool = False,
    ) -> SendResult:
        """Store a row; with ``delay`` the store's own clock decides the due time when it can."""
        if cancellable:
            raise UsageError("--cancellable is for --cloud azure (store messages can always be cancelled)")
        target = self.store
        store_after = getattr(target, "store_after", None)
        with self.errors():
            if delay is not None and callable(store_after):
                # The store's own clock decides (PostgreSQL: now() + delay), so a skewed sender cannot deliver early.
                message = store_after(delay, to, body, headers=dict(headers), message_id=message_id)
                due = message.due_at
            else:  # a delay counts from the write, not from before the store was opened
                at = due if delay is None else None
                message = DelayedMessage.create(
                    to, body, delay=delay, at=at, headers=dict(headers), message_id=message_id
                )
                target.store(message)
                due = message.due_at
        return SendResult(message.message_id, "store", to, due)

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """Exact: the store's backlog by due time."""
        s = self.store
        if not isinstance(s, InspectableStore):
            raise UsageError(f"{type(s).__name__} cannot list pending messages")
        with self.errors():
            earliest = s.earliest_due()
            buckets = dict(s.backlog(bucket_seconds))
            total = len(s)
        return backlog_report(buckets, earliest, pending=total, route="store")

    def cancel(self, request: CancelRequest) -> CancelResult:
        """Remove the message's row (exact)."""
        s = self.store
        with self.errors():
            cancelled = s.remove(request.message_id)
        return CancelResult(request.message_id, "store", cancelled=cancelled)

    def reschedule(self, request: RescheduleRequest) -> RescheduleResult:
        """Move the message's due time (exact)."""
        s = self.store  # opened first: a delay counts from the write, not from before the connection
        if not isinstance(s, ReschedulableStore):
            raise UsageError(f"{type(s).__name__} cannot reschedule")
        now = SystemClock().now()
        moment = new_due_time(resolve_due(request.due, now), now)
        with self.errors():
            moved = s.reschedule(request.message_id, moment)
        return RescheduleResult(request.message_id, "store", moment, moved=moved)


def _sqlite_problem(url: str, table: str, exc: sqlite3.Error) -> str:
    """What is wrong with the SQLite store at ``url``, from SQLite's error."""
    text = str(exc)
    where = url.removeprefix("sqlite:///")
    if "readonly" in text or "read-only" in text:
        return f"cannot write the SQLite store {where!r}: the file (or its folder) is read-only ({text})"
    if "no such column" in text or "no such table" in text or "has no column" in text:
        return (
            f"table {table!r} in the SQLite store {where!r} has another schema than delayed-delivery's ({text}): "
            "use another file, or a table that delayed-delivery made"
        )
    if "disk I/O" in text or "not a database" in text or "unable to open" in text or "malformed" in text:
        return f"{where!r} is not a usable SQLite database file ({text})"
    return f"SQLite store {where!r}: {text}"
