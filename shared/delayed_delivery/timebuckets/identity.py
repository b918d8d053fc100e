"""The id policy (docs/identity.md) on the tier's messages: when two copies are the same message, which one is kept.

One rule for every path that meets two copies under one id: the ingest function (one invocation's entries), the
object writer (``format.encode_bucket`` and the store's cut into objects) and the timer (one bucket's objects).
The same message is the same destination, body, attributes and due time; how often it was moved (``hops``) and when
it was first sent may differ (a resend, a retried write, a copy an interrupted move left). Of two copies the one sent
first is kept, so a cancel or reschedule record binds as it would have to the first. Different messages under one
id are never merged: the first sent wins and the other is reported with both ``content_digest``\\ s.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

__all__ = [
    "DIGEST_CHARS",
    "MessageCopy",
    "conflict_reason",
    "content_digest",
    "digest_conflict_reason",
    "first_sent",
    "same_message",
]

#: Hex characters of a content digest shown in reasons (64 bits of sha256: enough to tell two versions apart).
DIGEST_CHARS = 16


class MessageCopy(Protocol):
    """What the id policy reads of a copy (``format.BucketMessage`` is one; format imports this module, not back)."""

    @property
    def message_id(self) -> str: ...
    @property
    def destination(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def due_at_ms(self) -> int: ...
    @property
    def attributes(self) -> Mapping[str, Mapping[str, Any]]: ...
    @property
    def hops(self) -> int: ...
    @property
    def sent_at_ms(self) -> int | None: ...


M = TypeVar("M", bound=MessageCopy)


def _attributes(attributes: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The attributes in one canonical order and shape: ``[name, DataType, "s" | "b", text | base64]``."""
    out: list[list[str]] = []
    for name in sorted(attributes):
        value = attributes[name]
        binary = value.get("BinaryValue")
        if isinstance(binary, bytes | bytearray):
            out.append([name, str(value.get("DataType")), "b", base64.b64encode(bytes(binary)).decode("ascii")])
        else:
            out.append([name, str(value.get("DataType")), "s", str(value.get("StringValue"))])
    return out


def same_message(a: MessageCopy, b: MessageCopy) -> bool:
    """Whether two copies are the same message: destination, body, attributes and due time (id assumed equal)."""
    return (a.destination, a.body, a.due_at_ms) == (b.destination, b.body, b.due_at_ms) and _attributes(
        a.attributes
    ) == _attributes(b.attributes)


def content_digest(message: MessageCopy) -> str:
    """What makes ``message`` itself (id, destination, body, attributes, due time), as sha256: its first
    ``DIGEST_CHARS`` hex characters. Equal for every copy of one message, different for another message."""
    document = [
        message.message_id,
        message.destination,
        base64.b64encode(message.body).decode("ascii"),
        _attributes(message.attributes),
        message.due_at_ms,
    ]
    text = json.dumps(document, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:DIGEST_CHARS]


def _sent(message: MessageCopy) -> tuple[bool, int, int]:
    """Sort key: known send times first, earliest first, then the copy moved least."""
    return (message.sent_at_ms is None, message.sent_at_ms or 0, message.hops)


def first_sent(a: M, b: M) -> M:
    """Of two copies of one message, the one sent first (a known send time before an unknown one, then the one moved
    least; on a full tie, ``a``): the same copy whatever order they are met in."""
    return b if _sent(b) < _sent(a) else a


def conflict_reason(kept: MessageCopy, other: MessageCopy, where: str = "", other_where: str = "") -> str:
    """Why ``other`` is not delivered: another message under its id was sent first (both content digests named, and
    where each was read, when known)."""
    return digest_conflict_reason(kept.message_id, content_digest(kept), content_digest(other), where, other_where)


def digest_conflict_reason(message_id: str, kept: str, other: str, where: str = "", other_where: str = "") -> str:
    """``conflict_reason`` from the two copies' digests (a reader that kept only the first one's digest)."""
    first = f"digest {kept}" + (f", in {where}" if where else "")
    second = f"digest {other}" + (f", in {other_where}" if other_where else "")
    return (
        f"another message with id {message_id!r} ({first}) was sent first; an id names one message, so this "
        f"one ({second}) is not delivered and the first is kept"
    )
