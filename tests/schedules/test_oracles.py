"""cronsim and croniter as oracles (dev-only): where both accept an expression and agree on an instant, so do we.

Agreement is judged per instant of a window: an instant both oracles give must be ours (under the ``vixie`` preset,
the Debian rules cronsim copies), and an instant neither gives must not be. cronsim alone must equal ``vixie``
everywhere it accepts the expression (recurring-schedules.md: "cronsim must equal our vixie preset"), except in
Lord Howe: at its 30-minute fold cronsim 2.8 drops the 02:00 and 02:20 of ``*/20 2 * * *`` (slots that happen once);
croniter and the minute walker give them, and so do we (``test_cronsim_errs_at_lord_howe_and_we_follow_the_walker``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from cronsim import CronSim, CronSimError
from hypothesis import given, settings
from hypothesis import strategies as st

from delayed_delivery.schedules.recurrence import Recurrence

EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "5-50/15 3,9-11 * * *",
    "0 0 1 1 *",
    "30 2 * * *",
    "30 1 * * *",
    "0,30 2 * * *",
    "*/20 2 * * *",
    "0 */6 * * *",
    "15 10 * * MON-FRI",
    "0 12 1,15 * 5",
    "0 12 */2 * 1-5",
    "0 9 13 * FRI",
    "0 0 L * *",
    "0 0 LW * *",
    "0 6 * * 5L",
    "0 6 * * 1#2",
    "0 6 * * MON#5",
    "0 0 29 2 *",
    "0 0 * JAN,JUL SUN",
    "0 4 8-14 * 7",
    "59 23 31 DEC *",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@yearly",
    "0 0 ? * 2",
]
#: Per zone, the starts of windows that hold its DST transitions (spring and autumn 2027).
WINDOWS = {
    "UTC": ["2027-02-26T00:00:00Z"],
    "America/New_York": ["2027-03-12T00:00:00Z", "2027-11-05T00:00:00Z"],
    "Europe/Berlin": ["2027-03-26T00:00:00Z", "2027-10-29T00:00:00Z"],
    "Australia/Lord_Howe": ["2027-04-02T00:00:00Z", "2027-10-01T00:00:00Z"],
    "Asia/Kathmandu": ["2027-12-30T00:00:00Z"],
}
ZONES = list(WINDOWS)
#: Zones where cronsim's fold handling (written for 1-hour shifts) is not the reference.
_HALF_HOUR = {"Australia/Lord_Howe"}
SPAN = timedelta(days=4)
PER_WINDOW = 300


def _collect(step: Callable[[], datetime], end: datetime) -> set[datetime]:
    found: set[datetime] = set()
    for _ in range(PER_WINDOW):
        t = step().astimezone(UTC)
        if t >= end:
            break
        found.add(t)
    return found


#: The macros as cron(8) documents them (cronsim reads none of them, nor ``?``).
_MACROS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *"}
_MACROS["@yearly"] = "0 0 1 1 *"


def _cronsim(expression: str, zone: str, start: datetime, end: datetime) -> set[datetime] | None:
    text = _MACROS.get(expression, expression).replace("?", "*")
    try:
        it: Iterator[datetime] = iter(CronSim(text, start.astimezone(ZoneInfo(zone))))
    except (CronSimError, ValueError):
        return None
    return _collect(lambda: next(it), end)


def _croniter(expression: str, zone: str, start: datetime, end: datetime) -> set[datetime] | None:
    try:
        it = croniter(expression, start.astimezone(ZoneInfo(zone)))
    except (ValueError, KeyError, TypeError):
        return None
    return _collect(lambda: it.get_next(datetime), end)


def _ours(expression: str, zone: str, start: datetime, end: datetime) -> set[datetime]:
    """Our instants in ``(start, end)`` (the oracles answer strictly after ``start``), at most ``PER_WINDOW``."""
    fires = Recurrence(expression, zone, dst="vixie").fires(start + timedelta(seconds=1), end)
    return {f.nominal for _, f in zip(range(PER_WINDOW), fires, strict=False)}


def _check(expression: str, zone: str, start: datetime) -> tuple[bool, bool]:
    """Assert the agreement rules for one window; whether cronsim and croniter took part."""
    end = start + SPAN
    ours = _ours(expression, zone, start, end)
    sim, iter_ = _cronsim(expression, zone, start, end), _croniter(expression, zone, start, end)
    if sim is not None and zone not in _HALF_HOUR:
        assert ours == sim, f"cronsim differs on {expression!r} in {zone}: {sorted(ours ^ sim)[:6]}"
    if sim is not None and iter_ is not None:
        both, neither_ours = sim & iter_, ours - (sim | iter_)
        assert both <= ours, f"both oracles give {sorted(both - ours)[:6]} for {expression!r} in {zone}"
        assert not neither_ours, f"neither oracle gives {sorted(neither_ours)[:6]} for {expression!r} in {zone}"
    return sim is not None, iter_ is not None


@pytest.mark.parametrize("zone", ZONES)
def test_we_agree_with_cronsim_and_with_croniter_where_they_agree(zone: str) -> None:
    took_part = [_check(e, zone, datetime.fromisoformat(s)) for e in EXPRESSIONS for s in WINDOWS[zone]]
    assert all(sim for sim, _ in took_part), "cronsim refused an expression"
    assert sum(both for _, both in took_part) >= len(took_part) // 2, "croniter refused too many"


@st.composite
def _expressions(draw: st.DrawFn) -> str:
    def part(low: int, high: int, names: list[str] | None = None) -> str:
        kind = draw(st.sampled_from(["star", "value", "range", "step", "list"]))
        a = draw(st.integers(low, high - 1))
        b = draw(st.integers(a + 1, high))  # a-a: see test_a_one_value_range_is_that_value
        if kind == "star":
            return "*"
        if kind == "value":
            return names[a - low] if names and draw(st.booleans()) else str(a)
        if kind == "range":
            return f"{a}-{b}"
        if kind == "step":
            return f"{draw(st.sampled_from(['*', f'{a}-{b}']))}/{draw(st.integers(1, high - low + 1))}"
        return ",".join(str(draw(st.integers(low, high))) for _ in range(draw(st.integers(2, 4))))

    months = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
    days = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
    return " ".join(
        [part(0, 59), part(0, 23), part(1, 31), part(1, 12, months), part(0, 6, days)]  # 7 for Sunday: below
    )


@settings(max_examples=40)
@given(expression=_expressions(), zone=st.sampled_from(ZONES), which=st.integers(0, 1))
def test_random_expressions_agree_with_cronsim(expression: str, zone: str, which: int) -> None:
    start = WINDOWS[zone][which % len(WINDOWS[zone])]
    try:
        Recurrence(expression, zone)
    except ValueError:
        return  # never fires in 400 years (e.g. day 31 of a 30-day month with no weekday restriction)
    _check(expression, zone, datetime.fromisoformat(start))


def test_sunday_is_0_and_7_for_all_three() -> None:
    start = datetime(2027, 5, 1, tzinfo=UTC)
    for expression in ("0 0 * * 0", "0 0 * * 7"):
        assert _check(expression, "UTC", start) == (True, True)
        assert {t.isoweekday() for t in _ours(expression, "UTC", start, start + SPAN)} == {7}


def test_cronsim_errs_at_lord_howe_and_we_follow_the_walker() -> None:
    from tests.schedules.walker import Walk

    start = datetime(2027, 4, 3, tzinfo=UTC)
    end = start + timedelta(days=2)
    sim = _cronsim("*/20 2 * * *", "Australia/Lord_Howe", start, end)
    iter_ = _croniter("*/20 2 * * *", "Australia/Lord_Howe", start, end)
    ours = _ours("*/20 2 * * *", "Australia/Lord_Howe", start, end)
    walked = set(Walk("*/20 2 * * *", "Australia/Lord_Howe", start, end).instants("skip", "both"))
    assert ours == walked == iter_
    assert sim is not None and sim < ours  # cronsim 2.8 drops 02:00 and 02:20 of 04-04 (+10:30)


def test_a_one_value_range_is_that_value() -> None:
    """``20-20/1`` is hour 20 (Vixie's entry.c: a range num1-num2 then its step); cronsim 2.8 and croniter 7.0.0
    both read it as 20-23, a quirk of theirs that we do not follow (and disagree on ``5-5/2``)."""
    start = datetime(2027, 3, 10, tzinfo=UTC)
    ours = _ours("0 20-20/1 * * *", "UTC", start, start + SPAN)
    assert {t.hour for t in ours} == {20}
    assert ours == _ours("0 20 * * *", "UTC", start, start + SPAN)
    sim = _cronsim("0 20-20/1 * * *", "UTC", start, start + SPAN)
    assert sim is not None and {t.hour for t in sim} == {20, 21, 22, 23}
