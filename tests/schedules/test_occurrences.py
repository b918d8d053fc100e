"""Day extras, the day rule, occurrence ids, deterministic jitter, catch-up and the time-zone database."""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime, timedelta

import pytest

from delayed_delivery.errors import InvalidScheduleError
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy, plan_catch_up, split_late
from delayed_delivery.schedules.days import DayMatch, parse_day_match
from delayed_delivery.schedules.occurrences import (
    check_schedule_id,
    expand,
    jitter_seconds,
    occurrence_id,
    parse_occurrence_id,
)
from delayed_delivery.schedules.recurrence import Fire, Recurrence
from delayed_delivery.schedules.zones import load_zone, tz_database

T0 = datetime(2027, 1, 1, tzinfo=UTC)


def _days(expression: str, year: int = 2027, **kw: object) -> list[date]:
    r = Recurrence(expression, **kw)  # type: ignore[arg-type]
    return [f.nominal.date() for f in r.fires(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))]


def test_day_of_month_extras() -> None:
    assert [d.day for d in _days("0 0 L * *")] == [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    # last weekday: 2027-01-31 is a Sunday, 2027-07-31 a Saturday
    lw = _days("0 0 LW * *")
    assert lw[0] == date(2027, 1, 29) and lw[6] == date(2027, 7, 30) and all(d.isoweekday() <= 5 for d in lw)
    # nearest weekday, never leaving the month: 2027-05-01 is a Saturday -> Monday 3rd; 2027-10-31 a Sunday -> 29th
    assert _days("0 0 1W 5 *") == [date(2027, 5, 3)]
    assert _days("0 0 31W 10 *") == [date(2027, 10, 29)]
    assert _days("0 0 15W 5 *") == [date(2027, 5, 14)]  # Saturday 15th -> Friday
    with pytest.raises(InvalidScheduleError, match="never fires"):
        _days("0 0 31W 4 *")  # April has no 31st


def test_day_of_week_extras() -> None:
    assert _days("0 0 * 1 5L") == [date(2027, 1, 29)]
    assert _days("0 0 * 1 1#1,1#5") == [date(2027, 1, 4)]  # January 2027 has four Mondays
    assert _days("0 0 * 5 1#5") == [date(2027, 5, 31)]
    assert _days("0 0 * 3 SUN#2") == [date(2027, 3, 14)]


def test_the_day_rule_or_and_and() -> None:
    either = _days("0 0 13 * FRI")
    assert date(2027, 1, 13) in either and date(2027, 1, 1) in either  # the 13th, or any Friday
    both = _days("0 0 13 * FRI", day_match=DayMatch.AND)
    assert both == [date(2027, 8, 13)]
    starred = _days("0 0 */10 * FRI")  # a day field beginning with * makes both match (Vixie)
    assert starred == [d for d in starred if d.day in (1, 11, 21, 31) and d.isoweekday() == 5] != []
    assert parse_day_match("AND") is DayMatch.AND
    with pytest.raises(InvalidScheduleError, match="use or"):
        parse_day_match("xor")


def test_occurrence_ids_keep_the_nominal_instant() -> None:
    nominal = datetime(2027, 3, 14, 7, 30, tzinfo=UTC)
    assert occurrence_id("sched-42", nominal) == "sched-42@2027-03-14T07:30:00Z"
    assert parse_occurrence_id("sched-42@2027-03-14T07:30:00Z") == ("sched-42", nominal)
    assert occurrence_id("a" * 100, nominal).__len__() == 121  # within the 128 a message id may have
    for bad in ("", "-x", "a b", "a@b", "x" * 101, "é"):
        with pytest.raises(InvalidScheduleError, match="schedule id"):
            check_schedule_id(bad)
    with pytest.raises(InvalidScheduleError, match="not an occurrence id"):
        parse_occurrence_id("sched-42@2027-03-14")


def test_jitter_is_the_documented_formula_and_stays_below_the_next_occurrence() -> None:
    r = Recurrence("*/5 * * * *")
    occurrences = list(expand(r, T0, T0 + timedelta(hours=2), schedule_id="sched-42", max_jitter=600))
    for o in occurrences:
        assert o.id is not None
        expected = int.from_bytes(hashlib.sha256(o.id.encode()).digest()[:8], "big") % (299 + 1)  # J' = 300 - 1
        assert o.fire_at == o.nominal + timedelta(seconds=expected)
        assert o.id == occurrence_id("sched-42", o.nominal)  # jitter never changes the id
    assert len({o.fire_at - o.nominal for o in occurrences}) > 5  # spread, not constant
    again = list(expand(r, T0, T0 + timedelta(hours=2), schedule_id="sched-42", max_jitter=600))
    assert again == occurrences  # deterministic
    assert jitter_seconds("x@t", T0, T0 + timedelta(seconds=1), 600) == 0  # J' = 0: none
    assert jitter_seconds("x@t", T0, None, 0) == 0
    assert 0 <= jitter_seconds("x@t", T0, None, 30) <= 30
    with pytest.raises(InvalidScheduleError, match="jitter needs a schedule id"):
        list(expand(r, T0, T0 + timedelta(hours=1), max_jitter=5))


def _hourly() -> Recurrence:
    return Recurrence("0 * * * *")


def _hours(fires: tuple[Fire, ...] | list[Fire]) -> list[int]:
    return [int((f.nominal - T0).total_seconds() // 3600) for f in fires]


@pytest.mark.parametrize(
    ("policy", "window", "limit", "fire_late"),
    [
        (CatchUpPolicy.ALL, 86_400, 1000, list(range(1, 11))),
        (CatchUpPolicy.ALL, 86_400, 3, [8, 9, 10]),
        (CatchUpPolicy.ALL, 3 * 3600, 1000, [7, 8, 9, 10]),  # R - t <= W, inclusive: hour 7 is exactly 3 h old
        (CatchUpPolicy.LATEST, 86_400, 1000, [10]),
        (CatchUpPolicy.LATEST, 0, 1000, [10]),  # at exactly R: 0 s old
        (CatchUpPolicy.SKIP, 86_400, 1000, []),
    ],
)
def test_catch_up_fires_some_late_and_records_every_other_as_missed(
    policy: CatchUpPolicy, window: int, limit: int, fire_late: list[int]
) -> None:
    cursor, recovered = T0, T0 + timedelta(hours=10)  # occurrences 1..10 were missed, 10 is at R exactly
    plan = plan_catch_up(_hourly(), cursor, recovered, CatchUp(policy, window, limit))
    assert _hours(plan.fire_late) == fire_late
    assert _hours(plan.missed) == [h for h in range(1, 11) if h not in fire_late]
    assert plan.next is not None and _hours([plan.next]) == [11]


def test_catch_up_streams_in_bounded_memory() -> None:
    """A month of minutes missed: the split holds at most ``limit`` of them."""
    r = Recurrence("* * * * *")
    missed = 0

    def count(_: Fire) -> None:
        nonlocal missed
        missed += 1

    recovered = T0 + timedelta(days=30)
    late = split_late(r.between(T0, recovered), recovered, CatchUp(CatchUpPolicy.ALL, 3600, 10), count)
    assert len(late) == 10 and late[-1].nominal == recovered
    assert missed == 30 * 1440 - 10


def test_catch_up_refuses_bad_rules() -> None:
    for bad in ({"policy": "some"}, {"window_seconds": -1}, {"limit": 0}, {"limit": 10**9}):
        with pytest.raises(InvalidScheduleError):
            CatchUp(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidScheduleError, match="before the last fired"):
        plan_catch_up(_hourly(), T0, T0 - timedelta(hours=1), CatchUp())


def test_zones_come_from_the_tzdata_wheel_and_abbreviations_are_refused() -> None:
    database = tz_database()
    assert database.source == "tzdata wheel" and database.version[:2] == "20"
    assert load_zone("Europe/Berlin") is load_zone("Europe/Berlin")
    assert load_zone("America/Argentina/Buenos_Aires").utcoffset(datetime(2027, 1, 1)) == timedelta(hours=-3)
    for bad in ("EST", "CET", "Europe/Nowhere", "../etc/passwd", "Europe/../../x", "", "x" * 80):
        with pytest.raises(InvalidScheduleError, match="time zone"):
            load_zone(bad)


def test_a_catch_up_preview_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import delayed_delivery.schedules.catchup as catchup

    monkeypatch.setattr(catchup, "MAX_PREVIEW", 10)
    with pytest.raises(InvalidScheduleError, match="more than 10 occurrences were missed"):
        plan_catch_up(_hourly(), T0, T0 + timedelta(hours=30), CatchUp(CatchUpPolicy.LATEST))
    assert len(plan_catch_up(_hourly(), T0, T0 + timedelta(hours=11), CatchUp(CatchUpPolicy.LATEST)).missed) == 10
