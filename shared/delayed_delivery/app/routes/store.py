"""The SQL store route (``--store sqlite:///…|postgresql://…``): every operation exact, on the store's rows."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from delayed_delivery.app.routes.base import (
    CancelResult,
    PendingReport,
    RescheduleResult,
    SendResult,
    UsageError,
    backlog_report,
    refuse_sqs_options,
)
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import DelayedMessageStore, InspectableStore, ReschedulableStore
from delayed_delivery.stores import open_store

__all__ = ["StoreOperatorRoute"]


class StoreOperatorRoute:
    """A SQL store opened from its URL on first use (so option mistakes are reported before any connection)."""

    name = "store"

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._opened: DelayedMessageStore | None = None

    @property
    def store(self) -> DelayedMessageStore:
        """The store, opened on first use."""
        if self._opened is None:
            if not self.url:
                raise UsageError("give a route: --store URL (SQL) or --cloud aws|azure (add --local for the emulators)")
            self._opened = open_store(self.url)
        return self._opened

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
        if delay is not None and callable(store_after):
            # The store's own clock decides (PostgreSQL: now() + delay), so a skewed sender cannot deliver early.
            message = store_after(delay, to, body, headers=dict(headers), message_id=message_id)
            due = message.due_at
        else:
            message = DelayedMessage.create(to, body, at=due, headers=dict(headers), message_id=message_id)
            target.store(message)
        return SendResult(message.message_id, "store", to, due)

    def pending(self, bucket_seconds: int, *, queue: str | None = None) -> PendingReport:
        """Exact: the store's backlog by due time."""
        refuse_sqs_options(queue=queue)
        s = self.store
        if not isinstance(s, InspectableStore):
            raise UsageError(f"{type(s).__name__} cannot list pending messages")
        earliest = s.earliest_due()
        buckets = dict(s.backlog(bucket_seconds))
        return backlog_report(buckets, earliest, pending=len(s), route="store")

    def cancel(self, message_id: str, *, to: str | None = None, due: datetime | None = None) -> CancelResult:
        """Remove the message's row (exact)."""
        refuse_sqs_options(to, due)
        return CancelResult(message_id, "store", cancelled=self.store.remove(message_id))

    def reschedule(self, message_id: str, due: datetime, *, to: str | None = None) -> RescheduleResult:
        """Move the message's due time (exact)."""
        refuse_sqs_options(to)
        s = self.store
        if not isinstance(s, ReschedulableStore):
            raise UsageError(f"{type(s).__name__} cannot reschedule")
        return RescheduleResult(message_id, "store", due, moved=s.reschedule(message_id, due))
