"""Execute the hops: batched sends back to the ``-delay.fifo`` queue (plain or packed), to the destination, and to
the error queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...clock import Clock
from ...delivery import DELIVERY_HEADER, encode_delivery
from ...errors import DelayedDeliveryError, DestinationNotFoundError, TransientError
from ...headers import DELAY_SECONDS_ATTRIBUTE, FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION
from ...planning import HopAction
from ...settings import DelayedDeliverySettings
from ..errorqueue import DROPPED, Poison, full_form_problem, reduced_entry
from ..fifo_ids import deduplication_id
from ..packing import PackedMessage, content_fingerprint, envelope_attributes, envelope_body, envelope_id, pack
from ..settings import SqsSettings
from ..sqs import (
    MAX_ATTRIBUTES,
    EntryResult,
    QueueDirectory,
    QueueInfo,
    SendVerdict,
    classify_send,
    message_size,
    send_batches,
    valid_attribute_name,
)
from .plan import Ledger, MessagePlan, result_of
from .records import HopOutcome, ParsedMessage, RecordResult, seconds_text

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = ["Sending", "error_attributes"]


@dataclass(frozen=True, slots=True)
class Sending:
    """The SQS sends of one batch: hops in batches per queue, packed requeues, the error queue."""

    client: SQSClient
    directory: QueueDirectory
    settings: DelayedDeliverySettings
    sqs_settings: SqsSettings
    clock: Clock

    def _settle(
        self,
        queue: str,
        p: MessagePlan,
        error: DelayedDeliveryError | None,
        what: str,
        done: RecordResult,
        ledger: Ledger,
    ) -> None:
        """Apply one send result to ``p``'s message: its result, a poison reason, or ``FAILED``."""
        verdict = classify_send(error)
        if verdict is SendVerdict.OK:
            ledger.settle(p, done)
        elif verdict is SendVerdict.GONE:
            self.directory.forget(queue)
            ledger.refuse(p, f"destination gone: {error}")
        elif verdict is SendVerdict.REFUSED:
            ledger.refuse(p, f"{queue!r} refused the {what}: {error}")
        else:
            assert error is not None
            ledger.fail(p, error)

    def send_hops(self, plans: list[MessagePlan], ledger: Ledger) -> None:
        """Send every planned hop not settled yet: the requeues by queue, then the forwards by queue."""
        requeue: dict[str, list[MessagePlan]] = {}
        forward: dict[str, list[MessagePlan]] = {}
        for p in plans:
            if p.index not in ledger.results and p.action in (HopAction.REQUEUE, HopAction.FORWARD):
                (requeue if p.action is HopAction.REQUEUE else forward).setdefault(p.queue, []).append(p)
        for queue, group in requeue.items():
            self.send(queue, group, HopOutcome.REQUEUED, ledger)
        for queue, group in forward.items():
            self.send(queue, group, HopOutcome.FORWARDED, ledger)

    def send_packed(self, queue: str, info: QueueInfo, items: list[MessagePlan], ledger: Ledger) -> list[MessagePlan]:
        """Requeue ``items`` in envelopes; returns the ones to send on their own (too big, or alone in a bin)."""
        owner: dict[int, MessagePlan] = {}
        messages: list[PackedMessage] = []
        for p in items:
            w = p.message
            m = PackedMessage(w.message_id, w.hop + 1, w.remaining_ms, w.body, w.attributes, w.sent_ms)
            owner[id(m)] = p
            messages.append(m)
        envelopes, alone = pack(messages, min(self.sqs_settings.pack_bytes, info.max_message_size))
        if not envelopes:
            return items
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        for index, envelope in enumerate(envelopes):
            eid = envelope_id(envelope)
            entries.append(
                {
                    "Id": str(index),
                    "MessageBody": envelope_body(envelope),
                    "MessageAttributes": envelope_attributes(),
                    "MessageGroupId": eid,
                    "MessageDeduplicationId": eid,
                }
            )
        results = send_batches(self.client, info.url, entries, what=f"envelope to {queue!r}")
        for entry, envelope in zip(entries, envelopes, strict=True):
            error = results[entry["Id"]].error
            for m in envelope:
                p = owner[id(m)]
                done = result_of(
                    p.message, HopOutcome.REQUEUED, p.message.hop + 1, envelope_id=entry["MessageDeduplicationId"]
                )
                self._settle(queue, p, error, "envelope", done, ledger)
        return [owner[id(m)] for m in alone]

    def send(self, queue: str, items: list[MessagePlan], outcome: HopOutcome, ledger: Ledger) -> None:
        """Send one hop for ``items`` to ``queue`` in batches; poison ones get a reason instead of a result."""
        try:
            info = self.directory.get(queue)
        except DestinationNotFoundError as exc:
            for p in items:
                ledger.refuse(p, f"destination gone: {exc}")
            return
        except DelayedDeliveryError as exc:
            for p in items:
                ledger.fail(p, exc)
            return
        if outcome is HopOutcome.REQUEUED and self.sqs_settings.pack_bytes and len(items) >= 2:
            items = self.send_packed(queue, info, items, ledger)
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        sendable: list[MessagePlan] = []
        for index, p in enumerate(items):
            entry = self._hop_entry(str(index), p.message, outcome)
            size = message_size(p.message.body, entry.get("MessageAttributes", {}))
            if size > info.max_message_size:
                ledger.refuse(p, f"body too large: {size:,} bytes, {queue!r} accepts at most {info.max_message_size:,}")
                continue
            entries.append(entry)
            sendable.append(p)
        results = send_batches(self.client, info.url, entries, what=f"{outcome.value} to {queue!r}")
        for entry, p in zip(entries, sendable, strict=True):
            done = result_of(p.message, outcome, p.message.hop + 1)
            self._settle(queue, p, results[entry["Id"]].error, "message", done, ledger)

    def _hop_entry(self, entry_id: str, w: ParsedMessage, outcome: HopOutcome) -> SendMessageBatchRequestEntryTypeDef:
        """The batch entry of one hop: back to the FIFO queue with the control attribute, or to the destination."""
        assert w.remaining is not None
        entry: SendMessageBatchRequestEntryTypeDef = {"Id": entry_id, "MessageBody": w.body}
        if outcome is HopOutcome.REQUEUED:
            entry["MessageAttributes"] = {
                **w.attributes,
                DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": seconds_text(w.remaining_ms)},
            }
            entry["MessageGroupId"] = w.message_id
            fingerprint = content_fingerprint(w.body, w.attributes)
            entry["MessageDeduplicationId"] = deduplication_id(w.message_id, w.hop + 1, fingerprint, w.sent_ms)
        else:
            attributes = dict(w.attributes)
            if len(attributes) < MAX_ATTRIBUTES:  # the delivery header for the consumer, when a slot and bytes are free
                value = encode_delivery(
                    message_id=w.message_id,
                    due_ms=w.received_ms + w.decision_ms,
                    sent_ms=w.sent_ms,
                    hops=w.hop + 1,
                    route="fifo",
                )
                delivery: MessageAttributeValueTypeDef = {"DataType": "String", "StringValue": value}
                limit = self.directory.get(w.source.destination).max_message_size
                if message_size(w.body, {**attributes, DELIVERY_HEADER: delivery}) <= limit:
                    attributes[DELIVERY_HEADER] = delivery
            if attributes:
                entry["MessageAttributes"] = attributes
            entry["DelaySeconds"] = min(w.remaining, self.sqs_settings.max_native_delay)  # a skewed local clock
        return entry

    def to_error_queue(self, poison: list[MessagePlan], ledger: Ledger) -> None:
        """Send poison messages (each with its reason) to the error queue with the reason headers.

        What the error queue refuses for good (checked before sending: text SQS refuses, too large; or refused)
        goes in reduced form (``errorqueue``); refused even so, it is dropped with its reason, never retried.
        """
        try:
            info = self.directory.get(self.settings.error_queue)
        except DelayedDeliveryError as exc:
            error = exc if isinstance(exc, TransientError) else TransientError(f"error queue unusable: {exc}")
            for p in poison:
                ledger.fail(p, error)
            return
        failed_at = self.clock.now().isoformat()
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        reduced: set[str] = set()
        for index, p in enumerate(poison):
            w, attributes = p.message, error_attributes(p.message, failed_at)
            why = full_form_problem(w.body, attributes, info.max_message_size)
            if why is not None:
                entries.append(reduced_entry(str(index), _poison(w), failed_at, info.max_message_size, why))
                reduced.add(str(index))
            else:
                entries.append(
                    {"Id": str(index), "MessageBody": w.body or "(empty body)", "MessageAttributes": attributes}
                )
        results = send_batches(self.client, info.url, entries, what=f"error queue {info.name!r}")
        self._error_queue_retries(info, entries, poison, reduced, results, failed_at)
        for entry, p in zip(entries, poison, strict=True):
            problem = results[entry["Id"]].error
            if problem is None:
                ledger.settle(p, result_of(p.message, HopOutcome.ERROR_QUEUE, p.message.hop, reason=p.message.reason))
            elif isinstance(problem, TransientError):
                ledger.fail(p, problem)
            else:  # refused for good even reduced: retrying would only deliver its neighbours again
                reason = f"{DROPPED} ({problem}); {p.message.reason}"
                ledger.settle(p, result_of(p.message, HopOutcome.ERROR_QUEUE, p.message.hop, reason=reason))

    def _error_queue_retries(
        self,
        info: QueueInfo,
        entries: list[SendMessageBatchRequestEntryTypeDef],
        poison: list[MessagePlan],
        reduced: set[str],
        results: dict[str, EntryResult],
        failed_at: str,
    ) -> None:
        """Send again what the error queue refused for good: without the user's attributes, then reduced."""
        what = f"error queue {info.name!r}"

        def refused() -> list[tuple[SendMessageBatchRequestEntryTypeDef, ParsedMessage]]:
            return [
                (entry, p.message)
                for entry, p in zip(entries, poison, strict=True)
                if results[entry["Id"]].error is not None
                and not isinstance(results[entry["Id"]].error, TransientError)
                and entry["Id"] not in reduced
            ]

        # A poison record's own attributes may be what SQS refuses: send those again with only our headers.
        bare: list[SendMessageBatchRequestEntryTypeDef] = [
            {
                "Id": f"bare-{entry['Id']}",
                "MessageBody": entry["MessageBody"],
                "MessageAttributes": error_attributes(w, failed_at, keep_user_attributes=False),
            }
            for entry, w in refused()
            if w.attributes
        ]
        if bare:
            retried = send_batches(self.client, info.url, bare, what=what)
            for again in bare:
                results[again["Id"].removeprefix("bare-")] = retried[again["Id"]]
        still = refused()
        if still:
            forms = [
                reduced_entry(
                    f"reduced-{e['Id']}", _poison(w), failed_at, info.max_message_size, str(results[e["Id"]].error)
                )
                for e, w in still
            ]
            retried = send_batches(self.client, info.url, forms, what=what)
            for form in forms:
                results[form["Id"].removeprefix("reduced-")] = retried[form["Id"]]


