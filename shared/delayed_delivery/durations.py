"""Parsing and validating delays: seconds, timedeltas and strings such as ``2h30m`` or ``365d``."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from .clock import utc
from .errors import InvalidMessageError

__all__ = ["MAX_DELAY", "YEAR_SECONDS", "Delay", "format_duration", "new_due_time", "parse_duration", "to_seconds"]

#: A year: 365.25 days, the calendar's average (so ``100y``, ``36525d`` and 100 calendar years from now agree).
YEAR_SECONDS = 365.25 * 86_400
#: The longest delay accepted anywhere: 100 years (36,525 days). Anything longer is almost surely a unit mistake.
MAX_DELAY = timedelta(seconds=100 * YEAR_SECONDS)

Delay = float | int | timedelta | str

#: Units from the largest to the smallest: a duration names each at most once, in this order.
_UNITS = {"y": YEAR_SECONDS, "w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_ORDER = list(_UNITS)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
#: Unit words people write, and the unit each stands for ("40 days" as "40d", "5 min" as "5m").
_WORDS = {
    **dict.fromkeys(("years", "year", "yrs", "yr", "y"), "y"),
    **dict.fromkeys(("weeks", "week", "wks", "wk", "w"), "w"),
    **dict.fromkeys(("days", "day", "d"), "d"),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), "h"),
    **dict.fromkeys(("minutes", "minute", "mins", "min", "m"), "m"),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), "s"),
    **dict.fromkeys(("milliseconds", "millisecond", "msecs", "msec", "ms"), "ms"),
}
_PART = re.compile(
    r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(" + "|".join(sorted(_WORDS, key=len, reverse=True)) + r")(?![a-z])"
)
_HINT = (
    "use a number of seconds or units y, w, d, h, m, s, ms (or words: 40 days, 2 hours 30 minutes) from the largest "
    "to the smallest (e.g. 1d 2h 30m)"
)


def parse_duration(text: str) -> timedelta:
    """Parse ``90``, ``90s``, ``15m``, ``2h30m``, ``1d 2h 30m``, ``40d``, ``2y`` (a year is 365.25 days), ``1.5h``, or
    the same with words (``40 days``, ``2 hours 30 minutes``, ``5 min``)."""
    if not isinstance(text, str):
        raise InvalidMessageError(f"a duration must be a str, not {type(text).__name__}")
    raw = text.strip().lower()
    if not raw:
        raise InvalidMessageError("empty duration: use e.g. 90s, 15m, 2h30m, 40d or 1y")
    _refuse_loose_forms(text, raw)
    if _NUMBER.fullmatch(raw):
        return _checked(float(raw), text)
    pos, total, last = 0, 0.0, -1
    while pos < len(raw):
        match = _PART.match(raw, pos)
        if match is None:
            raise InvalidMessageError(f"cannot read duration {text!r}: {_HINT}")
        unit = _WORDS[match.group(2)]
        rank = _ORDER.index(unit)
        if rank == last:
            raise InvalidMessageError(f"cannot read duration {text!r}: repeated unit {unit!r}")
        if rank < last:
            raise InvalidMessageError(
                f"cannot read duration {text!r}: units go from largest to smallest (e.g. 1d 2h 30m), "
                f"got {unit!r} after {_ORDER[last]!r}"
            )
        last = rank
        total += float(match.group(1)) * _UNITS[unit]
        pos = match.end()
    return _checked(total, text)


def _refuse_loose_forms(text: str, raw: str) -> None:
    """Specific errors for what a looser parser would have read: signs, NaN, infinity, ``_`` and other digits."""
    unsigned = raw.lstrip("+-").strip()
    if unsigned in ("nan", "nans"):
        raise InvalidMessageError(f"not a number: {text.strip()!r} (NaN) is no duration")
    if unsigned in ("inf", "infinity", "infs"):
        raise InvalidMessageError(f"infinite duration {text.strip()!r}: the longest delay is 100 years")
    if raw.startswith("-"):
        raise InvalidMessageError(f"negative durations are not allowed: {text.strip()!r}")
    if "_" in raw:
        raise InvalidMessageError(f"cannot read duration {text!r}: no underscores in numbers (write 1000, not 1_000)")
    if not text.isascii():
        if any(ch.isdigit() or ch.isdecimal() for ch in text if not ch.isascii()):
            raise InvalidMessageError(f"cannot read duration {text!r}: use ASCII digits 0-9")
        raise InvalidMessageError(f"cannot read duration {text!r}: only ASCII letters, digits and spaces")


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
        raise InvalidMessageError("delay is not a number (NaN)")
    if math.isinf(seconds):
        raise InvalidMessageError(f"delay {original!r} is infinite: the longest delay is 100 years")
    if seconds < 0:
        raise InvalidMessageError(f"delay {original!r} is negative: negative durations are not allowed")
    if seconds > MAX_DELAY.total_seconds():
        raise InvalidMessageError(f"delay {original!r} is longer than the 100-year maximum")
    return timedelta(seconds=seconds)


def new_due_time(due: datetime, now: datetime) -> datetime:
    """``due`` in UTC as a waiting message's new due time: after ``now`` and at most 100 years on (every route's rule).

    A time in the past is refused rather than read as "now": a record or row due before 1970 is one no reader can use.
    """
    due, now = utc(due), utc(now)
    if due <= now:
        raise InvalidMessageError(
            f"new due time {due.isoformat()} is in the past (now {now.isoformat()}): give a later one, or cancel the "
            "message"
        )
    if due - now > MAX_DELAY:
        raise InvalidMessageError(f"new due time {due.isoformat()} is more than 100 years away")
    return due


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
