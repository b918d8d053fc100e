"""Send delayed messages to SQS: native ``DelaySeconds`` up to the cap, the destination's ``-delay.fifo`` beyond.

Settings used: ``enabled`` of the core settings (off: delays over the cap are refused before anything is sent),
and of the SQS settings (``SqsSettings``) ``max_native_delay`` (900 s), ``fifo_queue_delay`` (900 s), ``pack_bytes``,
``long_delay_route`` and ``bucket_ingest_queue``. A sender built without ``settings`` or ``sqs_settings`` reads them
from the ``DELAYED_DELIVERY_*`` environment when it is built (``DelayedDeliverySettings.from_env``,
``SqsSettings.from_env``).

Guarantees:

* The destination later receives exactly the body and message attributes the caller sent, plus the delivery
  header ``DelayedDelivery.Delivery`` (docs/receiving.md) on every route: so a message carries at most 9 attributes
  of its own (SQS takes 10), and body + attributes must leave room for the header (``longest_delivery``: about 90
  bytes plus the escaped id). Names starting with ``DelayedDelivery.``, ``AWS.`` or ``Amazon.`` are refused.
* Every input is checked before the first request: a negative, NaN or 100-year-plus delay, a body or
  attribute set over the queue's own ``MaximumMessageSize`` (read from the queue), text SQS refuses
  (lone surrogates, U+FFFE/U+FFFF, control characters other than tab and newlines) in the body or an
  attribute, an unknown destination or delay queue, too many attributes. A bad batch sends nothing.
* Long delays use ``MessageGroupId`` = message id and ``MessageDeduplicationId`` = ``<id>:<fp>:0``, where
  ``fp`` is the content fingerprint (body and typed attributes): the same send repeated within SQS's 5-minute
  window is dropped, another message under the same id is not. Each hop of the requeue function uses
  ``<id>:<fp>.<first send time>:<hop>``, so a hop repeated within the window is dropped (docs/identity.md).

Packing (``pack_bytes`` > 0, the default 64 KiB): ``send_delayed_batch`` puts two or more long-delay messages
for the same destination into envelopes (``packing.py``, the requeue function's format and limits; at most
``pack_bytes`` and the delay queue's ``MaximumMessageSize``), each with the deduplication id
``pack-<sha256 of its "<id>:<fp>:0" lines>``. Packing is deterministic in the set of messages, so sending the same
batch again within 5 minutes repeats the same envelopes and FIFO drops the ones already accepted. A refused
envelope lists every message inside it in ``failures``; ``BatchSendResult.raise_for_failures`` turns them into
one error naming them. ``send_delayed`` (one message) never packs.

``long_delay_route`` (``auto`` by default: the cheaper route per delay, when the tier is deployed) may send delays
past the cap to the S3 time-bucket tier instead: its ingest queue, packed in ingest envelopes (``aws/tier/sender.py``,
docs/buckets.md); the receipt says ``buckets``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ..clock import Clock, SystemClock
from ..delivery import DELIVERY_HEADER, encode_delivery, epoch_ms, longest_delivery
from ..durations import Delay
from ..errors import (
    DelayedDeliveryError,
    DestinationNotFoundError,
    InvalidMessageError,
    batch_failure,
)
from ..headers import DELAY_SECONDS_ATTRIBUTE
from ..naming import sqs_delay_queue_name, validate_sqs_queue_name
from ..planning import SqsRoute, plan_sqs_delay
from ..settings import DelayedDeliverySettings
from .fifo_ids import deduplication_id
from .packing import (
    PackedMessage,
    content_fingerprint,
    envelope_attributes,
    envelope_body,
    envelope_id,
    pack,
)
from .settings import SqsSettings
from .sqs import (
    MAX_ATTRIBUTES,
    QueueDirectory,
    check_sqs_text,
    message_size,
    normalize_attributes,
    send_batches,
    translate_error,
)
from .tier.sender import BucketSend, BucketSendLeg

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = [
    "BatchSendResult",
    "DelayedSend",
    "SendReceipt",
    "SqsDelayedSender",
    "send_delayed",
]

_MESSAGE_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
#: User attributes a message may carry on every route: SQS's 10 less one for the delivery header.
_USER_ATTRIBUTES = MAX_ATTRIBUTES - 1


@dataclass(frozen=True, slots=True)
class DelayedSend:
    """One message for ``send_delayed_batch``."""

    destination: str
    body: str
    delay: Delay
    attributes: Mapping[str, Any] | None = None
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """What was sent: ``queue`` is the destination (native), its ``-delay.fifo`` queue or the tier's ingest queue."""

    message_id: str
    destination: str
    queue: str
    route: SqsRoute
    delay_seconds: int
    fifo_cycles: int
    sqs_message_id: str | None = None
    #: The envelope's deduplication id when the message travelled packed (``sqs_message_id`` is the envelope's).
    envelope_id: str | None = None


