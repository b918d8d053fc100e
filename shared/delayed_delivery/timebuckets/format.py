"""The S3 time-bucket object format (v2; v1 still read): gzip-compressed JSON lines, a header line then one per message.

Header: ``{"v":2,"level":"fine","bucket":"2031-02-03T04:05:00Z","count":N}``. Message lines: ``{"id", "destination",
"t" (the body as text) or "body" (base64), "attributes" ({name: [DataType, "s" | "b", text | base64]}),
"due_at_ms", "hops", "sent_at_ms"}``; v1 lines always carry ``"body"``. Reading is bounded and total: a bad line
becomes a ``PoisonEntry``, a bad object a ``problem``; nothing raises. The format is described in docs/buckets.md.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from ..errors import InvalidMessageError
from ..jsonbounds import loads_bounded
from ..model import MAX_MESSAGE_ID_LENGTH, check_destination, is_usable_message_id
from ..validation import is_whole
from .identity import first_sent, same_message
from .wheel import BucketKey, BucketLevel, content_key

__all__ = [
    "FORMAT_VERSION",
    "MAX_ATTRIBUTES",
    "MAX_DECODED_BYTES",
    "MAX_LINE_BYTES",
    "MAX_LINE_CHARS",
    "MAX_OBJECT_MESSAGES",
    "MAX_POISON_RAW_BYTES",
    "READ_VERSIONS",
    "WRITE_BACK_SALT",
    "BucketContents",
    "BucketHeader",
    "BucketMessage",
    "BucketStream",
    "PoisonEntry",
    "RawLine",
    "bucket_object_key",
    "decode_bucket",
    "encode_bucket",
    "encode_bucket_object",
    "encoded_line_bytes",
    "line_id",
    "one_per_id",
    "read_line",
]

#: The version writers write; readers read every version in ``READ_VERSIONS``.
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
#: What a salted key's hash starts with (``encode_bucket_object``): never the start of an object's own bytes.
WRITE_BACK_SALT = "delayed-delivery-write-back/1 "
#: The most messages one object holds (the ingest writes ~1,000).
MAX_OBJECT_MESSAGES = 10_000
#: The most bytes an object holds once decompressed (writers split beyond it; readers stop there).
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: The longest line: a 1 MiB body in base64 plus its attributes.
MAX_LINE_CHARS = 1_500_000
#: SQS's limit on message attributes.
MAX_ATTRIBUTES = 10
#: How much of a line that cannot be read is kept with its ``PoisonEntry`` (for the error queue).
MAX_POISON_RAW_BYTES = 8_192
#: The longest line a reader holds: ``MAX_LINE_CHARS`` at 4 bytes a character. A longer one is poison, read past.
MAX_LINE_BYTES = 4 * MAX_LINE_CHARS
#: The longest ``sent_at_ms`` / ``due_at_ms`` accepted: the wheel's latest time.
_MAX_MS = 220_898_664_000_000  # 9000-01-01T00:00:00Z
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LEADING_ID = re.compile(rb'\{\s*"id"\s*:\s*("(?:[^"\\]|\\.){1,512}")')
_FIELDS = ("id", "destination", "body", "attributes", "due_at_ms", "hops", "sent_at_ms")
#: A v2 line carries the body as ``"t"`` (text) or ``"body"`` (base64).
_FIELDS_V2 = tuple(name for name in _FIELDS if name != "body")


@dataclass(frozen=True, slots=True)
class BucketMessage:
    """One message waiting in a bucket; ``attributes`` are SQS message attributes in the boto3 shape."""

    message_id: str
    destination: str
    body: bytes
    due_at_ms: int
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    hops: int = 0
    sent_at_ms: int | None = None

    def __post_init__(self) -> None:
        if not is_usable_message_id(self.message_id):
            raise InvalidMessageError(f"message id must be 1-{MAX_MESSAGE_ID_LENGTH} characters of text")
        check_destination(self.destination)
        if not isinstance(self.body, bytes):
            raise InvalidMessageError("body must be bytes")
        _ms("due_at_ms", self.due_at_ms)
        if self.sent_at_ms is not None:
            _ms("sent_at_ms", self.sent_at_ms)
        if not is_whole(self.hops, 0, 1_000_000):
            raise InvalidMessageError(f"hops must be a whole number from 0 to 1,000,000, got {self.hops!r}")
        _encode_attributes(self.attributes)

    @property
    def due_at(self) -> datetime:
        """The due time as an aware UTC datetime."""
        return _EPOCH + timedelta(milliseconds=self.due_at_ms)


@dataclass(frozen=True, slots=True)
class PoisonEntry:
    """A line that could not be read: its line number (1 = the first message), the id if readable, the reason."""

    line: int
    message_id: str | None
    reason: str
    #: The line's first ``MAX_POISON_RAW_BYTES`` bytes, as stored (``raw_size``: its whole length).
    raw: bytes = field(default=b"", compare=False, repr=False)
    raw_size: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class BucketContents:
    """What ``decode_bucket`` read. ``problem`` names what is wrong with the object as a whole, if anything."""

    version: int | None
    bucket: BucketKey | None
    count: int | None
    messages: tuple[BucketMessage, ...]
    poison: tuple[PoisonEntry, ...]
    problem: str | None = None

    @property
    def complete(self) -> bool:
        """Whether every message the header announces was read."""
        return self.problem is None and not self.poison


def _ms(name: str, value: object) -> int:
    if is_whole(value, 0, _MAX_MS - 1):
        return value
    raise InvalidMessageError(f"{name} must be whole milliseconds from 1970 to 9000, got {str(value)[:40]}")


def _encode_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    if not isinstance(attributes, Mapping) or len(attributes) > MAX_ATTRIBUTES:
        raise InvalidMessageError(f"attributes must be a mapping of at most {MAX_ATTRIBUTES} entries")
    encoded: dict[str, list[str]] = {}
    for name, value in attributes.items():
        data_type = value.get("DataType") if isinstance(value, Mapping) else None
        if not isinstance(name, str) or not name or not isinstance(data_type, str) or not data_type:
            raise InvalidMessageError(f"attribute {str(name)[:60]!r} needs a name and a DataType")
        _unicode(f"attribute {name[:60]!r}", name, data_type, value.get("StringValue"))
        if isinstance(value.get("BinaryValue"), bytes | bytearray):
            encoded[name] = [data_type, "b", base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")]
        elif isinstance(value.get("StringValue"), str):
            encoded[name] = [data_type, "s", value["StringValue"]]
        else:
            raise InvalidMessageError(f"attribute {name[:60]!r} needs a StringValue text or a BinaryValue bytes")
    return encoded


def _unicode(what: str, *texts: object) -> None:
    """Refuse text that cannot be written back as UTF-8 (a lone surrogate such as ``"\\ud800"``)."""
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidMessageError(f"{what} holds a lone surrogate: not Unicode text") from None


def _decode_attributes(raw: object) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict) or len(raw) > MAX_ATTRIBUTES:
        raise InvalidMessageError(f"attributes must be an object of at most {MAX_ATTRIBUTES} entries")
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
            raise InvalidMessageError(f"attribute {name[:60]!r} is not [DataType, kind, value]")
        data_type, kind, data = value
        if kind == "b":
            attributes[name] = {"DataType": data_type, "BinaryValue": _b64(f"attribute {name[:60]!r}", data)}
        elif kind == "s":
            attributes[name] = {"DataType": data_type, "StringValue": data}
        else:
            raise InvalidMessageError(f"attribute {name[:60]!r} has unknown kind {kind[:10]!r}")
    return attributes


def _b64(what: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidMessageError(f"{what} is not base64") from None


def _body_field(body: bytes) -> tuple[str, str]:
    """``("t", text)`` for a UTF-8 body no longer in JSON than in base64, else ``("body", base64)``.

    The length test keeps a v2 line never longer than the v1 line of the same message, so every bound holds.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and len(_dumps(text).encode("utf-8")) - 2 <= (len(body) + 2) // 3 * 4:
        return "t", text
    return "body", base64.b64encode(body).decode("ascii")


