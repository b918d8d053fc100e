"""SQS hop planning and the remaining-delay rule from broker timestamps (the NServiceBus SQS rules, testable).

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
from .validation import is_whole

__all__ = [
    "MAX_PARK_SECONDS",
    "MAX_VISIBILITY_TIMEOUT",
    "MIN_PARK_HOPS",
    "PARK_RETENTION_HEADROOM",
    "HopAction",
    "HopDecision",
    "SqsParkPolicy",
    "SqsParkSchedule",
    "SqsPlan",
    "SqsRoute",
    "decide_hop",
    "plan_sqs_delay",
    "remaining_delay",
    "remaining_delay_ms",
    "sqs_hop_schedule",
    "sqs_park_ms",
    "sqs_park_schedule",
    "whole_seconds",
]


class SqsRoute(StrEnum):
    """How a delayed message enters SQS."""

    NATIVE = "native"
    FIFO = "fifo"
    #: The S3 time-bucket tier (``long_delay_route``): the sender picks it, ``plan_sqs_delay`` never does.
    BUCKETS = "buckets"


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

    With ``unrestricted`` off (the NServiceBus SQS transport's enablement rules), a delay beyond the cap raises
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
    """Seconds still to wait after a FIFO hop, by the NServiceBus clock-drift rules (broker timestamps).

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
        if not is_whole(value):
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
        if not is_whole(value):
            raise InvalidMessageError(f"{name} must be a non-negative integer, got {value!r}")
    # remaining_delay floors whole seconds of elapsed time; scaling by 1000 keeps every millisecond.
    return remaining_delay(
        total_delay_ms, sent_timestamp_ms * 1000, first_receive_timestamp_ms * 1000, receive_count, now_ms * 1000
    )


class HopAction(StrEnum):
    """What the requeue function does with one message of a FIFO record.

    ``decide_hop`` chooses between ``REQUEUE`` and ``FORWARD`` from the time left; the requeue step's plan adds
    ``PARK`` (hold it on the queue), ``ERROR_QUEUE`` (poison) and ``DROP`` (cancelled). What then happened to the
    record is ``aws.requeue.HopOutcome``: a plan is never ``FAILED`` or ``UNPACKED``.
    """

    REQUEUE = "requeue"
    FORWARD = "forward"
    PARK = "park"
    ERROR_QUEUE = "error_queue"
    DROP = "drop"


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


#: SQS's longest visibility timeout (12 hours): the longest a received message can stay hidden.
MAX_VISIBILITY_TIMEOUT = 43_200
#: The longest park: SQS counts the 12 hours from the receive and refuses a change beyond them, and the requeue
#: function changes the visibility up to a function timeout after the event source received the record; 10
#: minutes are kept free for that.
MAX_PARK_SECONDS = MAX_VISIBILITY_TIMEOUT - 600
#: A park shorter than this many hops is not worth it: the ordinary hops cost about as much.
MIN_PARK_HOPS = 4
#: How much of a ``-delay.fifo`` queue's retention a park leaves free: NServiceBus's 4 days, so an outage that long
#: (the function down, parked messages piling up behind it) still loses nothing.
PARK_RETENTION_HEADROOM = 4 * 24 * 3600


@dataclass(frozen=True, slots=True)
class SqsParkPolicy:
    """What decides a park on the SQS hop cycle: the hop, the caps and the ``-delay.fifo`` queue's attributes."""

    fifo_queue_delay: int = 900
    max_native_delay: int = 900
    max_park_seconds: int = MAX_PARK_SECONDS
    retention_seconds: int = 14 * 24 * 3600
    visibility_timeout: int = 180
    retention_headroom: int = PARK_RETENTION_HEADROOM

    @property
    def return_threshold_ms(self) -> int:
        """``T``: a redelivery this long after the broker's first receive is a park return (visibility + a hop)."""
        return (self.visibility_timeout + self.fifo_queue_delay) * 1000

    @property
    def shortest_park_ms(self) -> int:
        """The shortest park worth making: ``MIN_PARK_HOPS`` hops, and twice the return threshold."""
        return max(MIN_PARK_HOPS * self.fifo_queue_delay * 1000, 2 * self.return_threshold_ms)


def sqs_park_ms(remaining_ms: int, age_ms: int, policy: SqsParkPolicy) -> int:
    """The park (whole seconds, in ms) for a message ``remaining_ms`` from due and ``age_ms`` since sent; 0 = none.

    A park ends with one hop and a margin (half the native cap) left, so the hop after it is the last requeue.
    Parks are split evenly over as few as ``max_park_seconds`` allows (when a share would be within a hop of
    too short, the longest park instead, and a few ordinary hops at the end). Age + park + one hop + margin
    stays ``retention_headroom`` inside the queue's retention. No park shorter than ``shortest_park_ms``.
    """
    hop_ms = policy.fifo_queue_delay * 1000
    margin_ms = policy.max_native_delay * 500
    max_ms = policy.max_park_seconds * 1000
    if max_ms <= 0:
        return 0
    shortest = policy.shortest_park_ms
    window = remaining_ms - hop_ms - margin_ms
    park = window // max(1, -(-window // max_ms)) if window > 0 else 0
    if park < shortest + hop_ms:  # the next even share would come back too short to park: the longest park now
        park = min(window, max_ms)
    by_retention = (policy.retention_seconds - policy.retention_headroom) * 1000 - age_ms - hop_ms - margin_ms
    park = min(park, by_retention, max_ms) // 1000 * 1000
    return park if park >= shortest else 0


@dataclass(frozen=True, slots=True)
class SqsParkSchedule:
    """How a delay travels with parking, broker-exact: ``parks`` receives that park, ``hops`` that re-send."""

    delay_seconds: int
    parks: int
    hops: int


def sqs_park_schedule(delay_seconds: Delay, policy: SqsParkPolicy | None = None) -> SqsParkSchedule:
    """Count the parks and hops (FIFO receives that requeue or forward) of one message, with no latency.

    This is the requeue function's rule played forward: the first receive parks when it can; a park return parks
    again or requeues (never forwards); a first receive that cannot park hops as before. ``hops`` counts the
    same FIFO cycles as ``SqsPlan.fifo_cycles`` does without parking (the final forward included).
    """
    policy = policy or SqsParkPolicy()
    total = whole_seconds(delay_seconds)
    hop_ms, cap_ms = policy.fifo_queue_delay * 1000, policy.max_native_delay * 1000
    if total <= policy.max_native_delay:
        return SqsParkSchedule(total, 0, 0)
    parks = hops = 0
    remaining, age, returning = total * 1000 - hop_ms, hop_ms, False  # the first receive, one hop after sending
    while True:
        park = sqs_park_ms(remaining, age, policy)
        if park:
            parks += 1
            remaining, age, returning = remaining - park, age + park, True
            continue
        hops += 1
        if not returning and remaining <= cap_ms:
            return SqsParkSchedule(total, parks, hops)  # forwarded with the remainder
        remaining, age, returning = remaining - hop_ms, hop_ms, False  # requeued: a fresh send, one hop on