@dataclass(frozen=True, slots=True)
class BatchSendResult:
    """Receipts for accepted messages and the error for each refused one (keyed by message id)."""

    receipts: tuple[SendReceipt, ...]
    failures: Mapping[str, DelayedDeliveryError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every message was accepted."""
        return not self.failures

    def raise_for_failures(self) -> None:
        """Raise one error naming every refused message (``TransientError`` when any of them may be retried)."""
        if self.failures:
            raise batch_failure(self.failures, len(self.failures) + len(self.receipts))


@dataclass(frozen=True, slots=True)
class _Prepared:
    receipt: SendReceipt
    queue_url: str
    entry: SendMessageBatchRequestEntryTypeDef
    attributes: Mapping[str, MessageAttributeValueTypeDef]
    max_message_size: int


class SqsDelayedSender:
    """Sends delayed messages with one boto3 SQS client; queue URLs and size limits are cached."""

    def __init__(
        self,
        client: SQSClient,
        settings: DelayedDeliverySettings | None = None,
        *,
        sqs_settings: SqsSettings | None = None,
        directory: QueueDirectory | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        #: Without explicit settings the DELAYED_DELIVERY_* environment applies, read now (never at import).
        self.settings = settings if settings is not None else DelayedDeliverySettings.from_env(os.environ)
        self.sqs_settings = sqs_settings if sqs_settings is not None else SqsSettings.from_env(os.environ)
        self.directory = directory or QueueDirectory(client)
        self.clock = clock or SystemClock()
        #: Delays past the cap that ``long_delay_route`` sends to the time-bucket tier (aws/tier/sender.py).
        self.buckets = BucketSendLeg(client, self.sqs_settings, self.directory, self.clock)

    def send_delayed(
        self,
        destination: str,
        body: str,
        delay: Delay,
        *,
        attributes: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> SendReceipt:
        """Deliver ``body`` to the queue ``destination`` after ``delay`` (seconds, timedelta or e.g. ``"40d"``)."""
        prepared = self._prepare(DelayedSend(destination, body, delay, attributes, message_id), where="")
        if prepared.receipt.route is SqsRoute.BUCKETS:
            result = self.buckets.send([_bucket_send(prepared)])[prepared.receipt.message_id]
            if result.error is not None:
                raise result.error
            return _with_sqs_id(prepared.receipt, result.sqs_message_id)
        entry = prepared.entry
        kwargs: dict[str, Any] = {"QueueUrl": prepared.queue_url, "MessageBody": entry["MessageBody"]}
        for key in ("MessageAttributes", "DelaySeconds", "MessageGroupId", "MessageDeduplicationId"):
            if key in entry:
                kwargs[key] = entry[key]
        try:
            reply = self.client.send_message(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, f"sending to {prepared.receipt.queue!r}")
            self.directory.forget(prepared.receipt.queue)
            raise error from exc
        return _with_sqs_id(prepared.receipt, reply.get("MessageId"))

    def send_delayed_batch(self, messages: Iterable[DelayedSend]) -> BatchSendResult:
        """Send many messages with SendMessageBatch (≤10 entries and the payload limit per call).

        Every message is validated first; one invalid message raises and nothing is sent. Long delays to one
        destination travel packed in envelopes (see the module docstring). Refusals by SQS come back in
        ``failures`` (every message of a refused envelope); ``raise_for_failures`` raises them as one error.
        """
        prepared = [self._prepare(m, where=f"message {i}: ") for i, m in enumerate(messages)]
        seen: set[str] = set()
        for index, p in enumerate(prepared):
            if p.receipt.message_id in seen:
                raise InvalidMessageError(f"message id {p.receipt.message_id!r} appears twice in the batch")
            seen.add(p.receipt.message_id)
            p.entry["Id"] = str(index)
        by_queue: dict[str, list[_Prepared]] = {}
        for p in prepared:
            by_queue.setdefault(p.queue_url, []).append(p)
        receipts: list[SendReceipt] = []
        failures: dict[str, DelayedDeliveryError] = {}
        for url, group in by_queue.items():
            if group[0].receipt.route is SqsRoute.BUCKETS:
                sent = self.buckets.send([_bucket_send(p) for p in group])
                for p in group:
                    result = sent[p.receipt.message_id]
                    if result.error is not None:
                        failures[p.receipt.message_id] = result.error
                    else:
                        receipts.append(_with_sqs_id(p.receipt, result.sqs_message_id))
                continue
            entries = [p.entry for p in group]
            envelopes: dict[str, list[_Prepared]] = {}
            if self.sqs_settings.pack_bytes and len(group) >= 2 and group[0].receipt.route is SqsRoute.FIFO:
                entries, envelopes = self._pack(group)
            results = send_batches(self.client, url, entries, what=f"sending to {group[0].receipt.queue!r}")
            by_id = {p.entry["Id"]: p for p in group}
            for entry in entries:
                result = results[entry["Id"]]
                inside = envelopes.get(entry["Id"])
                owners = inside if inside is not None else [by_id[entry["Id"]]]
                for p in owners:
                    if result.error is not None:
                        failures[p.receipt.message_id] = result.error
                    else:
                        eid = entry.get("MessageDeduplicationId") if inside is not None else None
                        receipts.append(replace(p.receipt, sqs_message_id=result.sqs_message_id, envelope_id=eid))
            if any(isinstance(failures.get(p.receipt.message_id), DestinationNotFoundError) for p in group):
                self.directory.forget(group[0].receipt.queue)
        order = {p.receipt.message_id: i for i, p in enumerate(prepared)}
        receipts.sort(key=lambda r: order[r.message_id])
        return BatchSendResult(tuple(receipts), failures)

    def _pack(
        self, group: list[_Prepared]
    ) -> tuple[list[SendMessageBatchRequestEntryTypeDef], dict[str, list[_Prepared]]]:
        """Entries for one ``-delay.fifo`` queue: envelopes (keyed by entry id) plus the messages sent alone."""
        owner: dict[int, _Prepared] = {}
        packed: list[PackedMessage] = []
        for p in group:
            m = PackedMessage(
                p.receipt.message_id, 0, p.receipt.delay_seconds * 1000, p.entry["MessageBody"], p.attributes
            )
            owner[id(m)] = p
            packed.append(m)
        bins, alone = pack(packed, min(self.sqs_settings.pack_bytes, group[0].max_message_size))
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        envelopes: dict[str, list[_Prepared]] = {}
        for index, envelope in enumerate(bins):
            eid = envelope_id(envelope)
            entry_id = f"e{index}"
            entries.append(
                {
                    "Id": entry_id,
                    "MessageBody": envelope_body(envelope),
                    "MessageAttributes": envelope_attributes(),
                    "MessageGroupId": eid,
                    "MessageDeduplicationId": eid,
                }
            )
            envelopes[entry_id] = [owner[id(m)] for m in envelope]
        entries += [owner[id(m)].entry for m in alone]
        return entries, envelopes

    def _prepare(self, message: DelayedSend, *, where: str) -> _Prepared:
        """Validate one message and build its request entry; raises before anything is sent."""
        try:
            return self._prepare_unchecked(message)
        except DelayedDeliveryError as exc:
            if not where:
                raise
            raise type(exc)(f"{where}{exc}") from exc

    def _prepare_unchecked(self, message: DelayedSend) -> _Prepared:
        _check_body(message.body)
        validate_sqs_queue_name(message.destination)
        plan = plan_sqs_delay(
            message.delay,
            self.sqs_settings.max_native_delay,
            fifo_queue_delay=self.sqs_settings.fifo_queue_delay,
            unrestricted=self.settings.enabled,
        )
        message_id = _checked_message_id(message.message_id)
        attributes = normalize_attributes(message.attributes)
        route = plan.route
        if route is SqsRoute.FIFO and self.buckets.takes(plan.delay_seconds):
            route = SqsRoute.BUCKETS
        if len(attributes) > _USER_ATTRIBUTES:
            raise InvalidMessageError(
                f"{len(attributes)} message attributes: at most {_USER_ATTRIBUTES} fit. SQS carries 10 and the tenth "
                + ("carries the delay on the -delay.fifo queue, then " if route is SqsRoute.FIFO else "")
                + f"carries the delivery header ({DELIVERY_HEADER}), by which the receive helpers recognise "
                "duplicates (docs/receiving.md)"
            )
        queue_name = message.destination
        if route is SqsRoute.FIFO or message.destination.endswith(".fifo"):
            # A FIFO destination takes no per-message delay on either route: sqs_delay_queue_name refuses it.
            delay_queue_name = sqs_delay_queue_name(message.destination)
            queue_name = delay_queue_name if route is SqsRoute.FIFO else queue_name
        destination = self.directory.get(message.destination)
        header = _delivery_attribute(longest_delivery(message_id))
        size = message_size(message.body, {**attributes, **header})
        if size > destination.max_message_size:
            raise InvalidMessageError(
                f"message is {size:,} bytes (body + attributes + up to {message_size('', header):,} for the delivery "
                f"header) but queue {destination.name!r} accepts at most {destination.max_message_size:,} (its "
                "MaximumMessageSize)"
            )
        entry: SendMessageBatchRequestEntryTypeDef = {"Id": "0", "MessageBody": message.body}
        url, max_size = destination.url, destination.max_message_size
        if route is SqsRoute.FIFO:
            url, max_size = self._fifo_entry(entry, queue_name, attributes, message_id, plan.delay_seconds)
        elif route is SqsRoute.BUCKETS:
            send = BucketSend(message_id, message.destination, message.body, attributes, plan.delay_seconds)
            ingest = self.buckets.check(send)
            url, max_size, queue_name = ingest.url, ingest.max_message_size, ingest.name
        else:
            sent = epoch_ms(self.clock.now())
            value = encode_delivery(
                message_id=message_id, due_ms=sent + plan.delay_seconds * 1000, sent_ms=sent, hops=0, route="native"
            )
            entry["MessageAttributes"] = {**attributes, **_delivery_attribute(value)}
            entry["DelaySeconds"] = plan.delay_seconds
        cycles = plan.fifo_cycles if route is SqsRoute.FIFO else 0
        receipt = SendReceipt(message_id, message.destination, queue_name, route, plan.delay_seconds, cycles)
        return _Prepared(receipt, url, entry, attributes, max_size)

    def _fifo_entry(
        self,
        entry: SendMessageBatchRequestEntryTypeDef,
        queue_name: str,
        attributes: Mapping[str, MessageAttributeValueTypeDef],
        message_id: str,
        delay_seconds: int,
    ) -> tuple[str, int]:
        """Fill ``entry`` for the ``-delay.fifo`` queue; returns its URL and MaximumMessageSize."""
        delay_queue = self.directory.get(queue_name)
        control: dict[str, MessageAttributeValueTypeDef] = {
            DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": str(delay_seconds)}
        }
        fifo_attributes = {**attributes, **control}
        fifo_size = message_size(entry["MessageBody"], fifo_attributes)
        if fifo_size > delay_queue.max_message_size:
            raise InvalidMessageError(
                f"message is {fifo_size:,} bytes with its delay attribute but {queue_name!r} accepts at most "
                f"{delay_queue.max_message_size:,}"
            )
        entry["MessageAttributes"] = fifo_attributes
        entry["MessageGroupId"] = message_id
        fingerprint = content_fingerprint(entry["MessageBody"], attributes)
        entry["MessageDeduplicationId"] = deduplication_id(message_id, 0, fingerprint)
        return delay_queue.url, delay_queue.max_message_size


def _delivery_attribute(value: str) -> dict[str, MessageAttributeValueTypeDef]:
    return {DELIVERY_HEADER: {"DataType": "String", "StringValue": value}}


def _check_body(body: object) -> None:
    """An SQS body is non-empty text SQS accepts."""
    if not isinstance(body, str):
        raise InvalidMessageError(
            f"an SQS body is text: pass str, not {type(body).__name__} (e.g. base64-encode bytes)"
        )
    if not body:
        raise InvalidMessageError("SQS rejects an empty body")
    check_sqs_text("the body", body)


def _checked_message_id(message_id: str | None) -> str:
    """The given id (1-128 printable ASCII characters: it becomes the FIFO MessageGroupId) or a fresh UUID."""
    message_id = message_id if message_id is not None else str(uuid.uuid4())
    if not isinstance(message_id, str) or not _MESSAGE_ID.match(message_id):
        raise InvalidMessageError(
            f"message id {message_id!r}: use 1-128 printable ASCII characters without spaces "
            "(it becomes the FIFO MessageGroupId)"
        )
    return message_id


def _bucket_send(p: _Prepared) -> BucketSend:
    r = p.receipt
    return BucketSend(r.message_id, r.destination, p.entry["MessageBody"], p.attributes, r.delay_seconds)


def _with_sqs_id(receipt: SendReceipt, sqs_message_id: str | None) -> SendReceipt:
    return replace(receipt, sqs_message_id=sqs_message_id)


def send_delayed(
    client: SQSClient,
    destination: str,
    body: str,
    delay: Delay,
    *,
    attributes: Mapping[str, Any] | None = None,
    message_id: str | None = None,
    settings: DelayedDeliverySettings | None = None,
    sqs_settings: SqsSettings | None = None,
) -> SendReceipt:
    """One-off form of ``SqsDelayedSender.send_delayed`` (build a sender to reuse its queue cache)."""
    return SqsDelayedSender(client, settings, sqs_settings=sqs_settings).send_delayed(
        destination, body, delay, attributes=attributes, message_id=message_id
    )
