"""The timer's SQS sends: ready messages to their destination with ``DelaySeconds``, the rest to the error queue."""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ...clock import Clock
from ...delivery import DELIVERY_HEADER, encode_delivery
from ...durations import format_duration
from ...errors import (
    DelayedDeliveryError,
    DestinationNotFoundError,
    DestinationRefusedError,
    InvalidMessageError,
    TransientError,
)
from ...headers import BODY_ENCODING, FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION, is_reserved
from ...settings import DelayedDeliverySettings
from ...timebuckets.apply import Rejected
from ...timebuckets.format import BucketMessage
from ...timebuckets.wheel import DispatchWindow
from ..errorqueue import REDUCED_MAX_BYTES, reduced_body, sqs_safe
from ..release_calendar import ReleaseCalendar
from ..sqs import (
    MAX_ATTRIBUTES,
    MAX_BATCH_ENTRIES,
    EntryResult,
    QueueDirectory,
    QueueInfo,
    SendVerdict,
    classify_send,
    message_size,
    normalize_attributes,
    send_batches,
    sqs_text_problem,
    valid_attribute_name,
)
from .config import DEFAULT_REFUSED_RETRY_SECONDS, DEFAULT_SEND_PHASE_MS, TierSettings, outside_reason

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = [
    "DispatchOutcome",
    "ErrorQueueOutcome",
    "Notice",
    "TimerSqs",
    "body_text",
    "give_up_refused",
    "refused_reason",
    "send_waves",
]

_Attributes = dict[str, "MessageAttributeValueTypeDef"]


@dataclass(frozen=True, slots=True)
class Notice:
    """An error-queue entry that is not a whole message: a line or an object that could not be read."""

    body: str
    reason: str
    destination: str = ""
    #: The object the notice is about (kept when the notice cannot be sent).
    key: str = ""
    #: A shorter body, sent when the error queue refuses ``body`` (empty: ``body`` again).
    reduced: str = ""


@dataclass(slots=True)
class DispatchOutcome:
    """What became of the messages of one dispatch."""

    sent: list[BucketMessage] = field(default_factory=list)
    #: Not sent for a passing reason (throttling, an unreachable queue): written again, sent by a later run.
    retry: list[BucketMessage] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    #: Messages a destination refused (access denied, its key): retried within the bound, then rejected.
    refused: int = 0
    #: Of those, the ones past the bound: rejected to the error queue with the reason.
    refused_given_up: int = 0
    #: Release control: per message sent to a capped destination, the seconds its release slot added.
    release_lags: list[float] = field(default_factory=list)
    #: Release control: messages held back, their destination's slots full up to 900 s ahead (their count, and the
    #: messages: the caller writes them into the destination's held area, ``held.py``).
    release_held: int = 0
    held: list[BucketMessage] = field(default_factory=list)

    def add(self, other: DispatchOutcome) -> None:
        """Count ``other`` in too (a dispatch sent in parts)."""
        self.sent += other.sent
        self.retry += other.retry
        self.rejected += other.rejected
        self.refused += other.refused
        self.refused_given_up += other.refused_given_up
        self.release_lags += other.release_lags
        self.release_held += other.release_held
        self.held += other.held


@dataclass(slots=True)
class ErrorQueueOutcome:
    """What became of the error-queue entries: sent, to retry later, or dropped (refused even in reduced form)."""

    sent: int = 0
    retry: list[Rejected | Notice] = field(default_factory=list)
    dropped: list[Rejected | Notice] = field(default_factory=list)


def give_up_refused(message: BucketMessage, now: datetime, retry_seconds: int) -> bool:
    """Whether a message its destination refuses has been retried long enough: more than ``retry_seconds`` past due."""
    return (now - message.due_at).total_seconds() > retry_seconds


def refused_reason(destination: str, error: DelayedDeliveryError, retry_seconds: int) -> str:
    """The reason a refused message goes to the error queue."""
    return (
        f"{destination!r} refused the timer for more than {format_duration(retry_seconds)} past its due time "
        f"(bucket_refused_retry_seconds): {error}"
    )


