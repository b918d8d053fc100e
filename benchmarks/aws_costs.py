"""Cost counted at moto per step, for every AWS long-delay route; what ``long_delay_route = auto`` decides from.

* **Parked FIFO** (``benchmarks.costs.fifo``): 1 KiB messages, sender and handler packed, parks of at most 12
  compressed seconds, end to end; per park (visibility change + the receive that brings the envelope back), per
  hop (FIFO send, arrival receive, delete), the first send and the final send, each counted and divided by how
  often the handler did it.
* **Time buckets on S3** (``benchmarks.costs.tier``): the real sender, ingest Lambda handler and timer, a manual
  clock and compressed buckets; per message: ingest send / receive / delete, S3 PUT (ingest and cascade writes,
  leases, LISTs beyond the idle ones), GET, DynamoDB look-ups, dispatch ``SendMessageBatch``, Lambda invocations
  and GB-seconds at 512 MB (the functions' CPU seconds plus each counted request × an assumed AWS latency,
  ``LATENCY``; the wall time at moto kept as an upper bound), the bytes S3 holds per message (listed);
  ``near`` (1 d, written once) and ``far`` (30 d and 1 y, written coarse then fine: the counted steps do not
  depend on how far). At 100, 1,000 and 10,000 messages a minute (``VOLUMES``); the idle timer run (the fixed
  cost) apart.

Costs per million 1 KiB messages at 1 d / 30 d / 1 y come from the medians and the list prices in
``delayed_delivery.cost`` (the research note's), beside EventBridge Scheduler plus its send ($1.40). Run:
``python -m benchmarks --only aws_costs`` (also refreshes ``measured.json``) or ``python -m benchmarks.aws_costs
[--smoke] [--runs 5] [--volumes 100:6,1000:3,10000:1]``. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

from benchmarks.common import Row, print_table, write_json
from benchmarks.costs.fifo import measure_parked, parked_steps
from benchmarks.costs.steps import S3_FREE, S3_TIER1
from benchmarks.costs.tier import LAMBDA_GB, SENDS_PER_MINUTE, TierRun, measure_tier
from benchmarks.sqs_hops import _moto, quiet_handler_output
from delayed_delivery.cost import SCHEDULER_PRICE_PER_INVOCATION, estimate_sqs_parked_cost
from delayed_delivery.timebuckets.cost import (
    ASSUMED_BUCKET_COUNTS,
    DEFAULT_TRAFFIC_PER_MINUTE,
    MEASURED_PATH_FIELDS,
    STANDARD_PRICE_PER_REQUEST,
    BucketCounts,
    estimate_bucket_cost,
    estimate_bucket_fixed_cost,
)

NAME = "aws_costs"
DELAYS = {"1d": 86_400, "30d": 30 * 86_400, "1y": 365 * 86_400}
#: The issue's targets for the tier, USD per million 1 KiB messages.
TARGETS = {"1d": 0.25, "30d": 0.30, "1y": 0.50}
SCHEDULER = (SCHEDULER_PRICE_PER_INVOCATION + STANDARD_PRICE_PER_REQUEST) * 1e6
#: Parked runs: 500 messages on one endpoint, due after 78 compressed hops (7 parks each).
PARK_MESSAGES, PARK_ENDPOINTS, PARK_DELAY = 500, 1, 78
#: The tier's traffic: messages a minute -> sends of 20 s of traffic simulated (at 100 a minute the ingest's whole
#: 5-minute window; at 1,000 and 10,000 a minute a minute and a third of one: moto's time).
VOLUMES = {100: 15, 1_000: 3, 10_000: 1}
#: The volume whose counts ship in measured.json as ``buckets`` (what ``auto`` decides from by default; the other
#: volumes' ship as ``buckets_by_traffic``, which ``auto`` reads for the traffic it is told).
SHIPPED = DEFAULT_TRAFFIC_PER_MINUTE
#: Assumed time a function waits on one request on AWS, in seconds (docs/aws.md names the sources): S3 100 ms
#: (the S3 performance guide's 100-200 ms for small objects, its low end), SQS 20 ms, DynamoDB 10 ms.
LATENCY = {"s3": 0.100, "sqs": 0.020, "dynamodb": 0.010}
PATH_FIELDS = MEASURED_PATH_FIELDS


def tier_runs(volumes: dict[int, int]) -> dict[str, tuple[str, int, str]]:
    """The tier's runs: key -> (scenario, messages a minute, body); the shipped volume's keys are plain."""
    shipped = SHIPPED if SHIPPED in volumes else sorted(volumes)[len(volumes) // 2]
    runs: dict[str, tuple[str, int, str]] = {}
    for per_minute in volumes:
        for scenario in ("near", "far"):
            key = scenario if per_minute == shipped else f"{scenario}_at_{per_minute}pm"
            runs[key] = (scenario, per_minute, "order")
    runs["near_random"] = ("near", shipped, "random")
    return runs


def _request_seconds(step: str) -> float:
    """The assumed wait on AWS for one request of a counted step (``s3_…``, ``dynamodb_…``, else SQS)."""
    if step.startswith(("s3_", "s3_lease_")):
        return LATENCY["s3"]
    return LATENCY["dynamodb"] if step.startswith("dynamodb_") else LATENCY["sqs"]


def modelled_seconds(run: TierRun, phase: str, cpu: float) -> float:
    """A phase's billed seconds on AWS: the functions' CPU seconds plus every request they made × its latency.

    The ingest phase's receive and delete are Lambda's event source mapping's (not billed as the function's time).
    """
    waits = 0.0
    for key, calls in run.steps.get("calls", {}).items():
        ph, _, step = key.partition(".")
        if ph == phase and not (phase == "ingest" and (step.startswith("receive") or step == "delete")):
            waits += calls * _request_seconds(step)
    return cpu + waits


def tier_figures(run: TierRun) -> dict[str, float]:
    """Per message (and per run for the idle timer) from one tier run's counts."""
    b, n = run.steps["billed"], float(run.messages)
    idle_lists = b.get("idle.s3_ListObjectsV2", 0.0) / max(1, run.idle_runs)
    idle_wall = run.idle_seconds / max(1, run.idle_runs)
    idle_model = modelled_seconds(run, "idle", run.idle_cpu) / max(1, run.idle_runs)
    s3 = {"put": 0.0, "get": 0.0}
    for key, value in b.items():
        phase, _, step = key.partition(".")
        if phase in ("ingest", "timer") and step.startswith("s3_"):
            op = step.rsplit("_", 1)[-1]
            if op not in S3_FREE:
                s3["put" if op in S3_TIER1 else "get"] += value
    extra_lists = max(0.0, b.get("timer.s3_ListObjectsV2", 0.0) - idle_lists * run.timer_runs)
    wall = run.ingest_seconds + max(0.0, run.timer_seconds - idle_wall * run.timer_runs)
    cpu = run.ingest_cpu + max(0.0, run.timer_cpu - run.idle_cpu / max(1, run.idle_runs) * run.timer_runs)
    model = modelled_seconds(run, "ingest", run.ingest_cpu) + max(
        0.0, modelled_seconds(run, "timer", run.timer_cpu) - idle_model * run.timer_runs
    )
    ingest_puts = b.get("ingest.s3_PutObject", 0.0)
    cascade_puts = b.get("timer.s3_PutObject", 0.0)
    return {
        "ingest_requests": (b.get("send.send", 0.0) + b.get("ingest.receive", 0.0) + b.get("ingest.delete", 0.0)) / n,
        "ingest_send": b.get("send.send", 0.0) / n,
        "ingest_receive": b.get("ingest.receive", 0.0) / n,
        "ingest_delete": b.get("ingest.delete", 0.0) / n,
        "dispatch_requests": b.get("timer.send", 0.0) / n,
        "s3_puts": (s3["put"] - b.get("timer.s3_ListObjectsV2", 0.0) + extra_lists) / n,
        "s3_object_puts": (ingest_puts + cascade_puts) / n,
        "s3_lease_puts": b.get("timer.s3_lease_PutObject", 0.0) / n,
        "s3_extra_lists": extra_lists / n,
        "s3_gets": s3["get"] / n,
        "dynamodb_reads": b.get("timer.dynamodb_Query", 0.0) / n,
        "lambda_invocations": run.ingest_invocations / n,
        "lambda_gb_seconds": model * LAMBDA_GB / n,
        "lambda_cpu_seconds": cpu / n,
        "lambda_gb_seconds_wall": wall * LAMBDA_GB / n,
        "messages_per_ingest_object": n / ingest_puts if ingest_puts else 0.0,
        "messages_per_cascade_object": run.timer.get("cascaded_messages", 0.0) / cascade_puts if cascade_puts else 0.0,
        "stored_bytes_per_message": run.stored_bytes / n,
        "idle_timer_lists_per_run": idle_lists,
        "idle_timer_gb_seconds_per_run": idle_model * LAMBDA_GB,
        "idle_timer_gb_seconds_wall_per_run": idle_wall * LAMBDA_GB,
        "lost": max(0.0, n - run.delivered),
        "duplicates": max(0.0, run.delivered - n) + run.timer.get("duplicates_skipped", 0.0),
        "to_error_queue": run.timer.get("to_error_queue", 0.0),
    }


