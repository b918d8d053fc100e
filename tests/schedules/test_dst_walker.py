"""The evaluator agrees with an independent walker over every UTC minute, under every gap/fold policy.

Cases: New York and Berlin (1-hour shifts, west and east of UTC), Lord Howe (30-minute shifts), Kathmandu (a
15-minute jump set by law, 1986), Apia (the removed day 2011-12-30), São Paulo (a gap at midnight), Almaty (a fold
set by law, 2024), Moscow (permanent summer time by law, 2011, and its end, 2014), Troll (a 2-hour shift).
"""

from __future__ import annotations

import itertools
from datetime import datetime
from functools import cache

import pytest

from delayed_delivery.schedules.days import DayMatch
from delayed_delivery.schedules.dst import DstRule
from delayed_delivery.schedules.recurrence import Recurrence
from tests.schedules.walker import Walk, utc

#: (zone, expression, window start, window end): each window holds a transition.
CASES = [
    ("America/New_York", "30 2 * * *", "2027-03-13T00:00Z", "2027-03-16T00:00Z"),
    ("America/New_York", "0,30 2 * * *", "2027-03-13T00:00Z", "2027-03-16T00:00Z"),
    ("America/New_York", "30 1 * * *", "2027-11-06T00:00Z", "2027-11-09T00:00Z"),
    ("America/New_York", "0 * * * *", "2027-03-13T12:00Z", "2027-03-15T00:00Z"),
    ("America/New_York", "0 * * * *", "2027-11-06T12:00Z", "2027-11-08T00:00Z"),
    ("America/New_York", "*/20 1-2 * * SUN", "2027-11-06T00:00Z", "2027-11-09T00:00Z"),
    ("Europe/Berlin", "30 2 * * *", "2027-03-27T00:00Z", "2027-03-30T00:00Z"),
    ("Europe/Berlin", "30 2 * * *", "2027-10-30T00:00Z", "2027-11-02T00:00Z"),
    ("Europe/Berlin", "*/20 2 * * *", "2027-10-30T00:00Z", "2027-11-02T00:00Z"),
    ("Europe/Berlin", "*/20 2 * * *", "2027-03-27T00:00Z", "2027-03-30T00:00Z"),
    ("Europe/Berlin", "30 2 L,28 * *", "2027-03-27T00:00Z", "2027-04-02T00:00Z"),
    ("Australia/Lord_Howe", "45 1 * * *", "2027-04-03T00:00Z", "2027-04-06T00:00Z"),
    ("Australia/Lord_Howe", "15 2 * * *", "2027-10-01T12:00Z", "2027-10-04T12:00Z"),
    ("Australia/Lord_Howe", "*/15 * * * *", "2027-10-02T10:00Z", "2027-10-02T20:00Z"),
    ("Australia/Lord_Howe", "*/30 * * * *", "2027-04-03T10:00Z", "2027-04-03T20:00Z"),
    ("Asia/Kathmandu", "*/5 0 * * *", "1985-12-30T00:00Z", "1986-01-02T00:00Z"),
    ("Asia/Kathmandu", "10 0 * * *", "1985-12-30T00:00Z", "1986-01-02T00:00Z"),
    ("Pacific/Apia", "0 12 * * *", "2011-12-28T00:00Z", "2012-01-01T12:00Z"),
    ("Pacific/Apia", "30 */6 * * *", "2011-12-28T00:00Z", "2012-01-01T12:00Z"),
    ("America/Sao_Paulo", "0 0 * * *", "2018-11-02T00:00Z", "2018-11-06T00:00Z"),
    ("America/Sao_Paulo", "30 23 * * *", "2019-02-15T00:00Z", "2019-02-18T00:00Z"),
    ("Asia/Almaty", "30 23 * * *", "2024-02-27T00:00Z", "2024-03-02T00:00Z"),
    ("Europe/Moscow", "30 2 * * *", "2011-03-25T00:00Z", "2011-03-28T00:00Z"),
    ("Europe/Moscow", "30 1 * * *", "2014-10-24T00:00Z", "2014-10-28T00:00Z"),
    ("Antarctica/Troll", "30 1 * * *", "2027-03-27T00:00Z", "2027-03-30T00:00Z"),
    ("Antarctica/Troll", "0 * * * *", "2027-10-30T12:00Z", "2027-11-01T00:00Z"),
]
POLICIES = [f"{g}/{f}" for g, f in itertools.product(("skip", "shift", "clamp"), ("first", "both", "last"))]


