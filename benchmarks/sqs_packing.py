"""SQS requests per message per hop with envelope packing beside without, counted at moto server, 5 runs each.

Every run uses ``benchmarks.sqs_hops.measure``: the same messages (1 KiB bodies plus one attribute), endpoints
and compressed hops; the real Lambda handler behind one local event source per ``-delay.fifo`` queue. Three
configurations differ only in where packing is on:

* ``unpacked``: sender and handler both unpacked (``pack_bytes=0``, ``DELAYED_DELIVERY_PACK_BYTES=0``);
* ``requeue_packed``: the handler packs (64 KiB), the sender's first hop is one FIFO message per message;
* ``packed``: the sender packs the first hop too (``SqsSettings(pack_bytes=65536)``, the default).

Hops are counted per message (an envelope record counts one hop for each message inside it). Requests are
counted twice: HTTP requests, and requests as SQS bills them (each 64 KiB chunk of a send or receive payload is
one request). The sender's first send is counted apart (per message) and also folded into an all-in figure.
The fully packed configuration runs again with 4× the hops, because the longer the delay the closer a message
gets to the steady packed figure. Costs per million messages for 1 day, 30 days and 1 year come from the
measured billed figures (planned 900 s hops × requests per message per hop × the FIFO price, plus the measured
first send and the final standard send), beside the NServiceBus formula (2 requests per 900 s cycle) and EventBridge
Scheduler ($1 per million invocations).

**Parked** (``parked``): the same 1 KiB messages, sender and handler packed, with visibility parking on, end to
end (every message delivered). Time is compressed further than a hop: hop and native cap 1 s (900 s real),
``max_park_seconds`` 12 (12 hops; the real default of 43,200 s is 48 hops), visibility timeout 1 s. Two delays,
``PARK_DELAYS`` (30 and 78 hops), each run ``runs`` times, all messages on one endpoint (``PARK_ENDPOINTS``: the
sender's envelopes of 50 fill whole receive batches of 10, as on a busy queue). Every request is counted per step
(``benchmarks.costs.fifo``): a park is its ``ChangeMessageVisibilityBatch`` plus the receive that brings the
envelope back (``ApproximateReceiveCount`` > 1, its share of the receive's billed chunks by bytes); a hop is the
FIFO send, the receive of the new message and its delete; the first send and the final send to the destination
are apart. Each is divided by how often the handler did it (its outcomes, per message), per run, so the figures
are medians, min and max over the runs, not a fit. The real-scale cost of a delay is those figures times the parks
and hops of ``planning.sqs_park_schedule`` under the real policy (900 s hops, 12 h parks, 14-day retention), plus
the counted first send (FIFO) and final send (standard). Empty receives (the local event sources poll an idle
queue every second; a real event source's idle polling is a fixed cost per queue) and queue look-ups are
reported per run, beside.

Run: ``python -m benchmarks.sqs_packing [--smoke] [--runs 5] [--messages 500] [--endpoints 10] [--hops 10]
[--only parked]``. Starts its own moto server unless ``MOTO_ENDPOINT`` is set. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks.common import Row, print_table, write_json
from benchmarks.costs.fifo import PARK_HOP, PARK_MAX, measure_parked, parked_steps
from benchmarks.sqs_hops import _moto, measure, quiet_handler_output
from delayed_delivery.aws.packing import DEFAULT_PACK_BYTES
from delayed_delivery.cost import (
    FIFO_PRICE_PER_REQUEST,
    SCHEDULER_PRICE_PER_INVOCATION,
    estimate_sqs_cost,
    fifo_cycle_cost,
)
from delayed_delivery.planning import SqsParkPolicy, sqs_park_schedule
from delayed_delivery.timebuckets.cost import STANDARD_PRICE_PER_REQUEST

NAME = "sqs_packing"
BODY_BYTES = 1024
DELAYS = {"1d": 86_400, "30d": 30 * 86_400, "1y": 365 * 86_400}
#: configuration → (sender pack bytes, handler pack bytes)
CONFIGS = {
    "unpacked": (0, 0),
    "requeue_packed": (0, DEFAULT_PACK_BYTES),
    "packed": (DEFAULT_PACK_BYTES, DEFAULT_PACK_BYTES),
}


#: The two delays of the parked runs, in hops (each message is due ``hops × hop + 1`` s after its send).
PARK_DELAYS = (30, 78)
#: Parked runs put all messages on one endpoint: the sender's envelopes of 50 then fill whole batches of 10, as
#: on a busy queue (moto answers in O(queue depth), and depth here is envelopes, not messages).
PARK_ENDPOINTS = 1
#: The real policy the parked figures are scaled to.
REAL_POLICY = SqsParkPolicy()


def parked_usd_per_million(seconds: int, steps: dict[str, float]) -> float:
    """USD per million messages parked at real scale: the real schedule's parks and hops at the counted per-park and
    per-hop requests, the counted first send (FIFO) and final send (standard)."""
    schedule = sqs_park_schedule(seconds, REAL_POLICY)
    fifo = schedule.parks * steps["per_park"] + schedule.hops * steps["per_hop"] + steps["first_send_per_message"]
    return (fifo * FIFO_PRICE_PER_REQUEST + steps["final_send_per_message"] * STANDARD_PRICE_PER_REQUEST) * 1e6


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


def cost_rows(figures: dict[str, tuple[float, float]], parked: dict[str, float] | None = None) -> list[Row]:
    """Dollars per million messages per delay: each measured configuration, parked, NServiceBus, Scheduler."""
    scheduler = SCHEDULER_PRICE_PER_INVOCATION * 1e6
    rows: list[Row] = []
    for label, seconds in DELAYS.items():
        dollars = {what: usd_per_million(seconds, hop, send) for what, (hop, send) in figures.items()}
        if parked is not None:
            dollars["parked"] = parked_usd_per_million(seconds, parked)
        dollars["nservicebus_formula"] = fifo_cycle_cost(seconds) * 1e6
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


#: Per-step figures of the parked runs: (step key of ``parked_steps``, metric suffix, unit).
PARKED_STEP_ROWS = (
    ("per_park", "billed_requests_per_message_per_park", "requests"),
    ("visibility_per_park", "visibility_change_requests_per_message_per_park", "requests"),
    ("return_receive_per_park", "return_receive_billed_requests_per_message_per_park", "requests"),
    ("per_hop", "billed_requests_per_message_per_hop", "requests"),
    ("fifo_send_per_hop", "fifo_send_billed_requests_per_message_per_hop", "requests"),
    ("arrival_receive_per_hop", "arrival_receive_billed_requests_per_message_per_hop", "requests"),
    ("delete_per_hop", "delete_requests_per_message_per_hop", "requests"),
    ("first_send_per_message", "first_send_billed_requests_per_message", "requests"),
    ("final_send_per_message", "final_send_billed_requests_per_message", "requests"),
    ("parks_per_message", "parks_per_message", "parks"),
    ("hops_per_message", "hops_per_message", "hops"),
    ("empty_receives_per_run", "empty_receives_per_run", "requests"),
    ("lost", "delivery_lost", "messages"),
    ("duplicates", "delivery_duplicates", "messages"),
)


def parked_rows(parked: dict[int, list[dict[str, Any]]]) -> tuple[list[Row], dict[str, float]]:
    """Rows of the parked runs, each step counted per run (no fit), and the medians over every parked run."""
    rows: list[Row] = []
    every: list[dict[str, float]] = []
    for hops, samples in parked.items():
        per = [parked_steps(c) for c in samples]
        every += per
        note = (
            f"{samples[0]['messages']} messages of {BODY_BYTES} B due {hops + 1} s (hop {PARK_HOP} s, parks ≤ "
            f"{PARK_MAX} s), {samples[0]['endpoints']} endpoints, {len(samples)} runs, end to end, counted per step"
        )
        rows += [
            Row(NAME, f"parked_{hops}_hops_{metric}", unit, tuple(p[key] for p in per), notes=note if i == 0 else "")
            for i, (key, metric, unit) in enumerate(PARKED_STEP_ROWS)
        ]
        rows.append(
            Row(
                NAME,
                f"parked_{hops}_hops_delivery_early",
                "messages",
                tuple(float(sum(1 for x in c["lateness_s_sorted"] or [] if x < -0.25)) for c in samples),
            )
        )
    medians = {k: statistics.median(p[k] for p in every) for k in every[0]}
    rows += [
        Row(
            NAME,
            "parked_billed_requests_per_message_per_park",
            "requests",
            tuple(p["per_park"] for p in every),
            notes="counted per step over every parked run: the visibility change and the receive that brings the "
            "envelope back, per message-park",
        ),
        Row(
            NAME,
            "parked_billed_requests_per_message_per_hop",
            "requests",
            tuple(p["per_hop"] for p in every),
            notes="counted per step: the FIFO send, the receive of the new message and its delete, per message-hop",
        ),
        Row(
            NAME,
            "parked_first_send_billed_requests_per_message",
            "requests",
            tuple(p["first_send_per_message"] for p in every),
        ),
        Row(
            NAME,
            "parked_final_send_billed_requests_per_message",
            "requests",
            tuple(p["final_send_per_message"] for p in every),
        ),
    ]
    return rows + _real_scale_rows(medians), medians


def _real_scale_rows(medians: dict[str, float]) -> list[Row]:
    """Billed requests per message per hop-equivalent at real scale, from the counted per-park and per-hop figures."""
    rows: list[Row] = []
    for label, seconds in DELAYS.items():
        schedule = sqs_park_schedule(seconds, REAL_POLICY)
        total = schedule.parks * medians["per_park"] + schedule.hops * medians["per_hop"]
        rows.append(
            Row(
                NAME,
                f"parked_real_scale_billed_requests_per_message_per_hop_{label}",
                "requests",
                (total / (seconds / REAL_POLICY.fifo_queue_delay),),
                "packed hopping",
                None,
                f"{schedule.parks} parks of ≤ 12 h and {schedule.hops} hops (planning.sqs_park_schedule)",
            )
        )
    return rows


def parked_delivery_rows(delivery: dict[str, Any]) -> list[Row]:
    """Lateness with parking, on small queues (moto answers in O(queue depth): 500 messages due at once on one
    destination take it seconds to hand out, which the cost runs above would add to every message's lateness)."""
    late = delivery["lateness_s_sorted"] or [0.0]
    note = (
        f"parked, {delivery['messages']} messages over {delivery['endpoints']} endpoints, due "
        f"{delivery['planned_hops'] + 1} s (hop {PARK_HOP} s, parks ≤ {PARK_MAX} s), end to end"
    )
    return [
        Row(
            NAME, "parked_delivery_lost", "messages", (float(delivery["messages"] - delivery["delivered"]),), notes=note
        ),
        Row(NAME, "parked_delivery_duplicates", "messages", (float(delivery["duplicates"]),)),
        Row(NAME, "parked_delivery_early", "messages", (float(sum(1 for x in late if x < -0.25)),)),
        Row(
            NAME,
            "parked_delivery_parks_per_message",
            "parks",
            (delivery["outcomes"].get("parked", 0) / delivery["messages"],),
        ),
        Row(NAME, "parked_delivery_lateness_p50", "s", (late[len(late) // 2],)),
        Row(NAME, "parked_delivery_lateness_p99", "s", (late[min(len(late) - 1, int(len(late) * 0.99))],)),
        Row(NAME, "parked_delivery_lateness_max", "s", (late[-1],)),
    ]


def _config_rows(config: str, samples: list[dict[str, Any]], bases: tuple[float, float, float], note: str) -> list[Row]:
    """Rows of one hopping configuration; ``bases``: the unpacked HTTP, billed and all-in medians."""
    base_http, base_bill, base_all = bases
    http = tuple(per_hop(c) for c in samples)
    bill = tuple(per_hop(c, billed=True) for c in samples)
    total = tuple(all_in(c) for c in samples)
    vs = config != "unpacked"
    return [
        Row(
            NAME,
            f"{config}_requests_per_message_per_hop",
            "requests",
            http,
            "unpacked, same run" if vs else "NServiceBus formula (2)",
            statistics.median(http) / (base_http if vs else 2.0),
            note if config == "packed" else "",
        ),
        Row(
            NAME,
            f"{config}_billed_requests_per_message_per_hop",
            "requests",
            bill,
            "unpacked billed" if vs else "NServiceBus formula (2)",
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


def rows_from(
    runs: dict[str, list[dict[str, Any]]],
    delivery: dict[str, Any],
    long: list[dict[str, Any]] | None = None,
    parked: dict[int, list[dict[str, Any]]] | None = None,
    parked_delivery: dict[str, Any] | None = None,
) -> list[Row]:
    """Benchmark rows: per-hop requests per configuration (median, min, max of the runs), costs, delivery checks."""
    extra = parked_delivery_rows(parked_delivery) if parked_delivery else []
    if not runs["packed"]:
        rows, counted = parked_rows(parked) if parked else ([], None)
        return rows + (cost_rows({}, counted) if counted else []) + extra
    first = runs["packed"][0]
    note = (
        f"{first['messages']:,} messages of {BODY_BYTES} B × {first['planned_hops']} hops, "
        f"{first['endpoints']} endpoints, envelopes ≤ {DEFAULT_PACK_BYTES:,} B, {len(runs['packed'])} runs"
    )
    base_http = _median(runs["unpacked"], per_hop)
    base_bill = _median(runs["unpacked"], per_hop, billed=True)
    base_all = _median(runs["unpacked"], all_in)
    rows: list[Row] = []
    bases = (base_http, base_bill, base_all)
    for config, samples in runs.items():
        rows += _config_rows(config, samples, bases, note if config == "packed" else "")
    figures = {
        config: (_median(samples, per_hop, billed=True), _median(samples, first_send, billed=True))
        for config, samples in runs.items()
    }
    if long:
        more, figures["packed"] = _long_rows(long, base_bill)
        rows += more
    counted = None
    if parked:
        more, counted = parked_rows(parked)
        rows += more
    rows += cost_rows(figures, counted)
    return rows + _packed_delivery_rows(delivery) + extra


def _long_rows(long: list[dict[str, Any]], base_bill: float) -> tuple[list[Row], tuple[float, float]]:
    """Rows of the long packed runs, and their (billed per hop, first send) figure for the cost rows."""
    l_bill = tuple(per_hop(c, billed=True) for c in long)
    rows = [
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
    return rows, (statistics.median(l_bill), _median(long, first_send, billed=True))


def _packed_delivery_rows(delivery: dict[str, Any]) -> list[Row]:
    """The packed end-to-end delivery check: lost, duplicates, early, lateness."""
    late = delivery["lateness_s_sorted"] or [0.0]
    note = f"packed, {delivery['messages']} messages, {delivery['planned_hops']} planned hops, end to end"
    return [
        Row(
            NAME, "packed_delivery_lost", "messages", (float(delivery["messages"] - delivery["delivered"]),), notes=note
        ),
        Row(NAME, "packed_delivery_duplicates", "messages", (float(delivery["duplicates"]),)),
        Row(NAME, "packed_delivery_early", "messages", (float(sum(1 for x in late if x < -0.25)),)),
        Row(NAME, "packed_delivery_lateness_p50", "s", (late[len(late) // 2],)),
        Row(NAME, "packed_delivery_lateness_p99", "s", (late[min(len(late) - 1, int(len(late) * 0.99))],)),
    ]


def _hops(
    messages: int,
    endpoints: int,
    hops: int,
    endpoint: str,
    sender_pack: int,
    handler_pack: int,
    *,
    hop_seconds: int = 1,
    deliver: bool = False,
) -> dict[str, Any]:
    """One hopping run of 1 KiB messages with the given sender and handler envelope sizes."""
    return measure(
        messages,
        endpoints,
        hops,
        hop_seconds,
        endpoint,
        deliver=deliver,
        pack_bytes=handler_pack,
        body_bytes=BODY_BYTES,
        sender_pack_bytes=sender_pack,
    )


def run(
    smoke: bool = False,
    *,
    runs: int = 5,
    messages: int = 500,
    endpoints: int = 10,
    hops: int = 10,
    only: str | None = None,
) -> list[Row]:
    """The benchmark-runner entry point: the configurations round by round, long packed runs, parked, delivery."""
    quiet_handler_output()
    park_delays = PARK_DELAYS
    if smoke:
        runs, messages, endpoints, hops, deliver_messages, deliver_endpoints = 1, 40, 2, 3, 20, 2
        park_delays = (8, 20)
    else:
        runs, deliver_messages, deliver_endpoints = max(5, runs), 200, 4
    hopping = only != "parked"
    samples: dict[str, list[dict[str, Any]]] = {config: [] for config in CONFIGS}
    long: list[dict[str, Any]] = []
    parked: dict[int, list[dict[str, Any]]] = {d: [] for d in park_delays}
    delivery: dict[str, Any] = {}
    parked_delivery: dict[str, Any] = {}

    with _moto() as endpoint:
        for _ in range(runs):
            for delay in park_delays:
                parked[delay].append(
                    measure_parked(messages, PARK_ENDPOINTS if not smoke else endpoints, delay, endpoint)
                )
            if not hopping:
                continue
            for config, (sender_pack, handler_pack) in CONFIGS.items():
                samples[config].append(_hops(messages, endpoints, hops, endpoint, sender_pack, handler_pack))
            if not smoke:
                long.append(_hops(messages, endpoints, hops * 4, endpoint, DEFAULT_PACK_BYTES, DEFAULT_PACK_BYTES))
        parked_delivery = measure_parked(deliver_messages, deliver_endpoints, park_delays[0], endpoint)
        if hopping:
            packed = (DEFAULT_PACK_BYTES, DEFAULT_PACK_BYTES)
            delivery = _hops(deliver_messages, deliver_endpoints, 3, endpoint, *packed, hop_seconds=2, deliver=True)
    run.last_counts = {  # type: ignore[attr-defined]
        **samples,
        "packed_long": long,
        "delivery": delivery,
        "parked": {str(d): c for d, c in parked.items()},
        "parked_delivery": parked_delivery,
    }
    return rows_from(samples, delivery, long or None, parked, parked_delivery)


def main() -> None:
    """Command line: print the table, write JSON (Powertools logs and EMF output are turned down)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--hops", type=int, default=10)
    parser.add_argument("--only", choices=["parked"], help="run only the parked configuration")
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, messages=a.messages, endpoints=a.endpoints, hops=a.hops, only=a.only)
    print_table(rows, "SQS requests per message per hop, packed vs unpacked (moto server, counted)")
    counts = run.last_counts  # type: ignore[attr-defined]
    suffix = ("-smoke" if a.smoke else "") + ("-parked" if a.only else "")
    print(write_json(NAME + suffix, rows, {"counts": counts}))


if __name__ == "__main__":
    main()
