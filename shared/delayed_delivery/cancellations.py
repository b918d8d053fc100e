"""Cancelling and rescheduling messages that travel without a store (the SQS ``-delay.fifo`` hop cycle).

A message on the hop cycle has no row anyone could delete or move: it *is* the FIFO message. Instead an
operator writes a small record (``Cancellation``) keyed by endpoint and message id; the requeue function reads
the endpoint's live records once per ``max_age`` seconds (``CancellationCache``), checks every message of a
batch in memory, drops cancelled ones, re-plans rescheduled ones, and deletes the records it applied. A record
applies only to messages first sent before it was requested (``Cancellation.binds``; docs/identity.md). Every
message in the cycle passes a hop each ``fifo_queue_delay`` seconds, or comes back from a park (SQS visibility
parking, at most ``max_park_seconds``, 12 h), so a record is applied within one hop or park and the set of live
records stays small: the lookup cost does not grow with the number of pending messages.

Limits: a message whose remaining delay already fits the native cap has left the cycle (it waits out its final
``DelaySeconds`` on the destination, where it cannot be recalled), so a cancel must arrive more than
``max_native_delay + max_age`` seconds before the due time to be certain; ``cancel_request`` refuses one that is
known to be too late. A rescheduled message moves at its next hop or park return, so a new due time sooner than
that is met late by up to one hop, or up to one park (12 h) if it is parked. A lookup that fails is skipped (a
late cancel beats a lost message).

Standard library only; the DynamoDB adapter is ``delayed_delivery.aws.cancellations``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol, TypeAlias, runtime_checkable

from .clock import Clock, SystemClock, utc
from .durations import MAX_DELAY, format_duration, new_due_time
from .errors import DelayedDeliveryError, InvalidMessageError
from .timebuckets.wheel import EARLIEST, LATEST

__all__ = [
    "BINDING_ALLOWANCE",
    "FAILURE_BACKOFF_S",
    "RECORD_TTL",
    "Cancellation",
    "CancellationCache",
    "CancellationKind",
    "CancellationStore",
    "InMemoryCancellationStore",
    "StoredRecord",
    "UnreadableRecord",
    "binding_note",
    "cancel_request",
    "is_live",
    "reschedule_request",
    "tier_record_ttl",
]

#: How long a record lives if nothing applies it: 5 days (a message passes the function at least every 12 h, the
#: longest park; the rest is room for an outage). Applied records are deleted at once.
RECORD_TTL = timedelta(days=5)
#: A record binds to the messages first sent before it was requested, plus this much for the difference between
#: the broker's clock (the send time) and the operator's (the request time).
BINDING_ALLOWANCE = timedelta(seconds=1)
#: After a failed lookup, how long the cache waits before asking the store again (at most ``max_age``).
FAILURE_BACKOFF_S = 5.0


class CancellationKind(StrEnum):
    """What a record asks for."""

    CANCEL = "cancel"
    RESCHEDULE = "reschedule"


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A request to drop (``CANCEL``) or move (``RESCHEDULE`` to ``due_at``) one message of an endpoint."""

    endpoint: str
    message_id: str
    kind: CancellationKind
    requested_at: datetime
    expires_at: datetime
    due_at: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, CancellationKind):
            raise InvalidMessageError(f"a record's kind is cancel or reschedule, not {str(self.kind)[:40]!r}")
        if (self.kind is CancellationKind.RESCHEDULE) != (self.due_at is not None):
            raise InvalidMessageError("a reschedule record needs a due time, a cancel record has none")
        _in_range("requested_at", self.requested_at)
        utc(self.expires_at)  # aware, or InvalidMessageError
        if self.due_at is not None:
            _in_range("due_at", self.due_at)

    def binds(self, sent_at: datetime | None) -> bool:
        """Whether this record applies to a message first sent at ``sent_at`` (``None``, unknown: it applies)."""
        return sent_at is None or utc(sent_at) <= self.requested_at + BINDING_ALLOWANCE