def bucket_counts(
    near: dict[str, float], far: dict[str, float], source: str, volume: str, *, wall: bool = False
) -> BucketCounts:
    """``BucketCounts`` from one near and one far figure set (and the idle timer of the far run).

    ``wall``: Lambda GB-seconds from the wall time at moto (an upper bound) instead of the model.
    """
    pick = {f: f"{f}_wall" if wall and f == "lambda_gb_seconds" else f for f in PATH_FIELDS}
    pick["stored_bytes"] = "stored_bytes_per_message"
    values = {f"near.{f}": near[pick[f]] for f in PATH_FIELDS} | {f"far.{f}": far[pick[f]] for f in PATH_FIELDS}
    values |= {"timer_lists_per_run": far["idle_timer_lists_per_run"]}
    idle = "idle_timer_gb_seconds_wall_per_run" if wall else "idle_timer_gb_seconds_per_run"
    values |= {"timer_gb_seconds_per_run": far[idle]}
    return ASSUMED_BUCKET_COUNTS.updated(values, source, volume)


def parked_usd(seconds: int, p: dict[str, float]) -> float:
    """USD per million 1 KiB messages parked for ``seconds`` at one run's counted steps."""
    e = estimate_sqs_parked_cost(
        seconds,
        p["per_park"],
        p["per_hop"],
        first_send=p["first_send_per_message"],
        final_send=p["final_send_per_message"],
    )
    return e.dollars * 1e6


