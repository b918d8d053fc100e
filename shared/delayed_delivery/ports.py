"""Ports: what the dispatcher needs from a store and a transport."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from .errors import CircuitBreakerTrippedError, MessageIdConflictError, MessageInFlightError
from .model import DelayedMessage

__all__ = [
    "BatchRemovingStore",
    "BoundedTransport",
    "ClaimedMessage",
    "CriticalErrorCallback",
    "DeferringStore",
    "DelayedMessageStore",
    "DelayedMessageStoreWithInfrastructure",
    "InspectableStore",
    "PlacingTransport",
    "ReleaseBacklog",
    "ReleaseSchedule",
    "ReleaseStateStore",
    "ReschedulableStore",
    "SharedReleaseState",
    "Transport",
    "UnsentFailureStore",
    "claim_of",
    "claimed_until",
    "id_conflict",
    "in_flight",
    "same_message",
    "slot_of",
]

#: Called once when a circuit breaker trips; the host decides whether to stop or alert.
CriticalErrorCallback = Callable[[CircuitBreakerTrippedError], None]


class ClaimedMessage(DelayedMessage):
    """A fetched message with the token of the claim that fetched it (kept in memory, never written)."""

    __slots__ = ("_claim", "_slot", "_until")

    @classmethod
    def of(
        cls, message: DelayedMessage, claim: str, slot: datetime | None = None, until: datetime | None = None
    ) -> ClaimedMessage:
        """``message`` as fetched under ``claim`` (no copy of the body, no validation again).

        ``slot``: the release slot the row was deferred to (``DeferringStore.defer``), when it was. ``until``: when
        the claim runs out (another dispatcher may then fetch the row), when the store says.
        """
        claimed = object.__new__(cls)
        for name in DelayedMessage.__slots__:
            object.__setattr__(claimed, name, getattr(message, name))
        object.__setattr__(claimed, "_claim", claim)
        object.__setattr__(claimed, "_slot", slot)
        object.__setattr__(claimed, "_until", until)
        return claimed

    @property
    def claim(self) -> str | None:
        """The claim token; None once copied (``with_headers``, ``redirected``)."""
        return getattr(self, "_claim", None)

    @property
    def slot(self) -> datetime | None:
        """The release slot its store kept for it (a deferred row coming back), else None."""
        return getattr(self, "_slot", None)

    @property
    def until(self) -> datetime | None:
        """When its claim runs out (the store's word), else None."""
        return getattr(self, "_until", None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DelayedMessage):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in DelayedMessage.__slots__)

    __hash__ = DelayedMessage.__hash__


def claim_of(message: DelayedMessage) -> str | None:
    """The claim token a store's fetch attached to ``message``, or None (a store without claim tokens)."""
    return message.claim if isinstance(message, ClaimedMessage) else None


def claimed_until(message: DelayedMessage) -> datetime | None:
    """When the claim a store's fetch attached to ``message`` runs out, or None (not said)."""
    return message.until if isinstance(message, ClaimedMessage) else None


def slot_of(message: DelayedMessage) -> datetime | None:
    """The release slot a store kept for a fetched ``message`` (``DeferringStore``), or None."""
    return message.slot if isinstance(message, ClaimedMessage) else None


def same_message(stored: DelayedMessage, new: DelayedMessage) -> bool:
    """Whether ``new`` is the pending ``stored`` message again: destination, body, headers and due time."""
    return (
        stored.destination == new.destination
        and stored.body == new.body
        and dict(stored.headers) == dict(new.headers)
        and stored.due_at == new.due_at
    )


def id_conflict(message_id: str) -> MessageIdConflictError:
    """The error for a different message under a pending id."""
    return MessageIdConflictError(
        f"message id {message_id!r} is already pending with a different destination, body, headers or due time"
    )


def in_flight(message_id: str) -> MessageInFlightError:
    """The error for an operator's change to a message a dispatcher is sending."""
    return MessageInFlightError(f"message {message_id!r} is being dispatched right now; try again shortly")


@runtime_checkable
class DelayedMessageStore(Protocol):
    """Where delayed messages wait until due (NServiceBus's IDelayedMessageStore, plus batch claims)."""

    def store(self, message: DelayedMessage) -> None:
        """Persist ``message``; the same message again is a no-op, another under a pending id is refused.

        Raises ``MessageIdConflictError`` when a message with this id is pending and differs in destination,
        body, headers or due time (docs/identity.md).
        """
        ...

    def remove(self, message_id: str, claim: str | None = None) -> bool:
        """Delete a message; False when it was already gone.

        With ``claim`` (from ``claim_of``): only while the row still holds that claim, else False (superseded).
        Without: an operator's cancel, which raises ``MessageInFlightError`` while a dispatcher's claim lasts.
        """
        ...

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        """Count one failed delivery and release its claim; False when gone (or, with ``claim``, superseded)."""
        ...

    def next_due(self) -> datetime | None:
        """Earliest time at which some message can be fetched, or None when the store is empty."""
        ...

    def fetch_next_due(self, at: datetime) -> DelayedMessage | None:
        """Claim the earliest message due at ``at``, or return None (default: ``fetch_due(at, 1)``)."""
        found = self.fetch_due(at, 1)
        return found[0] if found else None

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Claim up to ``limit`` messages due at ``at``, earliest first; no two callers get the same one."""
        ...


@runtime_checkable
class DelayedMessageStoreWithInfrastructure(DelayedMessageStore, Protocol):
    """A store that can create its own tables."""

    def setup_infrastructure(self) -> None:
        """Create tables, indexes or containers if missing; safe to call repeatedly."""
        ...


@runtime_checkable
class ReschedulableStore(Protocol):
    """A store that can move a message's due time (used for retry backoff and by operators)."""

    def reschedule(self, message_id: str, due_at: datetime, claim: str | None = None) -> bool:
        """Set a new due time and release any claim; False when gone (or, with ``claim``, superseded).

        Without ``claim`` (an operator): raises ``MessageInFlightError`` while a dispatcher's claim lasts.
        """
        ...


