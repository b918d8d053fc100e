"""Envelope packing: many delayed messages on their way through a ``-delay.fifo`` queue in one FIFO message.

An envelope is a FIFO message with the attribute ``DelayedDelivery.Envelope`` = ``"1"`` (the format version)
and a compact JSON body::

    {"v":1,"m":[{"i":"<message id>","h":<hop>,"d":<remaining ms>,"b":"<body>","a":{"<name>":["String","s","x"]},
                 "s":<sent ms>}]}

Per inner message: ``i`` its id, ``h`` the hop it is on (as in its own dedup id ``<id>:<fp>:<h>``), ``d`` the
delay it still had when it was packed (ms; the envelope's broker timestamps tell how much of it has passed since),
``b`` its body, ``a`` its user attributes as ``[DataType, "s", text]`` or ``[DataType, "b", base64]``, and
``s`` (optional, from hop 1 on) when the message was first sent (epoch ms; readers without it ignore it).
The envelope's ``MessageGroupId`` and ``MessageDeduplicationId`` are ``pack-<sha256 of the sorted
"<id>:<fp>:<h>" lines>`` (``fp``: ``content_fingerprint``): the same messages on the same hops always give the
same id, so a repeated send is dropped by FIFO, and other content under the same ids gives another envelope.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..durations import MAX_DELAY
from ..errors import InvalidMessageError
from ..headers import HEADER_PREFIX
from ..jsonbounds import loads_bounded
from ..validation import is_whole
from .sqs import MAX_ATTRIBUTES, message_size, normalize_attributes, sqs_text_problem

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

__all__ = [
    "DEFAULT_PACK_BYTES",
    "ENVELOPE_ATTRIBUTE",
    "FINGERPRINT_CHARS",
    "MAX_ENVELOPE_CHARS",
    "MAX_ENVELOPE_ENTRIES",
    "MAX_HOP",
    "MAX_REMAINING_MS",
    "PACK_BYTES_ENV",
    "BadItem",
    "PackedMessage",
    "content_fingerprint",
    "decode_attribute_entries",
    "decode_envelope",
    "envelope_attributes",
    "envelope_body",
    "envelope_id",
    "pack",
]

#: Message attribute that marks a FIFO message as an envelope; its value is the format version.
ENVELOPE_ATTRIBUTE = HEADER_PREFIX + "Envelope"
_VERSION = 1
#: SQS bills each 64 KiB of a request's payload as one request: the default envelope size.
DEFAULT_PACK_BYTES = 65_536
#: Environment variable of the requeue function: envelope size in bytes (0 turns packing off).
PACK_BYTES_ENV = "DELAYED_DELIVERY_PACK_BYTES"

#: Most entries one envelope may carry. The requeue function handles up to 10 records per invocation within a
#: 30 s timeout; in the worst case every entry is due at once and goes out in SendMessageBatch calls of 10, so
#: 10 records x 500 entries = 500 calls, which fits the budget at the tens of milliseconds a call takes. The
#: packer fills envelopes by size, and only entries under ~130 bytes (64 KiB / 500) reach this count first.
MAX_ENVELOPE_ENTRIES = 500
#: Longest envelope body read: SQS's largest message (1 MiB).
MAX_ENVELOPE_CHARS = 1_048_576
#: Longest remaining delay an entry may carry: 100 years in milliseconds.
MAX_REMAINING_MS = int(MAX_DELAY.total_seconds()) * 1000
#: Latest send time an entry may carry (epoch ms, year 9999); another value is read as unknown.
MAX_SENT_MS = 253_402_300_799_999
#: Highest hop an entry may be on: more than 100 years of 1-second hops.
MAX_HOP = 2**32
#: Deepest JSON nesting read: an envelope nests 5 deep (object, list, entry, attributes, attribute).
_MAX_DEPTH = 16
#: Hex characters of the content fingerprint in deduplication ids (48 bits).
FINGERPRINT_CHARS = 12
_MESSAGE_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
_EMPTY = len(json.dumps({"v": _VERSION, "m": []}, separators=(",", ":")))


@dataclass(frozen=True, slots=True)
class PackedMessage:
    """One delayed message inside an envelope."""

    message_id: str
    hop: int
    remaining_ms: int
    body: str
    attributes: Mapping[str, MessageAttributeValueTypeDef]
    #: When the message was first sent (epoch ms), or ``None`` when unknown (packed by an older version).
    sent_ms: int | None = None


@dataclass(frozen=True, slots=True)
class BadItem:
    """An inner entry that cannot be read: it goes to the error queue alone, with ``reason``."""

    message_id: str
    body: str
    reason: str


def envelope_attributes() -> dict[str, MessageAttributeValueTypeDef]:
    """The marker attribute every envelope carries."""
    return {ENVELOPE_ATTRIBUTE: {"DataType": "String", "StringValue": str(_VERSION)}}


def _encode_attributes(attributes: Mapping[str, MessageAttributeValueTypeDef] | None) -> dict[str, list[str]]:
    """Attributes as ``{name: [DataType, "s", text] or [DataType, "b", base64]}``."""
    encoded: dict[str, list[str]] = {}
    for name, value in (attributes or {}).items():
        if "BinaryValue" in value:
            data = value["BinaryValue"]
            if not isinstance(data, bytes | bytearray):
                raise InvalidMessageError(f"attribute {name!r}: a binary value to pack must be bytes")
            encoded[name] = [value["DataType"], "b", base64.b64encode(data).decode("ascii")]
        else:
            encoded[name] = [value["DataType"], "s", str(value.get("StringValue", ""))]
    return encoded


def _encode(message: PackedMessage) -> dict[str, Any]:
    attributes = _encode_attributes(message.attributes)
    item: dict[str, Any] = {"i": message.message_id, "h": message.hop, "d": message.remaining_ms, "b": message.body}
    if attributes:
        item["a"] = attributes
    if message.sent_ms is not None:
        item["s"] = message.sent_ms
    return item


def content_fingerprint(body: str, attributes: Mapping[str, MessageAttributeValueTypeDef] | None) -> str:
    """The first 12 hex characters of SHA-256 over the body and the user attributes (by name, typed)."""
    encoded = _encode_attributes(attributes)
    canonical = json.dumps([body, sorted([name, *value] for name, value in encoded.items())], separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:FINGERPRINT_CHARS]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _safe_dumps(value: Any) -> str:
    """JSON in ASCII: a bad entry's text for the error queue, which SQS takes whatever the entry held."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def envelope_body(messages: Sequence[PackedMessage]) -> str:
    """The JSON body of an envelope holding ``messages``."""
    return _dumps({"v": _VERSION, "m": [_encode(m) for m in messages]})


