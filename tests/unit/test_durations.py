from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery import InvalidMessageError, format_duration, parse_duration, to_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("2h30m", 9000),
        ("40d", 40 * 86400),
        ("365d", 31_536_000),
        ("1y", 31_536_000),
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
        ("1y 2w", 31_536_000 + 14 * 86400),
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