def _per_run_rows(prefix: str, figures: list[dict[str, float]], units: dict[str, str], note: str) -> list[Row]:
    return [
        Row(
            NAME,
            f"{prefix}_{key}",
            units.get(key, "requests"),
            tuple(f[key] for f in figures),
            notes=note if i == 0 else "",
        )
        for i, key in enumerate(figures[0])
    ]


_TIER_UNITS = {
    "lambda_invocations": "invocations",
    "lambda_gb_seconds": "GB-s",
    "lambda_cpu_seconds": "CPU s",
    "lambda_gb_seconds_wall": "GB-s",
    "messages_per_ingest_object": "messages",
    "messages_per_cascade_object": "messages",
    "stored_bytes_per_message": "bytes",
    "idle_timer_gb_seconds_per_run": "GB-s",
    "idle_timer_gb_seconds_wall_per_run": "GB-s",
    "lost": "messages",
    "duplicates": "messages",
    "to_error_queue": "messages",
}
_PLAIN = ("idle_", "messages_per", "lost", "duplicates", "to_error", "stored")


def tier_rows(tier: dict[str, list[TierRun]], volumes: dict[str, str]) -> list[Row]:
    """Per-step rows of the tier, one sample per run, metric ``buckets_<run>_<field>[_per_message]``."""
    rows: list[Row] = []
    for key, runs in tier.items():
        figures = [tier_figures(r) for r in runs]
        for i, field in enumerate(figures[0]):
            if field.startswith("idle_") and key != "far":
                continue
            per = "" if field.startswith(_PLAIN) else "_per_message"
            metric = f"buckets_{field}" if field.startswith("idle_") else f"buckets_{key}_{field}{per}"
            samples = tuple(f[field] for f in figures)
            rows.append(
                Row(NAME, metric, _TIER_UNITS.get(field, "requests"), samples, notes=volumes[key] if i == 0 else "")
            )
    return rows


