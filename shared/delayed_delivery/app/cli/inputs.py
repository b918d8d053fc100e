"""What the operator and schedule commands read from their arguments: instants, bodies, headers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from delayed_delivery.app.routes import (  # no cloud SDK at import: the routes import theirs when used
    UsageError,
)
from delayed_delivery.clock import utc
from delayed_delivery.errors import (
    InvalidMessageError,
)

__all__ = ["MAX_BODY_BYTES", "parse_headers", "parse_instant", "read_body"]


def parse_instant(text: str, option: str) -> datetime:
    """``option``'s ISO-8601 instant with a time zone, in UTC; a one-line error otherwise."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidMessageError(f"cannot read {option} {text!r}: use ISO-8601, e.g. 2027-01-31T09:00:00Z") from None
    if parsed.tzinfo is None:
        raise InvalidMessageError(f"{option} {text!r} is naive (no time zone): add one, e.g. Z or +02:00")
    return utc(parsed)


#: The largest body ``send`` takes (inline or ``@FILE``); a file is read no further than one byte past it.
MAX_BODY_BYTES = 1024 * 1024


def read_body(body: str) -> bytes:
    """``--body``: the text, or the bytes of ``@FILE``, at most ``MAX_BODY_BYTES`` (an endless file stops there)."""
    if body.startswith("@"):
        path = Path(body[1:])
        try:
            with path.open("rb") as f:
                data = f.read(MAX_BODY_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"cannot read body file {str(path)!r}: {exc.strerror or exc}") from None
    else:
        data = body.encode()
    if len(data) > MAX_BODY_BYTES:
        raise UsageError(f"body larger than 1 MiB ({MAX_BODY_BYTES:,} bytes): send a reference to the data instead")
    return data


def parse_headers(pairs: list[str]) -> dict[str, str]:
    """``--header key=value`` pairs as a mapping."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--header {pair!r} is not key=value")
        out[key] = value
    return out
