"""The Azure burst model: a million rows due in the same second, at Azure's documented limits.

A second-by-second model of what the timer app (``AzureDispatcherHost``) can put on the queues, for each deployment:
every second it makes at most ``min(processes / cpu_per_message, shards × partition limit / entity operations per
message, queues × queue limit, account limit / requests per message)`` puts, and none in the seconds a timer run is
not running (a run of ``run_seconds`` starts at each minute). The burst is due at ``due_phase`` seconds past the
minute; the worst phase (0..59) is reported.

* With a lead (``DELAYED_DELIVERY_PLACE_AHEAD``), rows are placed from ``lead`` seconds before their due time until
  2 s before it (``placement.MIN_AHEAD``), hidden until due: each becomes visible at the due second. What is left
  is sent from then on (the dispatcher) and becomes visible when sent. Entity operations per placed message: claim
  1, record 1, sweep 2 (due and index rows); per sent message: claim 1, delete 2.
* Without (lead 0), or when the rows are already due (after an outage), everything is sent from the due second.

Lateness is ``visible − due`` per message; the table gives the last one (all visible within), p50 and p99, and what
bounds the rate. ``cpu_per_message`` is the Python CPU one put costs the dispatcher (default: the figure measured on
Azurite by ``python -m benchmarks.azure_put_cpu``; the issue measured 2.7-3.8 ms).

Costs: requests per message (puts and table transactions) and USD per million messages, from list prices given
as options (``--table-price``, ``--queue-price``: USD per 10,000 transactions; defaults are Azure's standard LRS
list prices as of writing: check the pricing page for your region), for the burst and for steady traffic at 100,
1,000 and 10,000 a minute (which adds the idle queries of each shard), and the idle cost per shard per day.

Run: ``python -m benchmarks.azure_burst_model [--messages 1000000] [--cpu-ms 3.1] [--smoke]``. Prints a table and
writes ``benchmarks/results/azure_burst_model[-smoke].json``. Figures: benchmarks/azure.md ("Bursts").
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from benchmarks.common import Row, print_table, write_json

NAME = "azure_burst_model"
#: Azure's documented scalability targets (standard storage account).
PARTITION_ENTITIES_PER_S = 2000
QUEUE_MESSAGES_PER_S = 2000
ACCOUNT_REQUESTS_PER_S = 20000
#: Placement leaves rows due within this many seconds to the dispatcher (placement.MIN_AHEAD).
MIN_AHEAD = 2
#: Entity operations per message: placed (claim, record, sweep of two rows), sent at due (claim, delete of two).
PLACED_ENTITY_OPS = 4
SENT_ENTITY_OPS = 3
#: Table requests per message beyond the put: batched transactions of ≤ 100 operations (50 pairs) and range
#: queries of ≤ 100 rows (the placer's batch; the sweep reads 1,000 a page).
PLACED_TABLE_REQUESTS = 1 / 100 + 1 / 100 + 1 / 100 + 1 / 50 + 1 / 1000
SENT_TABLE_REQUESTS = 1 / 100 + 1 / 100 + 1 / 50
#: Queries a shard makes while its lease is held and nothing is due: the dispatcher's poll (1 a second, ``next_due``
#: and ``fetch_due``) and, with a lead, placement and sweep every 5 s; plus lease renewals (one every 4-6 s, blob).
IDLE_TABLE_REQUESTS_PER_HOUR = 2 * 3600
IDLE_PLACEMENT_REQUESTS_PER_HOUR = 2 * 3600 / 5
IDLE_LEASE_REQUESTS_PER_HOUR = 3600 / 6 + 60 * 2


@dataclass(frozen=True, slots=True)
class Deployment:
    """A way to run the dispatcher."""

    name: str
    shards: int = 1
    processes: int = 1
    lead: int = 7200
    run_seconds: int = 50
    queues: int = 4


@dataclass(frozen=True, slots=True)
class Outcome:
    """When the burst became visible."""

    last_s: float
    p50_s: float
    p99_s: float
    placed: int
    bound: str
    rate: float


def rate(d: Deployment, cpu_per_message: float, placed: bool) -> tuple[float, str]:
    """Puts per second while a run is on, and the limit that sets it."""
    ops = PLACED_ENTITY_OPS if placed else SENT_ENTITY_OPS
    requests = 1 + (PLACED_TABLE_REQUESTS if placed else SENT_TABLE_REQUESTS)
    limits = {
        f"Python CPU of {d.processes} process(es)": d.processes / cpu_per_message,
        f"{d.shards} partition(s) × {PARTITION_ENTITIES_PER_S} entities/s": d.shards * PARTITION_ENTITIES_PER_S / ops,
        f"{d.queues} queue(s) × {QUEUE_MESSAGES_PER_S}/s": d.queues * QUEUE_MESSAGES_PER_S,
        f"account {ACCOUNT_REQUESTS_PER_S} requests/s": ACCOUNT_REQUESTS_PER_S / requests,
    }
    bound = min(limits, key=lambda k: limits[k])
    return limits[bound], bound


def simulate(d: Deployment, messages: int, cpu_per_message: float, phase: int, already_due: bool) -> Outcome:
    """The burst due at second ``phase`` past a minute (the timer starts a run at each minute)."""
    lead = 0 if already_due else d.lead
    place_rate, place_bound = rate(d, cpu_per_message, placed=True)
    send_rate, send_bound = rate(d, cpu_per_message, placed=False)
    left = messages
    placed = 0
    credit = 0.0
    t = -lead if lead > MIN_AHEAD else 0
    while t < 0 and left:
        if t <= -MIN_AHEAD and (t + phase) % 60 < d.run_seconds:
            credit += place_rate
            n = min(left, int(credit))
            credit -= n
            placed += n
            left -= n
        t += 1
    lateness: list[tuple[float, int]] = [(0.0, placed)] if placed else []
    t, credit = 0, 0.0
    while left:
        if (t + phase) % 60 < d.run_seconds:
            credit += send_rate
            n = min(left, int(credit))
            credit -= n
            left -= n
            if n:
                lateness.append((t + 1.0, n))
        t += 1
    bound = place_bound if placed == messages else send_bound
    return Outcome(
        last_s=lateness[-1][0],
        p50_s=_quantile(lateness, messages, 0.50),
        p99_s=_quantile(lateness, messages, 0.99),
        placed=placed,
        bound=bound,
        rate=place_rate if placed == messages else send_rate,
    )


def _quantile(weighted: list[tuple[float, int]], total: int, q: float) -> float:
    need = math.ceil(q * total)
    seen = 0
    for value, n in weighted:
        seen += n
        if seen >= need:
            return value
    return weighted[-1][0]


def worst(d: Deployment, messages: int, cpu: float, already_due: bool) -> Outcome:
    """The outcome at the worst due phase within the minute."""
    return max((simulate(d, messages, cpu, p, already_due) for p in range(60)), key=lambda o: (o.last_s, o.p99_s))


def costs(
    messages_per_minute: float, shards: int, lead: bool, table_price: float, queue_price: float
) -> dict[str, float]:
    """Requests per message and USD per million for steady traffic (``0``: idle; per shard per day)."""
    table_per_msg = PLACED_TABLE_REQUESTS if lead else SENT_TABLE_REQUESTS
    idle_hour = shards * (IDLE_TABLE_REQUESTS_PER_HOUR + (IDLE_PLACEMENT_REQUESTS_PER_HOUR if lead else 0))
    lease_hour = shards * IDLE_LEASE_REQUESTS_PER_HOUR
    if messages_per_minute == 0:
        day = 24 * ((idle_hour) * table_price + lease_hour * queue_price) / 10_000 / shards
        return {"usd_per_shard_per_day": day, "requests_per_shard_per_day": 24 * (idle_hour + lease_hour) / shards}
    per_hour = messages_per_minute * 60
    table = table_per_msg + idle_hour / per_hour
    per_message = 1 + table + lease_hour / per_hour
    usd = 1e6 * ((1 + lease_hour / per_hour) * queue_price + table * table_price) / 10_000
    return {"requests_per_message": per_message, "usd_per_million": usd}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--cpu-ms", type=float, default=3.1, help="Python CPU per put (ms)")
    parser.add_argument("--table-price", type=float, default=0.00036, help="USD per 10,000 table transactions")
    parser.add_argument("--queue-price", type=float, default=0.004, help="USD per 10,000 queue operations")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    messages = 20_000 if args.smoke else args.messages
    cpu = args.cpu_ms / 1000
    deployments = [
        Deployment("default deployment (Bicep: 1 shard, timer app, lead 2 h)", lead=7200),
        Deployment("1 shard, timer app, lead 1 h", lead=3600),
        Deployment("placement off (lead 0: before #34)", lead=0),
        Deployment("16 shards, 4 processes, lead 0 (fan-out, not deployed)", shards=16, processes=4, lead=0),
    ]
    table: list[dict[str, Any]] = []
    rows: list[Row] = []
    for d in deployments:
        for already_due in (False, True):
            if already_due and d.lead == 0:
                continue
            o = worst(d, messages, cpu, already_due)
            what = f"{d.name}{' — already due (outage)' if already_due else ''}"
            table.append(
                {
                    "deployment": what,
                    "visible_within_s": o.last_s,
                    "p50_s": o.p50_s,
                    "p99_s": o.p99_s,
                    "placed_ahead": o.placed,
                    "puts_per_s": round(o.rate),
                    "bound_by": o.bound,
                }
            )
            rows.append(Row(NAME, f"{what}: last visible after due", "s", (o.last_s,), notes=o.bound))
    header = f"{messages:,} rows due in one second, CPU {args.cpu_ms} ms per put, worst phase of the minute"
    print(header)
    print(f"{'deployment':<72} {'last':>8} {'p50':>7} {'p99':>7} {'placed':>9} {'puts/s':>7}  bound")
    for r in table:
        print(
            f"{r['deployment']:<72} {r['visible_within_s']:>7.0f}s {r['p50_s']:>6.0f}s {r['p99_s']:>6.0f}s "
            f"{r['placed_ahead']:>9,} {r['puts_per_s']:>7}  {r['bound_by']}"
        )
    cost_rows = []
    for lead in (True, False):
        for per_minute in (100, 1000, 10000):
            c = costs(per_minute, 1, lead, args.table_price, args.queue_price)
            cost_rows.append({"lead": lead, "per_minute": per_minute, **c})
        burst = costs(messages, 1, lead, args.table_price, args.queue_price)  # a burst: idle share negligible
        cost_rows.append({"lead": lead, "per_minute": "burst", **burst})
        cost_rows.append({"lead": lead, "per_minute": "idle", **costs(0, 1, lead, args.table_price, args.queue_price)})
    print("\ncosts (1 shard):")
    for c in cost_rows:
        print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()))
    print_table(rows)
    result = {"messages": messages, "cpu_ms": args.cpu_ms, "outcomes": table, "costs": cost_rows}
    write_json(NAME + ("-smoke" if args.smoke else ""), rows, extra=result)
    return result


if __name__ == "__main__":
    main()
