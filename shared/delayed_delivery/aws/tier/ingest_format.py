"""The ingest envelope (v1): bucket-routed messages on their way from the sender to the ingest function.

An ingest envelope is an SQS message on the tier's standard ingest queue with the attribute
``DelayedDelivery.Ingest`` = ``"1"`` (the format version) and a compact JSON body::

    {"v":1,"m":[{"i":"<id>","q":"<destination queue>","b":"<body text>","a":{"<name>":["String","s","x"]},
                 "d":<due epoch ms>,"s":<first send epoch ms>}]}

``a`` (attributes as ``[DataType, "s", text]`` or ``[DataType, "b", base64]``) is left out when empty; ``s`` is
optional. One message sent alone is an envelope of one. Reading is bounded and never raises (docs/buckets.md).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError, InvalidMessageError
from ...headers import HEADER_PREFIX
from ...jsonbounds import json_depth
from ...naming import FIFO_SUFFIX, validate_sqs_queue_name
from ...timebuckets.format import BucketMessage
from ...validation import is_whole
from ..packing import decode_attribute_entries
from ..sqs import MAX_ATTRIBUTES, message_size, sqs_text_problem

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

__all__ = [
    "DEFAULT_INGEST_BYTES",
    "INGEST_ATTRIBUTE",
    "INGEST_VERSION",
    "MAX_INGEST_CHARS",
    "MAX_INGEST_ENTRIES",
    "BadItem",
    "decode_ingest",
    "encode_ingest",
    "ingest_attributes",
    "ingest_entry_bytes",
    "pack_ingest",
]

#: Message attribute marking an SQS message as an ingest envelope; its value is the format version.
INGEST_ATTRIBUTE = HEADER_PREFIX + "Ingest"
INGEST_VERSION = 1
#: SQS bills each 64 KiB of payload as one request: the sender fills envelopes up to this size.
DEFAULT_INGEST_BYTES = 65_536
#: Most entries one envelope may carry (as on the ``-delay.fifo`` route).
MAX_INGEST_ENTRIES = 500
#: Longest envelope body read: SQS's largest message.
MAX_INGEST_CHARS = 1_048_576
#: Deepest JSON nesting read (an envelope nests 5 deep).
_MAX_DEPTH = 16
#: Longest run of digits read as a number; a longer one makes only its entry bad.
_MAX_DIGITS = 20
#: Latest due or send time accepted (9000-01-01T00:00:00Z, as in the bucket objects).
_MAX_MS = 220_898_664_000_000
_MESSAGE_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
_ENVELOPE_ID = "ingest-envelope"
_EMPTY = len(json.dumps({"v": INGEST_VERSION, "m": []}, separators=(",", ":")))


class _Unreadable:
    """A number the decoder would not read (too many digits, NaN, Infinity); its entry becomes bad."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"a {len(self.text)}-character number" if len(self.text) > 40 else self.text


@dataclass(frozen=True, slots=True)
class BadItem:
    """An entry (or a whole envelope) that cannot be read: it goes to the error queue alone, with ``reason``."""

    message_id: str
    body: str
    reason: str
    #: The destination the entry named, when it is a usable queue name.
    destination: str | None = None


def ingest_attributes() -> dict[str, MessageAttributeValueTypeDef]:
    """The marker attribute every ingest envelope carries."""
    return {INGEST_ATTRIBUTE: {"DataType": "String", "StringValue": str(INGEST_VERSION)}}


def _body_text(message: BucketMessage) -> str:
    try:
        text = message.body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessageError(f"message {message.message_id!r}: an SQS body is UTF-8 text") from None
    if not text or sqs_text_problem(text) is not None:
        raise InvalidMessageError(f"message {message.message_id!r}: the body is empty or text SQS refuses")
    return text


