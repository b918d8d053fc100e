"""Schedule expressions: ``cron(...)`` or a bare 5-field string, ``rate(N unit)`` and ``at(...)``.

``rate(N seconds|minutes|hours|days)`` is absolute time: the anchor plus k·N units, a day being 86,400 s, so
daylight saving never applies. ``at(2027-03-14T02:30)`` is a local time in the schedule's zone (mapped by the DST
policy); ``at(2027-03-14T07:30Z)`` or with an offset is one absolute instant. Instants are whole seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from ..durations import MAX_DELAY
from ..errors import InvalidScheduleError
from .cron import MAX_CRON_LENGTH, CronFields, parse_cron

__all__ = ["AtExpression", "CronExpression", "Expression", "RateExpression", "parse_expression"]

_RATE = re.compile(r"^rate\(\s*(?P<n>[0-9]+)\s+(?P<unit>[a-z]+)\s*\)$", re.IGNORECASE)
_AT = re.compile(r"^at\(\s*(?P<when>[^()]*?)\s*\)$", re.IGNORECASE)
_CRON = re.compile(r"^cron\((?P<fields>[^()]*)\)$", re.IGNORECASE)
_UNITS = {"second": 1, "minute": 60, "hour": 3_600, "day": 86_400}
#: The longest rate period: 100 years, the longest delay (36,525 days: one definition, ``durations.MAX_DELAY``).
MAX_RATE_SECONDS = int(MAX_DELAY.total_seconds())


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A 5-field cron expression."""

    fields: CronFields

    def __str__(self) -> str:
        return self.fields.text


@dataclass(frozen=True, slots=True)
class RateExpression:
    """Every ``seconds`` seconds from the schedule's anchor."""

    seconds: int
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class AtExpression:
    """One time: ``local`` (naive, in the schedule's zone, through the DST policy) or ``instant`` (UTC)."""

    local: datetime | None
    instant: datetime | None
    text: str

    def __str__(self) -> str:
        return self.text


Expression = CronExpression | RateExpression | AtExpression


def parse_expression(text: str) -> Expression:
    """Parse any expression; ``InvalidScheduleError`` says in one line what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidScheduleError("empty schedule expression: give cron fields, rate(N unit) or at(time)")
    if len(text) > MAX_CRON_LENGTH:
        raise InvalidScheduleError(f"schedule expression is longer than {MAX_CRON_LENGTH} characters")
    source = text.strip()
    head = source[:5].lower()
    if head.startswith("rate"):
        return _rate(source)
    if head.startswith("at("):
        return _at(source)
    cron = _CRON.match(source)
    return CronExpression(parse_cron(cron.group("fields") if cron else source))


def _rate(source: str) -> RateExpression:
    match = _RATE.match(source)
    if match is None:
        raise InvalidScheduleError(
            f"cannot read {source[:60]!r}: write rate(N unit) with a whole N and a unit of seconds, minutes, hours or "
            "days, e.g. rate(15 minutes)"
        )
    unit = match.group("unit").lower()
    size = _UNITS.get(unit.removesuffix("s"))
    if size is None:
        raise InvalidScheduleError(f"rate unit {unit!r}: use seconds, minutes, hours or days")
    count = int(match.group("n"))
    if count < 1:
        raise InvalidScheduleError(f"{source[:60]!r}: a rate needs N of at least 1")
    if count * size > MAX_RATE_SECONDS:
        raise InvalidScheduleError(f"{source[:60]!r}: a rate period is at most 100 years")
    name = unit.removesuffix("s")
    return RateExpression(count * size, f"rate({count} {name}{'' if count == 1 else 's'})")


def _at(source: str) -> AtExpression:
    match = _AT.match(source)
    when = match.group("when") if match else ""
    try:
        if "T" not in when.upper():
            raise ValueError("no time of day")
        moment = datetime.fromisoformat(when)
        instant = moment.astimezone(UTC) if moment.tzinfo is not None else None
    except (ValueError, OverflowError):
        raise InvalidScheduleError(
            f"cannot read {source[:60]!r}: write at(YYYY-MM-DDThh:mm[:ss]) for a local time in the schedule's zone, "
            "or with Z or an offset for an absolute instant (e.g. at(2027-03-14T07:30Z))"
        ) from None
    if moment.microsecond:
        raise InvalidScheduleError(f"{source[:60]!r}: at(...) takes whole seconds")
    if instant is None:
        return AtExpression(moment, None, f"at({moment.isoformat()})")
    return AtExpression(None, instant, f"at({instant.strftime('%Y-%m-%dT%H:%M:%SZ')})")