def _counts(tier: dict[str, list[TierRun]], near: str, far: str, volume: str, **kw: Any) -> list[BucketCounts]:
    """One ``BucketCounts`` per run from the runs ``near`` and ``far``."""
    pairs = zip(tier[near], tier[far], strict=False)
    return [bucket_counts(tier_figures(a), tier_figures(b), "this run", volume, **kw) for a, b in pairs]


def _random_body(counts: list[BucketCounts], tier: dict[str, list[TierRun]]) -> list[BucketCounts]:
    """The counts with the stored bytes of random text: near counted, far scaled by the same ratio (same format)."""
    out = []
    for c, order, rand in zip(counts, tier["near"], tier["near_random"], strict=False):
        ratio = rand.stored_bytes / order.messages / max(1e-9, c.near.stored_bytes) * (order.messages / rand.messages)
        near = dataclasses.replace(c.near, stored_bytes=c.near.stored_bytes * ratio)
        out.append(
            dataclasses.replace(c, near=near, far=dataclasses.replace(c.far, stored_bytes=c.far.stored_bytes * ratio))
        )
    return out


def _usd(counts: list[BucketCounts], seconds: int) -> tuple[float, ...]:
    return tuple(estimate_bucket_cost(seconds, counts=c).dollars * 1e6 for c in counts)


def _lines(counts: list[BucketCounts], label: str, seconds: int) -> list[Row]:
    """The shipped volume's dollars per million, line by line (ingest, dispatch, S3, DynamoDB, Lambda, storage)."""
    parts = ("ingest_usd", "dispatch_usd", "s3_requests_usd", "dynamodb_usd", "lambda_usd", "storage_usd")
    estimates = [estimate_bucket_cost(seconds, counts=c) for c in counts]
    return [
        Row(
            NAME,
            f"usd_per_million_{label}_buckets_{p.removesuffix('_usd')}",
            "USD",
            tuple(getattr(e, p) * 1e6 for e in estimates),
        )
        for p in parts
    ]


def cost_rows(parked: list[dict[str, float]], tier: dict[str, list[TierRun]], volumes: dict[str, str]) -> list[Row]:
    """USD per million per delay and volume, per run: buckets, parked FIFO, Scheduler; ratios; the fixed cost."""
    counts = _counts(tier, "near", "far", volumes["near"])
    variants = {
        f"at_{k.removeprefix('near_at_')}": _counts(tier, k, "far" + k[4:], volumes[k])
        for k in tier
        if k.startswith("near_at_")
    }
    variants["wall_at_moto"] = _counts(tier, "near", "far", volumes["near"], wall=True)
    variants["random_body"] = _random_body(counts, tier)
    rows: list[Row] = []
    for label, seconds in DELAYS.items():
        buckets, fifo = _usd(counts, seconds), tuple(parked_usd(seconds, p) for p in parked)
        med_b, med_f = statistics.median(buckets), statistics.median(fifo)
        vs = f"target ≤ ${TARGETS[label]:.2f}; parked FIFO same run ${med_f:.2f}"
        rows += [
            Row(
                NAME,
                f"usd_per_million_{label}_buckets",
                "USD",
                buckets,
                "Scheduler + send ($1.40)",
                med_b / SCHEDULER,
                vs,
            ),
            Row(
                NAME, f"usd_per_million_{label}_parked_fifo", "USD", fifo, "Scheduler + send ($1.40)", med_f / SCHEDULER
            ),
            Row(NAME, f"usd_per_million_{label}_buckets_to_parked_fifo", "ratio", (med_b / med_f,)),
            *_lines(counts, label, seconds),
        ]
        for name, c in variants.items():
            usd = _usd(c, seconds)
            note = f"to parked FIFO {statistics.median(usd) / med_f:.2f}×"
            rows.append(
                Row(
                    NAME,
                    f"usd_per_million_{label}_buckets_{name}",
                    "USD",
                    usd,
                    "Scheduler + send ($1.40)",
                    statistics.median(usd) / SCHEDULER,
                    note,
                )
            )
        rows.append(Row(NAME, f"usd_per_million_{label}_scheduler", "USD", (SCHEDULER,)))
    fixed = tuple(estimate_bucket_fixed_cost(c).usd for c in counts)
    rows.append(
        Row(NAME, "buckets_fixed_usd_per_month", "USD", fixed, notes="a timer run every minute: 43,200 a month")
    )
    return rows


