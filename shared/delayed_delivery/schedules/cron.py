"""The 5-field cron grammar (Vixie/Debian dialect plus ``L``, ``LW``, ``nW``, ``nL``, ``n#k``): text to field sets.

Fields: ``minute hour day-of-month month day-of-week``. Each field is a list of ``*``, ``?`` (= ``*``), ``a``,
``a-b``, ``a-b/s``, ``*/s`` or ``a/s`` (a to the field's maximum, step s); months and weekdays also by name
(JAN-DEC, SUN-SAT), weekday 0 and 7 both Sunday. Day-of-month extras: ``L`` (last day), ``LW`` (last weekday),
``nW`` (the weekday nearest day n, within the month); day-of-week extras: ``nL`` (last weekday n of the month) and
``n#k`` (k-th weekday n, k = 1..5). Macros ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/
``@midnight``, ``@hourly``. Every refusal is one line naming the field and the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidScheduleError

__all__ = ["MACROS", "CronFields", "DaysOfMonth", "DaysOfWeek", "parse_cron"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: Longest cron text read (a list of every minute written out is about 170 characters).
MAX_CRON_LENGTH = 1000

_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_WEEKDAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_RANGE = re.compile(r"^(?P<a>[0-9A-Z]+)(?:-(?P<b>[0-9A-Z]+))?(?:/(?P<step>[0-9]+))?$")
_STAR = re.compile(r"^[*?](?:/(?P<step>[0-9]+))?$")
_NEAREST = re.compile(r"^(?P<n>[0-9]+)W$")
_LAST_WEEKDAY = re.compile(r"^(?P<d>[0-9]|[A-Z]{3})L$")
_NTH_WEEKDAY = re.compile(r"^(?P<d>[0-9]|[A-Z]{3})#(?P<k>[0-9]+)$")
_CLASHING_DIALECTS = (
    "seconds first (Quartz, Azure Functions NCRONTAB, cronsim), a year last with weekdays 1-7 = SUN-SAT "
    "(EventBridge), or seconds last (croniter's option)"
)


@dataclass(frozen=True, slots=True)
class DaysOfMonth:
    """The day-of-month field: plain days, ``L``, ``LW`` and ``nW``."""

    days: frozenset[int] = frozenset()
    last: bool = False
    last_weekday: bool = False
    nearest_weekday: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class DaysOfWeek:
    """The day-of-week field, Sunday = 0: plain weekdays, ``nL`` (last n of the month) and ``n#k``."""

    days: frozenset[int] = frozenset()
    last: frozenset[int] = frozenset()
    nth: frozenset[tuple[int, int]] = frozenset()