def _poison(w: ParsedMessage) -> Poison:
    """``w`` as the error queue sees it."""
    return Poison(w.message_id, w.body, w.reason, w.source.destination)


def error_attributes(
    w: ParsedMessage, failed_at: str, *, keep_user_attributes: bool = True
) -> dict[str, MessageAttributeValueTypeDef]:
    """The user's attributes plus the reason headers, within SQS's 10-attribute limit (reason first)."""
    reason = w.reason or "unknown"
    if not keep_user_attributes:
        reason = f"{reason} (the record's own attributes were refused and dropped)"
    headers: list[tuple[str, str]] = [
        (FAILURE_REASON, reason[:1024]),
        (ORIGINAL_DESTINATION, w.source.destination),
        (FAILED_AT, failed_at),
    ]
    attributes = {k: v for k, v in w.attributes.items() if valid_attribute_name(k)} if keep_user_attributes else {}
    if keep_user_attributes and len(attributes) < len(w.attributes):
        headers[0] = (FAILURE_REASON, f"{reason} (attributes with names SQS refuses were dropped)"[:1024])
    while len(attributes) >= MAX_ATTRIBUTES:
        attributes.popitem()
    for name, value in headers:
        if len(attributes) < MAX_ATTRIBUTES:
            attributes[name] = {"DataType": "String", "StringValue": value}
    return attributes
