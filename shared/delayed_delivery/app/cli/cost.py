"""``delayed-delivery cost``: SQS delayed delivery priced three ways, and the time-bucket tier beside them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import typer
from rich.table import Table

from delayed_delivery.app.cli.output import emit_json, fail, print_table
from delayed_delivery.cost import MEASURED_TRAFFIC, SqsCostComparison, choose_long_delay_route, compare_sqs_costs
from delayed_delivery.durations import format_duration, to_seconds
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.timebuckets.cost import (
    DEFAULT_TRAFFIC_PER_MINUTE,
    PACKED_MEASURED_SIZE,
    SQS_MAX_BYTES,
    BucketCostEstimate,
    estimate_bucket_cost,
    estimate_bucket_fixed_cost,
)

__all__ = ["cost", "register_cost_command"]


def cost(
    delay: Annotated[str, typer.Option("--delay", "-d", help="Delay, e.g. 90s, 2h, 30d, 365d.")],
    size: Annotated[int, typer.Option("--size", help="Message size in bytes (billed per 64 KiB chunk).")] = 1024,
    messages: Annotated[int, typer.Option(help="Number of messages to price.")] = 1_000_000,
    per_minute: Annotated[
        int,
        typer.Option(
            "--per-minute",
            envvar="DELAYED_DELIVERY_AUTO_TRAFFIC_PER_MINUTE",
            help="Long-delayed messages a minute the time-bucket tier is priced at (auto_traffic_per_minute).",
        ),
    ] = DEFAULT_TRAFFIC_PER_MINUTE,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Price SQS delayed delivery for DELAY: the NServiceBus formula, our plan at the measured figures, Scheduler.

    Every SQS request and Scheduler invocation is billed per 64 KiB chunk of payload. us-east-1 list prices.
    The measured figures ship with the package (refreshed by `python -m benchmarks`). The time-bucket row prices the
    requests counted per step at moto (`python -m benchmarks --only aws_costs`) at --per-minute messages a minute,
    and the caption names the route `long_delay_route = auto` picks at this delay and at 1 d / 30 d / 1 y, at that
    traffic and at 100, 1,000 and 10,000 a minute.

    Example: delayed-delivery cost --delay 365d --size 2048 --per-minute 100
    """
    try:
        seconds = to_seconds(delay)
    except DelayedDeliveryError as exc:
        raise fail(str(exc)) from None
    if messages < 1:
        raise fail("--messages must be at least 1")
    if per_minute < 1:
        raise fail("--per-minute must be at least 1 (long-delayed messages a minute)")
    if not 1 <= size <= SQS_MAX_BYTES:
        raise fail(f"--size must be from 1 to {SQS_MAX_BYTES:,} bytes (the SQS message limit)")
    try:
        comparison = compare_sqs_costs(seconds, size, messages)
        figures = comparison.figures
        counts = figures.bucket_counts(per_minute)
        buckets = estimate_bucket_cost(seconds, size, counts)
        auto = choose_long_delay_route(seconds, figures, counts) if size <= PACKED_MEASURED_SIZE else None
        by_traffic = {
            rate: {d: choose_long_delay_route(to_seconds(d), figures, per_minute=rate) for d in ("1d", "30d", "1y")}
            for rate in sorted({per_minute, *MEASURED_TRAFFIC})
        }
    except DelayedDeliveryError as exc:
        raise fail(str(exc)) from None
    if as_json:
        tier = _bucket_json(buckets, messages, auto) | {
            "auto_traffic_per_minute": per_minute,
            "auto_route_by_delay": by_traffic[per_minute],
            "auto_route_by_traffic": {str(rate): picks for rate, picks in by_traffic.items()},
        }
        emit_json(comparison.as_dict() | tier | _fixed_json(comparison, per_minute))
    else:
        table = _cost_table(comparison)
        _add_bucket_row(table, buckets, messages, auto, by_traffic, (comparison, per_minute))
        print_table(table)


def _bucket_json(b: BucketCostEstimate, n: int, auto: str | None) -> dict[str, object]:
    """The bucket tier's keys of ``cost --json``."""
    return {
        "buckets_usd_total": b.dollars * n,
        "buckets_requests_per_message": b.sqs_requests + b.s3_puts + b.s3_gets,
        "buckets_writes_per_message": b.writes_per_message,
        "buckets_counts_measured": b.measured,
        "auto_route": auto,
    }


