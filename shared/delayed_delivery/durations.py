"""Parsing and validating delays: seconds, timedeltas and strings such as ``2h30m`` or ``365d``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import InvalidMessageError

__all__ = ["MAX_DELAY", "Delay", "format_duration", "parse_duration", "to_seconds"]

#: The longest delay accepted anywhere: 100 years. Anything longer is almost surely a unit mistake.
MAX_DELAY = timedelta(days=36_525)

Delay = float | int | timedelta | str

_UNITS = {"w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "y": 31_536_000.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|[wdhmsy])")


def parse_duration(text: str) -> timedelta:
    """Parse ``90``, ``90s``, ``15m``, ``2h30m``, ``40d``, ``2y`` (365 days) or ``1.5h`` into a timedelta."""
    raw = text.strip().lower().replace(" ", "")
    if not raw:
        raise InvalidMessageError("empty duration: use e.g. 90s, 15m, 2h30m, 40d or 1y")
    try:
        return _checked(float(raw), text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(raw) or pos == 0:
        raise InvalidMessageError(
            f"cannot read duration {text!r}: use a number of seconds or units w, d, h, m, s, ms, y (e.g. 2h30m)"
        )
    return _checked(total, text)


def to_seconds(delay: Delay) -> float:
    """Validate a delay given as seconds, a timedelta or a duration string; return seconds."""
    if isinstance(delay, bool):
        raise InvalidMessageError("a delay must be a number of seconds, a timedelta or a duration string, not a bool")
    if isinstance(delay, str):
        return parse_duration(delay).total_seconds()
    if isinstance(delay, timedelta):
        return _checked(delay.total_seconds(), delay).total_seconds()
    if isinstance(delay, int | float):
        try:
            seconds = float(delay)
        except OverflowError:  # an int beyond any float, e.g. 10**400 (not printed: it may be huge)
            what = "negative" if delay < 0 else "longer than the 100-year maximum"
            raise InvalidMessageError(f"delay of {int(delay).bit_length()} bits is {what}") from None
        return _checked(seconds, delay).total_seconds()
    raise InvalidMessageError(
        f"a delay must be a number of seconds, a timedelta or a duration string, not {type(delay).__name__}"
    )


def _checked(seconds: float, original: object) -> timedelta:
    if math.isnan(seconds):
        raise InvalidMessageError("delay is NaN")
    if math.isinf(seconds):
        raise InvalidMessageError("delay is infinite")
    if seconds < 0:
        raise InvalidMessageError(f"delay {original!r} is negative")
    if seconds > MAX_DELAY.total_seconds():
        raise InvalidMessageError(f"delay {original!r} is longer than the 100-year maximum")
    return timedelta(seconds=seconds)


def format_duration(seconds: float) -> str:
    """Render seconds compactly, e.g. ``1d 2h``, ``15m``, ``845s``."""
    if seconds < 60:
        return f"{seconds:g}s"
    parts = []
    rest = round(seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts[:2])
