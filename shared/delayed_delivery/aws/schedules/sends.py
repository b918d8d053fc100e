"""The timer's sends: each occurrence straight to its destination with ``DelaySeconds`` (no tier hop).

An occurrence fires at most ``lead + 60 s`` (at most 900 s) after the pass that sends it, so SQS's own delay holds it
until its fire time; the delivery header says ``route=native``, its due time is the fire time and its id the
occurrence id. Release control applies as on the rest of the SQS route: a capped destination's occurrences take their
seconds from the shared DynamoDB calendar (``aws/release_calendar.py``) and are sent with ``DelaySeconds`` to their
slot; one with no slot within 900 s is not sent this pass (``HELD``) and goes again with the next.

Each occurrence gets a fate: ``SENT``; ``REJECTED`` (it cannot be delivered: a FIFO or missing destination, a body SQS
does not take, too large; sent to the error queue with the reason, so decided); ``RETRY`` (throttled, unreachable,
refused for less than ``refused_retry_seconds`` past its fire time, no release slot, or the error queue failed).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING

from ...clock import Clock
from ...delivery import DELIVERY_HEADER, encode_delivery, epoch_ms
from ...errors import DelayedDeliveryError, DestinationNotFoundError, DestinationRefusedError, InvalidMessageError
from ...headers import BODY_ENCODING, FAILED_AT, FAILURE_REASON, OCCURRENCE, ORIGINAL_DESTINATION, SCHEDULE_ID
from ...schedules.model import Schedule
from ...schedules.occurrences import Occurrence, utc_text
from ..errorqueue import REDUCED_MAX_BYTES, reduced_body, sqs_safe
from ..release_calendar import ReleaseCalendar, apply_placements
from ..sqs import (
    MAX_ATTRIBUTES,
    EntryResult,
    QueueDirectory,
    SendVerdict,
    classify_send,
    message_size,
    normalize_attributes,
    send_batches,
    send_batches_side_by_side,
    sqs_text_problem,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = ["MAX_DELAY_SECONDS", "Fate", "OccurrenceSender", "Outgoing", "SendOutcome", "check_sqs_template"]

#: SQS's longest ``DelaySeconds``.
MAX_DELAY_SECONDS = 900
#: Attributes an occurrence carries besides the template's: the schedule id, the occurrence, the delivery header.
_OWN_ATTRIBUTES = 3
_Attributes = dict[str, "MessageAttributeValueTypeDef"]


class Fate(Enum):
    """What became of one occurrence in a pass."""

    SENT = "sent"
    REJECTED = "rejected"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One occurrence to send, with the schedule whose template it carries."""

    occurrence: Occurrence
    schedule: Schedule

    @property
    def id(self) -> str:
        """The occurrence id (the message id)."""
        assert self.occurrence.id is not None
        return self.occurrence.id


@dataclass(slots=True)
class SendOutcome:
    """The fate of each occurrence (by id) and what the sends measured."""

    fates: dict[str, Fate] = field(default_factory=dict)
    #: Per occurrence sent: seconds between its fire time and when it becomes visible (0 when on time).
    lateness: list[float] = field(default_factory=list)
    release_lags: list[float] = field(default_factory=list)
    release_held: int = 0
    refused: int = 0
    to_error_queue: int = 0


def check_sqs_template(schedule: Schedule) -> None:
    """Refuse, in one line, a schedule whose occurrences SQS cannot take (checked when it is created on AWS)."""
    t = schedule.template
    if t.destination.endswith(".fifo"):
        raise InvalidMessageError(
            f"{t.destination!r} is a FIFO queue: it takes no per-message DelaySeconds, so occurrences cannot be timed"
        )
    try:
        text = t.body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessageError("an SQS body is text: the schedule's body is not UTF-8") from None
    if not text:
        raise InvalidMessageError("SQS rejects an empty body")
    problem = sqs_text_problem(text)
    if problem is not None:
        raise InvalidMessageError(f"the body {problem}")
    if len(t.headers) > MAX_ATTRIBUTES - _OWN_ATTRIBUTES:
        raise InvalidMessageError(
            f"{len(t.headers)} headers: at most {MAX_ATTRIBUTES - _OWN_ATTRIBUTES} fit beside the schedule id, the "
            "occurrence and the delivery header (SQS carries 10 attributes)"
        )
    normalize_attributes(dict(t.headers))


