"""The release planner: rates parsed and refused, slots at the cap, due order kept, state carried between runs."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.release import (
    ReleasePlanner,
    ReleaseRates,
    assign_slots,
    busiest_window,
    second_capacity,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_rates_parse_the_documented_example() -> None:
    rates = ReleaseRates.parse('{"orders": 200, "*": 1000}')
    assert rates.rate_for("orders") == 200
    assert rates.rate_for("invoices") == 1000
    assert rates.to_json() == '{"*":1000,"orders":200}'
    assert ReleaseRates.parse(rates.to_json()) == rates
    assert rates


def test_null_lifts_the_default_and_absent_means_unlimited() -> None:
    rates = ReleaseRates.parse('{"*": 5, "audit": null}')
    assert rates.rate_for("audit") is None
    assert rates.rate_for("orders") == 5
    assert ReleaseRates().rate_for("orders") is None
    assert not ReleaseRates()
    assert not ReleaseRates.parse('{"audit": null}')


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[1, 2]", "JSON object"),
        ("200", "JSON object"),
        ('{"orders": 0}', "more than 0"),
        ('{"orders": -3}', "more than 0"),
        ('{"orders": NaN}', "not a rate"),
        ('{"orders": Infinity}', "not a rate"),
        ('{"orders": 1e12}', "at most"),
        ('{"orders": "200"}', "must be a number"),
        ('{"orders": true}', "must be a number"),
        ('{"orders": 200', "not JSON"),
        ('{"a b": 2}', "not a queue name"),
        ('{"": 2}', "not a queue name"),
        ('{"' + "q" * 81 + '": 2}', "not a queue name"),
        ('{"orders": 2, "orders": 3}', "twice"),
        ("[" * 100_000, "longer than"),
    ],
)
def test_bad_rates_are_refused_with_the_reason(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ReleaseRates.parse(text)


def test_too_many_destinations_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 1000"):
        ReleaseRates.of({f"q{i}": 1 for i in range(1001)})


def test_a_burst_is_spread_at_the_rate_from_its_due_time() -> None:
    due = T0.timestamp()
    slots, next_free = assign_slots(200, [due] * 10_000)
    assert slots[0] == due
    assert slots[-1] == pytest.approx(due + 9_999 / 200)
    assert next_free == pytest.approx(due + 10_000 / 200)
    assert busiest_window(slots, 10.0) == 2000


def test_slots_follow_due_order_and_never_come_before_the_due_time() -> None:
    dues = [5.0, 1.0, 3.0, 1.0, 2.0]
    slots, _ = assign_slots(1, dues, not_before=0.0)
    by_due = sorted(range(len(dues)), key=lambda i: (dues[i], i))
    assert [slots[i] for i in by_due] == sorted(slots)
    assert all(s >= d for s, d in zip(slots, dues, strict=True))
    assert slots == [5.0, 1.0, 4.0, 2.0, 3.0]


def test_not_before_and_an_idle_gap_restart_the_schedule() -> None:
    slots, next_free = assign_slots(2, [0.0, 0.0], not_before=10.0)
    assert slots == [10.0, 10.5]
    slots, _ = assign_slots(2, [100.0], next_free)
    assert slots == [100.0]  # idle since: no debt is carried, no burst credit either


@given(
    rate=st.floats(min_value=0.01, max_value=5000),
    dues=st.lists(st.floats(min_value=0, max_value=1000), max_size=300),
    window=st.floats(min_value=0.5, max_value=30),
)
def test_no_window_holds_more_than_its_share_of_slots(rate: float, dues: list[float], window: float) -> None:
    slots, _ = assign_slots(rate, dues)
    assert busiest_window(slots, window) <= math.floor(rate * window * (1 + 1e-9)) + 1
    assert all(s >= d for s, d in zip(slots, dues, strict=True))


def test_the_planner_carries_its_state_between_runs() -> None:
    first = ReleasePlanner({"orders": 10})
    a = first.plan("orders", [0.0] * 5, not_before=0.0)
    second = ReleasePlanner({"orders": 10}, state=first.state())
    b = second.plan("orders", [0.0] * 5, not_before=0.0)
    assert a + b == pytest.approx([i / 10 for i in range(10)])
    assert second.lag("orders", 0.0) == pytest.approx(1.0)
    assert second.lags(0.0) == {"orders": pytest.approx(1.0)}


def test_uncapped_destinations_keep_their_due_time_and_no_state() -> None:
    planner = ReleasePlanner({"orders": 1})
    due = T0 + timedelta(seconds=3)
    assert planner.slot("invoices", due, T0) == due
    assert planner.plan("invoices", [1.0, 1.0], 0.0) == [1.0, 1.0]
    assert planner.state() == {}
    assert planner.slot("orders", due, T0) == due
    assert planner.slot("orders", due, T0) == due + timedelta(seconds=1)


def test_a_share_divides_the_cap_and_observe_takes_booked_slots_in() -> None:
    planner = ReleasePlanner({"*": 100}, share=0.25)
    assert planner.rate_for("orders") == 25
    planner.observe("orders", 50.0)
    assert planner.slot_epoch("orders", 0.0, 0.0) == pytest.approx(50.04)
    planner.forget_before(60.0)
    assert planner.state() == {}
    with pytest.raises(ValueError, match="share"):
        ReleasePlanner({"*": 1}, share=0)


def test_state_for_uncapped_destinations_is_not_kept() -> None:
    planner = ReleasePlanner({"orders": 1}, state={"invoices": 5.0, "orders": math.inf, "x": 1.0})
    assert planner.state() == {}


@pytest.mark.parametrize("rate", [0.3, 1.0, 2.5, 200.0, 1234.5])
def test_a_whole_second_calendar_gives_the_rate_per_second_on_average(rate: float) -> None:
    caps = [second_capacity(rate, s) for s in range(1_000_000, 1_000_100)]
    assert all(c >= 0 for c in caps)
    assert abs(sum(caps) - rate * 100) <= 1
    for start in range(0, 90):
        assert sum(caps[start : start + 10]) <= math.floor(rate * 10) + 1


def test_busiest_window_counts_half_open_windows() -> None:
    assert busiest_window([], 10) == 0
    assert busiest_window([0.0, 9.999, 10.0], 10) == 2
    times = [random.Random(3).uniform(0, 100) for _ in range(50)]
    assert busiest_window(times, 1000) == 50