@runtime_checkable
class BatchRemovingStore(Protocol):
    """A store that removes many messages in one round trip (e.g. one table transaction)."""

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> Sequence[bool]:
        """Delete each message; one flag per id, False when that message was already gone.

        With ``claims`` (one per id, from ``claim_of``): each only while its row still holds that claim.
        """
        ...


@runtime_checkable
class UnsentFailureStore(Protocol):
    """A store that tells a failed send that certainly put nothing from one whose outcome is unknown."""

    def count_unsent_failure(self, message_id: str, claim: str) -> bool:
        """``increment_failure_count`` under ``claim`` of a send the destination refused (nothing was put): the row
        may then be cancelled exactly again. False when gone or superseded."""
        ...


@runtime_checkable
class DeferringStore(Protocol):
    """A store that can keep a claimed row back until its release slot (release control), due time unchanged."""

    def defer(self, deferrals: Sequence[tuple[str, datetime, str]]) -> Sequence[bool]:
        """For each ``(message id, slot, claim)``: release the claim, the row fetchable again at the slot.

        One flag per entry, False when the row is gone or no longer holds that claim. A deferred row keeps its due
        time (its place in due order); the fetch that takes it again names the slot (``ClaimedMessage.slot``).
        An operator may cancel or reschedule a deferred row (it is not in flight).
        """
        ...

    def release_backlog(self) -> Mapping[str, tuple[int, datetime]]:
        """Deferred rows per destination: how many, and the latest slot among them."""
        ...


#: Deferred rows per destination: (count, latest slot).
ReleaseBacklog = Mapping[str, tuple[int, datetime]]


@runtime_checkable
class ReleaseSchedule(Protocol):
    """Release control's one port: a slot per message of a destination, at most the destination's cap.

    Every implementation keeps the promises ``testing/release_contract.py`` checks: the cap kept in every window, due
    order kept within a booking, never a slot before a message is due, and a booking never used (its caller crashed)
    costs later bookings at most the slots it took. In-process: ``release.ReleasePlanner``; shared by several
    processes: ``release.SharedStateSchedule`` (over a ``SharedReleaseState``, e.g. Azure's blob),
    ``postgres.release.SharedReleaseSchedule`` and ``aws.release_calendar.ReleaseCalendar`` (DynamoDB).
    """

    def reserve(self, destination: str, dues: Sequence[float], now: float) -> list[float | None]:
        """Book a slot (epoch seconds: when it is to become visible) for each message of ``destination`` due at
        ``dues`` (epoch seconds), in the order given; None: no slot within what the schedule can reach."""
        ...


@runtime_checkable
class ReleaseStateStore(Protocol):
    """Where a dispatcher keeps its release schedule between runs (e.g. a blob per Azure shard)."""

    def load(self) -> Mapping[str, float]:
        """Each capped destination's next free slot (epoch seconds) as last saved; empty when none was."""
        ...

    def save(self, state: Mapping[str, float]) -> None:
        """Keep ``state`` (next free slot per destination) for the next run or the next holder of this shard."""
        ...


@runtime_checkable
class SharedReleaseState(ReleaseStateStore, Protocol):
    """One release schedule several dispatchers book from (e.g. every shard of an Azure table): a cap is then shared
    by what each of them has due, not split evenly."""

    def book(self, plan: Callable[[Mapping[str, float]], Mapping[str, float]]) -> None:
        """Save ``plan(latest schedule)`` unless another dispatcher saved meanwhile; then ``plan`` runs again on theirs.

        ``plan`` books slots after everything the schedule it is given has booked and returns the schedule with
        them; the last call of ``plan`` is the booking that holds. Raises when no booking sticks (storage down).
        """
        ...


@runtime_checkable
class InspectableStore(Protocol):
    """A store operators can look into: backlog by time bucket and single messages."""

    def backlog(self, bucket_seconds: int) -> Sequence[tuple[datetime, int]]:
        """Pending message counts per due-time bucket (bucket start, count), earliest first."""
        ...

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, or None."""
        ...

    def earliest_due(self) -> datetime | None:
        """The earliest due time of any pending message, claimed or not."""
        ...

    def __len__(self) -> int:
        """How many messages are pending."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Sends a due message to its destination queue."""

    def send(self, message: DelayedMessage) -> None:
        """Deliver ``message.body`` and ``message.headers`` to ``message.destination``.

        Raise ``TransientError`` for failures worth retrying and ``PermanentError``
        (e.g. ``DestinationNotFoundError``) for ones that are not.
        """
        ...


@runtime_checkable
class BoundedTransport(Transport, Protocol):
    """A transport whose every send ends (done, failed or timed out, its retries included) within a bound."""

    @property
    def send_timeout(self) -> float:
        """The longest one send takes, in seconds (the dispatcher starts none its claim could not outlast)."""
        ...


@runtime_checkable
class PlacingTransport(Transport, Protocol):
    """A transport whose queue can hide what it is sent for a while (SQS ``DelaySeconds``, Azure's visibility)."""

    @property
    def max_delay_seconds(self) -> int:
        """The longest whole-second delay ``send_delayed`` takes (SQS 900, Azure 7 days)."""
        ...

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        """Send ``message`` now, visible on its queue only after ``delay_seconds`` (0 to ``max_delay_seconds``)."""
        ...