def envelope_id(messages: Iterable[PackedMessage]) -> str:
    """``pack-<sha256>`` of the sorted ``<id>:<fp>:<hop>`` lines: group and deduplication id of the envelope."""
    lines = sorted(f"{m.message_id}:{content_fingerprint(m.body, m.attributes)}:{m.hop}" for m in messages)
    return "pack-" + hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def pack(messages: Sequence[PackedMessage], max_bytes: int) -> tuple[list[list[PackedMessage]], list[PackedMessage]]:
    """Split ``messages`` into envelopes of at most ``max_bytes`` (attribute included) in message-id order.

    Returns (envelopes with ≥ 2 messages, messages left to send alone: too big to share or alone in a bin).
    Sorting first makes the split depend only on the set of messages, so a repeated batch repeats its ids.
    """
    room = max_bytes - message_size("", envelope_attributes()) - _EMPTY
    bins: list[list[PackedMessage]] = []
    current: list[PackedMessage] = []
    used = 0
    alone: list[PackedMessage] = []
    for m in sorted(messages, key=lambda m: (m.message_id, m.hop)):
        size = len(_dumps(_encode(m)).encode("utf-8")) + 1  # the separating comma
        if size > room:
            alone.append(m)
            continue
        if current and (used + size > room or len(current) == MAX_ENVELOPE_ENTRIES):
            bins.append(current)
            current, used = [], 0
        current.append(m)
        used += size
    if current:
        bins.append(current)
    envelopes = [b for b in bins if len(b) >= 2]
    alone += [b[0] for b in bins if len(b) == 1]
    return envelopes, alone