class OccurrenceSender:
    """Sends occurrences to SQS (queue URLs cached), the undeliverable ones to the error queue."""

    def __init__(
        self,
        client: SQSClient,
        error_queue: str,
        clock: Clock,
        *,
        directory: QueueDirectory | None = None,
        release: ReleaseCalendar | None = None,
        refused_retry_seconds: int = 3600,
        send_threads: int = 4,
    ) -> None:
        self.client = client
        self.error_queue = error_queue
        self.clock = clock
        self.directory = directory or QueueDirectory(client)
        self.release = release
        self.refused_retry_seconds = refused_retry_seconds
        self.send_threads = max(1, send_threads)

    def send(self, outgoing: Sequence[Outgoing]) -> SendOutcome:
        """Send ``outgoing`` (grouped by destination, in order); every occurrence gets a fate."""
        outcome = SendOutcome()
        groups: dict[str, list[Outgoing]] = {}
        for o in outgoing:
            groups.setdefault(o.schedule.template.destination, []).append(o)
        rejected: list[tuple[Outgoing, str]] = []
        for destination, group in groups.items():
            self._to(destination, group, outcome, rejected)
        if rejected:
            self._error_queue(rejected, outcome)
        return outcome

    def _to(
        self, destination: str, group: list[Outgoing], outcome: SendOutcome, rejected: list[tuple[Outgoing, str]]
    ) -> None:
        if destination.endswith(".fifo"):
            reason = f"{destination!r} is a FIFO queue: it takes no per-message DelaySeconds"
            rejected.extend((o, reason) for o in group)
            return
        try:
            info = self.directory.get(destination)
        except DestinationNotFoundError as exc:
            rejected.extend((o, f"destination gone: {exc}") for o in group)
            return
        except DestinationRefusedError as exc:
            self._refused(group, exc, outcome, rejected)
            return
        except DelayedDeliveryError:
            outcome.fates.update((o.id, Fate.RETRY) for o in group)
            return
        now = self.clock.now()
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        sendable: list[Outgoing] = []
        for o in group:
            entry = self._entry(str(len(entries)), o, now, info.max_message_size)
            if isinstance(entry, str):
                rejected.append((o, entry))
            elif entry["DelaySeconds"] > MAX_DELAY_SECONDS:
                outcome.fates[o.id] = Fate.RETRY  # fires too far ahead for SQS: the next pass sends it
            else:
                entries.append(entry)
                sendable.append(o)
        lags = self._place(destination, entries, sendable, now, outcome)
        results = self._send(info.url, entries, f"occurrences to {destination!r}")
        for entry, o in zip(entries, sendable, strict=True):
            error = results[entry["Id"]].error
            verdict = classify_send(error)
            if isinstance(error, DestinationRefusedError):
                self._refused([o], error, outcome, rejected)
            elif verdict is SendVerdict.OK:
                outcome.fates[o.id] = Fate.SENT
                visible = now.timestamp() + entry["DelaySeconds"]
                outcome.lateness.append(max(0.0, visible - o.occurrence.fire_at.timestamp()))
                if entry["Id"] in lags:
                    outcome.release_lags.append(lags[entry["Id"]])
            elif verdict is SendVerdict.RETRY:
                outcome.fates[o.id] = Fate.RETRY
            else:
                if verdict is SendVerdict.GONE:
                    self.directory.forget(destination)
                rejected.append((o, f"{destination!r} refused the occurrence: {error}"))

    def _entry(
        self, entry_id: str, o: Outgoing, now: datetime, max_size: int
    ) -> SendMessageBatchRequestEntryTypeDef | str:
        """The batch entry of an occurrence, or why it cannot be sent."""
        t = o.schedule.template
        try:
            text = t.body.decode("utf-8")
        except UnicodeDecodeError:
            return "the body is not UTF-8 text SQS accepts"
        if not text or sqs_text_problem(text) is not None:
            return "the body is not text SQS accepts"
        try:
            attributes: _Attributes = normalize_attributes(dict(t.headers))
        except InvalidMessageError as exc:
            return f"the schedule's headers cannot be sent: {exc}"
        if len(attributes) > MAX_ATTRIBUTES - _OWN_ATTRIBUTES:
            return f"{len(attributes)} headers: at most {MAX_ATTRIBUTES - _OWN_ATTRIBUTES} fit"
        fire = o.occurrence.fire_at
        attributes[SCHEDULE_ID] = {"DataType": "String", "StringValue": o.schedule.schedule_id}
        attributes[OCCURRENCE] = {"DataType": "String", "StringValue": utc_text(o.occurrence.nominal)}
        delivery = encode_delivery(message_id=o.id, due_ms=epoch_ms(fire), sent_ms=epoch_ms(now), hops=0,
                                   route="native")  # fmt: skip
        attributes[DELIVERY_HEADER] = {"DataType": "String", "StringValue": delivery}
        size = message_size(text, attributes)
        if size > max_size:
            return f"{size:,} bytes, the destination accepts at most {max_size:,}"
        delay = max(0, math.ceil((fire - now).total_seconds()))
        return {"Id": entry_id, "MessageBody": text, "MessageAttributes": attributes, "DelaySeconds": delay}

    def _place(
        self,
        destination: str,
        entries: list[SendMessageBatchRequestEntryTypeDef],
        sendable: list[Outgoing],
        now: datetime,
        outcome: SendOutcome,
    ) -> dict[str, float]:
        """Release control: each capped entry's ``DelaySeconds`` set to its slot, in place; no slot within 900 s
        (or the calendar unreachable): not sent this pass (``RETRY``). Returns each placed entry's release lag."""
        if self.release is None or not self.release.capped(destination) or not entries:
            return {}
        try:
            placed = self.release.place(destination, [epoch_ms(o.occurrence.fire_at) for o in sendable],
                                        epoch_ms(now))  # fmt: skip
        except DelayedDeliveryError:
            outcome.fates.update((o.id, Fate.RETRY) for o in sendable)
            entries.clear()
            sendable.clear()
            return {}
        lags, held = apply_placements(entries, sendable, placed)
        for o in held:
            outcome.fates[o.id] = Fate.RETRY
        outcome.release_held += len(held)
        return lags

    def _refused(
        self,
        group: Sequence[Outgoing],
        error: DestinationRefusedError,
        outcome: SendOutcome,
        rejected: list[tuple[Outgoing, str]],
    ) -> None:
        """A destination refused (access denied, its key): retried until ``refused_retry_seconds`` past the fire
        time, then to the error queue with the reason."""
        outcome.refused += len(group)
        now = self.clock.now()
        for o in group:
            if (now - o.occurrence.fire_at).total_seconds() > self.refused_retry_seconds:
                rejected.append((o, f"the destination refused it for {self.refused_retry_seconds} s: {error}"))
            else:
                outcome.fates[o.id] = Fate.RETRY

    def _send(self, url: str, entries: list[SendMessageBatchRequestEntryTypeDef], what: str) -> dict[str, EntryResult]:
        return send_batches_side_by_side(self.client, url, entries, what=what, threads=self.send_threads)

    def _error_queue(self, rejected: list[tuple[Outgoing, str]], outcome: SendOutcome) -> None:
        """Send what cannot be delivered to the error queue with the reason; those it does not take: ``RETRY``."""
        try:
            info = self.directory.get(self.error_queue)
        except DelayedDeliveryError:
            outcome.fates.update((o.id, Fate.RETRY) for o, _ in rejected)
            return
        failed_at = self.clock.now().isoformat()
        entries = [self._error_entry(str(n), o, reason, failed_at, info.max_message_size)
                   for n, (o, reason) in enumerate(rejected)]  # fmt: skip
        results = send_batches(self.client, info.url, entries, what=f"error queue {info.name!r}")
        for entry, (o, _) in zip(entries, rejected, strict=True):
            if results[entry["Id"]].ok:
                outcome.fates[o.id] = Fate.REJECTED
                outcome.to_error_queue += 1
            else:
                outcome.fates[o.id] = Fate.RETRY

    @staticmethod
    def _error_entry(
        entry_id: str, o: Outgoing, reason: str, failed_at: str, max_size: int
    ) -> SendMessageBatchRequestEntryTypeDef:
        """The error-queue entry: the body (base64 when SQS does not take it as text), the reason and the ids."""
        headers: _Attributes = {
            FAILURE_REASON: {"DataType": "String", "StringValue": sqs_safe(reason)[:1024]},
            ORIGINAL_DESTINATION: {"DataType": "String", "StringValue": sqs_safe(o.schedule.template.destination)},
            FAILED_AT: {"DataType": "String", "StringValue": failed_at},
            SCHEDULE_ID: {"DataType": "String", "StringValue": o.schedule.schedule_id},
            OCCURRENCE: {"DataType": "String", "StringValue": utc_text(o.occurrence.nominal)},
        }
        raw = o.schedule.template.body
        try:
            text: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if not text or sqs_text_problem(text) is not None:
            headers[BODY_ENCODING] = {"DataType": "String", "StringValue": "base64"}
            text = base64.b64encode(raw).decode("ascii") or "(empty body)"
        if message_size(text, headers) > max_size:
            headers.pop(BODY_ENCODING, None)
            room = min(REDUCED_MAX_BYTES, max_size) - message_size("", headers)
            text = reduced_body(o.id, sqs_safe(reason)[:1024], raw, room)
        return {"Id": entry_id, "MessageBody": text, "MessageAttributes": headers}