def _in_range(name: str, value: datetime) -> None:
    """Refuse a naive time, or one outside 1970-9000 (the range every reader of a record can use)."""
    when = utc(value)
    if not EARLIEST <= when < LATEST:
        raise InvalidMessageError(f"{name} {when.isoformat()} is outside 1970-01-01 to 9000-01-01")


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """A stored record that names a message but cannot be used (hand-written or damaged: a naive time, a due time
    outside 1970-9000, an unknown kind).

    Nobody can tell whether it meant to drop or move the message, so whoever meets that message treats it as poison:
    the message goes to the error queue with ``problem()``, then the record is deleted. Its neighbours go on as planned.
    """

    endpoint: str
    message_id: str
    reason: str
    #: When it expires, if that much can be read (``None``: it is live until deleted).
    expires_at: datetime | None = None
    #: What the store needs to delete exactly this record (opaque; DynamoDB: the stored ``requested_at`` value).
    version: object = field(default=None, compare=False)

    def binds(self, sent_at: datetime | None) -> bool:
        """Always: what it was meant for cannot be read, so every message under its id is held for an operator."""
        return True

    def problem(self) -> str:
        """The reason its message goes to the error queue."""
        return (
            f"the cancel or reschedule record for {self.message_id!r} on {self.endpoint!r} cannot be read "
            f"({self.reason}), so the message is neither delivered nor dropped; the record is deleted"
        )


#: What a store hands back: a usable record, or one that cannot be used (the message it names goes to the error queue).
StoredRecord: TypeAlias = Cancellation | UnreadableRecord


def is_live(record: StoredRecord, now: datetime) -> bool:
    """Whether ``record`` has not expired at ``now`` (an unreadable one without an expiry stays live)."""
    return record.expires_at is None or record.expires_at > now


@runtime_checkable
class CancellationStore(Protocol):
    """Where cancel and reschedule records wait until the requeue function applies them."""

    def put(self, record: Cancellation) -> None:
        """Write ``record``; a later record for the same endpoint and id replaces it."""
        ...

    def live(self, endpoint: str) -> Sequence[StoredRecord]:
        """Every record of ``endpoint`` (expired ones may be included; callers filter), unreadable ones as such."""
        ...

    def delete(self, records: Sequence[StoredRecord]) -> None:
        """Delete ``records`` unless a newer request replaced them; missing ones are ignored."""
        ...

    def settle(self, records: Sequence[Cancellation], until: Mapping[tuple[str, str], datetime]) -> None:
        """Keep each of ``records`` only until ``until[(endpoint, message id)]`` (never longer than it would live),
        unless a newer request replaced it; missing ones are ignored."""
        ...


class InMemoryCancellationStore:
    """A ``CancellationStore`` in a dict (tests, single-process tools)."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], StoredRecord] = {}
        self._lock = threading.Lock()
        self.lookups = 0

    def put(self, record: StoredRecord) -> None:
        """Write ``record`` (an ``UnreadableRecord`` too: tests stand in for a damaged item with one)."""
        with self._lock:
            self._records[(record.endpoint, record.message_id)] = record

    def live(self, endpoint: str) -> Sequence[StoredRecord]:
        """The endpoint's records."""
        with self._lock:
            self.lookups += 1
            return [r for (e, _), r in self._records.items() if e == endpoint]

    def delete(self, records: Sequence[StoredRecord]) -> None:
        """Drop ``records`` (a newer request for the same id stays)."""
        with self._lock:
            for record in records:
                key = (record.endpoint, record.message_id)
                if self._records.get(key) == record:
                    del self._records[key]

    def settle(self, records: Sequence[Cancellation], until: Mapping[tuple[str, str], datetime]) -> None:
        """Shorten each record's life to ``until`` (a newer request for the same id stays as it is)."""
        with self._lock:
            for record in records:
                key = (record.endpoint, record.message_id)
                stored = self._records.get(key)
                if isinstance(stored, Cancellation) and stored.requested_at == record.requested_at and key in until:
                    self._records[key] = replace(stored, expires_at=min(stored.expires_at, utc(until[key])))


def cancel_request(
    endpoint: str,
    message_id: str,
    *,
    now: datetime,
    max_native_delay: int,
    max_age: float,
    due: datetime | None = None,
    ttl: timedelta = RECORD_TTL,
) -> Cancellation:
    """A cancel record living ``ttl``; raises ``InvalidMessageError`` when ``due`` shows it is already out of reach."""
    now = utc(now)
    if due is not None:
        left = (utc(due) - now).total_seconds()
        reach = max_native_delay + max_age
        if left <= reach:
            when = "was due" if left <= 0 else f"is due in {format_duration(left)}"
            raise InvalidMessageError(
                f"too late to cancel {message_id!r} on SQS: it {when} ({utc(due).isoformat()}), within the "
                f"{format_duration(max_native_delay)} native cap + {format_duration(max_age)} record cache, so it may "
                f"already wait out its final native delay on {endpoint!r}, where SQS cannot recall it; "
                "have the consumer drop it by id"
            )
    return Cancellation(endpoint, message_id, CancellationKind.CANCEL, now, now + _positive(ttl))


