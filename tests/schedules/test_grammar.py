"""The grammar: what parses to which values, and the one-line refusals."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from delayed_delivery.errors import InvalidScheduleError
from delayed_delivery.schedules.cron import MACROS, parse_cron
from delayed_delivery.schedules.days import DayMatch
from delayed_delivery.schedules.expressions import AtExpression, RateExpression, parse_expression
from delayed_delivery.schedules.recurrence import Recurrence


def test_names_ranges_steps_lists_and_sunday_seven() -> None:
    f = parse_cron("5-50/15,59 9-11/2 1,15,L * MON-FRI,7")
    assert f.minutes == (5, 20, 35, 50, 59)
    assert f.hours == (9, 11)
    assert f.days_of_month.days == {1, 15} and f.days_of_month.last
    assert f.months == set(range(1, 13))
    assert f.days_of_week.days == {0, 1, 2, 3, 4, 5}
    assert parse_cron("0 0 * jan-mar,Dec sun").months == {1, 2, 3, 12}
    assert parse_cron("30/10 * * * *").minutes == (30, 40, 50)
    assert parse_cron("0 0 ? 1 ?").starred == (False, False, True, False, True)
    assert parse_cron("0 0 * * 5-7").days_of_week.days == {5, 6, 0}
    extras = parse_cron("0 0 LW,15W * 5L,MON#2")
    assert extras.days_of_month.last_weekday and extras.days_of_month.nearest_weekday == {15}
    assert extras.days_of_week.last == {5} and extras.days_of_week.nth == {(1, 2)}


@pytest.mark.parametrize("macro", list(MACROS))
def test_macros_are_their_expansions(macro: str) -> None:
    start = datetime(2027, 1, 1, tzinfo=UTC)
    ours = [f.nominal for f in Recurrence(macro).fires(start, datetime(2028, 1, 1, tzinfo=UTC))]
    assert ours == [f.nominal for f in Recurrence(MACROS[macro]).fires(start, datetime(2028, 1, 1, tzinfo=UTC))]
    assert ours


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("60 * * * *", "minute field: '60' holds 60, out of range"),
        ("0 24 * * *", "hour field: '24' holds 24, out of range"),
        ("0 0 0 * *", "day-of-month field: '0' holds 0"),
        ("0 0 32 * *", "day-of-month field: '32' holds 32"),
        ("0 0 * 13 *", "month field: '13' holds 13"),
        ("0 0 * * 8", "day-of-week field: '8' holds 8"),
        ("*/0 * * * *", "step 0"),
        ("0 5-2 * * *", "reversed range (5 after 2)"),
        ("0 0 * * FRI-MON", "reversed range"),
        ("0 0 * * 1#6", "use #1 to #5"),
        ("0 0 * * L", "write nL"),
        ("0 0 32W * *", "out of range"),
        ("0 0 * * * *", "6 fields"),
        ("0 0 0 * * ? 2027", "7 fields"),
        ("0 0 * *", "4 field(s)"),
        ("a * * * *", "not a number"),
        ("1,,2 * * * *", "is empty"),
        ("@reboot", "unknown cron macro"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0 0 30W 2 *", "never fires"),
        ("rate(0 minutes)", "at least 1"),
        ("rate(5 fortnights)", "rate unit"),
        ("rate(1.5 hours)", "write rate(N unit)"),
        ("at(2027-03-14)", "write at(YYYY-MM-DDThh:mm"),
        ("at(tomorrow)", "write at("),
        ("", "empty schedule expression"),
    ],
)
def test_refusals_are_one_line_naming_the_problem(expression: str, words: str) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        Recurrence(expression, anchor=datetime(2027, 1, 1, tzinfo=UTC))
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_six_and_seven_fields_name_the_three_clashing_dialects() -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        parse_cron("0 30 9 * * ?")
    message = str(caught.value)
    for dialect in ("Quartz", "NCRONTAB", "EventBridge", "croniter"):
        assert dialect in message


def test_rare_dates_are_accepted_and_found_fast() -> None:
    started = time.process_time()
    leap_mondays = Recurrence("0 0 29 2 MON", day_match=DayMatch.AND)
    found = [f.nominal.date().isoformat() for f in leap_mondays.fires(datetime(2027, 1, 1, tzinfo=UTC))]
    assert found[:2] == ["2044-02-29", "2072-02-29"]  # lazily: only the first two were computed
    fifth_monday_of_february = Recurrence("0 0 * 2 1#5")
    assert next(fifth_monday_of_february.fires(datetime(2027, 1, 1, tzinfo=UTC))).nominal.date().isoformat() == (
        "2044-02-29"
    )
    assert time.process_time() - started < 5  # generous: walking minutes over 17 years would take minutes


def test_rate_and_at_forms() -> None:
    assert parse_expression("rate(1 minute)") == RateExpression(60, "rate(1 minute)")
    assert parse_expression("RATE(2 Days)") == RateExpression(172_800, "rate(2 days)")
    at = parse_expression("at(2027-03-14T02:30)")
    assert isinstance(at, AtExpression) and at.local == datetime(2027, 3, 14, 2, 30) and at.instant is None
    absolute = parse_expression("at(2027-03-14T09:30+02:00)")
    assert isinstance(absolute, AtExpression) and absolute.instant == datetime(2027, 3, 14, 7, 30, tzinfo=UTC)
    assert str(parse_expression("cron(0 9 * * *)")) == "0 9 * * *"


def test_rate_is_absolute_time_from_its_anchor_across_dst() -> None:
    anchor = datetime(2027, 3, 13, 7, 0, tzinfo=UTC)
    daily = Recurrence("rate(1 day)", "America/New_York", anchor=anchor)
    fires = list(daily.fires(anchor, datetime(2027, 3, 16, tzinfo=UTC)))
    assert [f.nominal.hour for f in fires] == [7, 7, 7]  # 86,400 s apart: 02:00 EST becomes 03:00 EDT locally
    assert [f.local.hour for f in fires] == [2, 3, 3]
    assert all(f.note is None for f in fires)
    later = list(daily.fires(datetime(2027, 3, 14, 7, 0, 1, tzinfo=UTC), datetime(2027, 3, 16, tzinfo=UTC)))
    assert [f.nominal.day for f in later] == [15]
    with pytest.raises(InvalidScheduleError, match="needs an anchor"):
        Recurrence("rate(5 minutes)")


def test_at_local_goes_through_the_policy_and_absolute_does_not() -> None:
    start = datetime(2027, 1, 1, tzinfo=UTC)
    gap = "at(2027-03-14T02:30)"
    assert [f.nominal.hour for f in Recurrence(gap, "America/New_York").fires(start)] == [7]  # shifted: 03:30 EDT
    assert list(Recurrence(gap, "America/New_York", dst="skip/first").fires(start)) == []
    fold = "at(2027-11-07T01:30)"
    assert [f.nominal.hour for f in Recurrence(fold, "America/New_York", dst="clamp/both").fires(start)] == [5, 6]
    absolute = Recurrence("at(2027-03-14T02:30Z)", "America/New_York", dst="skip/first")
    assert [f.nominal.hour for f in absolute.fires(start)] == [2]