def _encode_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    encoded: dict[str, list[str]] = {}
    for name, value in attributes.items():
        if isinstance(value.get("BinaryValue"), bytes | bytearray):
            encoded[name] = [value["DataType"], "b", base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")]
        else:
            encoded[name] = [value["DataType"], "s", str(value["StringValue"])]
    return encoded


def _entry(message: BucketMessage) -> dict[str, Any]:
    item: dict[str, Any] = {"i": message.message_id, "q": message.destination, "b": _body_text(message)}
    if message.attributes:
        item["a"] = _encode_attributes(message.attributes)
    item["d"] = message.due_at_ms
    if message.sent_at_ms is not None:
        item["s"] = message.sent_at_ms
    return item


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def encode_ingest(messages: Sequence[BucketMessage]) -> str:
    """The JSON body of an ingest envelope holding ``messages`` (1 to 500, bodies UTF-8 text SQS takes)."""
    if not 1 <= len(messages) <= MAX_INGEST_ENTRIES:
        raise InvalidMessageError(f"an ingest envelope holds 1 to {MAX_INGEST_ENTRIES} messages, not {len(messages)}")
    return _dumps({"v": INGEST_VERSION, "m": [_entry(m) for m in messages]})


def ingest_entry_bytes(message: BucketMessage) -> int:
    """The bytes ``message`` adds to an envelope body (its entry and a separating comma)."""
    return len(_dumps(_entry(message)).encode("utf-8")) + 1


def pack_ingest(messages: Sequence[BucketMessage], max_bytes: int = DEFAULT_INGEST_BYTES) -> list[list[BucketMessage]]:
    """Split ``messages`` into envelopes of at most ``max_bytes`` (attribute included), in message-id order.

    A message too big to share an envelope travels alone (the sender checks it against the queue's own limit).
    """
    room = max_bytes - message_size("", ingest_attributes()) - _EMPTY
    bins: list[list[BucketMessage]] = []
    current: list[BucketMessage] = []
    used = 0
    for message in sorted(messages, key=lambda m: m.message_id):
        size = ingest_entry_bytes(message)
        if current and (used + size > room or len(current) == MAX_INGEST_ENTRIES):
            bins.append(current)
            current, used = [], 0
        current.append(message)
        used += size
    if current:
        bins.append(current)
    return bins


def _safe(value: Any) -> str:
    """JSON in ASCII: a bad entry's text for the error queue, which SQS takes whatever the entry held."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, default=repr)
    except (ValueError, RecursionError):
        return repr(value)[:1_000]


def _parse_int(text: str) -> int | _Unreadable:
    digits = len(text) - (1 if text.startswith("-") else 0)
    return int(text) if digits <= _MAX_DIGITS else _Unreadable(text)


def _load(body: object) -> Any:
    """The envelope's JSON; raises ``InvalidMessageError`` naming what is wrong with it as a whole."""
    if not isinstance(body, str):
        raise InvalidMessageError(f"an ingest envelope is JSON text, not {type(body).__name__}")
    if len(body) > MAX_INGEST_CHARS:
        raise InvalidMessageError(f"{len(body):,} characters, more than the {MAX_INGEST_CHARS:,} read")
    if json_depth(body, _MAX_DEPTH) > _MAX_DEPTH:
        raise InvalidMessageError(f"JSON nested more than {_MAX_DEPTH} deep")
    try:
        return json.loads(body, parse_int=_parse_int, parse_constant=_Unreadable)
    except (ValueError, RecursionError) as exc:
        raise InvalidMessageError(f"not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def decode_ingest(body: str) -> list[BucketMessage | BadItem]:
    """Read an ingest envelope body: one ``BucketMessage`` or ``BadItem`` per entry; never raises.

    An envelope that cannot be read as a whole (not JSON, over 1 MiB, nested over 16 deep, another version, no
    entries or more than 500) is one ``BadItem`` holding the whole body.
    """
    try:
        document = _load(body)
        if not isinstance(document, dict) or document.get("v") != INGEST_VERSION:
            raise InvalidMessageError(f"not an ingest envelope of version {INGEST_VERSION}")
        items = document.get("m")
        if not isinstance(items, list) or not items:
            raise InvalidMessageError("no messages")
        if len(items) > MAX_INGEST_ENTRIES:
            raise InvalidMessageError(f"{len(items):,} entries, more than {MAX_INGEST_ENTRIES}")
    except InvalidMessageError as exc:
        text = body if isinstance(body, str) else _safe(body)
        return [BadItem(_ENVELOPE_ID, text, f"malformed ingest envelope: {exc}")]
    return [_decode_item(index, item) for index, item in enumerate(items)]


def _decode_item(index: int, item: Any) -> BucketMessage | BadItem:
    if not isinstance(item, dict):
        return BadItem(f"ingest-item-{index}", _safe(item), f"malformed ingest entry {index}: not an object")
    message_id, destination, body = item.get("i"), item.get("q"), item.get("b")
    good_id = isinstance(message_id, str) and _MESSAGE_ID.match(message_id) is not None
    name = str(message_id) if good_id else f"ingest-item-{index}"
    good_body = isinstance(body, str) and body != "" and sqs_text_problem(body) is None
    text = str(body) if good_body else _safe(item)
    where = _destination(destination)
    try:
        if not good_id:
            raise InvalidMessageError("missing or invalid message id (1-128 printable ASCII characters)")
        if where is None:
            raise InvalidMessageError(f"destination {_safe(destination)[:100]} is not a standard SQS queue name")
        if not isinstance(body, str) or not body:
            raise InvalidMessageError("missing or empty body")
        problem = sqs_text_problem(body)
        if problem is not None:
            raise InvalidMessageError(f"the body {problem}")
        extra = set(item) - {"i", "q", "b", "a", "d", "s"}
        if extra:
            raise InvalidMessageError(f"unknown fields {sorted(extra)[:5]}")
        sent = item.get("s")
        message = BucketMessage(
            message_id=name,
            destination=where,
            body=body.encode("utf-8"),
            due_at_ms=_ms("due time", item.get("d")),
            attributes=decode_attribute_entries(item.get("a", {}), limit=MAX_ATTRIBUTES),
            sent_at_ms=None if sent is None else _ms("send time", sent),
        )
    except InvalidMessageError as exc:
        return BadItem(name, text, f"malformed ingest entry {index}: {exc}", where)
    return message


def _destination(value: Any) -> str | None:
    """``value`` when it names a standard SQS queue (a FIFO queue takes no per-message delay), else ``None``."""
    if not isinstance(value, str) or value.endswith(FIFO_SUFFIX):
        return None
    try:
        return validate_sqs_queue_name(value)
    except ConfigurationError:
        return None


def _ms(label: str, value: Any) -> int:
    if not is_whole(value, 0, _MAX_MS - 1):
        shown = repr(value) if isinstance(value, _Unreadable) else _safe(value)[:40]
        raise InvalidMessageError(f"{label} must be whole epoch milliseconds from 1970 to 9000, got {shown}")
    return value