def decode_envelope(body: str) -> list[PackedMessage | BadItem]:
    """Read an envelope body; raises ``InvalidMessageError`` when the envelope itself is unreadable or too big.

    Bounds (see docs/aws.md): at most ``MAX_ENVELOPE_CHARS`` characters nested at most ``_MAX_DEPTH`` deep and at
    most ``MAX_ENVELOPE_ENTRIES`` entries, else the whole envelope is poison. An entry with a reserved attribute
    name (an envelope inside an envelope, a forged ``DelayedDelivery.*`` control attribute), a remaining delay over
    100 years, a hop over ``MAX_HOP`` or text SQS refuses is a ``BadItem`` with the reason.
    """
    try:
        document = loads_bounded(body, what="malformed envelope", max_chars=MAX_ENVELOPE_CHARS, max_depth=_MAX_DEPTH)
    except InvalidMessageError as exc:
        raise InvalidMessageError(str(exc)) from exc
    if not isinstance(document, dict) or document.get("v") != _VERSION:
        raise InvalidMessageError(f"malformed envelope: expected an object with version {_VERSION}")
    items = document.get("m")
    if not isinstance(items, list) or not items:
        raise InvalidMessageError("malformed envelope: no messages")
    if len(items) > MAX_ENVELOPE_ENTRIES:
        raise InvalidMessageError(
            f"malformed envelope: {len(items)} entries, more than {MAX_ENVELOPE_ENTRIES} (the most one record may "
            "carry within the requeue function's time budget)"
        )
    return [_decode_item(index, item) for index, item in enumerate(items)]


def _decode_item(index: int, item: Any) -> PackedMessage | BadItem:
    if not isinstance(item, dict):
        return BadItem(f"envelope-item-{index}", _safe_dumps(item), f"malformed envelope entry {index}: not an object")
    message_id = item.get("i")
    good_id = isinstance(message_id, str) and _MESSAGE_ID.match(message_id) is not None
    name = message_id if good_id and isinstance(message_id, str) else f"envelope-item-{index}"
    body = item.get("b")
    text = body if isinstance(body, str) and body and sqs_text_problem(body) is None else _safe_dumps(item)
    try:
        if not good_id:
            raise InvalidMessageError("missing or invalid message id")
        hop, remaining = _bounded_int("hop", item.get("h"), MAX_HOP), _bounded_int("remaining delay", item.get("d"))
        if not isinstance(body, str) or not body:
            raise InvalidMessageError("missing or empty body")
        problem = sqs_text_problem(body)
        if problem is not None:
            raise InvalidMessageError(f"the body {problem}")
        attributes = decode_attribute_entries(item.get("a", {}), limit=MAX_ATTRIBUTES - 1)
    except InvalidMessageError as exc:
        return BadItem(name, text, f"malformed envelope entry {index}: {exc}")
    assert isinstance(message_id, str)
    sent = item.get("s")
    known = is_whole(sent, 0, MAX_SENT_MS)
    return PackedMessage(message_id, hop, remaining, body, attributes, sent if known else None)


def _bounded_int(label: str, value: Any, limit: int | None = None) -> int:
    """A non-negative int within ``limit`` (default: the remaining delay's 100 years in ms)."""
    if not is_whole(value):
        shown = _safe_dumps(value) if not isinstance(value, int) or value > -(10**30) else "a huge negative number"
        raise InvalidMessageError(f"{label} must be a non-negative integer, got {shown[:40]}")
    shown = str(value) if value < 10**30 else f"a {len(str(value))}-digit number"
    if limit is not None and value > limit:
        raise InvalidMessageError(f"{label} {shown} is more than {limit:,}")
    if limit is None and value > MAX_REMAINING_MS:
        raise InvalidMessageError(f"{label} of {shown} ms is longer than the 100-year maximum")
    return value


def decode_attribute_entries(raw: Any, *, limit: int) -> dict[str, MessageAttributeValueTypeDef]:
    """``{name: [DataType, "s" | "b", text | base64]}`` in the boto3 shape, at most ``limit``, checked as sent."""
    if not isinstance(raw, dict) or len(raw) > limit:
        raise InvalidMessageError(f"attributes must be an object with at most {limit} entries")
    attributes: dict[str, Any] = {}
    for key, value in raw.items():
        if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
            raise InvalidMessageError(f"attribute {key[:60]!r} is not [DataType, kind, value]")
        data_type, kind, data = value
        if kind == "b":
            try:
                attributes[key] = {"DataType": data_type, "BinaryValue": base64.b64decode(data, validate=True)}
            except (binascii.Error, ValueError):
                raise InvalidMessageError(f"attribute {key[:60]!r}: invalid base64") from None
        elif kind == "s":
            attributes[key] = {"DataType": data_type, "StringValue": data}
        else:
            raise InvalidMessageError(f"attribute {key[:60]!r}: unknown kind {kind[:10]!r}")
    return normalize_attributes(attributes)