@dataclass(frozen=True, slots=True)
class CronFields:
    """A parsed 5-field expression: the values each field allows, and which fields begin with ``*``/``?``."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: DaysOfMonth
    months: frozenset[int]
    days_of_week: DaysOfWeek
    #: Per field, whether it begins with ``*`` or ``?`` (the Vixie day rule and the vixie preset read this).
    starred: tuple[bool, bool, bool, bool, bool]

    @property
    def every_hour(self) -> bool:
        """Whether the hour field covers all 24 hours (a cadence, for the ``auto`` DST policy)."""
        return len(self.hours) == 24


def parse_cron(text: str) -> CronFields:
    """Parse a 5-field expression or macro; ``InvalidScheduleError`` names the field and the problem."""
    if not isinstance(text, str):
        raise InvalidScheduleError(f"a cron expression is text, not {type(text).__name__}")
    if len(text) > MAX_CRON_LENGTH:
        raise InvalidScheduleError(f"cron expression is longer than {MAX_CRON_LENGTH} characters")
    source = text.strip()
    if source.startswith("@"):
        expanded = MACROS.get(source.lower())
        if expanded is None:
            raise InvalidScheduleError(f"unknown cron macro {source[:40]!r}: use one of {', '.join(MACROS)}")
        source = expanded
    fields = source.upper().split()
    if len(fields) in (6, 7):
        raise InvalidScheduleError(
            f"{text.strip()[:100]!r} has {len(fields)} fields; cron here has 5 (minute hour day-of-month month "
            f"day-of-week), because 6 or 7 fields mean different things in three dialects: {_CLASHING_DIALECTS}"
        )
    if len(fields) != 5:
        raise InvalidScheduleError(
            f"{text.strip()[:100]!r} has {len(fields)} field(s); cron has 5: minute hour day-of-month month day-of-week"
        )
    minute, hour, dom, month, dow = fields
    return CronFields(
        text=" ".join(fields),
        minutes=tuple(sorted(_plain(minute, 0))),
        hours=tuple(sorted(_plain(hour, 1))),
        days_of_month=_days_of_month(dom),
        months=frozenset(_plain(month, 3)),
        days_of_week=_days_of_week(dow),
        starred=tuple(f[0] in "*?" for f in fields),  # type: ignore[arg-type]  # five fields, checked above
    )


def _refuse(index: int, item: str, problem: str) -> InvalidScheduleError:
    low, high = _BOUNDS[index]
    return InvalidScheduleError(f"cron {_NAMES[index]} field: {item[:40]!r} {problem} (allowed {low}-{high})")


def _number(index: int, token: str, item: str) -> int:
    """One value of a field: digits, or a month or weekday name where the field takes names."""
    names = _MONTHS if index == 3 else _WEEKDAYS if index == 4 else {}
    if token in names:
        return names[token]
    if not token.isdigit() or not token.isascii():
        raise _refuse(index, item, "is not a number" + (" or a name" if names else ""))
    value = int(token)
    low, high = _BOUNDS[index]
    if not low <= value <= high:
        raise _refuse(index, item, f"holds {value}, out of range")
    return value


def _plain(field: str, index: int) -> set[int]:
    """The values of a field of numbers (and names): lists of ``*``, ``a``, ``a-b``, ``/step`` forms."""
    values: set[int] = set()
    for item in field.split(","):
        values |= _item(index, item)
    if index == 4:
        values = {v % 7 for v in values}  # 7 is Sunday too
    return values


def _item(index: int, item: str) -> set[int]:
    low, high = _BOUNDS[index]
    if not item:
        raise _refuse(index, item, "is empty (two commas in a row, or a trailing comma)")
    star = _STAR.match(item)
    if star is not None:
        start, end, step = low, high, star.group("step")
    else:
        match = _RANGE.match(item)
        if match is None:
            raise _refuse(index, item, "is not a value, range or step")
        start = _number(index, match.group("a"), item)
        step = match.group("step")
        b = match.group("b")
        end = _number(index, b, item) if b is not None else (high if step is not None else start)
        if end < start:
            raise _refuse(index, item, f"is a reversed range ({start} after {end}); write the lower bound first")
    stride = 1 if step is None else int(step)
    if stride < 1:
        raise _refuse(index, item, "has step 0")
    if stride > high - low + 1:
        raise _refuse(index, item, f"has step {stride}, larger than the field")
    return set(range(start, end + 1, stride))


def _days_of_month(field: str) -> DaysOfMonth:
    days: set[int] = set()
    last = last_weekday = False
    nearest: set[int] = set()
    for item in field.split(","):
        if item == "L":
            last = True
        elif item == "LW":
            last_weekday = True
        elif (m := _NEAREST.match(item)) is not None:
            nearest.add(_number(2, m.group("n"), item))
        else:
            days |= _item(2, item)
    return DaysOfMonth(frozenset(days), last, last_weekday, frozenset(nearest))


def _days_of_week(field: str) -> DaysOfWeek:
    days: set[int] = set()
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in field.split(","):
        if (m := _LAST_WEEKDAY.match(item)) is not None:
            last.add(_number(4, m.group("d"), item) % 7)
        elif (m := _NTH_WEEKDAY.match(item)) is not None:
            k = int(m.group("k"))
            if not 1 <= k <= 5:
                raise InvalidScheduleError(f"cron day-of-week field: {item[:40]!r} asks for week {k}; use #1 to #5")
            nth.add((_number(4, m.group("d"), item) % 7, k))
        elif item == "L":
            raise _refuse(4, item, "is ambiguous: write nL for the last weekday n of the month (e.g. 5L)")
        else:
            days |= {v % 7 for v in _item(4, item)}
    return DaysOfWeek(frozenset(days), frozenset(last), frozenset(nth))
