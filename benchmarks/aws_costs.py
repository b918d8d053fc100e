"""Cost counted at moto per step, for every AWS long-delay route; what ``long_delay_route = auto`` decides from.

* **Parked FIFO** (``benchmarks.costs.fifo``): 1 KiB messages, sender and handler packed, parks of at most 12
  compressed seconds, end to end; per park (visibility change + the receive that brings the envelope back), per
  hop (FIFO send, arrival receive, delete), the first send and the final send, each counted and divided by how
  often the handler did it.
* **Time buckets on S3** (``benchmarks.costs.tier``): the real sender, ingest Lambda handler and timer, a manual
  clock and compressed buckets; per message: ingest send / receive / delete, S3 PUT (ingest and cascade writes,
  leases, LISTs beyond the idle ones), GET, DynamoDB look-ups, dispatch ``SendMessageBatch``, Lambda invocations
  and GB-seconds (measured durations × 512 MB); ``near`` (1 d, written once) and ``far`` (30 d and 1 y, written
  coarse then fine: the counted steps do not depend on how far). The idle timer run (the fixed cost) apart.

Costs per million 1 KiB messages at 1 d / 30 d / 1 y come from the medians and the list prices in
``delayed_delivery.cost`` (the research note's), beside EventBridge Scheduler plus its send ($1.40). Run:
``python -m benchmarks --only aws_costs`` (also refreshes ``measured.json``) or ``python -m benchmarks.aws_costs
[--smoke] [--runs 5] [--messages 2000] [--minutes 4]``. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

from benchmarks.common import Row, print_table, write_json
from benchmarks.costs.fifo import measure_parked, parked_steps
from benchmarks.costs.steps import S3_FREE, S3_TIER1
from benchmarks.costs.tier import LAMBDA_GB, WINDOWS_PER_MINUTE, TierRun, measure_tier
from benchmarks.sqs_hops import _moto, quiet_handler_output
from delayed_delivery.cost import (
    ASSUMED_BUCKET_COUNTS,
    SCHEDULER_PRICE_PER_INVOCATION,
    STANDARD_PRICE_PER_REQUEST,
    BucketCounts,
    estimate_bucket_cost,
    estimate_bucket_fixed_cost,
    estimate_sqs_parked_cost,
)

NAME = "aws_costs"
DELAYS = {"1d": 86_400, "30d": 30 * 86_400, "1y": 365 * 86_400}
#: The issue's targets for the tier, USD per million 1 KiB messages.
TARGETS = {"1d": 0.25, "30d": 0.30, "1y": 0.50}
SCHEDULER = (SCHEDULER_PRICE_PER_INVOCATION + STANDARD_PRICE_PER_REQUEST) * 1e6
#: Parked runs: 500 messages on one endpoint, due after 78 compressed hops (7 parks each).
PARK_MESSAGES, PARK_ENDPOINTS, PARK_DELAY = 500, 1, 78
#: The tier's runs: as built (the timer reads cancellation records per message), and with one read per run.
TIER_RUNS = {
    "near": ("near", False),
    "far": ("far", False),
    "near_lookup_per_run": ("near", True),
    "far_lookup_per_run": ("far", True),
}
PATH_FIELDS = (
    "ingest_requests",
    "dispatch_requests",
    "s3_puts",
    "s3_gets",
    "dynamodb_reads",
    "lambda_invocations",
    "lambda_gb_seconds",
)


def tier_figures(run: TierRun) -> dict[str, float]:
    """Per message (and per run for the idle timer) from one tier run's counts."""
    b, n = run.steps["billed"], float(run.messages)
    idle_lists = b.get("idle.s3_ListObjectsV2", 0.0) / max(1, run.idle_runs)
    idle_seconds = run.idle_seconds / max(1, run.idle_runs)
    s3 = {"put": 0.0, "get": 0.0}
    for key, value in b.items():
        phase, _, step = key.partition(".")
        if phase in ("ingest", "timer") and step.startswith("s3_"):
            op = step.rsplit("_", 1)[-1]
            if op not in S3_FREE:
                s3["put" if op in S3_TIER1 else "get"] += value
    extra_lists = max(0.0, b.get("timer.s3_ListObjectsV2", 0.0) - idle_lists * run.timer_runs)
    busy_seconds = run.ingest_seconds + max(0.0, run.timer_seconds - idle_seconds * run.timer_runs)
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
        "lambda_gb_seconds": busy_seconds * LAMBDA_GB / n,
        "messages_per_ingest_object": n / ingest_puts if ingest_puts else 0.0,
        "messages_per_cascade_object": run.timer.get("cascaded_messages", 0.0) / cascade_puts if cascade_puts else 0.0,
        "stored_bytes_per_message": run.steps.get("bytes", {}).get("ingest.s3_put_bytes", 0.0) / n,
        "idle_timer_lists_per_run": idle_lists,
        "idle_timer_gb_seconds_per_run": idle_seconds * LAMBDA_GB,
        "lost": max(0.0, n - run.delivered),
        "duplicates": max(0.0, run.delivered - n) + run.timer.get("duplicates_skipped", 0.0),
        "to_error_queue": run.timer.get("to_error_queue", 0.0),
    }


def bucket_counts(near: dict[str, float], far: dict[str, float], source: str, volume: str) -> BucketCounts:
    """``BucketCounts`` from one near and one far figure set (and the idle timer of the far run)."""
    values = {f"near.{f}": near[f] for f in PATH_FIELDS} | {f"far.{f}": far[f] for f in PATH_FIELDS}
    values |= {"timer_lists_per_run": far["idle_timer_lists_per_run"]}
    values |= {"timer_gb_seconds_per_run": far["idle_timer_gb_seconds_per_run"]}
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
    "messages_per_ingest_object": "messages",
    "messages_per_cascade_object": "messages",
    "stored_bytes_per_message": "bytes",
    "idle_timer_gb_seconds_per_run": "GB-s",
    "lost": "messages",
    "duplicates": "messages",
    "to_error_queue": "messages",
}


