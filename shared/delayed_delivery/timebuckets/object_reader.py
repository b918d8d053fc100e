"""The S3 time-bucket object reader: bounded and total, a bad line is a ``PoisonEntry``, a bad object a ``problem``.

It reads every version in ``READ_VERSIONS``, whole (``decode_bucket``) or as its bytes arrive (``BucketStream``);
``format.py`` describes the format.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import InvalidMessageError
from ..jsonbounds import loads_bounded
from ..model import is_usable_message_id
from ..validation import is_whole
from .bucket_message import (
    FORMAT_VERSION,
    MAX_ATTRIBUTES,
    MAX_DECODED_BYTES,
    MAX_LINE_BYTES,
    MAX_LINE_CHARS,
    MAX_OBJECT_MESSAGES,
    MAX_POISON_RAW_BYTES,
    READ_VERSIONS,
    BucketContents,
    BucketMessage,
    PoisonEntry,
    checked_ms,
)
from .wheel import BucketKey

__all__ = ["BucketHeader", "BucketStream", "RawLine", "decode_bucket", "line_id", "read_line"]

_LEADING_ID = re.compile(rb'\{\s*"id"\s*:\s*("(?:[^"\\]|\\.){1,512}")')
_FIELDS = ("id", "destination", "body", "attributes", "due_at_ms", "hops", "sent_at_ms")
#: A v2 line carries the body as ``"t"`` (text) or ``"body"`` (base64).
_FIELDS_V2 = tuple(name for name in _FIELDS if name != "body")


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
        due_at_ms=checked_ms("due_at_ms", value["due_at_ms"]),
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
