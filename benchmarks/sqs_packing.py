"""SQS requests per message per hop with envelope packing beside without, counted at moto server, 5 runs each.

Every run uses ``benchmarks.sqs_hops.measure``: the same messages (1 KiB bodies plus one attribute), endpoints
and compressed hops; the real Lambda handler behind one local event source per ``-delay.fifo`` queue. Three
configurations differ only in where packing is on:

* ``unpacked``: sender and handler both unpacked (``pack_bytes=0``, ``DELAYED_DELIVERY_PACK_BYTES=0``);
* ``requeue_packed``: the handler packs (64 KiB), the sender's first hop is one FIFO message per message;
* ``packed``: the sender packs the first hop too (``SqsDelayedSender(pack_bytes=65536)``, the default).

Hops are counted per message (an envelope record counts one hop for each message inside it). Requests are
counted twice: HTTP requests, and requests as SQS bills them (each 64 KiB chunk of a send or receive payload is
one request). The sender's first send is counted apart (per message) and also folded into an all-in figure.
The fully packed configuration runs again with 4× the hops, because the longer the delay the closer a message
gets to the steady packed figure. Costs per million messages for 1 day, 30 days and 1 year come from the
measured billed figures (planned 900 s hops × requests per message per hop × the FIFO price, plus the measured
first send and the final standard send), beside the seed's formula (2 requests per 900 s cycle) and EventBridge
Scheduler ($1 per million invocations).

Run: ``python -m benchmarks.sqs_packing [--smoke] [--runs 5] [--messages 500] [--endpoints 10] [--hops 10]``.
Starts its own moto server unless ``MOTO_ENDPOINT`` is set. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from benchmarks.common import Row, print_table, write_json
from benchmarks.sqs_hops import _moto, measure
from delayed_delivery.aws.packing import DEFAULT_PACK_BYTES
from delayed_delivery.cost import (
    FIFO_PRICE_PER_REQUEST,
    SCHEDULER_PRICE_PER_INVOCATION,
    estimate_sqs_cost,
    fifo_cycle_cost,
)

NAME = "sqs_packing"
BODY_BYTES = 1024
DELAYS = {"1d": 86_400, "30d": 30 * 86_400, "1y": 365 * 86_400}
#: configuration → (sender pack bytes, handler pack bytes)
CONFIGS = {
    "unpacked": (0, 0),
    "requeue_packed": (0, DEFAULT_PACK_BYTES),
    "packed": (DEFAULT_PACK_BYTES, DEFAULT_PACK_BYTES),
}


def per_hop(counts: dict[str, Any], *, billed: bool = False, minus_empty: bool = False) -> float:
    """Requests on the hop path per message per hop."""
    total = counts["hop_billed_requests"] if billed else sum(counts["hop_requests"].values())
    if minus_empty:
        total -= counts["empty_receives"]
    return float(total) / float(counts["hops"])


def first_send(counts: dict[str, Any], *, billed: bool = False) -> float:
    """The sender's first-hop requests per message."""
    total = counts["send_billed_requests"] if billed else sum(counts["send_requests"].values())
    return float(total) / float(counts["messages"])


def all_in(counts: dict[str, Any]) -> float:
    """Billed requests per message per hop including the sender's first send."""
    return float(counts["hop_billed_requests"] + counts["send_billed_requests"]) / float(counts["hops"])


def _median(runs: list[dict[str, Any]], fn: Any, **kwargs: Any) -> float:
    return float(statistics.median(fn(c, **kwargs) for c in runs))


def usd_per_million(seconds: int, requests_per_hop: float, first_send_per_message: float) -> float:
    """USD per million messages: planned 900 s hops × requests per hop, the first send, the final standard send."""
    estimate = estimate_sqs_cost(seconds, requests_per_hop=requests_per_hop)
    return (estimate.dollars + first_send_per_message * FIFO_PRICE_PER_REQUEST) * 1e6


def cost_rows(figures: dict[str, tuple[float, float]]) -> list[Row]:
    """Dollars per million messages per delay: each measured configuration, the seed formula, Scheduler."""
    scheduler = SCHEDULER_PRICE_PER_INVOCATION * 1e6
    rows: list[Row] = []
    for label, seconds in DELAYS.items():
        dollars = {what: usd_per_million(seconds, hop, send) for what, (hop, send) in figures.items()}
        dollars["seed"] = fifo_cycle_cost(seconds) * 1e6
        for what, value in dollars.items():
            rows.append(
                Row(
                    NAME,
                    f"usd_per_million_{label}_{what}",
                    "USD",
                    (value,),
                    "EventBridge Scheduler ($1/M)",
                    value / scheduler,
                )
            )
    return rows


