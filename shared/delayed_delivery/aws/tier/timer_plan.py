"""What the timer does with the messages of one bucket: duplicates dropped by id, cancel and reschedule applied.

Pure: no client, no clock. The timer (``timer.py``) reads the objects, asks this module what to send, and sends.
A record that cannot be used (unreadable, or a due time no bucket holds) holds its one message for the error queue;
planning never raises for what a record or a message holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from ...cancellations import Cancellation, CancellationKind, StoredRecord, UnreadableRecord
from ...delivery import epoch_ms, from_epoch_ms
from ...errors import InvalidMessageError
from ...timebuckets.format import BucketMessage
from ...timebuckets.identity import conflict_reason, content_digest, digest_conflict_reason, same_message
from ...timebuckets.seen import SeenEntry

__all__ = ["SEEN_LIMIT", "Admission", "BucketPlan", "Found", "Lookup", "Rejected", "Seen", "plan_bucket"]

#: ``lookup(destination) -> {message id: record}`` (``CancellationCache.lookup``).
Lookup = Callable[[str], Mapping[str, StoredRecord]]


@dataclass(frozen=True, slots=True)
class Found:
    """A message as read, with the key of the object it came from."""

    message: BucketMessage
    key: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that goes to the error queue instead, and why (``key``: the object it came from, if kept there)."""

    message: BucketMessage
    reason: str
    key: str = ""


@dataclass(slots=True)
class BucketPlan:
    """The outcome of planning one bucket (or one group of objects of a coarse bucket)."""

    #: Messages to pass on (dispatch, or cascade into fine buckets), one per id.
    keep: list[BucketMessage] = field(default_factory=list)
    #: The same message read more than once (a retried write, a crash before a delete).
    duplicates: int = 0
    #: Different messages under one id: all but the first sent.
    conflicts: list[Rejected] = field(default_factory=list)
    cancelled: int = 0
    #: Rescheduled messages with their new due time, to be written into the bucket of that time.
    moved: list[BucketMessage] = field(default_factory=list)
    #: Messages whose record cannot be used (unreadable, or a due time no bucket holds): to the error queue.
    unusable: list[Rejected] = field(default_factory=list)
    #: The records applied (settled once the bucket's objects are gone: ``BucketWork.applied``).
    applied: list[StoredRecord] = field(default_factory=list)
    #: (endpoint, message id) -> the latest due time (epoch ms) of a message a record applied to, and of the record.
    applied_until: dict[tuple[str, str], int] = field(default_factory=dict)


#: The most ids one partition remembers (about 120 bytes each); past it, a copy of an id met may be sent again.
SEEN_LIMIT = 200_000


class Admission(Enum):
    """What a message met in plan order is: the first of its id, the same message again, or a different one."""

    NEW = "new"
    SAME = "same"
    CONFLICT = "conflict"


class Seen:
    """The messages a partition met so far, in plan order, with their ``content_digest``: bounded.

    A message is its id and due time (docs/identity.md): two copies under one id and due time are the same message
    (a duplicate) or a conflict; under one id with other due times they are two messages. A bucket sent in pieces
    cannot wait for every copy before sending one: the first copy met in plan order is sent, a later copy of the same
    message is a duplicate, a different message under the id and due time goes to the error queue (``reason``).
    Messages written back into the bucket are marked (``written``), so a snapshot tells them from those handed on.
    """

    def __init__(self, limit: int = SEEN_LIMIT) -> None:
        self.limit = limit
        self._ids: dict[tuple[str, int], int] = {}
        #: The messages written back into the bucket (not handed on: they wait in another object).
        self._written: set[tuple[str, int]] = set()
        #: Messages not remembered because the limit was reached (a copy of one of them would be sent again).
        self.overflow = 0
        #: What was met or marked since the last snapshot or delta was written (``take_fresh``): the next delta.
        self._fresh: dict[tuple[str, int], None] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def admit(self, message: BucketMessage) -> tuple[Admission, int]:
        """Meet ``message``: its admission and the digest of the first message of its id and due time (an int)."""
        digest = int(content_digest(message), 16)
        key = (message.message_id, message.due_at_ms)
        first = self._ids.get(key)
        if first is None:
            if len(self._ids) < self.limit:
                self._ids[key] = digest
                self._fresh[key] = None
            else:
                self.overflow += 1
            return Admission.NEW, digest
        return (Admission.SAME if first == digest else Admission.CONFLICT), first

    def written_back(self, messages: Iterable[BucketMessage]) -> None:
        """Mark ``messages`` written back into the bucket."""
        keys = [(m.message_id, m.due_at_ms) for m in messages]
        self._written.update(keys)
        self._fresh.update((key, None) for key in keys if key in self._ids)

    def take_fresh(self) -> tuple[SeenEntry, ...]:
        """The entries met or marked since the last call (a delta), forgotten as fresh."""
        ids, written = self._ids, self._written
        fresh = tuple((key[0], key[1], ids[key], key in written) for key in self._fresh if key in ids)
        self._fresh = {}
        return fresh

    def entries(self) -> tuple[SeenEntry, ...]:
        """What was met, for a snapshot (``timebuckets/seen.py``)."""
        written = self._written
        return tuple((i, due, digest, (i, due) in written) for (i, due), digest in self._ids.items())

    def load(self, entries: Iterable[SeenEntry], *, handed_on_only: bool = False) -> int:
        """Meet again what a snapshot holds (``handed_on_only``: not the messages written back); how many."""
        loaded = 0
        for message_id, due_ms, digest, written in entries:
            if handed_on_only and written:
                continue
            key = (message_id, due_ms)
            if key in self._ids:
                if written:  # a later delta marks one met before as written back
                    self._written.add(key)
                continue
            if len(self._ids) >= self.limit:
                self.overflow += 1
                continue
            self._ids[key] = digest
            if written:
                self._written.add(key)
            loaded += 1
        return loaded

    @staticmethod
    def reason(message: BucketMessage, first: int, key: str) -> str:
        """Why ``message`` (read in ``key``) is not delivered: a different message under its id was sent first."""
        return digest_conflict_reason(message.message_id, f"{first:016x}", content_digest(message), "", key)