def _line(message: BucketMessage) -> dict[str, Any]:
    name, body = _body_field(message.body)
    return {
        "id": message.message_id,
        "destination": message.destination,
        name: body,
        "attributes": _encode_attributes(message.attributes),
        "due_at_ms": message.due_at_ms,
        "hops": message.hops,
        "sent_at_ms": message.sent_at_ms,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def one_per_id(messages: Sequence[BucketMessage]) -> dict[tuple[str, int], BucketMessage]:
    """One copy per message, the first sent (``identity.py``: a message is its id and due time; under one id, other
    due times are other messages); raises ``InvalidMessageError`` for two different messages under one id and due
    time (a writer refuses what would replace a message)."""
    unique: dict[tuple[str, int], BucketMessage] = {}
    for message in messages:
        if not isinstance(message, BucketMessage):
            raise InvalidMessageError(f"expected BucketMessage, got {type(message).__name__}")
        key = (message.message_id, message.due_at_ms)
        known = unique.setdefault(key, message)
        if known is message:
            continue
        if not same_message(known, message):
            raise InvalidMessageError(
                f"two different messages with id {message.message_id!r} and one due time in one bucket object"
            )
        unique[key] = first_sent(known, message)
    return unique


def _ordered(bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel) -> list[BucketMessage]:
    """The messages sorted by (due, id), copies of one message kept once; refuses a conflict, an outsider, too many."""
    unique = one_per_id(messages)
    for message in unique.values():
        if not bucket.holds(message.due_at, levels):
            raise InvalidMessageError(f"message {message.message_id!r} is not due within bucket {bucket.iso}")
    if not unique or len(unique) > MAX_OBJECT_MESSAGES:
        raise InvalidMessageError(f"a bucket object holds 1 to {MAX_OBJECT_MESSAGES:,} messages, not {len(unique):,}")
    return sorted(unique.values(), key=lambda m: (m.due_at_ms, m.message_id))


def encoded_line_bytes(message: BucketMessage) -> int:
    """The bytes ``message`` takes in an object once decompressed (its line and the newline), for writers that split."""
    return len(_dumps(_line(message)).encode("utf-8")) + 1


def _text(bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel | None) -> tuple[bytes, int]:
    """The object's decompressed bytes and its message count: the same messages in any order give the same bytes."""
    ordered = _ordered(bucket, messages, levels or BucketLevel())
    header = {"v": FORMAT_VERSION, "level": bucket.level, "bucket": bucket.iso, "count": len(ordered)}
    lines = [_dumps(header)]
    for message in ordered:
        line = _dumps(_line(message))
        if len(line) > MAX_LINE_CHARS:
            raise InvalidMessageError(f"message {message.message_id!r} is {len(line):,} characters, over the bound")
        lines.append(line)
    text = ("\n".join(lines) + "\n").encode("utf-8")
    if len(text) > MAX_DECODED_BYTES:
        raise InvalidMessageError(f"{len(text):,} bytes is more than one bucket object holds: write two objects")
    return text, len(ordered)


def encode_bucket(bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel | None = None) -> bytes:
    """The object for ``messages`` in ``bucket``: the same messages in any order give the same bytes."""
    text, _ = _text(bucket, messages, levels)
    return gzip.compress(text, compresslevel=6, mtime=0)


def encode_bucket_object(
    prefix: str,
    bucket: BucketKey,
    messages: Sequence[BucketMessage],
    levels: BucketLevel | None = None,
    *,
    salt: str = "",
    ordered: bool = False,
) -> tuple[str, bytes]:
    """The key (v3: the sha256 of the object's decompressed bytes, and the count) and the object for ``messages``.

    The key names the content itself, so a retried write of the same messages writes the same key and bytes, and
    no write can replace a different message (key v2 hashed only ids and due times: another body under the same id
    and due time overwrote the first, #23). ``salt`` (a dispatch plan's name) hashes it in too: the same content
    then gets another key, so a worker's write-back never lands on an object of the plan that wrote it (#31).
    ``ordered``: the hash's first 16 hex characters are the first due time's epoch ms instead, so a bucket's objects
    list in due order (the held areas, ``aws/tier/held.py``). Readers never recompute the hash, so every reader reads
    such a key.
    """
    text, count = _text(bucket, messages, levels)
    digest = hashlib.sha256(f"{WRITE_BACK_SALT}{salt}\n".encode() + text if salt else text).hexdigest()
    if ordered:
        first = min(m.due_at_ms for m in messages)
        digest = f"{first:016x}{digest[16:]}"
    key = content_key(prefix, bucket, digest, count)
    return key, gzip.compress(text, compresslevel=6, mtime=0)


def bucket_object_key(
    prefix: str, bucket: BucketKey, messages: Sequence[BucketMessage], levels: BucketLevel | None = None
) -> str:
    """The key of the object ``encode_bucket`` writes for ``messages`` (key v3, ``encode_bucket_object``)."""
    return encode_bucket_object(prefix, bucket, messages, levels)[0]


def _header(line: bytes) -> tuple[int, BucketKey, int]:
    value = loads_bounded(line, what="header", max_chars=1_000, max_depth=1)
    version = value.get("v") if isinstance(value, dict) else None
    if isinstance(version, bool) or version not in READ_VERSIONS:
        known = ", ".join(map(str, READ_VERSIONS))
        raise InvalidMessageError(f"header: version {str(version)[:20]} is not one this reader knows ({known})")
    assert isinstance(value, dict) and isinstance(version, int)
    count = value.get("count")
    if not is_whole(count, 0, MAX_OBJECT_MESSAGES):
        raise InvalidMessageError(f"header: count {str(count)[:20]} is not from 0 to {MAX_OBJECT_MESSAGES:,}")
    level, start = value.get("level"), value.get("bucket")
    if not isinstance(level, str) or not isinstance(start, str):
        raise InvalidMessageError("header: level and bucket must be text")
    return version, BucketKey.parse(level, start), count


def _body(value: dict[str, Any], version: int) -> bytes:
    """The body of a line: ``"body"`` (base64; v1 lines only have that), or in v2 ``"t"`` (text), exactly one."""
    has_text = version >= 2 and "t" in value
    if has_text == ("body" in value):
        raise InvalidMessageError("line: holds both t and body" if has_text else "line: missing t or body")
    if not has_text:
        if not isinstance(value["body"], str):
            raise InvalidMessageError("body is not base64 text")
        return _b64("body", value["body"])
    if not isinstance(value["t"], str):
        raise InvalidMessageError("t (the body as text) is not text")
    try:
        return value["t"].encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError("t (the body as text) holds a lone surrogate: not Unicode text") from None


def _message(line: bytes, version: int) -> BucketMessage:
    value = loads_bounded(line, what="line", max_chars=MAX_LINE_CHARS, max_depth=3)
    if not isinstance(value, dict):
        raise InvalidMessageError(f"line: a JSON {type(value).__name__}, not an object")
    missing = [name for name in (_FIELDS if version == 1 else _FIELDS_V2) if name not in value]
    if missing:
        raise InvalidMessageError(f"line: missing {', '.join(missing)}")
    return BucketMessage(
        message_id=value["id"],
        destination=value["destination"],
        body=_body(value, version),
        due_at_ms=_ms("due_at_ms", value["due_at_ms"]),
        attributes=_decode_attributes(value["attributes"]),
        hops=value["hops"],
        sent_at_ms=value["sent_at_ms"],
    )


def _poison(number: int, line: bytes, reason: str) -> PoisonEntry:
    """The entry for a bad line, with its message id when one can be read (writers put the id first)."""
    value: Any = None
    try:
        if len(line) <= MAX_LINE_CHARS:
            value = json.loads(line).get("id")
        else:
            match = _LEADING_ID.match(line[:1_000])
            value = json.loads(match[1]) if match else None
    except (ValueError, RecursionError, AttributeError):
        value = None
    usable = value if is_usable_message_id(value) else None
    return PoisonEntry(number, usable, reason, bytes(line[:MAX_POISON_RAW_BYTES]), len(line))


def decode_bucket(data: bytes) -> BucketContents:
    """Read an object ``encode_bucket`` wrote (any version this reader knows); never raises."""
    if not isinstance(data, bytes | bytearray):
        return BucketContents(None, None, None, (), (), f"expected bytes, got {type(data).__name__}")
    return BucketStream([bytes(data)]).contents()


@dataclass(frozen=True, slots=True)
class BucketHeader:
    """An object's header line, read."""

    version: int
    bucket: BucketKey
    count: int


class RawLine(NamedTuple):
    """One message line as stored, not yet read: its number (1 = the first message) and bytes (a tuple: a stream
    makes one per line, so it is made cheaply).

    A line longer than ``MAX_LINE_BYTES`` is not held: ``data`` keeps its first ``MAX_POISON_RAW_BYTES`` and ``size``
    its whole length, and it reads as poison.
    """

    number: int
    data: bytes
    size: int

    @property
    def whole(self) -> bool:
        """Whether ``data`` is the whole line."""
        return self.size == len(self.data)


def read_line(raw: RawLine, version: int) -> BucketMessage | PoisonEntry:
    """The message on ``raw`` (a line of an object of ``version``), or a ``PoisonEntry`` saying why not."""
    if not raw.whole:
        reason = f"line: {raw.size:,} bytes, more than the {MAX_LINE_BYTES:,} a line may hold"
        return PoisonEntry(raw.number, _leading_id(raw.data), reason, raw.data[:MAX_POISON_RAW_BYTES], raw.size)
    try:
        return _message(raw.data, version)
    except InvalidMessageError as exc:
        return _poison(raw.number, raw.data, str(exc))


def line_id(raw: RawLine) -> str | None:
    """The message id a line names, read cheaply where writers put it (first); else from the whole line, if it parses.

    Every reader gets the same answer for the same bytes, so it can split an object's lines between workers by id.
    """
    leading = _leading_id(raw.data)
    if leading is not None or not raw.whole:
        return leading
    try:
        value = json.loads(raw.data)
    except (ValueError, RecursionError):
        return None
    found = value.get("id") if isinstance(value, dict) else None
    return found if is_usable_message_id(found) else None


def _leading_id(data: bytes) -> str | None:
    match = _LEADING_ID.match(data[:1_000])
    if match is None:
        return None
    try:
        value = json.loads(match[1])
    except ValueError:
        return None
    return value if is_usable_message_id(value) else None


#: Decompressed bytes handed on at a time, and compressed bytes read at a time from a stream.
_STEP = 256 * 1024


class BucketStream:
    """One object read as its bytes arrive: the header, then each line, holding one line at a time.

    The bounds and the rules are ``decode_bucket``'s (which reads through this class): at most ``MAX_DECODED_BYTES``
    decompressed and ``MAX_OBJECT_MESSAGES`` message lines; a line that cannot be read is a ``PoisonEntry``; what is
    wrong with the object as a whole is ``problem``, known once the lines are read. Nothing raises on bad content;
    an error of the byte source itself (a broken connection) passes through.
    """

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._lines = self._split(self._texts())
        self._started = False
        self.header: BucketHeader | None = None
        #: What is wrong with the object as a whole (final once ``lines`` is exhausted).
        self.problem: str | None = None
        #: Message lines found, read or not (the count the header must announce).
        self.found = 0
        #: Decompressed bytes read so far.
        self.decompressed = 0

    def open(self) -> BucketHeader | None:
        """Read up to the header: the header, or ``None`` with ``problem`` set."""
        if self._started:
            return self.header
        self._started = True
        first = next(self._lines, None)
        if first is None:
            self.problem = self.problem or "empty object: no header line"
            return None
        try:
            if not first.whole:
                raise InvalidMessageError(f"header: {first.size:,} bytes, more than a header line holds")
            self.header = BucketHeader(*_header(first.data))
        except InvalidMessageError as exc:
            self.problem = str(exc)
            self._lines = iter(())
        return self.header

    def lines(self) -> Iterator[RawLine]:
        """The message lines as stored (the first ``MAX_OBJECT_MESSAGES``); ``problem`` is final after the last."""
        header = self.open()
        if header is None:
            return
        for raw in self._lines:
            self.found = raw.number
            if raw.number <= MAX_OBJECT_MESSAGES:
                yield raw
        if self.problem is None and self.found != header.count:
            self.problem = f"the header announces {header.count:,} messages, the object has {self.found:,} lines"

    def items(self) -> Iterator[BucketMessage | PoisonEntry]:
        """Each message line read: a message, or a ``PoisonEntry``."""
        for raw in self.lines():
            yield read_line(raw, self.header.version if self.header else FORMAT_VERSION)

    def contents(self) -> BucketContents:
        """Everything at once, as ``decode_bucket`` returns it (for objects known to be small)."""
        messages: list[BucketMessage] = []
        poison: list[PoisonEntry] = []
        for item in self.items():
            (messages if isinstance(item, BucketMessage) else poison).append(item)  # type: ignore[arg-type]
        header = self.header
        if header is None:
            return BucketContents(None, None, None, (), (), self.problem)
        return BucketContents(header.version, header.bucket, header.count, tuple(messages), tuple(poison), self.problem)

    def _texts(self) -> Iterator[bytes]:
        """The decompressed bytes, at most the bound; sets ``problem`` when something stops the reading early."""
        inflater = zlib.decompressobj(wbits=31)
        bound = MAX_DECODED_BYTES
        seen = 0
        for chunk in self._chunks:
            if not isinstance(chunk, bytes | bytearray):
                self.problem = f"expected bytes, got {type(chunk).__name__}"
                return
            if not chunk:
                continue
            if inflater.eof:
                self.problem = "bytes after the end of the gzip stream"
                return
            seen += len(chunk)
            if seen > bound + _STEP:  # gzip never shrinks this much below what it holds: not an object of ours
                self.problem = f"more than {bound:,} bytes stored"
                return
            data = bytes(chunk)
            while data and not inflater.eof:
                try:
                    text = inflater.decompress(data, _STEP)
                except zlib.error as exc:
                    what = "not a gzip object" if self.decompressed == 0 else "the gzip stream is damaged"
                    self.problem = f"{what} ({exc})"
                    return
                data = inflater.unconsumed_tail
                if self.decompressed + len(text) > bound:
                    yield text[: bound - self.decompressed]
                    self.decompressed = bound
                    self.problem = f"more than {bound:,} bytes once decompressed: read that far"
                    return
                self.decompressed += len(text)
                if text:
                    yield text
            if inflater.eof and (data or inflater.unused_data):
                self.problem = "bytes after the end of the gzip stream"
                return
        if seen == 0:
            self.problem = "not a gzip object (0 bytes)"
        elif not inflater.eof:
            self.problem = "the gzip stream is cut short"

    @staticmethod
    def _split(texts: Iterator[bytes]) -> Iterator[RawLine]:
        """Lines of the text (numbered from 0, the header), each held whole only up to ``MAX_LINE_BYTES``."""
        number = 0
        parts: list[bytes] = []
        size = 0
        for text in texts:
            pieces = text.split(b"\n")
            for piece in pieces[:-1]:
                if parts:
                    yield RawLine(number, _joined(parts, piece, size + len(piece)), size + len(piece))
                    parts, size = [], 0
                elif len(piece) > MAX_LINE_BYTES:
                    yield RawLine(number, piece[:MAX_POISON_RAW_BYTES], len(piece))
                else:
                    yield RawLine(number, piece, len(piece))
                number += 1
            tail = pieces[-1]
            if tail:
                if size + len(tail) <= MAX_LINE_BYTES or size < MAX_POISON_RAW_BYTES:
                    parts.append(tail)
                size += len(tail)
        if parts:
            yield RawLine(number, _joined(parts, b"", size), size)


def _joined(parts: list[bytes], last: bytes, size: int) -> bytes:
    """A line from its pieces: whole when at most ``MAX_LINE_BYTES``, else its first ``MAX_POISON_RAW_BYTES``."""
    line = b"".join([*parts, last])
    return line if size <= MAX_LINE_BYTES else line[:MAX_POISON_RAW_BYTES]
