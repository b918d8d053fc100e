"""Which queues the Azure dispatcher may send to: its own storage account's queues, optionally narrowed.

A destination comes from a table row, so anyone who can write to the table chooses it. The dispatcher
therefore sends only to a plain queue name, which its queue client resolves inside its own storage
account; a URL, an ``account/queue`` path or anything else that is not a queue name is refused. With
``DELAYED_DELIVERY_ALLOWED_DESTINATIONS`` set (comma-separated queue names or ``*``/``?`` patterns), only
matching queues are allowed. The error queue is always allowed. A refused message is never sent: its
delivery fails with ``PermanentError`` and the dispatcher moves it to the error queue with the reason.

A message no queue can take (over 64 KiB as a queue message) fails permanently too, and if its error-queue
copy does not fit either, the copy goes without the body (the reason says so) instead of being retried forever.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from .. import headers as hdr
from ..errors import ConfigurationError, InvalidMessageError, PermanentError
from ..model import DelayedMessage
from ..ports import BoundedTransport, PlacingTransport, Transport

__all__ = ["DestinationPolicy", "GuardedTransport", "parse_patterns"]

#: A storage queue name: 3-63 lowercase letters, digits and single hyphens, starting and ending alphanumeric.
_QUEUE_NAME = re.compile(r"\A[a-z0-9](?:[a-z0-9]|-(?!-)){1,61}[a-z0-9]\Z")
_PATTERN = re.compile(r"\A[a-z0-9*?-]{1,63}\Z")


def parse_patterns(raw: str, variable: str) -> tuple[str, ...]:
    """Comma-separated queue names or ``*``/``?`` patterns; ``ConfigurationError`` names a bad one."""
    patterns = tuple(p.strip() for p in raw.split(",") if p.strip())
    for pattern in patterns:
        if not _PATTERN.match(pattern):
            raise ConfigurationError(
                f"{variable}: {pattern!r} is not a queue name or pattern (lowercase letters, digits, '-', '*', '?'; "
                "queues of other storage accounts cannot be allowed)"
            )
    return patterns


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """Queues of the dispatcher's own storage account, matching ``patterns`` when there are any."""

    error_queue: str
    patterns: tuple[str, ...] = ()

    def refusal(self, destination: str) -> str | None:
        """Why ``destination`` may not be sent to, or ``None`` when it may."""
        if destination == self.error_queue:
            return None
        if not _QUEUE_NAME.match(destination):
            return (
                f"destination {destination[:100]!r} is not a queue name of this storage account "
                "(URLs and other accounts are never sent to)"
            )
        if self.patterns and not any(fnmatchcase(destination, p) for p in self.patterns):
            return f"destination {destination!r} is not in DELAYED_DELIVERY_ALLOWED_DESTINATIONS"
        return None


class GuardedTransport:
    """A ``Transport`` that refuses (``PermanentError``) destinations its policy does not allow."""

    def __init__(self, inner: Transport, policy: DestinationPolicy) -> None:
        self.inner = inner
        self.policy = policy

    @property
    def max_delay_seconds(self) -> int:
        """The inner transport's longest placement (0: it cannot hide what it sends)."""
        return self.inner.max_delay_seconds if isinstance(self.inner, PlacingTransport) else 0

    @property
    def send_timeout(self) -> float:
        """The inner transport's longest send (0: it says none)."""
        return self.inner.send_timeout if isinstance(self.inner, BoundedTransport) else 0.0

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        """``send``, the message hidden on its queue for ``delay_seconds`` (release control's placement)."""
        self.send(message, delay_seconds)

    def send(self, message: DelayedMessage, delay_seconds: int = 0) -> None:
        """Send through the inner transport, or raise ``PermanentError`` without sending."""
        reason = self.policy.refusal(message.destination)
        if reason is not None:
            raise PermanentError(f"message {message.message_id!r}: {reason}")
        try:
            if delay_seconds:
                if not isinstance(self.inner, PlacingTransport):
                    raise PermanentError(f"{type(self.inner).__name__} cannot hide a message for a while")
                self.inner.send_delayed(message, delay_seconds)
            else:
                self.inner.send(message)
        except InvalidMessageError as exc:  # e.g. larger than a queue message: it never fits, so never retry
            if message.destination != self.policy.error_queue or hdr.FAILURE_REASON not in message.headers:
                raise PermanentError(str(exc)) from exc
            # The error-queue copy itself does not fit: keep the reason, drop the body, rather than loop forever.
            note = f" (body of {len(message.body)} bytes not kept: too large for a queue message)"
            reason = message.headers[hdr.FAILURE_REASON] + note
            self.inner.send(replace(message, body=b"", headers={**message.headers, hdr.FAILURE_REASON: reason}))
