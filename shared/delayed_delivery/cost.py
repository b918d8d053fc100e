"""Cost model: the SQS seed's FIFO-cycle formula and what a plan actually spends."""

from __future__ import annotations

from dataclasses import dataclass

from .durations import Delay, to_seconds
from .planning import SqsRoute, plan_sqs_delay

__all__ = [
    "FIFO_PRICE_PER_REQUEST",
    "SCHEDULER_PRICE_PER_INVOCATION",
    "STANDARD_PRICE_PER_REQUEST",
    "SqsCostEstimate",
    "estimate_sqs_cost",
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
