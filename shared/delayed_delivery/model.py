"""The message model: what is delayed, where it goes and when it is due."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from .clock import Clock, SystemClock, utc
from .durations import MAX_DELAY, Delay, to_seconds
from .errors import InvalidMessageError
from .headers import UNREADABLE, refuse_reserved
from .validation import is_whole

__all__ = [
    "MAX_DESTINATION_LENGTH",
    "MAX_MESSAGE_ID_LENGTH",
    "DelayedMessage",
    "Headers",
    "check_destination",
    "is_usable_message_id",
    "unreadable_message",
]

#: Longest accepted message id (NServiceBus's SQL persistence column is nvarchar(250); SQS group ids allow 128).
MAX_MESSAGE_ID_LENGTH = 128
#: Longest destination ``DelayedMessage.create`` accepts: SQS's 80 (Azure queue names stop at 63).
MAX_DESTINATION_LENGTH = 80
#: The characters every supported queue service allows in some name; each sender then applies its own rules.
_DESTINATION = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_DESTINATION_LENGTH}}}")


class Headers(Mapping[str, str]):
    """An immutable, hashable, picklable str-to-str mapping."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: dict[str, str] = dict(items or {})

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"

    def __reduce__(self) -> tuple[type[Headers], tuple[dict[str, str]]]:
        return (Headers, (self._items,))


@dataclass(frozen=True, slots=True)
class DelayedMessage:
    """A message to deliver to ``destination`` once ``due_at`` has passed."""

    message_id: str
    destination: str
    body: bytes
    due_at: datetime
    headers: Mapping[str, str] = field(default_factory=Headers)
    failure_count: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.message_id, str) or not self.message_id.strip():
            raise InvalidMessageError("message_id must be a non-empty string")
        if len(self.message_id) > MAX_MESSAGE_ID_LENGTH:
            raise InvalidMessageError(f"message_id is longer than {MAX_MESSAGE_ID_LENGTH} characters")
        if not isinstance(self.destination, str) or not self.destination.strip():
            raise InvalidMessageError("destination must be a non-empty queue name")
        _check_unicode("message_id", self.message_id)
        _check_unicode("destination", self.destination)
        if isinstance(self.body, bytearray | memoryview):
            object.__setattr__(self, "body", bytes(self.body))
        elif not isinstance(self.body, bytes):
            raise InvalidMessageError(
                f"body must be bytes, not {type(self.body).__name__} (encode text first, e.g. text.encode())"
            )
        object.__setattr__(self, "due_at", utc(self.due_at))
        object.__setattr__(self, "headers", _frozen_headers(self.headers))
        if not is_whole(self.failure_count):
            raise InvalidMessageError("failure_count must be a non-negative integer")

    @classmethod
    def create(
        cls,
        destination: str,
        body: bytes,
        *,
        delay: Delay | None = None,
        at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        clock: Clock | None = None,
    ) -> DelayedMessage:
        """Build a message due after ``delay`` or at ``at`` (exactly one), with a fresh id unless given."""
        if (delay is None) == (at is None):
            raise InvalidMessageError("give exactly one of delay= or at=")
        check_destination(destination)
        if headers is not None and isinstance(headers, Mapping):
            refuse_reserved(headers.keys())
        now = (clock or SystemClock()).now()
        if at is not None:
            due_at = utc(at)
            if due_at - now > MAX_DELAY:
                raise InvalidMessageError(
                    f"due time {due_at.isoformat()} is more than the 100-year maximum after now ({now.isoformat()})"
                )
        else:
            assert delay is not None
            seconds = to_seconds(delay)
            try:
                due_at = now + timedelta(seconds=seconds)
            except OverflowError:
                raise InvalidMessageError(f"a {seconds} s delay from {now.isoformat()} is past year 9999") from None
        return cls(
            message_id=message_id if message_id is not None else str(uuid.uuid4()),
            destination=destination,
            body=body,
            due_at=due_at,
            headers=headers or {},
        )

    def delay_from(self, now: datetime) -> float:
        """Seconds from ``now`` until due (0 when already due)."""
        return max(0.0, (self.due_at - utc(now)).total_seconds())

    def with_headers(self, extra: Mapping[str, str]) -> DelayedMessage:
        """A copy with ``extra`` headers added (overriding same-named ones)."""
        return replace(self, headers={**self.headers, **extra})

    def redirected(self, destination: str) -> DelayedMessage:
        """A copy addressed to ``destination``."""
        return replace(self, destination=destination)


def check_destination(destination: object) -> str:
    """Check a destination against the rule every queue service shares: 1-80 letters, digits, ``_``, ``-``, ``.``."""
    if not isinstance(destination, str) or not destination.strip():
        raise InvalidMessageError("destination must be a non-empty queue name")
    if _DESTINATION.fullmatch(destination) is None:
        raise InvalidMessageError(
            f"destination {destination[:100]!r} is not a queue name: use 1-{MAX_DESTINATION_LENGTH} ASCII letters, "
            "digits, '_', '-' or '.' (each cloud narrows this further: SQS 80 with an optional .fifo, Azure 3-63 "
            "lowercase letters, digits and hyphens)"
        )
    return destination


def _frozen_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(headers, Mapping):
        raise InvalidMessageError(f"headers must be a mapping of str to str, not {type(headers).__name__}")
    for key, value in headers.items():
        if not isinstance(key, str) or not key:
            raise InvalidMessageError(f"header names must be non-empty strings, got {key!r}")
        if not isinstance(value, str):
            raise InvalidMessageError(f"header {key!r} must have a str value, not {type(value).__name__}")
        _check_unicode("a header name", key)
        _check_unicode(f"header {key!r}", value)
    return headers if isinstance(headers, Headers) else Headers(headers)


def _check_unicode(what: str, text: str) -> None:
    """Refuse text no store or queue can encode: a lone surrogate such as ``"\\ud800"`` is not Unicode."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessageError(
                f"{what} holds {text[exc.start : exc.end]!r} at {exc.start}, a lone surrogate, not a Unicode character"
            ) from None


def _is_text(value: object) -> bool:
    """True for a non-blank str that is valid Unicode."""
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        _check_unicode("text", value)
    except InvalidMessageError:
        return False
    return True


def is_usable_message_id(value: object) -> bool:
    """True when ``value`` would be accepted as a ``DelayedMessage.message_id``."""
    return _is_text(value) and len(str(value)) <= MAX_MESSAGE_ID_LENGTH


def unreadable_message(
    message_id: str, destination: object, body: object, due_at: datetime, reason: str
) -> DelayedMessage:
    """A well-formed stand-in for a store row that cannot be read, marked ``DelayedDelivery.Unreadable``.

    The dispatcher moves it to the error queue with ``reason`` instead of sending it. ``message_id`` must find the
    row in its store; the row's destination and body are kept where usable (a text body as its bytes).
    """
    where = destination if isinstance(destination, str) and _is_text(destination) else "unreadable"
    text = reason.encode("utf-8", "backslashreplace").decode("utf-8")[:1024]
    return DelayedMessage(message_id, where, _salvaged(body), due_at, {UNREADABLE: text})


def _salvaged(body: object) -> bytes:
    """The bytes of a stored body: bytes as they are, text as UTF-8 (undoing ``surrogateescape``), else none."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        try:
            return body.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return body.encode("utf-8", "backslashreplace")
    return b""
