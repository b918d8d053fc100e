"""Envelope packing: many delayed messages on their way through a ``-delay.fifo`` queue in one FIFO message.

An envelope is a FIFO message with the attribute ``DelayedDelivery.Envelope`` = ``"1"`` (the format version)
and a compact JSON body::

    {"v":1,"m":[{"i":"<message id>","h":<hop>,"d":<remaining ms>,"b":"<body>","a":{"<name>":["String","s","x"]}}]}

Per inner message: ``i`` its id, ``h`` the hop it is on (as in its own dedup id ``<id>:<h>``), ``d`` the delay
it still had when it was packed (ms; the envelope's broker timestamps tell how much of it has passed since),
``b`` its body, ``a`` its user attributes as ``[DataType, "s", text]`` or ``[DataType, "b", base64]``.
The envelope's ``MessageGroupId`` and ``MessageDeduplicationId`` are ``pack-<sha256 of the sorted "<id>:<h>"
lines>``: the same messages on the same hops always give the same id, so a repeated send is dropped by FIFO.
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

from ..errors import InvalidMessageError
from ..headers import HEADER_PREFIX
from .sqs import MAX_ATTRIBUTES, message_size

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

__all__ = [
    "DEFAULT_PACK_BYTES",
    "ENVELOPE_ATTRIBUTE",
    "PACK_BYTES_ENV",
    "BadItem",
    "PackedMessage",
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


@dataclass(frozen=True, slots=True)
class BadItem:
    """An inner entry that cannot be read: it goes to the error queue alone, with ``reason``."""

    message_id: str
    body: str
    reason: str


def envelope_attributes() -> dict[str, MessageAttributeValueTypeDef]:
    """The marker attribute every envelope carries."""
    return {ENVELOPE_ATTRIBUTE: {"DataType": "String", "StringValue": str(_VERSION)}}


def _encode(message: PackedMessage) -> dict[str, Any]:
    attributes: dict[str, list[str]] = {}
    for name, value in message.attributes.items():
        if "BinaryValue" in value:
            data = value["BinaryValue"]
            if not isinstance(data, bytes | bytearray):
                raise InvalidMessageError(f"attribute {name!r}: a binary value to pack must be bytes")
            attributes[name] = [value["DataType"], "b", base64.b64encode(data).decode("ascii")]
        else:
            attributes[name] = [value["DataType"], "s", str(value.get("StringValue", ""))]
    item: dict[str, Any] = {"i": message.message_id, "h": message.hop, "d": message.remaining_ms, "b": message.body}
    if attributes:
        item["a"] = attributes
    return item


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def envelope_body(messages: Sequence[PackedMessage]) -> str:
    """The JSON body of an envelope holding ``messages``."""
    return _dumps({"v": _VERSION, "m": [_encode(m) for m in messages]})


def envelope_id(messages: Iterable[PackedMessage]) -> str:
    """``pack-<sha256>`` of the sorted ``<id>:<hop>`` lines: group and deduplication id of the envelope."""
    lines = sorted(f"{m.message_id}:{m.hop}" for m in messages)
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
        if current and used + size > room:
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
    """Read an envelope body; raises ``InvalidMessageError`` when the envelope itself is unreadable."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidMessageError(f"malformed envelope: not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("v") != _VERSION:
        raise InvalidMessageError(f"malformed envelope: expected an object with version {_VERSION}")
    items = document.get("m")
    if not isinstance(items, list) or not items:
        raise InvalidMessageError("malformed envelope: no messages")
    return [_decode_item(index, item) for index, item in enumerate(items)]


def _decode_item(index: int, item: Any) -> PackedMessage | BadItem:
    if not isinstance(item, dict):
        return BadItem(f"envelope-item-{index}", _dumps(item), f"malformed envelope entry {index}: not an object")
    message_id = item.get("i")
    good_id = isinstance(message_id, str) and _MESSAGE_ID.match(message_id) is not None
    name = message_id if good_id and isinstance(message_id, str) else f"envelope-item-{index}"
    body = item.get("b")
    text = body if isinstance(body, str) and body else _dumps(item)

    def bad(reason: str) -> BadItem:
        return BadItem(name, text, f"malformed envelope entry {index}: {reason}")

    if not good_id:
        return bad("missing or invalid message id")
    hop, remaining = item.get("h"), item.get("d")
    for label, value in (("hop", hop), ("remaining delay", remaining)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return bad(f"{label} must be a non-negative integer, got {value!r}")
    if not isinstance(body, str) or not body:
        return bad("missing or empty body")
    raw = item.get("a", {})
    if not isinstance(raw, dict) or len(raw) > MAX_ATTRIBUTES - 1:
        return bad("attributes must be an object with at most 9 entries")
    attributes: dict[str, MessageAttributeValueTypeDef] = {}
    for key, value in raw.items():
        if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
            return bad(f"attribute {key!r} is not [DataType, kind, value]")
        data_type, kind, data = value
        if kind == "b":
            try:
                attributes[key] = {"DataType": data_type, "BinaryValue": base64.b64decode(data, validate=True)}
            except (binascii.Error, ValueError):
                return bad(f"attribute {key!r}: invalid base64")
        elif kind == "s":
            attributes[key] = {"DataType": data_type, "StringValue": data}
        else:
            return bad(f"attribute {key!r}: unknown kind {kind!r}")
    assert isinstance(message_id, str) and isinstance(hop, int) and isinstance(remaining, int)
    return PackedMessage(message_id, hop, remaining, body, attributes)
