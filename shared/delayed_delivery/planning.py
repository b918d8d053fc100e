"""SQS hop planning and the remaining-delay rule from broker timestamps (the SQS seed, made testable).

A delay up to ``max_native_delay`` (900 s) goes straight to the destination with
``DelaySeconds``. A longer one goes to ``<queue>-delay.fifo``, whose queue-level delay
holds it for one hop; on each receive the remaining delay is the total minus whole
seconds between the broker's ``SentTimestamp`` and ``ApproximateFirstReceiveTimestamp``
(the local clock replaces the first-receive time only when ``ApproximateReceiveCount`` > 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from .durations import Delay, to_seconds
from .errors import DelayedDeliveryDisabledError, InvalidMessageError

__all__ = [
    "HopAction",
    "HopDecision",
    "SqsPlan",
    "SqsRoute",
    "decide_hop",
    "plan_sqs_delay",
    "remaining_delay",
    "remaining_delay_ms",
    "sqs_hop_schedule",
    "whole_seconds",
]


class SqsRoute(StrEnum):
    """How a delayed message enters SQS."""

    NATIVE = "native"
    FIFO = "fifo"


@dataclass(frozen=True, slots=True)
class SqsPlan:
    """The route for a delay: ``delay_seconds`` is the total, rounded up to whole seconds."""

    route: SqsRoute
    delay_seconds: int
    fifo_cycles: int
    final_native_delay: int


def whole_seconds(delay: Delay) -> int:
    """Round a delay up to whole seconds (never early); tiny float noise is ignored."""
    return max(0, math.ceil(to_seconds(delay) - 1e-9))


def sqs_hop_schedule(delay_seconds: int, max_native_delay: int = 900, fifo_queue_delay: int = 900) -> tuple[int, int]:
    """Return (FIFO cycles, final native delay) for a whole-second delay, assuming broker-exact hops."""
    if delay_seconds <= max_native_delay:
        return 0, delay_seconds
    cycles = math.ceil((delay_seconds - max_native_delay) / fifo_queue_delay)
    return cycles, delay_seconds - cycles * fifo_queue_delay


def plan_sqs_delay(
    delay_seconds: Delay,
    max_native_delay: int = 900,
    *,
    fifo_queue_delay: int | None = None,
    unrestricted: bool = True,
) -> SqsPlan:
    """Plan a delay: native ``DelaySeconds`` when it fits, else via the ``-delay.fifo`` queue.

    With ``unrestricted`` off (the seed's enablement matrix), a delay beyond the cap raises
    ``DelayedDeliveryDisabledError`` before anything is sent.
    """
    if max_native_delay < 1:
        raise InvalidMessageError("max_native_delay must be at least 1 second")
    total = whole_seconds(delay_seconds)
    if total <= max_native_delay:
        return SqsPlan(SqsRoute.NATIVE, total, 0, total)
    if not unrestricted:
        raise DelayedDeliveryDisabledError(
            f"a {total} s delay exceeds SQS's {max_native_delay} s limit and unrestricted delayed delivery is "
            "disabled: enable it on the sender and the receiver, or use a shorter delay"
        )
    cycles, final = sqs_hop_schedule(total, max_native_delay, fifo_queue_delay or max_native_delay)
    return SqsPlan(SqsRoute.FIFO, total, cycles, final)


def remaining_delay(
    total_delay_seconds: int,
    sent_timestamp_ms: int,
    first_receive_timestamp_ms: int,
    receive_count: int,
    now_ms: int,
) -> int:
    """Seconds still to wait after a FIFO hop, by the seed's clock-drift rules.

    Elapsed time is whole seconds of (first receive − sent), both broker clocks. On a
    redelivery (receive count > 1) more time has passed than the broker's first receive shows,
    so the local ``now_ms`` counts when it says more: a local clock behind the broker's can
    never take back time the broker has proven, so every hop makes progress. A negative
    elapsed time (clock disagreement) counts as zero: late, never early.
    """
    for name, value in (
        ("total delay", total_delay_seconds),
        ("SentTimestamp", sent_timestamp_ms),
        ("ApproximateFirstReceiveTimestamp", first_receive_timestamp_ms),
        ("ApproximateReceiveCount", receive_count),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidMessageError(f"{name} must be a non-negative integer, got {value!r}")
    if receive_count < 1:
        raise InvalidMessageError("ApproximateReceiveCount must be at least 1")
    received_ms = first_receive_timestamp_ms
    if receive_count > 1:
        received_ms = max(received_ms, now_ms)
    elapsed = max(0, (received_ms - sent_timestamp_ms) // 1000)
    return max(0, total_delay_seconds - elapsed)


def remaining_delay_ms(
    total_delay_ms: int,
    sent_timestamp_ms: int,
    first_receive_timestamp_ms: int,
    receive_count: int,
    now_ms: int,
) -> int:
    """``remaining_delay`` at millisecond resolution, so rounding does not add up over thousands of hops.

    Same rules: broker elapsed time (first receive − sent), the local ``now_ms`` only on a redelivery
    and only when it says more time has passed, a negative elapsed time counts as zero (late, never early).
    """
    for name, value in (("total delay", total_delay_ms), ("now", now_ms)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidMessageError(f"{name} must be a non-negative integer, got {value!r}")
    # remaining_delay floors whole seconds of elapsed time; scaling by 1000 keeps every millisecond.
    return remaining_delay(
        total_delay_ms, sent_timestamp_ms * 1000, first_receive_timestamp_ms * 1000, receive_count, now_ms * 1000
    )


class HopAction(StrEnum):
    """What the requeue function does with a received FIFO record."""

    REQUEUE = "requeue"
    FORWARD = "forward"


@dataclass(frozen=True, slots=True)
class HopDecision:
    """Requeue to the FIFO queue with ``delay_seconds`` left, or forward with native ``delay_seconds``."""

    action: HopAction
    delay_seconds: int


def decide_hop(remaining_seconds: int, max_native_delay: int = 900) -> HopDecision:
    """Requeue while more than the native cap remains; otherwise forward with the remainder."""
    if remaining_seconds > max_native_delay:
        return HopDecision(HopAction.REQUEUE, remaining_seconds)
    return HopDecision(HopAction.FORWARD, max(0, remaining_seconds))
