from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery import InvalidMessageError, format_duration, parse_duration, to_seconds
from delayed_delivery.durations import MAX_DELAY, YEAR_SECONDS, new_due_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("2h30m", 9000),
        ("40d", 40 * 86400),
        ("365d", 31_536_000),
        ("1y", 31_557_600),  # a year is 365.25 days
        ("1.5h", 5400),
        ("500ms", 0.5),
        (" 2W ", 14 * 86400),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "abc", "5x", "h", "1h-2m", "-5", "nan", "inf", "200y"])
def test_bad_durations_have_clear_errors(bad: str) -> None:
    with pytest.raises(InvalidMessageError):
        parse_duration(bad)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), float("-inf"), True, 10**12, timedelta(days=-1)])
def test_to_seconds_rejects_bad_numbers(bad: object) -> None:
    with pytest.raises(InvalidMessageError):
        to_seconds(bad)  # type: ignore[arg-type]


@given(st.floats(min_value=0, max_value=3_000_000_000, allow_nan=False))
def test_numbers_and_timedeltas_agree(seconds: float) -> None:
    assert to_seconds(seconds) == pytest.approx(to_seconds(timedelta(seconds=seconds)), abs=1e-6)


def test_format_duration() -> None:
    assert format_duration(845) == "14m 5s"
    assert format_duration(31_536_000) == "365d"
    assert format_duration(5) == "5s"


@pytest.mark.parametrize(
    ("huge", "needle"),
    [(10**400, "100-year"), (-(10**400), "negative"), (10**5000, "100-year")],
    ids=["1e400", "-1e400", "1e5000"],
)
def test_integer_delay_too_large_for_a_float_is_invalid_not_overflow_error(huge: int, needle: str) -> None:
    # found by tests/reliability/test_sender_fuzz.py: float(10**400) raised OverflowError out of every sender
    with pytest.raises(InvalidMessageError, match=needle):
        to_seconds(huge)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1d 2h 30m", 86400 + 9000),
        ("1y 2w", 31_557_600 + 14 * 86400),
        ("1h 30m 15s 500ms", 5415.5),
        ("2 h 30 m", 9000),
        ("0", 0),
        ("0.5s", 0.5),
    ],
)
def test_strict_grammar_keeps_sane_forms(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("1_000", "underscore"),
        ("1_000s", "underscore"),
        ("\u0663d", "ASCII digits"),
        ("\uff11\uff12", "ASCII digits"),
        ("1d 1d 1d", "repeated unit 'd'"),
        ("1h 2d", "largest to smallest"),
        ("-5", "negative durations are not allowed"),
        ("-5m", "negative durations are not allowed"),
        ("nan", "not a number: 'nan'"),
        ("NaN", "not a number"),
        ("inf", "infinite"),
        ("-infinity", "infinite"),
        ("1e3", "cannot read duration"),
        ("1 000", "cannot read duration"),
        ("1.5.5h", "cannot read duration"),
    ],
)
def test_strict_grammar_has_specific_messages(bad: str, needle: str) -> None:
    with pytest.raises(InvalidMessageError, match=needle):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [(float("nan"), "not a number"), (float("inf"), "infinite"), (-1, "negative durations are not allowed")],
)
def test_numbers_have_specific_messages(bad: float, needle: str) -> None:
    with pytest.raises(InvalidMessageError, match=needle):
        to_seconds(bad)


#: "100 years" in every spelling a caller may use: the year unit, words, days, hours, seconds, a timedelta.
HUNDRED_YEARS = ["100y", "100 years", "36525d", "876600h", "3155760000", 3_155_760_000, timedelta(days=36_525)]


@pytest.mark.parametrize("spelling", HUNDRED_YEARS, ids=str)
def test_every_spelling_of_100_years_is_the_same_limit(spelling: object) -> None:
    """One definition: a year is 365.25 days, so ``100y`` and ``36525d`` are the limit itself (issue 32: they were 25
    days apart, ``100y 20d`` passed while ``101y`` did not)."""
    assert to_seconds(spelling) == MAX_DELAY.total_seconds() == 100 * YEAR_SECONDS  # type: ignore[arg-type]


@pytest.mark.parametrize("spelling", ["100y 1s", "100 years 1 second", "36525d 1s", "3155760001", "100y 1d"])
def test_a_second_past_100_years_is_refused_in_every_spelling(spelling: str) -> None:
    with pytest.raises(InvalidMessageError, match="100-year maximum"):
        to_seconds(spelling)


def test_100_calendar_years_ahead_is_within_the_limit() -> None:
    """An ``--at`` 100 calendar years on (36,524 or 36,525 days, whatever the leap years) is within the limit."""
    for start in (
        datetime(2024, 2, 29, tzinfo=UTC),
        datetime(2026, 11, 28, tzinfo=UTC),
        datetime(2099, 3, 1, tzinfo=UTC),
    ):
        later = start.replace(year=start.year + 100, day=min(start.day, 28))
        assert new_due_time(later, start) == later
        with pytest.raises(InvalidMessageError, match="more than 100 years"):
            new_due_time(start + MAX_DELAY + timedelta(seconds=1), start)


def test_schedules_use_the_same_100_years() -> None:
    """A rate period and a catch-up window are at most 100 years too, the same 36,525 days (they were 36,500)."""
    from delayed_delivery.errors import InvalidScheduleError
    from delayed_delivery.schedules.catchup import CatchUp
    from delayed_delivery.schedules.expressions import parse_expression

    assert str(parse_expression("rate(36525 days)")) == "rate(36525 days)"
    assert CatchUp(window_seconds=int(MAX_DELAY.total_seconds())).window_seconds == 3_155_760_000
    with pytest.raises(InvalidScheduleError, match="100 years"):
        parse_expression("rate(36526 days)")
    with pytest.raises(InvalidScheduleError, match="100 years"):
        CatchUp(window_seconds=int(MAX_DELAY.total_seconds()) + 1)
