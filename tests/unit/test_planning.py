"""SQS hop planning and the remaining-delay rule, with the seed's examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from delayed_delivery import (
    DelayedDeliveryDisabledError,
    HopAction,
    InvalidMessageError,
    SqsRoute,
    decide_hop,
    plan_sqs_delay,
    remaining_delay,
)
from delayed_delivery.planning import sqs_hop_schedule, whole_seconds


def test_seed_example_845_seconds_goes_direct() -> None:
    plan = plan_sqs_delay(845)
    assert plan.route is SqsRoute.NATIVE
    assert (plan.delay_seconds, plan.fifo_cycles, plan.final_native_delay) == (845, 0, 845)


def test_seed_example_1925_seconds_two_cycles_then_125() -> None:
    plan = plan_sqs_delay(1925)
    assert plan.route is SqsRoute.FIFO
    assert (plan.delay_seconds, plan.fifo_cycles, plan.final_native_delay) == (1925, 2, 125)


def test_exactly_the_cap_is_native_and_one_more_is_fifo() -> None:
    assert plan_sqs_delay(900).route is SqsRoute.NATIVE
    assert plan_sqs_delay(900.5).route is SqsRoute.FIFO  # rounds up to 901
    assert plan_sqs_delay(901).route is SqsRoute.FIFO


def test_one_year_is_35039_cycles_plus_a_native_tail() -> None:
    plan = plan_sqs_delay("365d")
    assert plan.fifo_cycles == 35_039 and plan.final_native_delay == 900


def test_disabled_unrestricted_delay_refuses_long_delays() -> None:
    assert plan_sqs_delay(900, unrestricted=False).route is SqsRoute.NATIVE
    with pytest.raises(DelayedDeliveryDisabledError, match="disabled"):
        plan_sqs_delay(901, unrestricted=False)


def test_fractional_delays_round_up_never_early() -> None:
    assert whole_seconds(0.2) == 1
    assert whole_seconds(845.0000000001) == 845
    assert whole_seconds(0) == 0


def _simulate(total: int, cap: int, fifo_delay: int) -> tuple[int, int]:
    """Walk the hops as the requeue function would, with exact broker timestamps."""
    if total <= cap:
        return 0, total
    cycles, remaining, sent_ms = 0, total, 1_000_000
    while True:
        cycles += 1
        first_receive_ms = sent_ms + fifo_delay * 1000 + 37  # the broker delivers a little after the delay
        remaining = remaining_delay(remaining, sent_ms, first_receive_ms, 1, first_receive_ms)
        decision = decide_hop(remaining, cap)
        if decision.action is HopAction.FORWARD:
            return cycles, decision.delay_seconds
        sent_ms = first_receive_ms + 5


@given(
    cap=st.integers(min_value=1, max_value=900),
    fifo_delay=st.integers(min_value=1, max_value=900),
    hops=st.integers(min_value=0, max_value=3_000),
    extra=st.integers(min_value=0, max_value=900),
)
def test_planned_schedule_matches_the_hop_by_hop_walk(cap: int, fifo_delay: int, hops: int, extra: int) -> None:
    assume(fifo_delay <= cap)
    total = hops * fifo_delay + extra
    cycles, final = sqs_hop_schedule(total, cap, fifo_delay)
    assert (cycles, final) == _simulate(total, cap, fifo_delay)
    assert 0 <= final <= cap
    assert cycles * fifo_delay + final == total, "broker-exact hops deliver exactly on time"


@given(
    total=st.integers(min_value=0, max_value=10**8),
    sent=st.integers(min_value=0, max_value=2**41),
    wait_ms=st.integers(min_value=0, max_value=10**7),
)
def test_remaining_uses_broker_timestamps_on_first_receive(total: int, sent: int, wait_ms: int) -> None:
    skewed_now = 0  # the local clock is wildly off and must not matter
    got = remaining_delay(total, sent, sent + wait_ms, 1, skewed_now)
    assert got == max(0, total - wait_ms // 1000)


@given(
    total=st.integers(min_value=0, max_value=10**8),
    sent=st.integers(min_value=10**12, max_value=2**41),
    first=st.integers(min_value=0, max_value=10**7),
    local=st.integers(min_value=0, max_value=10**7),
    count=st.integers(min_value=2, max_value=50),
)
def test_redelivery_counts_the_local_clock_when_it_says_more_time_passed(
    total: int, sent: int, first: int, local: int, count: int
) -> None:
    got = remaining_delay(total, sent, sent + first, count, sent + local)
    assert got == max(0, total - max(first, local) // 1000)
    # a local clock behind the broker's never undoes the broker's elapsed time: every hop makes progress
    assert got <= remaining_delay(total, sent, sent + first, 1, 0)


@given(
    total=st.integers(min_value=0, max_value=10**8),
    sent=st.integers(min_value=10**7, max_value=2**41),
    behind_ms=st.integers(min_value=1, max_value=10**7),
    count=st.integers(min_value=1, max_value=5),
)
def test_a_clock_behind_the_send_time_never_shortens_the_delay(
    total: int, sent: int, behind_ms: int, count: int
) -> None:
    earlier = sent - behind_ms
    assert remaining_delay(total, sent, earlier, count, earlier) == total


@given(
    total=st.integers(min_value=0, max_value=10**7),
    wait_ms=st.integers(min_value=0, max_value=10**7),
)
def test_whole_second_truncation_is_never_early(total: int, wait_ms: int) -> None:
    left = remaining_delay(total, 0, wait_ms, 1, wait_ms)
    assert wait_ms / 1000 + left >= min(total, wait_ms / 1000 + left)
    assert left * 1000 + wait_ms >= total * 1000 or left == 0


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 0, 1, 0), (10, -5, 0, 1, 0), (10, 0, 0, 0, 0), (10, 0, 0, True, 0), (10.5, 0, 0, 1, 0)],
)
def test_garbage_attributes_raise_invalid_message(args: tuple[int, ...]) -> None:
    with pytest.raises(InvalidMessageError):
        remaining_delay(*args)


def test_decide_hop() -> None:
    assert decide_hop(1025).action is HopAction.REQUEUE
    assert decide_hop(900).action is HopAction.FORWARD
    assert decide_hop(125).delay_seconds == 125
    assert decide_hop(5, max_native_delay=2).action is HopAction.REQUEUE
