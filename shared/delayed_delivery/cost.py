"""Cost model: the NServiceBus FIFO-cycle formula, what a plan actually spends, and the measured figures."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from importlib import resources
from typing import Any, Literal

from .durations import Delay, to_seconds
from .errors import ConfigurationError, InvalidMessageError
from .planning import SqsParkPolicy, SqsRoute, plan_sqs_delay, sqs_park_schedule
from .timebuckets.cost import (
    ASSUMED_BUCKET_COUNTS,
    BILLED_CHUNK_BYTES,
    DEFAULT_TRAFFIC_PER_MINUTE,
    MEASURED_PATH_FIELDS,
    PACKED_MEASURED_SIZE,
    SQS_MAX_BYTES,
    STANDARD_PRICE_PER_REQUEST,
    BucketCounts,
    counts_at_traffic,
    estimate_bucket_cost,
)

__all__ = [
    "FIFO_PRICE_PER_REQUEST",
    "MEASURED_BUCKET_METRICS",
    "MEASURED_METRICS",
    "MEASURED_TRAFFIC",
    "SCHEDULER_MAX_BYTES",
    "SCHEDULER_PRICE_PER_INVOCATION",
    "LongDelayRoute",
    "MeasuredFigure",
    "MeasuredFigures",
    "SqsCostComparison",
    "SqsCostEstimate",
    "SqsParkedCostEstimate",
    "bucket_metrics_at",
    "choose_long_delay_route",
    "compare_sqs_costs",
    "estimate_sqs_cost",
    "estimate_sqs_parked_cost",
    "fifo_cycle_cost",
    "load_measured_figures",
]

#: us-east-1 list prices (USD per request / invocation); the standard queue's and the tier's are in timebuckets/cost.py.
FIFO_PRICE_PER_REQUEST = 0.0000005
SCHEDULER_PRICE_PER_INVOCATION = 0.000001


def fifo_cycle_cost(
    delay_seconds: Delay,
    price_per_request: float = FIFO_PRICE_PER_REQUEST,
    requests_per_cycle: float = 2,
    cycle_seconds: float = 900,
) -> float:
    """The NServiceBus formula: (delay / 900) cycles × requests per cycle × price per request."""
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
    first_send: float = 0.0,
    final_send: float = 1.0,
) -> SqsParkedCostEstimate:
    """Cost of one message with parking: parks × ``requests_per_park`` + hops × ``requests_per_hop`` + the sends.

    The parks and hops are those of ``sqs_park_schedule`` under ``policy`` (default: 900 s hops, 12 h parks, 14 days
    of retention); a delay too short to park is priced as hops alone, like ``estimate_sqs_cost``. ``first_send``:
    the sender's FIFO requests per message; ``final_send``: the standard requests of the forward (1 unless counted).
    """
    schedule = sqs_park_schedule(delay_seconds, policy)
    fifo_requests = schedule.parks * requests_per_park + schedule.hops * requests_per_hop + first_send
    dollars = fifo_requests * FIFO_PRICE_PER_REQUEST + final_send * STANDARD_PRICE_PER_REQUEST
    return SqsParkedCostEstimate(
        schedule.delay_seconds, schedule.parks, schedule.hops, fifo_requests + final_send, dollars
    )


# ------------------------------------------------------------------------------------ measured figures

#: Where each measured figure comes from: (benchmark module, metric) of ``python -m benchmarks``. The parked ones
#: are counted per step (``benchmarks/costs/fifo.py``); the first and final send are optional in the package data.
MEASURED_METRICS: Mapping[str, tuple[str, str]] = {
    "requests_per_hop": ("sqs_hops", "fifo_requests_per_message_per_hop"),
    "packed_requests_per_hop": ("sqs_packing", "packed_billed_requests_per_message_per_hop_40_hops"),
    "requests_per_park": ("aws_costs", "parked_billed_requests_per_message_per_park"),
    "parked_requests_per_hop": ("aws_costs", "parked_billed_requests_per_message_per_hop"),
    "parked_first_send_requests": ("aws_costs", "parked_first_send_billed_requests_per_message"),
    "parked_final_send_requests": ("aws_costs", "parked_final_send_billed_requests_per_message"),
}
_OPTIONAL = ("parked_first_send_requests", "parked_final_send_requests")
#: The tier's fields of ``MeasuredFigures`` (read and written apart from the figures).
_TIER = ("buckets", "buckets_by_traffic")
#: The traffic levels (messages a minute) aws_costs counts the tier at; ``buckets`` holds the default's.
MEASURED_TRAFFIC: tuple[int, ...] = (100, DEFAULT_TRAFFIC_PER_MINUTE, 10_000)


def bucket_metrics_at(per_minute: int) -> Mapping[str, tuple[str, str]]:
    """The tier's counted work at ``per_minute``: ``BucketCounts`` field (``near.<f>`` / ``far.<f>`` for a path) ->
    aws_costs metric (the default traffic's are plain, the others' carry ``_at_<n>pm``; the idle timer's are shared)."""
    tag = "" if per_minute == DEFAULT_TRAFFIC_PER_MINUTE else f"_at_{per_minute}pm"
    return {
        **{
            f"{p}.{f}": ("aws_costs", f"buckets_{p}{tag}_{f}_per_message")
            for p in ("near", "far")
            for f in MEASURED_PATH_FIELDS
        },
        "timer_lists_per_run": ("aws_costs", "buckets_idle_timer_lists_per_run"),
        "timer_gb_seconds_per_run": ("aws_costs", "buckets_idle_timer_gb_seconds_per_run"),
    }


#: The tier's counted work at the default traffic (what ``measured.json``'s ``buckets`` holds).
MEASURED_BUCKET_METRICS: Mapping[str, tuple[str, str]] = bucket_metrics_at(DEFAULT_TRAFFIC_PER_MINUTE)
_DATA = ("data", "measured.json")


@dataclass(frozen=True, slots=True)
class MeasuredFigure:
    """A billed-requests figure and where it was measured."""

    value: float
    source: str


@dataclass(frozen=True, slots=True)
class MeasuredFigures:
    """The figures ``cost`` prices with, shipped as package data and refreshed by ``python -m benchmarks``."""

    requests_per_hop: MeasuredFigure
    packed_requests_per_hop: MeasuredFigure
    requests_per_park: MeasuredFigure
    parked_requests_per_hop: MeasuredFigure
    parked_first_send_requests: MeasuredFigure | None = None
    parked_final_send_requests: MeasuredFigure | None = None
    buckets: BucketCounts | None = None
    #: The tier's counts at each traffic level measured (messages a minute -> counts); older files lack them.
    buckets_by_traffic: Mapping[int, BucketCounts] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredFigures:
        """Read the package-data form: ``{name: {"value": float, "source": str}}`` (older files lack some)."""
        try:
            figures = {
                f.name: MeasuredFigure(float(data[f.name]["value"]), str(data[f.name]["source"]))
                for f in fields(cls)
                if f.name not in _TIER and (f.name in data or f.name not in _OPTIONAL)
            }
            by_traffic = {
                int(k): BucketCounts.from_dict(v) for k, v in dict(data.get("buckets_by_traffic", {})).items()
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"measured figures are malformed: {exc!r}") from None
        if any(level < 1 for level in by_traffic):
            raise ConfigurationError(f"measured figures are malformed: traffic levels {sorted(by_traffic)}")
        buckets = BucketCounts.from_dict(data["buckets"]) if "buckets" in data else None
        return cls(**figures, buckets=buckets, buckets_by_traffic=by_traffic or None)

    def as_dict(self) -> dict[str, Any]:
        """The package-data form (what ``from_dict`` reads)."""
        out: dict[str, Any] = {
            f.name: asdict(getattr(self, f.name)) for f in fields(self) if f.name not in _TIER and getattr(self, f.name)
        }
        if self.buckets is not None:
            out["buckets"] = self.buckets.as_dict()
        if self.buckets_by_traffic:
            out["buckets_by_traffic"] = {str(k): v.as_dict() for k, v in sorted(self.buckets_by_traffic.items())}
        return out

    def bucket_counts(self, per_minute: float | None = None) -> BucketCounts:
        """The tier's counts (at ``per_minute`` messages a minute when given and measured at several levels):
        measured when the package data has them, else the design's assumptions."""
        if per_minute is not None and self.buckets_by_traffic:
            return counts_at_traffic(self.buckets_by_traffic, per_minute)
        return self.buckets if self.buckets is not None else ASSUMED_BUCKET_COUNTS

    def parked_sends(self) -> tuple[float, float]:
        """The parked route's first (FIFO) and final (standard) send per message: counted, or 0 and 1."""
        first, final = self.parked_first_send_requests, self.parked_final_send_requests
        return (first.value if first else 0.0, final.value if final else 1.0)

    def parked_estimate(self, delay_seconds: Delay) -> SqsParkedCostEstimate:
        """One 1 KiB message parked for ``delay_seconds`` at these figures."""
        first, final = self.parked_sends()
        return estimate_sqs_parked_cost(
            delay_seconds,
            self.requests_per_park.value,
            self.parked_requests_per_hop.value,
            first_send=first,
            final_send=final,
        )

    def updated(
        self,
        medians: Mapping[tuple[str, str], float],
        source: str,
        volume: str = "",
        volumes: Mapping[int, str] | None = None,
    ) -> MeasuredFigures:
        """These figures with every one whose ``(benchmark, metric)`` is in ``medians`` replaced, from ``source``
        (``volume``: the default traffic's description, ``volumes`` each measured level's)."""
        changes: dict[str, Any] = {
            name: MeasuredFigure(float(medians[key]), f"python -m benchmarks.{key[0]}, {source}")
            for name, key in MEASURED_METRICS.items()
            if key in medians
        }
        tier_source = f"python -m benchmarks.aws_costs, {source}"
        counted = {name: medians[key] for name, key in MEASURED_BUCKET_METRICS.items() if key in medians}
        if any("." in name for name in counted):  # a path counted, not only the idle timer shared by every level
            changes["buckets"] = self.bucket_counts().updated(counted, tier_source, volume)
        by_traffic = dict(self.buckets_by_traffic or {})
        for level in MEASURED_TRAFFIC:
            at = {name: medians[key] for name, key in bucket_metrics_at(level).items() if key in medians}
            if any("." in name for name in at):
                base = by_traffic.get(level, self.bucket_counts())
                text = (volumes or {}).get(level, volume if level == DEFAULT_TRAFFIC_PER_MINUTE else "")
                by_traffic[level] = base.updated(at, tier_source, text)
        if by_traffic:
            changes["buckets_by_traffic"] = by_traffic
        return replace(self, **changes)


def load_measured_figures() -> MeasuredFigures:
    """The figures shipped in ``delayed_delivery/data/measured.json``."""
    path = resources.files(__package__).joinpath(*_DATA)
    try:
        return MeasuredFigures.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the package's measured figures ({'/'.join(_DATA)}): {exc}") from None


# ------------------------------------------------------------------------------------ comparison

SCHEDULER_MAX_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class SqsCostComparison:
    """One delay priced four ways for ``messages`` messages: the NServiceBus formula, ours unpacked, packed, parked.

    ``packed`` and ``parked`` are None above ``PACKED_MEASURED_SIZE`` (not measured); ``scheduler_usd_per_message``
    is None above Scheduler's 256 KB payload limit.
    """

    delay_seconds: float
    size_bytes: int
    chunks: int
    messages: int
    nservicebus_usd_per_message: float
    unpacked: SqsCostEstimate
    requests_per_message_at_2_per_hop: float
    packed: SqsCostEstimate | None
    parked: SqsParkedCostEstimate | None
    scheduler_usd_per_message: float | None
    figures: MeasuredFigures

    @property
    def park_seconds(self) -> int:
        """The longest park of the default policy (what the parked row assumes)."""
        return SqsParkPolicy().max_park_seconds

    def as_dict(self) -> dict[str, Any]:
        """The ``cost --json`` document (its keys are a contract for scripts)."""
        f, packed, parked, n = self.figures, self.packed, self.parked, self.messages
        return {
            "delay_seconds": self.delay_seconds,
            "size_bytes": self.size_bytes,
            "billed_chunks_per_request": self.chunks,
            "messages": n,
            "nservicebus_formula_usd_per_message": self.nservicebus_usd_per_message,
            "nservicebus_formula_usd_total": self.nservicebus_usd_per_message * n,
            # the same two figures under the keys scripts read before they were named for the formula
            "seed_formula_usd_per_message": self.nservicebus_usd_per_message,
            "seed_formula_usd_total": self.nservicebus_usd_per_message * n,
            "our_plan_fifo_cycles": self.unpacked.fifo_cycles,
            "our_plan_requests_per_message_at_2_per_hop": self.requests_per_message_at_2_per_hop,
            "our_measured_requests_per_hop": f.requests_per_hop.value,
            "our_measured_requests_per_hop_source": f.requests_per_hop.source,
            "our_measured_requests_per_message": self.unpacked.requests,
            "our_measured_usd_total": self.unpacked.dollars * self.chunks * n,
            "eventbridge_scheduler_usd_total": _times(self.scheduler_usd_per_message, n),
            "our_packed_requests_per_hop": None if packed is None else f.packed_requests_per_hop.value,
            "our_packed_requests_per_hop_source": f.packed_requests_per_hop.source,
            "our_packed_usd_total": None if packed is None else packed.dollars * n,
            "our_parked_parks": None if parked is None else parked.parks,
            "our_parked_hops": None if parked is None else parked.hops,
            "our_parked_requests_per_park": None if parked is None else f.requests_per_park.value,
            "our_parked_requests_per_hop": None if parked is None else f.parked_requests_per_hop.value,
            "our_parked_requests_source": f.requests_per_park.source,
            "our_parked_usd_total": None if parked is None else parked.dollars * n,
        }


def _times(value: float | None, n: int) -> float | None:
    return None if value is None else value * n


def compare_sqs_costs(
    delay_seconds: Delay, size_bytes: int, messages: int, figures: MeasuredFigures | None = None
) -> SqsCostComparison:
    """Price ``messages`` messages of ``size_bytes`` delayed ``delay_seconds`` with the measured ``figures``."""
    if messages < 1:
        raise InvalidMessageError("messages must be at least 1")
    if not 1 <= size_bytes <= SQS_MAX_BYTES:
        raise InvalidMessageError(f"size must be from 1 to {SQS_MAX_BYTES:,} bytes (the SQS message limit)")
    seconds = to_seconds(delay_seconds)
    f = figures if figures is not None else load_measured_figures()
    chunks = -(-size_bytes // BILLED_CHUNK_BYTES)
    small = size_bytes <= PACKED_MEASURED_SIZE
    parked = f.parked_estimate(seconds)
    return SqsCostComparison(
        delay_seconds=seconds,
        size_bytes=size_bytes,
        chunks=chunks,
        messages=messages,
        nservicebus_usd_per_message=fifo_cycle_cost(seconds) * chunks,
        unpacked=estimate_sqs_cost(seconds, requests_per_hop=f.requests_per_hop.value),
        requests_per_message_at_2_per_hop=estimate_sqs_cost(seconds, requests_per_hop=2.0).requests,
        packed=estimate_sqs_cost(seconds, requests_per_hop=f.packed_requests_per_hop.value) if small else None,
        parked=parked if small else None,
        scheduler_usd_per_message=(
            (SCHEDULER_PRICE_PER_INVOCATION + STANDARD_PRICE_PER_REQUEST) * chunks
            if size_bytes <= SCHEDULER_MAX_BYTES
            else None
        ),
        figures=f,
    )


#: Where a delay travels: SQS's own DelaySeconds, the -delay.fifo queue, or the time-bucket tier.
LongDelayRoute = Literal["native", "fifo", "buckets"]


def choose_long_delay_route(
    delay_seconds: Delay,
    measured: MeasuredFigures | None = None,
    counts: BucketCounts | None = None,
    *,
    max_native_delay: int = 900,
    per_minute: float | None = None,
) -> LongDelayRoute:
    """What ``long_delay_route = auto`` picks for 1 KiB messages: the cheaper of parked FIFO and buckets (tie: fifo).

    Both sides come from counted requests (``measured``, default the package's figures; ``counts``, default the
    tier's counts in them at ``per_minute`` long-delayed messages a minute, the default traffic when None).
    """
    if to_seconds(delay_seconds) <= max_native_delay:
        return "native"
    f = measured if measured is not None else load_measured_figures()
    tier = counts if counts is not None else f.bucket_counts(per_minute)
    fifo = f.parked_estimate(delay_seconds).dollars
    return "buckets" if estimate_bucket_cost(delay_seconds, counts=tier).dollars < fifo else "fifo"