def _fixed_json(c: SqsCostComparison, per_minute: int) -> dict[str, object]:
    """The tier's fixed monthly cost and where its counts come from."""
    counts = c.figures.bucket_counts(per_minute)
    return {
        "buckets_fixed_usd_per_month": estimate_bucket_fixed_cost(counts).usd,
        "buckets_counts_source": counts.source,
        "buckets_counts_volume": counts.volume,
    }


def _add_bucket_row(
    table: Table,
    b: BucketCostEstimate,
    n: int,
    auto: str | None,
    by_traffic: Mapping[int, Mapping[str, str]],
    priced: tuple[SqsCostComparison, int],
) -> None:
    """The time-bucket row, its fixed monthly cost, and which route ``long_delay_route = auto`` picks."""
    c, per_minute = priced
    counts = c.figures.bucket_counts(per_minute)
    label = f"counted at moto, {counts.volume}" if b.measured else "assumed counts, not yet measured"
    table.add_row(
        f"time buckets on S3 ({label}): {b.writes_per_message} write(s) per message, plus "
        f"${estimate_bucket_fixed_cost(counts).usd:,.2f} a month for the timer",
        f"{b.sqs_requests:,.3f} SQS + {b.s3_puts + b.s3_gets:,.4f} S3",
        f"${b.dollars * n:,.2f}",
    )
    picks = auto if auto is not None else f"n/a (parked FIFO measured for ≤ {PACKED_MEASURED_SIZE:,} bytes)"
    each = " / ".join(by_traffic[per_minute].values())
    others = "; ".join(
        f"{rate:,} a minute: {' / '.join(p.values())}" for rate, p in by_traffic.items() if rate != per_minute
    )
    table.caption = (
        f"{table.caption}; buckets: {counts.source}; long_delay_route = auto picks at {per_minute:,} long-delayed "
        f"messages a minute: {picks} (1 KiB at 1 d / 30 d / 1 y: {each}; at {others})"
    )


def _cost_table(c: SqsCostComparison) -> Table:
    """The ``cost`` comparison as a table, one row per approach."""
    f, n, packed, parked = c.figures, c.messages, c.packed, c.parked
    not_measured = f"n/a (measured for ≤ {PACKED_MEASURED_SIZE:,} bytes)"
    table = Table(
        title=f"SQS cost of {n:,} messages delayed {format_duration(c.delay_seconds)}, {c.size_bytes:,} bytes "
        f"({c.chunks} billed chunk{'s' if c.chunks > 1 else ''} per request)"
    )
    table.add_column("approach")
    table.add_column("requests / message", justify="right")
    table.add_column("USD total", justify="right")
    table.add_row(
        "the NServiceBus formula (delay/900 × 2 × $0.50/M)",
        f"{c.delay_seconds / 900 * 2:,.1f}",
        f"${c.nservicebus_usd_per_message * n:,.2f}",
    )
    table.add_row(
        f"our plan: {c.unpacked.fifo_cycles:,} FIFO hops × {f.requests_per_hop.value:.3f} measured + 1 native send",
        f"{c.unpacked.requests:,.1f}",
        f"${c.unpacked.dollars * c.chunks * n:,.2f}",
    )
    table.add_row(
        f"our plan, packed (64 KiB envelopes): {f.packed_requests_per_hop.value:.3f} measured per hop "
        "for 1 KiB messages",
        f"{packed.requests:,.1f}" if packed is not None else not_measured,
        f"${packed.dollars * n:,.2f}" if packed is not None else "-",
    )
    parks = f"our plan, parked (default; parks of up to {c.park_seconds:,} s)"
    table.add_row(
        (
            f"{parks}: {parked.parks:,} parks × {f.requests_per_park.value:.4f} + {parked.hops:,} "
            f"hops × {f.parked_requests_per_hop.value:.3f} measured, for 1 KiB messages"
        )
        if parked is not None
        else parks,
        f"{parked.requests:,.2f}" if parked is not None else not_measured,
        f"${parked.dollars * n:,.2f}" if parked is not None else "-",
    )
    table.add_row(
        "EventBridge Scheduler ($1.00/M) + SQS send ($0.40/M)",
        "1 invocation + 1 send" if c.scheduler_usd_per_message is not None else "n/a (payload > 256 KB)",
        f"${c.scheduler_usd_per_message * n:,.2f}" if c.scheduler_usd_per_message is not None else "-",
    )
    table.caption = (
        f"measured requests per hop: {f.requests_per_hop.source}; packed: {f.packed_requests_per_hop.source}; "
        f"parked: {f.requests_per_park.source}"
    )
    return table


def register_cost_command(app: typer.Typer) -> None:
    """Add ``cost`` to ``app``."""
    app.command()(cost)