def reschedule_request(
    endpoint: str, message_id: str, due_at: datetime, *, now: datetime, ttl: timedelta = RECORD_TTL
) -> Cancellation:
    """A reschedule record moving ``message_id`` to ``due_at`` (after ``now``, at most 100 years on), living ``ttl``."""
    now = utc(now)
    due_at = new_due_time(due_at, now)
    return Cancellation(endpoint, message_id, CancellationKind.RESCHEDULE, now, now + _positive(ttl), due_at)


def tier_record_ttl(now: datetime, due: datetime | None = None) -> timedelta:
    """How long a record for a message in the time-bucket tier lives: until it is applied at the message's dispatch.

    The tier applies a record only when the message's bucket is cascaded or dispatched, which may be up to 100 years
    away: the record lives until ``RECORD_TTL`` after ``due`` when the due time is known, else 100 years plus
    ``RECORD_TTL``. Applied records are deleted at once.
    """
    if due is None:
        return MAX_DELAY + RECORD_TTL
    return max(RECORD_TTL, utc(due) - utc(now) + RECORD_TTL)


def binding_note(requested_at: datetime) -> str:
    """What the record applies to: the messages under its id sent before it (docs/identity.md)."""
    return (
        f"; it applies only to a message with this id sent before now ({requested_at.isoformat()}), "
        "never to one sent later"
    )


def _positive(ttl: timedelta) -> timedelta:
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise InvalidMessageError(f"a record's time to live must be a positive timedelta, got {ttl!r}")
    return ttl


#: ``on_error(operation, error)``: operation is ``"lookup"`` or ``"delete"``.
ErrorCallback = Callable[[str, DelayedDeliveryError], None]


class CancellationCache:
    """Per warm function instance: each endpoint's live records, read at most once per ``max_age`` seconds.

    A failed read returns no records (messages go on as planned) and reports the error through ``on_error``;
    the store is asked again after ``FAILURE_BACKOFF_S`` (or ``max_age`` when that is shorter).
    """

    def __init__(
        self,
        store: CancellationStore,
        max_age: float,
        *,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_error: ErrorCallback | None = None,
    ) -> None:
        if max_age < 0:
            raise InvalidMessageError(f"max_age must be ≥ 0 seconds, got {max_age!r}")
        self.store = store
        self.max_age = max_age
        self.clock = clock or SystemClock()
        self.monotonic = monotonic
        self.on_error = on_error
        self._cached: dict[str, tuple[float, dict[str, StoredRecord]]] = {}
        self._lock = threading.Lock()

    def lookup(self, endpoint: str) -> Mapping[str, StoredRecord]:
        """The endpoint's unexpired records by message id (cached; empty when the store cannot be read)."""
        with self._lock:
            hit = self._cached.get(endpoint)
            if hit is not None and self.monotonic() < hit[0]:
                return dict(hit[1])
        try:
            found = self.store.live(endpoint)
        except DelayedDeliveryError as exc:
            if self.on_error is not None:
                self.on_error("lookup", exc)
            with self._lock:
                self._cached[endpoint] = (self.monotonic() + min(self.max_age, FAILURE_BACKOFF_S), {})
            return {}
        now = self.clock.now()
        records = {r.message_id: r for r in found if is_live(r, now)}
        with self._lock:
            self._cached[endpoint] = (self.monotonic() + self.max_age, records)
        return dict(records)

    def settle(self, records: Sequence[Cancellation], until: Mapping[tuple[str, str], datetime]) -> None:
        """Keep records applied only until ``until`` (the time-bucket tier: a copy of the message sent before the
        record may still arrive); a failed write is reported (the record then lives out its time to live)."""
        if not records:
            return
        try:
            self.store.settle(records, until)
        except DelayedDeliveryError as exc:
            if self.on_error is not None:
                self.on_error("delete", exc)

    def applied(self, records: Sequence[StoredRecord]) -> None:
        """Delete ``records`` once applied; a failed delete is reported (re-applying is harmless, the TTL cleans up)."""
        if not records:
            return
        with self._lock:
            for record in records:
                hit = self._cached.get(record.endpoint)
                if hit is not None and hit[1].get(record.message_id) == record:
                    del hit[1][record.message_id]
        try:
            self.store.delete(list(records))
        except DelayedDeliveryError as exc:
            if self.on_error is not None:
                self.on_error("delete", exc)
