"""SQS requests per message per hop with envelope packing beside without, counted at moto server in one run.

Both sides use ``benchmarks.sqs_hops.measure``: the same messages (1 KiB bodies plus one attribute), endpoints
and compressed hops; the real Lambda handler behind one local event source per ``-delay.fifo`` queue. The only
difference is the handler's ``DELAYED_DELIVERY_PACK_BYTES`` (65,536 against 0). Hops are counted per message
(an envelope record counts one hop for each message inside it). Requests are counted twice: HTTP requests, and
requests as SQS bills them (each 64 KiB chunk of a send or receive payload is one request).

Costs per million messages for 1 day, 30 days and 1 year come from the measured billed figures (planned 900 s
hops × requests per message per hop × the FIFO price, plus the final standard send), beside the seed's formula
(2 requests per 900 s cycle) and EventBridge Scheduler ($1 per million invocations).

Run: ``python -m benchmarks.sqs_packing [--smoke] [--messages 1000] [--endpoints 10] [--hops 10]``. Starts its
own moto server unless ``MOTO_ENDPOINT`` is set. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from benchmarks.common import Row, print_table, write_json
from benchmarks.sqs_hops import _moto, measure
from delayed_delivery.aws.packing import DEFAULT_PACK_BYTES
from delayed_delivery.cost import SCHEDULER_PRICE_PER_INVOCATION, estimate_sqs_cost, fifo_cycle_cost

NAME = "sqs_packing"
BODY_BYTES = 1024
DELAYS = {"1d": 86_400, "30d": 30 * 86_400, "1y": 365 * 86_400}


def per_hop(counts: dict[str, Any], *, billed: bool = False, minus_empty: bool = False) -> float:
    """Requests on the hop path per message per hop."""
    total = counts["hop_billed_requests"] if billed else sum(counts["hop_requests"].values())
    if minus_empty:
        total -= counts["empty_receives"]
    return float(total) / float(counts["hops"])


def cost_rows(packed: float, unpacked: float) -> list[Row]:
    """Dollars per million messages for each delay: measured packed and unpacked, the seed formula, Scheduler."""
    rows: list[Row] = []
    for label, seconds in DELAYS.items():
        per_million = {
            "packed": estimate_sqs_cost(seconds, requests_per_hop=packed).dollars * 1e6,
            "unpacked": estimate_sqs_cost(seconds, requests_per_hop=unpacked).dollars * 1e6,
            "seed": fifo_cycle_cost(seconds) * 1e6,
        }
        scheduler = SCHEDULER_PRICE_PER_INVOCATION * 1e6
        for what, dollars in per_million.items():
            rows.append(
                Row(
                    NAME,
                    f"usd_per_million_{label}_{what}",
                    "USD",
                    (dollars,),
                    "EventBridge Scheduler ($1/M)",
                    dollars / scheduler,
                )
            )
    return rows


def rows_from(
    packed: dict[str, Any], unpacked: dict[str, Any], delivery: dict[str, Any], long: dict[str, Any] | None = None
) -> list[Row]:
    """Benchmark rows: per-hop requests packed vs unpacked, costs, and the packed delivery check.

    ``long``: the packed run again with 4× the hops. The first hop cannot pack across batches (it receives the
    sender's one-message records), so the longer the delay the closer a message gets to the steady packed figure;
    costs use the long run's billed figure when there is one.
    """
    note = (
        f"{packed['messages']:,} messages of {BODY_BYTES} B × {packed['planned_hops']} hops, "
        f"{packed['endpoints']} endpoints, envelopes ≤ {packed['pack_bytes']:,} B"
    )
    p_http, u_http = per_hop(packed), per_hop(unpacked)
    p_bill, u_bill = per_hop(packed, billed=True), per_hop(unpacked, billed=True)
    rows = [
        Row(
            NAME,
            "packed_requests_per_message_per_hop",
            "requests",
            (p_http,),
            "unpacked, same run",
            p_http / u_http,
            note,
        ),
        Row(NAME, "unpacked_requests_per_message_per_hop", "requests", (u_http,), "seed formula (2)", u_http / 2),
        Row(
            NAME,
            "packed_billed_requests_per_message_per_hop",
            "requests",
            (p_bill,),
            "unpacked billed",
            p_bill / u_bill,
        ),
        Row(
            NAME, "unpacked_billed_requests_per_message_per_hop", "requests", (u_bill,), "seed formula (2)", u_bill / 2
        ),
        Row(
            NAME,
            "packed_requests_per_message_per_hop_without_empty_receives",
            "requests",
            (per_hop(packed, minus_empty=True),),
        ),
        Row(
            NAME,
            "unpacked_requests_per_message_per_hop_without_empty_receives",
            "requests",
            (per_hop(unpacked, minus_empty=True),),
        ),
        Row(NAME, "packed_hops_per_message", "hops", (packed["hops"] / packed["messages"],)),
        Row(NAME, "unpacked_hops_per_message", "hops", (unpacked["hops"] / unpacked["messages"],)),
    ]
    if long is not None:
        l_bill = per_hop(long, billed=True)
        rows += [
            Row(
                NAME,
                f"packed_billed_requests_per_message_per_hop_{long['planned_hops']}_hops",
                "requests",
                (l_bill,),
                "unpacked billed",
                l_bill / u_bill,
                f"the packed run with {long['planned_hops']} hops per message",
            ),
            Row(
                NAME,
                f"packed_requests_per_message_per_hop_{long['planned_hops']}_hops",
                "requests",
                (per_hop(long),),
            ),
        ]
        p_bill = l_bill
    rows += cost_rows(p_bill, u_bill)
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


def run(smoke: bool = False, *, messages: int = 1000, endpoints: int = 10, hops: int = 10) -> list[Row]:
    """The benchmark-runner entry point: unpacked, then packed, then a packed end-to-end delivery check."""
    if smoke:
        messages, endpoints, hops, deliver_messages, deliver_endpoints = 40, 2, 3, 20, 2
    else:
        deliver_messages, deliver_endpoints = 200, 4
    with _moto() as endpoint:
        unpacked = measure(messages, endpoints, hops, 1, endpoint, deliver=False, pack_bytes=0, body_bytes=BODY_BYTES)
        packed = measure(
            messages, endpoints, hops, 1, endpoint, deliver=False, pack_bytes=DEFAULT_PACK_BYTES, body_bytes=BODY_BYTES
        )
        long = None
        if not smoke:
            long = measure(
                messages,
                endpoints,
                hops * 4,
                1,
                endpoint,
                deliver=False,
                pack_bytes=DEFAULT_PACK_BYTES,
                body_bytes=BODY_BYTES,
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
        )
    counts = {"unpacked": unpacked, "packed": packed, "packed_long": long, "delivery": delivery}
    run.last_counts = counts  # type: ignore[attr-defined]
    return rows_from(packed, unpacked, delivery, long)


def main() -> None:
    """Command line: print the table, write JSON (Powertools logs and EMF output are turned down)."""
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--hops", type=int, default=10)
    a = parser.parse_args()
    rows = run(a.smoke, messages=a.messages, endpoints=a.endpoints, hops=a.hops)
    print_table(rows, "SQS requests per message per hop, packed vs unpacked (moto server, counted)")
    counts = run.last_counts  # type: ignore[attr-defined]
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, {"counts": counts}))


if __name__ == "__main__":
    main()
