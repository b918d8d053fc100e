"""Cost model: the SQS seed's FIFO-cycle formula and what a plan actually spends."""

from __future__ import annotations

from dataclasses import dataclass

from .durations import Delay, to_seconds
from .planning import SqsParkPolicy, SqsRoute, plan_sqs_delay, sqs_park_schedule

__all__ = [
    "FIFO_PRICE_PER_REQUEST",
    "SCHEDULER_PRICE_PER_INVOCATION",
    "STANDARD_PRICE_PER_REQUEST",
    "SqsCostEstimate",
    "SqsParkedCostEstimate",
    "estimate_sqs_cost",
    "estimate_sqs_parked_cost",
    "fifo_cycle_cost",
]

#: us-east-1 list prices (USD per request / invocation).
FIFO_PRICE_PER_REQUEST = 0.0000005
STANDARD_PRICE_PER_REQUEST = 0.0000004
SCHEDULER_PRICE_PER_INVOCATION = 0.000001


def fifo_cycle_cost(
    delay_seconds: Delay,
    price_per_request: float = FIFO_PRICE_PER_REQUEST,
    requests_per_cycle: float = 2,
    cycle_seconds: float = 900,
) -> float:
    """The seed's formula: (delay / 900) cycles × requests per cycle × price per request."""
    return to_seconds(delay_seconds) / cycle_seconds * requests_per_cycle * price_per_request


@dataclass(frozen=True, slots=True)
class SqsCostEstimate:
    """Requests and dollars for one message under a given requests-per-hop figure."""

    delay_seconds: int
    route: SqsRoute
    fifo_cycles: int
    requests: float
    dollars: float


def estimate_sqs_cost(
    delay_seconds: Delay,
    requests_per_hop: float = 2.0,
    *,
    max_native_delay: int = 900,
    fifo_queue_delay: int = 900,
) -> SqsCostEstimate:
    """Cost of one message: the planned FIFO cycles × ``requests_per_hop``, plus the final native send."""
    plan = plan_sqs_delay(delay_seconds, max_native_delay, fifo_queue_delay=fifo_queue_delay)
    fifo_requests = plan.fifo_cycles * requests_per_hop
    requests = fifo_requests + 1  # the final send to the destination (standard queue)
    dollars = fifo_requests * FIFO_PRICE_PER_REQUEST + STANDARD_PRICE_PER_REQUEST
    return SqsCostEstimate(plan.delay_seconds, plan.route, plan.fifo_cycles, requests, dollars)


@dataclass(frozen=True, slots=True)
class SqsParkedCostEstimate:
    """Requests and dollars for one message with visibility parking: its parks and the few hops around them."""

    delay_seconds: int
    parks: int
    hops: int
    requests: float
    dollars: float


def estimate_sqs_parked_cost(
    delay_seconds: Delay,
    requests_per_park: float,
    requests_per_hop: float,
    *,
    policy: SqsParkPolicy | None = None,
) -> SqsParkedCostEstimate:
    """Cost of one message with parking: parks × ``requests_per_park`` + hops × ``requests_per_hop`` + final send.

    The parks and hops are those of ``sqs_park_schedule`` under ``policy`` (default: 900 s hops, 12 h parks, 14 days
    of retention); a delay too short to park is priced as hops alone, like ``estimate_sqs_cost``.
    """
    schedule = sqs_park_schedule(delay_seconds, policy)
    fifo_requests = schedule.parks * requests_per_park + schedule.hops * requests_per_hop
    dollars = fifo_requests * FIFO_PRICE_PER_REQUEST + STANDARD_PRICE_PER_REQUEST
    return SqsParkedCostEstimate(schedule.delay_seconds, schedule.parks, schedule.hops, fifo_requests + 1, dollars)
