"""How far a timer run of the real ``AzureDispatcherHost`` overruns its budget, with a backlog due (Azurite).

N rows of 1 KiB, all due when the first run starts, over 4 queues and S shards; timer runs of ``--budget`` seconds
one after another (as the timer fires them) until every row is sent. Per run: its wall time minus its budget (the
overrun: a run that ends late delays the next timer occurrence), and what it sent. Before #34's run budgets every
shard finished its batch of 100 past the deadline.

Run: ``python -m benchmarks.azure_run_budget [--messages 4000] [--shards 16] [--budget 20]``. Starts its own
Azurite unless ``AZURITE_CONNECTION_STRING`` is set. Prints a table and writes
``benchmarks/results/azure_run_budget.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from azure.storage.queue import QueueServiceClient

from benchmarks.azure_dispatch import _name, azurite
from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings

NAME = "azure_run_budget"
BODY = b"x" * 1024
QUEUES = 4


def runs(conn: str, messages: int, shards: int, budget: float, most: int) -> dict[str, Any]:
    """Timer runs over one backlog; each run's overrun and sends."""
    service = QueueServiceClient.from_connection_string(conn)
    names = [_name("q") for _ in range(QUEUES)]
    for n in names:
        service.create_queue(n)
    table = _name("budget")
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        run_seconds=budget,
        shards=shards,
        settings=DelayedDeliverySettings(max_concurrency=16),
    )
    host = AzureDispatcherHost(config, heartbeat=False)
    host.setup_infrastructure()
    due = datetime.now(UTC)
    rows = [DelayedMessage(f"m-{i}", names[i % QUEUES], BODY, due) for i in range(messages)]
    for start in range(0, messages, 500):
        host.store.store_many(rows[start : start + 500])
    overruns: list[float] = []
    sent: list[int] = []
    while sum(sent) < messages and len(sent) < most:
        start = time.monotonic()
        summary = host.run()
        overruns.append(time.monotonic() - start - budget)
        sent.append(summary.dispatched)
    return {
        "messages": messages,
        "shards": shards,
        "budget_s": budget,
        "runs": len(sent),
        "sent_per_run": sent,
        "overrun_per_run_s": [round(x, 2) for x in overruns],
        "max_overrun_s": max(overruns),
        "median_overrun_s": statistics.median(overruns),
        "left_unsent": messages - sum(sent),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--most-runs", type=int, default=6)
    args = parser.parse_args(argv)
    with azurite() as conn:
        result = runs(conn, args.messages, args.shards, args.budget, args.most_runs)
    notes = f"{result['messages']} due, {result['shards']} shards, runs of {result['budget_s']:g} s"
    rows = [
        Row(NAME, "max overrun", "s", (float(result["max_overrun_s"]),), notes=notes),
        Row(NAME, "median overrun", "s", (float(result["median_overrun_s"]),), notes=notes),
        Row(NAME, "runs to send all", "runs", (float(result["runs"]),), notes=notes),
        Row(NAME, "left unsent", "msgs", (float(result["left_unsent"]),), notes=notes),
    ]
    print_table(rows, "Timer runs against their budget on Azurite")
    print("per run: overrun", result["overrun_per_run_s"], "sent", result["sent_per_run"])
    write_json(NAME, rows, extra={"result": result})
    return result


if __name__ == "__main__":
    main()