def body_text(body: bytes) -> str | None:
    """The body as SQS text, or ``None`` when it is not UTF-8 text SQS accepts."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if sqs_text_problem(text) is None else None


def send_waves(
    messages: Sequence[BucketMessage], start: datetime, phase_ms: int
) -> list[tuple[timedelta, list[BucketMessage]]]:
    """``messages`` in waves of (offset from ``start``, messages), earliest first.

    A message due ``x`` seconds after ``start`` goes at the first step of ``phase_ms`` after ``x``'s fractional part
    has passed, when it is a whole number of seconds (less at most a step) from due: ``DelaySeconds`` rounded up
    then adds at most a step. Due, overdue, on a whole second, or ``phase_ms`` 0: at once.
    """
    waves: dict[int, list[BucketMessage]] = {}
    for message in messages:
        # In microseconds, as the clock reads: floored to milliseconds, a run starting at hh:mm:ss.9996 saw a message
        # due on a whole second 5.0004 s away as 5 s away, sent it at once, and it was ~1 s late (#31).
        remaining_us = (message.due_at - start) // timedelta(microseconds=1)
        fraction = remaining_us % 1_000_000
        step = 0 if phase_ms <= 0 or remaining_us <= 0 or fraction == 0 else fraction // (phase_ms * 1000) + 1
        waves.setdefault(step, []).append(message)
    return [(timedelta(milliseconds=step * phase_ms), waves[step]) for step in sorted(waves)]


class TimerSqs:
    """Sends for one timer: a queue directory (URLs cached), the settings and the clock for the failure time."""

    def __init__(
        self,
        client: SQSClient,
        settings: DelayedDeliverySettings,
        clock: Clock,
        directory: QueueDirectory | None = None,
        *,
        send_phase_ms: int = DEFAULT_SEND_PHASE_MS,
        refused_retry_seconds: int = DEFAULT_REFUSED_RETRY_SECONDS,
        destinations: Collection[str] | None = None,
        send_threads: int = 1,
        release: ReleaseCalendar | None = None,
    ) -> None:
        self.client = client
        #: Release control (``release_rates``): the shared calendar capped destinations' slots come from.
        self.release = release
        self.settings = settings
        #: The send waves' step (``bucket_send_phase_ms``, ``send_waves``).
        self.send_phase_ms = send_phase_ms
        #: How long past its due time a refused message is retried (``bucket_refused_retry_seconds``).
        self.refused_retry_seconds = refused_retry_seconds
        #: The queues the tier may deliver to (``None``: any): a message for another goes to the error queue.
        self.destinations = frozenset(destinations) if destinations is not None else None
        self.clock = clock
        self.directory = directory or QueueDirectory(client)
        #: SendMessageBatch calls kept in flight at once for one destination's messages.
        self.send_threads = max(1, send_threads)

    @classmethod
    def for_tier(
        cls,
        client: SQSClient,
        settings: DelayedDeliverySettings,
        clock: Clock,
        tier: TierSettings,
        *,
        waves: bool = True,
        destinations: Collection[str] | None = None,
        release: ReleaseCalendar | None = None,
    ) -> TimerSqs:
        """An engine's send path, each setting read from ``tier``; ``waves`` False sends at once (the workers: a wave
        waits up to a second, which each piece would pay again)."""
        return cls(
            client,
            settings,
            clock,
            send_phase_ms=tier.bucket_send_phase_ms if waves else 0,
            refused_retry_seconds=tier.bucket_refused_retry_seconds,
            destinations=destinations,
            send_threads=tier.bucket_send_threads,
            release=release,
        )

    def dispatch(self, messages: Sequence[BucketMessage], window: DispatchWindow) -> DispatchOutcome:
        """Send ``messages`` to their destinations with ``DelaySeconds`` the remainder at the moment of the send.

        Sends go in waves (``send_waves``): each message when its due time is a whole number of seconds away, within
        ``bucket_send_phase_ms``, so the whole-second rounding adds at most that much lateness.
        """
        outcome = DispatchOutcome()
        start = self.clock.now()
        # A capped destination's messages take release slots (whole seconds) in due order, all at once: split into
        # waves, a later-due message of an earlier wave took the slot of an earlier-due one of a later wave (#31).
        capped = [m for m in messages if self.release is not None and self.release.capped(m.destination)]
        free = [m for m in messages if self.release is None or not self.release.capped(m.destination)]
        waves = send_waves(free, start, self.send_phase_ms)
        if capped:
            first = waves.pop(0)[1] if waves and not waves[0][0] else []
            waves = [(timedelta(0), [*capped, *first]), *waves]
        for offset, wave in waves:
            wait = (start + offset - self.clock.now()).total_seconds()
            if wait > 0:
                self.clock.sleep(wait)
            by_destination: dict[str, list[BucketMessage]] = {}
            for message in wave:
                by_destination.setdefault(message.destination, []).append(message)
            for destination, group in by_destination.items():
                # The clock is read per destination: a wave's earlier sends must not make its later ones late.
                now = DispatchWindow(max(self.clock.now(), window.now), window.last)
                self._dispatch_to(destination, group, now, outcome)
        return outcome

    def _dispatch_to(
        self, destination: str, group: list[BucketMessage], window: DispatchWindow, outcome: DispatchOutcome
    ) -> None:
        if destination.endswith(".fifo"):
            reason = f"{destination!r} is a FIFO queue: it takes no per-message DelaySeconds, so it cannot be timed"
            outcome.rejected.extend(Rejected(m, reason) for m in group)
            return
        if self.destinations is not None and destination not in self.destinations:
            outcome.rejected.extend(Rejected(m, outside_reason(destination)) for m in group)
            return
        try:
            info = self.directory.get(destination)
        except DestinationNotFoundError as exc:
            outcome.rejected.extend(Rejected(m, f"destination gone: {exc}") for m in group)
            return
        except DestinationRefusedError as exc:
            self._refused(destination, group, exc, window, outcome)
            return
        except DelayedDeliveryError:
            outcome.retry.extend(group)
            return
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        sendable: list[BucketMessage] = []
        for message in group:
            entry = self._entry(str(len(entries)), message, window, info)
            if isinstance(entry, str):
                outcome.rejected.append(Rejected(message, entry))
            else:
                entries.append(entry)
                sendable.append(message)
        lags = self._place(destination, entries, sendable, window, outcome)
        results = self._send(info.url, entries, f"dispatch to {destination!r}")
        for entry, message in zip(entries, sendable, strict=True):
            error = results[entry["Id"]].error
            verdict = classify_send(error)
            if isinstance(error, DestinationRefusedError):
                self._refused(destination, [message], error, window, outcome)
            elif verdict is SendVerdict.OK:
                outcome.sent.append(message)
                if entry["Id"] in lags:
                    outcome.release_lags.append(lags[entry["Id"]])
            elif verdict is SendVerdict.RETRY:
                outcome.retry.append(message)
            else:
                if verdict is SendVerdict.GONE:
                    self.directory.forget(destination)
                outcome.rejected.append(Rejected(message, f"{destination!r} refused the message: {error}"))

    def _place(
        self,
        destination: str,
        entries: list[SendMessageBatchRequestEntryTypeDef],
        sendable: list[BucketMessage],
        window: DispatchWindow,
        outcome: DispatchOutcome,
    ) -> dict[str, float]:
        """Each entry's ``DelaySeconds`` set to its release slot (the calendar the FIFO route shares), in place; a
        message with no slot within 900 s is held (``held``: its destination's held area), and every one stays in
        its bucket for a later run (``retry``) when the calendar cannot be reached: nothing is dropped, due order
        kept. Returns each placed entry's release lag."""
        lags: dict[str, float] = {}
        if self.release is None or not self.release.capped(destination) or not entries:
            return lags
        now_ms = int(window.now.timestamp() * 1000)
        try:
            placed = self.release.place(destination, [m.due_at_ms for m in sendable], now_ms)
        except DelayedDeliveryError:
            outcome.retry.extend(sendable)
            entries.clear()
            sendable.clear()
            return lags
        kept: list[SendMessageBatchRequestEntryTypeDef] = []
        kept_messages: list[BucketMessage] = []
        for entry, message, where in zip(entries, sendable, placed, strict=True):
            if where is None:
                outcome.held.append(message)
                outcome.release_held += 1
                continue
            entry["DelaySeconds"] = where.delay_seconds
            lags[entry["Id"]] = where.lag
            kept.append(entry)
            kept_messages.append(message)
        entries[:] = kept
        sendable[:] = kept_messages
        return lags

    def _refused(
        self,
        destination: str,
        messages: Sequence[BucketMessage],
        error: DestinationRefusedError,
        window: DispatchWindow,
        outcome: DispatchOutcome,
    ) -> None:
        """Messages ``destination`` refused: retried until ``refused_retry_seconds`` past their due time, then given
        up to the error queue with the reason (an operator may fix access in the meantime; not retried for ever)."""
        outcome.refused += len(messages)
        for message in messages:
            if give_up_refused(message, window.now, self.refused_retry_seconds):
                outcome.refused_given_up += 1
                outcome.rejected.append(
                    Rejected(message, refused_reason(destination, error, self.refused_retry_seconds))
                )
            else:
                outcome.retry.append(message)

    def _send(self, url: str, entries: list[SendMessageBatchRequestEntryTypeDef], what: str) -> dict[str, EntryResult]:
        """``send_batches``, cut into up to ``send_threads`` runs of whole batches sent side by side."""
        runs = min(self.send_threads, -(-len(entries) // MAX_BATCH_ENTRIES))
        if runs <= 1:
            return send_batches(self.client, url, entries, what=what)
        per = -(-len(entries) // runs // MAX_BATCH_ENTRIES) * MAX_BATCH_ENTRIES
        cuts = [entries[start : start + per] for start in range(0, len(entries), per)]
        results: dict[str, EntryResult] = {}
        with ThreadPoolExecutor(max_workers=len(cuts), thread_name_prefix="dd-send") as pool:
            for part in pool.map(lambda cut: send_batches(self.client, url, cut, what=what), cuts):
                results.update(part)
        return results

    def _entry(
        self, entry_id: str, message: BucketMessage, window: DispatchWindow, info: QueueInfo
    ) -> SendMessageBatchRequestEntryTypeDef | str:
        """The batch entry for ``message``, or why it cannot be sent."""
        text = body_text(message.body)
        if text is None:
            return "the body is not UTF-8 text SQS accepts"
        try:
            attributes: _Attributes = normalize_attributes(message.attributes)
        except InvalidMessageError as exc:  # reserved names, text SQS refuses: objects are written by anyone
            return f"the message's attributes cannot be sent: {exc}"
        if len(attributes) < MAX_ATTRIBUTES:  # the delivery header, when a slot and the bytes are free
            value = encode_delivery(
                message_id=message.message_id,
                due_ms=message.due_at_ms,
                sent_ms=message.sent_at_ms,
                hops=message.hops + 1,
                route="buckets",
            )
            header: MessageAttributeValueTypeDef = {"DataType": "String", "StringValue": value}
            if message_size(text, {**attributes, DELIVERY_HEADER: header}) <= info.max_message_size:
                attributes[DELIVERY_HEADER] = header
        size = message_size(text, attributes)
        if size > info.max_message_size:
            return f"{size:,} bytes, {info.name!r} accepts at most {info.max_message_size:,}"
        entry: SendMessageBatchRequestEntryTypeDef = {
            "Id": entry_id,
            "MessageBody": text,
            "DelaySeconds": window.delay_seconds(message.due_at),
        }
        if attributes:
            entry["MessageAttributes"] = attributes
        return entry

    def to_error_queue(self, items: Sequence[Rejected | Notice]) -> ErrorQueueOutcome:
        """Send ``items`` to the error queue with the reason headers; what it refuses goes once more in reduced form."""
        outcome = ErrorQueueOutcome()
        if not items:
            return outcome
        try:
            info = self.directory.get(self.settings.error_queue)
        except DelayedDeliveryError:
            outcome.retry.extend(items)
            return outcome
        failed_at = self.clock.now().isoformat()
        refused = self._send_errors(items, info, failed_at, outcome, reduced=False)
        if refused:  # once more, reduced to id, reason and body; refused again, dropped
            outcome.dropped.extend(self._send_errors(refused, info, failed_at, outcome, reduced=True))
        return outcome

    def _send_errors(
        self,
        items: Sequence[Rejected | Notice],
        info: QueueInfo,
        failed_at: str,
        outcome: ErrorQueueOutcome,
        *,
        reduced: bool,
    ) -> list[Rejected | Notice]:
        """Send ``items`` to the error queue (counted in ``outcome``); return the ones it refused for good."""
        entries = [self._error_entry(str(n), item, failed_at, info, reduced=reduced) for n, item in enumerate(items)]
        results = send_batches(self.client, info.url, entries, what=f"error queue {info.name!r}")
        refused: list[Rejected | Notice] = []
        for entry, item in zip(entries, items, strict=True):
            error = results[entry["Id"]].error
            if error is None:
                outcome.sent += 1
            elif isinstance(error, TransientError):
                outcome.retry.append(item)
            else:
                refused.append(item)
        return refused

    def _error_entry(
        self, entry_id: str, item: Rejected | Notice, failed_at: str, info: QueueInfo, *, reduced: bool
    ) -> SendMessageBatchRequestEntryTypeDef:
        if isinstance(item, Notice):
            headers = _reason_headers(item.reason, item.destination, failed_at)
            body = item.body
            if item.reduced and (reduced or message_size(body, headers) > info.max_message_size):
                body = item.reduced
            return {"Id": entry_id, "MessageBody": body, "MessageAttributes": headers}
        message = item.message
        text = body_text(message.body)
        attributes = {} if reduced else _user_attributes(message.attributes)
        headers = _reason_headers(item.reason, message.destination, failed_at)
        room = MAX_ATTRIBUTES - len(headers) - (1 if text is None else 0)
        while len(attributes) > room:
            attributes.popitem()
        attributes.update(headers)
        if text is None:
            attributes[BODY_ENCODING] = {"DataType": "String", "StringValue": "base64"}
            text = base64.b64encode(message.body).decode("ascii")
        if reduced or message_size(text or "(empty body)", attributes) > info.max_message_size:
            return {"Id": entry_id, "MessageBody": _reduced_body(item, info, headers), "MessageAttributes": headers}
        return {"Id": entry_id, "MessageBody": text or "(empty body)", "MessageAttributes": attributes}


def _user_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> _Attributes:
    """The attributes SQS would take on the error-queue copy (the others are left out)."""
    kept: _Attributes = {}
    for name, value in attributes.items():
        if valid_attribute_name(name) and not is_reserved(name):
            try:
                kept.update(normalize_attributes({name: value}))
            except InvalidMessageError:
                continue
    return kept


def _reason_headers(reason: str, destination: str, failed_at: str) -> _Attributes:
    headers: _Attributes = {FAILURE_REASON: {"DataType": "String", "StringValue": sqs_safe(reason)[:1024]}}
    if destination:
        headers[ORIGINAL_DESTINATION] = {"DataType": "String", "StringValue": destination}
    headers[FAILED_AT] = {"DataType": "String", "StringValue": failed_at}
    return headers


def _reduced_body(item: Rejected, info: QueueInfo, headers: _Attributes) -> str:
    """The reduced form (``aws/errorqueue.py``): the id, the reason and the body in base64, cut to fit the queue."""
    room = min(REDUCED_MAX_BYTES, info.max_message_size) - message_size("", headers)
    return reduced_body(item.message.message_id, sqs_safe(item.reason)[:1024], item.message.body, room)
