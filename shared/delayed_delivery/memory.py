"""In-memory store and transport: first-class fakes for tests, demos and custom-store authors."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from .clock import Clock, SystemClock, utc
from .errors import DestinationNotFoundError, TransientError
from .model import DelayedMessage
from .ports import ClaimedMessage, DelayedMessageStore, id_conflict, in_flight, same_message

__all__ = ["InMemoryDelayedMessageStore", "InMemoryTransport", "SentMessage"]


@dataclass(slots=True)
class _Row:
    message: DelayedMessage
    claimed_until: datetime | None = None
    claim: str | None = None
    slot: datetime | None = None  # deferred to its release slot (release control)

    def available_at(self) -> datetime:
        if self.claimed_until is None:
            return self.message.due_at if self.slot is None else max(self.message.due_at, self.slot)
        return max(self.message.due_at, self.claimed_until)


class InMemoryDelayedMessageStore(DelayedMessageStore):
    """A thread-safe store in a dict; a claim hides a message for ``claim_timeout`` seconds."""

    def __init__(self, claim_timeout: float = 60.0) -> None:
        self.claim_timeout = timedelta(seconds=claim_timeout)
        self._rows: dict[str, _Row] = {}
        self._lock = threading.Lock()

    def setup_infrastructure(self) -> None:
        """Nothing to create."""

    def store(self, message: DelayedMessage) -> None:
        """Keep ``message``; the same message again is a no-op, a different one under a pending id is refused."""
        with self._lock:
            row = self._rows.get(message.message_id)
            if row is None:
                self._rows[message.message_id] = _Row(message)
            elif not same_message(row.message, message):
                raise id_conflict(message.message_id)

    def remove(self, message_id: str, claim: str | None = None) -> bool:
        """Forget a message; False when already gone (or superseded: the row no longer holds ``claim``)."""
        with self._lock:
            if self._held(message_id, claim) is None:
                return False
            del self._rows[message_id]
            return True

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        """Count a failure and release the claim (the token stays, for the settling that follows)."""
        with self._lock:
            row = self._rows.get(message_id)
            if row is None or (claim is not None and row.claim != claim):
                return False
            row.message = replace(row.message, failure_count=row.message.failure_count + 1)
            row.claimed_until = None
            row.slot = None
            return True

    def reschedule(self, message_id: str, due_at: datetime, claim: str | None = None) -> bool:
        """Move the due time and release the claim."""
        with self._lock:
            row = self._held(message_id, claim)
            if row is None:
                return False
            row.message = replace(row.message, due_at=utc(due_at))
            row.claimed_until = None
            row.claim = None
            row.slot = None
            return True

    def defer(self, deferrals: Sequence[tuple[str, datetime, str]]) -> Sequence[bool]:
        """Release each claim, the row fetchable again at its release slot (due time unchanged)."""
        flags: list[bool] = []
        with self._lock:
            for message_id, slot, claim in deferrals:
                row = self._rows.get(message_id)
                held = row is not None and row.claim == claim
                if row is not None and held:
                    row.claimed_until = None
                    row.claim = None
                    row.slot = utc(slot)
                flags.append(held)
        return flags

    def release_backlog(self) -> Mapping[str, tuple[int, datetime]]:
        """Deferred rows per destination: how many, and the latest slot among them."""
        backlog: dict[str, tuple[int, datetime]] = {}
        with self._lock:
            for row in self._rows.values():
                if row.slot is not None and row.claim is None:
                    count, latest = backlog.get(row.message.destination, (0, row.slot))
                    backlog[row.message.destination] = (count + 1, max(latest, row.slot))
        return backlog

    def _held(self, message_id: str, claim: str | None) -> _Row | None:
        """The row, when ``claim`` still holds it (or, without one, when no dispatcher's claim lasts)."""
        row = self._rows.get(message_id)
        if row is None:
            return None
        if claim is not None:
            return row if row.claim == claim else None
        if row.claim is not None and row.claimed_until is not None and row.claimed_until > datetime.now(UTC):
            raise in_flight(message_id)
        return row

    def next_due(self) -> datetime | None:
        """Earliest time something becomes fetchable."""
        with self._lock:
            return min((r.available_at() for r in self._rows.values()), default=None)

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Claim up to ``limit`` due messages, earliest first."""
        at = utc(at)
        with self._lock:
            due = sorted(
                (r for r in self._rows.values() if r.available_at() <= at),
                key=lambda r: (r.message.due_at, r.message.message_id),
            )[: max(0, limit)]
            claim = uuid.uuid4().hex
            fetched: list[DelayedMessage] = []
            for row in due:
                slot = row.slot if row.claim is None else None
                row.claimed_until = at + self.claim_timeout
                row.claim = claim
                row.slot = None
                fetched.append(ClaimedMessage.of(row.message, claim, slot))
            return fetched

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, claimed or not."""
        with self._lock:
            row = self._rows.get(message_id)
            return row.message if row else None

    def earliest_due(self) -> datetime | None:
        """The earliest due time, claimed or not."""
        with self._lock:
            return min((r.message.due_at for r in self._rows.values()), default=None)

    def backlog(self, bucket_seconds: int) -> Sequence[tuple[datetime, int]]:
        """Pending counts per due-time bucket, earliest first."""
        size = max(1, int(bucket_seconds))
        counts: dict[datetime, int] = {}
        with self._lock:
            for row in self._rows.values():
                ts = row.message.due_at.timestamp()
                start = datetime.fromtimestamp(ts - ts % size, UTC)
                counts[start] = counts.get(start, 0) + 1
        return sorted(counts.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)


@dataclass(frozen=True, slots=True)
class SentMessage:
    """A message as the in-memory transport received it, with the time it arrived."""

    message: DelayedMessage
    sent_at: datetime


class InMemoryTransport:
    """Records sends; can be told which destinations exist and when to fail."""

    def __init__(self, clock: Clock | None = None, destinations: set[str] | None = None) -> None:
        self.clock = clock or SystemClock()
        self.destinations = destinations
        self.sent: list[SentMessage] = []
        self._failures: dict[str, list[Callable[[], Exception]]] = {}
        self._lock = threading.Lock()

    def fail(self, destination: str, times: int = 1, error: Callable[[], Exception] | None = None) -> None:
        """Make the next ``times`` sends to ``destination`` raise (a TransientError by default)."""
        make = error or (lambda: TransientError(f"injected failure sending to {destination}"))
        with self._lock:
            self._failures.setdefault(destination, []).extend([make] * times)

    def send(self, message: DelayedMessage) -> None:
        """Record ``message`` or raise the injected/missing-destination error."""
        with self._lock:
            pending = self._failures.get(message.destination)
            if pending:
                raise pending.pop(0)()
            if self.destinations is not None and message.destination not in self.destinations:
                raise DestinationNotFoundError(f"queue {message.destination!r} does not exist")
            self.sent.append(SentMessage(message, self.clock.now()))

    def to(self, destination: str) -> list[DelayedMessage]:
        """Messages sent to ``destination`` in order."""
        with self._lock:
            return [s.message for s in self.sent if s.message.destination == destination]