def _first_sent(found: Found) -> tuple[bool, int, int, str]:
    sent = found.message.sent_at_ms
    return (sent is None, sent or 0, found.message.hops, found.key)


def _dedupe(found: Iterable[Found], plan: BucketPlan) -> list[BucketMessage]:
    """One message per id and due time (docs/identity.md): the first by (send time, object key); copies counted,
    conflicts rejected. Messages under one id with other due times are other messages: each is kept."""
    by_id: dict[tuple[str, int], list[Found]] = {}
    for item in found:
        by_id.setdefault((item.message.message_id, item.message.due_at_ms), []).append(item)
    unique: list[BucketMessage] = []
    for items in by_id.values():
        items.sort(key=_first_sent)
        winner = items[0].message
        unique.append(winner)
        for other in items[1:]:
            if same_message(winner, other.message):
                plan.duplicates += 1
            else:
                reason = conflict_reason(winner, other.message, items[0].key, other.key)
                plan.conflicts.append(Rejected(other.message, reason, other.key))
    return unique


def _apply(message: BucketMessage, lookup: Lookup | None, plan: BucketPlan) -> None:
    record = lookup(message.destination).get(message.message_id) if lookup is not None else None
    if record is None or not record.binds(from_epoch_ms(message.sent_at_ms)):
        plan.keep.append(message)
        return
    plan.applied.append(record)
    key = (record.endpoint, record.message_id)
    record_due = epoch_ms(record.due_at) if isinstance(record, Cancellation) and record.due_at is not None else 0
    plan.applied_until[key] = max(plan.applied_until.get(key, 0), message.due_at_ms, record_due)
    if isinstance(record, UnreadableRecord):
        plan.unusable.append(Rejected(message, record.problem()))
        return
    if record.kind is CancellationKind.CANCEL:
        plan.cancelled += 1
        return
    assert record.due_at is not None
    try:
        due_ms = epoch_ms(record.due_at)
        moved = replace(message, due_at_ms=due_ms, hops=message.hops + 1)  # validates the new due time
    except (InvalidMessageError, OverflowError, ValueError) as exc:
        reason = f"its reschedule record (to {record.due_at.isoformat()}) cannot be applied: {exc}"
        plan.unusable.append(Rejected(message, reason[:1024]))
        return
    if due_ms == message.due_at_ms:  # already moved by an earlier run whose record delete did not happen
        plan.keep.append(message)
        return
    plan.moved.append(moved)


def plan_bucket(found: Sequence[Found], lookup: Lookup | None = None) -> BucketPlan:
    """Dedupe ``found`` by id, then apply the cancel and reschedule records ``lookup`` gives."""
    plan = BucketPlan()
    for message in _dedupe(found, plan):
        _apply(message, lookup, plan)
    plan.keep.sort(key=lambda m: (m.due_at_ms, m.message_id))
    return plan