@cache
def _walk(zone: str, expression: str, start: str, end: str) -> Walk:
    return Walk(expression, zone, utc(start), utc(end))


def _ours(zone: str, expression: str, start: str, end: str, dst: str, day_match: str = "or") -> list[datetime]:
    recurrence = Recurrence(expression, zone, dst=dst, day_match=DayMatch(day_match))
    return [f.nominal for f in recurrence.fires(utc(start), utc(end))]


@pytest.mark.parametrize("case", CASES, ids=[f"{z}:{e}:{s[:10]}" for z, e, s, _ in CASES])
def test_every_policy_agrees_with_the_walker(case: tuple[str, str, str, str]) -> None:
    walk = _walk(*case)
    assert walk.gaps or any(len(v) > 1 for v in walk.visits.values()), "the case crosses no gap or fold"
    for policy in POLICIES:
        gap, fold = policy.split("/")
        assert _ours(*case, dst=policy) == walk.instants(gap, fold), policy


@pytest.mark.parametrize("case", CASES, ids=[f"{z}:{e}:{s[:10]}" for z, e, s, _ in CASES])
def test_auto_and_the_presets_are_the_documented_policies(case: tuple[str, str, str, str]) -> None:
    zone, expression, _, _ = case
    walk = _walk(*case)
    fields = Recurrence(expression, zone).expression.fields  # type: ignore[union-attr]
    cadence = len(fields.hours) == 24
    starred = fields.starred[0] or fields.starred[1]
    expected = {
        "auto": ("skip", "both") if cadence else ("shift", "first"),
        "eventbridge": ("skip", "first"),
        "temporal": ("skip", "both"),
        "kubernetes": ("skip", "both"),
        "vixie": ("skip", "both") if starred else ("clamp", "first"),
    }
    for preset, (gap, fold) in expected.items():
        assert _ours(*case, dst=preset) == walk.instants(gap, fold), preset
        resolved = DstRule(preset).resolve(every_hour=cadence, minute_or_hour_starred=starred)
        assert (str(resolved.gap), str(resolved.fold)) == (gap, fold)


def test_the_headline_cases_fire_where_the_research_measured() -> None:
    """recurring-schedules.md §2, column "our default auto"."""

    def first(zone: str, expression: str, start: str, end: str) -> list[str]:
        return [t.strftime("%m-%dT%H:%MZ") for t in _ours(zone, expression, start, end, dst="auto")]

    assert first("America/New_York", "30 2 * * *", "2027-03-14T00:00Z", "2027-03-15T00:00Z") == ["03-14T07:30Z"]
    assert first("America/New_York", "30 1 * * *", "2027-11-07T00:00Z", "2027-11-08T00:00Z") == ["11-07T05:30Z"]
    assert first("Europe/Berlin", "30 2 * * *", "2027-03-28T00:00Z", "2027-03-29T00:00Z") == ["03-28T01:30Z"]
    assert first("Europe/Berlin", "30 2 * * *", "2027-10-31T00:00Z", "2027-11-01T00:00Z") == ["10-31T00:30Z"]
    assert first("Australia/Lord_Howe", "45 1 * * *", "2027-04-03T12:00Z", "2027-04-04T12:00Z") == ["04-03T14:45Z"]
    assert first("Australia/Lord_Howe", "15 2 * * *", "2027-10-02T12:00Z", "2027-10-03T12:00Z") == ["10-02T15:45Z"]
    assert first("Asia/Almaty", "30 23 * * *", "2024-02-29T12:00Z", "2024-03-01T12:00Z") == ["02-29T17:30Z"]
    # Apia: the removed day's slot shifts onto 12-31 12:00, which fires once
    assert first("Pacific/Apia", "0 12 * * *", "2011-12-29T00:00Z", "2012-01-01T00:00Z") == [
        "12-29T22:00Z",
        "12-30T22:00Z",
        "12-31T22:00Z",
    ]


def test_day_match_and_agrees_with_the_walker_on_a_rare_date() -> None:
    start, end = "2016-02-01T00:00Z", "2016-03-05T00:00Z"
    walk = Walk("0 0 29 2 MON", "UTC", utc(start), utc(end), day_match="and")
    assert walk.instants("shift", "first") == _ours("UTC", "0 0 29 2 MON", start, end, "auto", "and") != []