def rows_from(
    runs: dict[str, list[dict[str, Any]]], delivery: dict[str, Any], long: list[dict[str, Any]] | None = None
) -> list[Row]:
    """Benchmark rows: per-hop requests per configuration (median, min, max of the runs), costs, delivery check."""
    first = runs["packed"][0]
    note = (
        f"{first['messages']:,} messages of {BODY_BYTES} B × {first['planned_hops']} hops, "
        f"{first['endpoints']} endpoints, envelopes ≤ {DEFAULT_PACK_BYTES:,} B, {len(runs['packed'])} runs"
    )
    base_http = _median(runs["unpacked"], per_hop)
    base_bill = _median(runs["unpacked"], per_hop, billed=True)
    base_all = _median(runs["unpacked"], all_in)
    rows: list[Row] = []
    for config, samples in runs.items():
        http = tuple(per_hop(c) for c in samples)
        bill = tuple(per_hop(c, billed=True) for c in samples)
        total = tuple(all_in(c) for c in samples)
        vs = config != "unpacked"
        rows += [
            Row(
                NAME,
                f"{config}_requests_per_message_per_hop",
                "requests",
                http,
                "unpacked, same run" if vs else "seed formula (2)",
                statistics.median(http) / (base_http if vs else 2.0),
                note if config == "packed" else "",
            ),
            Row(
                NAME,
                f"{config}_billed_requests_per_message_per_hop",
                "requests",
                bill,
                "unpacked billed" if vs else "seed formula (2)",
                statistics.median(bill) / (base_bill if vs else 2.0),
            ),
            Row(
                NAME,
                f"{config}_billed_requests_per_message_per_hop_with_first_send",
                "requests",
                total,
                "unpacked, same" if vs else None,
                statistics.median(total) / base_all if vs else None,
            ),
            Row(
                NAME,
                f"{config}_requests_per_message_per_hop_without_empty_receives",
                "requests",
                tuple(per_hop(c, minus_empty=True) for c in samples),
            ),
            Row(NAME, f"{config}_first_send_requests_per_message", "requests", tuple(first_send(c) for c in samples)),
            Row(NAME, f"{config}_hops_per_message", "hops", tuple(c["hops"] / c["messages"] for c in samples)),
            Row(
                NAME,
                f"{config}_failed_or_redelivered_records",
                "records",
                tuple(float(c["failed_records"] + c["redelivered_records"] + c["handler_errors"]) for c in samples),
            ),
        ]
    figures = {
        config: (_median(samples, per_hop, billed=True), _median(samples, first_send, billed=True))
        for config, samples in runs.items()
    }
    if long:
        l_bill = tuple(per_hop(c, billed=True) for c in long)
        rows += [
            Row(
                NAME,
                f"packed_billed_requests_per_message_per_hop_{long[0]['planned_hops']}_hops",
                "requests",
                l_bill,
                "unpacked billed",
                statistics.median(l_bill) / base_bill,
                f"sender and handler packed, {long[0]['planned_hops']} hops per message, {len(long)} runs",
            ),
            Row(
                NAME,
                f"packed_requests_per_message_per_hop_{long[0]['planned_hops']}_hops",
                "requests",
                tuple(per_hop(c) for c in long),
            ),
            Row(
                NAME,
                f"packed_billed_requests_per_message_per_hop_with_first_send_{long[0]['planned_hops']}_hops",
                "requests",
                tuple(all_in(c) for c in long),
            ),
        ]
        figures["packed"] = (statistics.median(l_bill), _median(long, first_send, billed=True))
    rows += cost_rows(figures)
    late = delivery["lateness_s_sorted"] or [0.0]
    note = f"packed, {delivery['messages']} messages, {delivery['planned_hops']} planned hops, end to end"
    rows += [
        Row(
            NAME, "packed_delivery_lost", "messages", (float(delivery["messages"] - delivery["delivered"]),), notes=note
        ),
        Row(NAME, "packed_delivery_duplicates", "messages", (float(delivery["duplicates"]),)),
        Row(NAME, "packed_delivery_early", "messages", (float(sum(1 for x in late if x < -0.25)),)),
        Row(NAME, "packed_delivery_lateness_p50", "s", (late[len(late) // 2],)),
        Row(NAME, "packed_delivery_lateness_p99", "s", (late[min(len(late) - 1, int(len(late) * 0.99))],)),
    ]
    return rows


def run(smoke: bool = False, *, runs: int = 5, messages: int = 500, endpoints: int = 10, hops: int = 10) -> list[Row]:
    """The benchmark-runner entry point: the three configurations round by round, long packed runs, delivery."""
    if smoke:
        runs, messages, endpoints, hops, deliver_messages, deliver_endpoints = 1, 40, 2, 3, 20, 2
    else:
        runs, deliver_messages, deliver_endpoints = max(5, runs), 200, 4
    samples: dict[str, list[dict[str, Any]]] = {config: [] for config in CONFIGS}
    long: list[dict[str, Any]] = []
    with _moto() as endpoint:
        for _ in range(runs):
            for config, (sender_pack, handler_pack) in CONFIGS.items():
                samples[config].append(
                    measure(
                        messages,
                        endpoints,
                        hops,
                        1,
                        endpoint,
                        deliver=False,
                        pack_bytes=handler_pack,
                        body_bytes=BODY_BYTES,
                        sender_pack_bytes=sender_pack,
                    )
                )
            if not smoke:
                long.append(
                    measure(
                        messages,
                        endpoints,
                        hops * 4,
                        1,
                        endpoint,
                        deliver=False,
                        pack_bytes=DEFAULT_PACK_BYTES,
                        body_bytes=BODY_BYTES,
                        sender_pack_bytes=DEFAULT_PACK_BYTES,
                    )
                )
        delivery = measure(
            deliver_messages,
            deliver_endpoints,
            3,
            2,
            endpoint,
            deliver=True,
            pack_bytes=DEFAULT_PACK_BYTES,
            body_bytes=BODY_BYTES,
            sender_pack_bytes=DEFAULT_PACK_BYTES,
        )
    run.last_counts = {**samples, "packed_long": long, "delivery": delivery}  # type: ignore[attr-defined]
    return rows_from(samples, delivery, long or None)


def main() -> None:
    """Command line: print the table, write JSON (Powertools logs and EMF output are turned down)."""
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--hops", type=int, default=10)
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, messages=a.messages, endpoints=a.endpoints, hops=a.hops)
    print_table(rows, "SQS requests per message per hop, packed vs unpacked (moto server, counted)")
    counts = run.last_counts  # type: ignore[attr-defined]
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, {"counts": counts}))


if __name__ == "__main__":
    main()