def tier_rows(tier: dict[str, list[TierRun]], volume: str) -> list[Row]:
    """Per-step rows of the tier, one sample per run, metric ``buckets_<run>_<field>[_per_message]``."""
    rows: list[Row] = []
    for scenario, runs in tier.items():
        figures = [tier_figures(r) for r in runs]
        for i, key in enumerate(figures[0]):
            per = (
                ""
                if key.startswith(("idle_", "messages_per", "lost", "duplicates", "to_error", "stored"))
                else "_per_message"
            )
            metric = (
                f"buckets_{key}" if key.startswith("idle_") and scenario == "far" else f"buckets_{scenario}_{key}{per}"
            )
            if key.startswith("idle_") and scenario != "far":
                continue
            rows.append(
                Row(
                    NAME,
                    metric,
                    _TIER_UNITS.get(key, "requests"),
                    tuple(f[key] for f in figures),
                    notes=volume if i == 0 else "",
                )
            )
    return rows


def cost_rows(parked: list[dict[str, float]], tier: dict[str, list[TierRun]], volume: str) -> list[Row]:
    """USD per million per delay, per run: buckets, parked FIFO, Scheduler; ratios; the fixed monthly cost."""
    counts, memo = (
        [
            bucket_counts(tier_figures(a), tier_figures(b), "this run", volume)
            for a, b in zip(tier[near], tier[far], strict=False)
        ]
        for near, far in (("near", "far"), ("near_lookup_per_run", "far_lookup_per_run"))
    )
    rows: list[Row] = []
    for label, seconds in DELAYS.items():
        buckets = tuple(estimate_bucket_cost(seconds, counts=c).dollars * 1e6 for c in counts)
        per_run = tuple(estimate_bucket_cost(seconds, counts=c).dollars * 1e6 for c in memo)
        fifo = tuple(parked_usd(seconds, p) for p in parked)
        med_b, med_f = statistics.median(buckets), statistics.median(fifo)
        rows += [
            Row(
                NAME,
                f"usd_per_million_{label}_buckets",
                "USD",
                buckets,
                "Scheduler + send ($1.40)",
                med_b / SCHEDULER,
                f"target ≤ ${TARGETS[label]:.2f}; parked FIFO same run ${med_f:.2f} → {med_b / med_f:.2f}×",
            ),
            Row(
                NAME, f"usd_per_million_{label}_parked_fifo", "USD", fifo, "Scheduler + send ($1.40)", med_f / SCHEDULER
            ),
            Row(NAME, f"usd_per_million_{label}_buckets_to_parked_fifo", "ratio", (med_b / med_f,)),
            Row(
                NAME,
                f"usd_per_million_{label}_buckets_lookup_per_run",
                "USD",
                per_run,
                "Scheduler + send ($1.40)",
                statistics.median(per_run) / SCHEDULER,
                "what-if: cancellation records read once per destination per timer run, not per message",
            ),
            Row(NAME, f"usd_per_million_{label}_scheduler", "USD", (SCHEDULER,)),
        ]
    fixed = tuple(estimate_bucket_fixed_cost(c).usd for c in counts)
    rows.append(
        Row(NAME, "buckets_fixed_usd_per_month", "USD", fixed, notes="a timer run every minute: 43,200 a month")
    )
    return rows


def rows_from(parked_runs: list[dict[str, Any]], tier: dict[str, list[TierRun]], volume: str) -> list[Row]:
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
    return rows + tier_rows(tier, volume) + cost_rows(parked, tier, volume)


def run(smoke: bool = False, *, runs: int = 5, messages: int = 2_000, minutes: int = 4) -> list[Row]:
    """The benchmark-runner entry point: parked FIFO runs, then the tier's near and far runs, ``runs`` times each."""
    quiet_handler_output()
    park = (PARK_MESSAGES, PARK_ENDPOINTS, PARK_DELAY)
    if smoke:
        runs, messages, minutes, park = 1, 200, 4, (40, 2, 8)
    else:
        runs = max(5, runs)
    parked: list[dict[str, Any]] = []
    tier: dict[str, list[TierRun]] = {key: [] for key in TIER_RUNS}
    with _moto() as endpoint:
        for _ in range(runs):
            parked.append(measure_parked(*park, endpoint))
            for key, (scenario, per_run) in TIER_RUNS.items():
                tier[key].append(measure_tier(scenario, messages, minutes, endpoint, per_run=per_run))
    volume = (
        f"{messages:,} messages of 1 KiB over {minutes} minutes ({messages // minutes:,} a minute), "
        f"{WINDOWS_PER_MINUTE} ingest invocations a minute, {runs} runs"
    )
    run.last_counts = {  # type: ignore[attr-defined]
        "parked": parked,
        "tier": {k: [dataclasses.asdict(r) for r in v] for k, v in tier.items()},
        "volume": volume,
    }
    return rows_from(parked, tier, volume)


def main() -> None:
    """Command line: print the table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--minutes", type=int, default=4)
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, messages=a.messages, minutes=a.minutes)
    print_table(rows, "AWS long-delay routes: requests counted per step at moto, and USD per million")
    counts = run.last_counts  # type: ignore[attr-defined]
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, {"counts": counts}))


if __name__ == "__main__":
    main()