def rows_from(parked_runs: list[dict[str, Any]], tier: dict[str, list[TierRun]], volumes: dict[str, str]) -> list[Row]:
    """Every row: parked FIFO per step, the tier per step, costs."""
    parked = [parked_steps(c) for c in parked_runs]
    c0 = parked_runs[0]
    note = (
        f"{c0['messages']} messages of 1 KiB due {c0['planned_hops'] + 1} compressed hops (parks ≤ 12), "
        f"{c0['endpoints']} endpoint(s), {len(parked)} runs, counted per step"
    )
    units = {"parks_per_message": "parks", "hops_per_message": "hops", "lost": "messages", "duplicates": "messages"}
    rows = _per_run_rows("parked", parked, units, note)
    rename = {
        "parked_per_park": "parked_billed_requests_per_message_per_park",
        "parked_per_hop": "parked_billed_requests_per_message_per_hop",
        "parked_first_send_per_message": "parked_first_send_billed_requests_per_message",
        "parked_final_send_per_message": "parked_final_send_billed_requests_per_message",
    }
    rows = [dataclasses.replace(r, metric=rename.get(r.metric, r.metric)) for r in rows]
    return rows + tier_rows(tier, volumes) + cost_rows(parked, tier, volumes)


def _volume(per_minute: int, sends: int, body: str, runs: int) -> str:
    text = "JSON order documents" if body == "order" else "random text"
    return (
        f"{per_minute:,} messages of 1 KiB ({text}) a minute in {SENDS_PER_MINUTE} batch sends a minute, {sends} "
        f"sends simulated ({per_minute * sends // SENDS_PER_MINUTE:,} messages), ingest batching window 300 s, "
        f"{runs} runs"
    )


def run(smoke: bool = False, *, runs: int = 5, volumes: dict[int, int] | None = None) -> list[Row]:
    """The benchmark-runner entry point: parked FIFO runs, then the tier's runs at each volume, ``runs`` times."""
    quiet_handler_output()
    park = (PARK_MESSAGES, PARK_ENDPOINTS, PARK_DELAY)
    volumes = dict(volumes or VOLUMES)
    if smoke:
        runs, volumes, park = 1, {60: 6}, (40, 2, 8)
    else:
        runs = max(5, runs)
    plan = tier_runs(volumes)
    parked: list[dict[str, Any]] = []
    tier: dict[str, list[TierRun]] = {key: [] for key in plan}
    with _moto() as endpoint:
        for _ in range(runs):
            started = time.monotonic()
            parked.append(measure_parked(*park, endpoint))
            print(f"aws_costs: parked {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            for key, (scenario, per_minute, body) in plan.items():
                started = time.monotonic()
                tier[key].append(measure_tier(scenario, per_minute, volumes[per_minute], endpoint, body=body))
                print(f"aws_costs: {key} {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    notes = {key: _volume(pm, volumes[pm], body, runs) for key, (_, pm, body) in plan.items()}
    run.last_counts = {  # type: ignore[attr-defined]
        "parked": parked,
        "tier": {k: [dataclasses.asdict(r) for r in v] for k, v in tier.items()},
        "volumes": notes,
        "latency_seconds": LATENCY,
    }
    return rows_from(parked, tier, notes)


def _volumes(text: str) -> dict[int, int]:
    """``100:15,1000:3`` -> {100: 15, 1000: 3} (messages a minute: sends of 20 s of traffic simulated)."""
    try:
        pairs = [item.split(":") for item in text.split(",") if item]
        volumes = {int(a): int(b) for a, b in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write messages a minute:sends, e.g. 100:15,1000:3") from None
    if not volumes or min(volumes) < 1 or min(volumes.values()) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each figure must be a whole number of at least 1")
    return volumes


def main() -> None:
    """Command line: print the table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--volumes",
        type=_volumes,
        default="100:15,1000:3,10000:1",
        help="messages a minute:sends of 20 s of traffic simulated, comma-separated",
    )
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, volumes=a.volumes)
    print_table(rows, "AWS long-delay routes: requests counted per step at moto, and USD per million")
    counts = run.last_counts  # type: ignore[attr-defined]
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, {"counts": counts}))


if __name__ == "__main__":
    main()
