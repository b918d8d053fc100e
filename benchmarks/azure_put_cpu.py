"""Python CPU per Put Message on Azurite: the raw SDK put beside the transport the dispatcher and placer use.

* raw: ``QueueClient.send_message`` of a ready envelope through the SDK's default HTTP transport;
* transport: ``StorageQueueTransport.place`` (envelope with the delivery header, visibility timeout) through the
  clients ``AzureClients.create`` builds (the dispatcher's pool and session).

Each case puts ``--messages`` envelopes of 1 KiB from ``--concurrency`` threads; CPU is this process's CPU time
(``time.process_time``) divided by the puts (the emulator runs in its own process, so it is not counted). The
figure feeds ``benchmarks.azure_burst_model --cpu-ms``. Alternating runs; medians.

Run: ``python -m benchmarks.azure_put_cpu [--messages 2000] [--runs 3] [--concurrency 16]``. Starts its own
Azurite unless ``AZURITE_CONNECTION_STRING`` is set. Prints a table and writes
``benchmarks/results/azure_put_cpu.json``.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any

from azure.storage.queue import QueueServiceClient

from benchmarks.azure_dispatch import _name, azurite
from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.config import AzureClients, AzureDelayedDeliveryConfig
from delayed_delivery.azure.storage_queue import StorageQueueTransport, encode_envelope
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings

NAME = "azure_put_cpu"
BODY = b"x" * 1024


def _cpu_per_put(put: Any, messages: list[DelayedMessage], concurrency: int) -> tuple[float, float]:
    """(ms of CPU per put, puts per second of wall time)."""
    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(put, messages))
    return (time.process_time() - cpu) * 1000 / len(messages), len(messages) / (time.perf_counter() - wall)


def _raw_put(raw: Any, message: DelayedMessage) -> None:
    raw.send_message(encode_envelope(message))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    due = datetime.now(UTC)
    samples: dict[str, list[tuple[float, float]]] = {"raw": [], "transport": []}
    with azurite() as conn:
        raw_service = QueueServiceClient.from_connection_string(conn)
        config = AzureDelayedDeliveryConfig(
            table_name=_name("t"),
            container_name=_name("c"),
            connection_string=conn,
            settings=DelayedDeliverySettings(max_concurrency=args.concurrency),
        )
        transport = StorageQueueTransport(AzureClients.create(config).queues, route="table")
        for run in range(args.runs):
            queue = _name("q")
            raw_service.create_queue(queue)
            batch = [DelayedMessage(f"m-{run}-{i}", queue, BODY, due) for i in range(args.messages)]
            raw = raw_service.get_queue_client(queue)
            samples["raw"].append(_cpu_per_put(partial(_raw_put, raw), batch, args.concurrency))
            samples["transport"].append(
                _cpu_per_put(partial(transport.place, visibility_timeout=3600), batch, args.concurrency)
            )
    note = f"{args.messages} puts of 1 KiB, {args.concurrency} threads, Azurite"
    rows = [
        Row(NAME, f"{case}: CPU per put", "ms", tuple(c for c, _ in got), notes=note) for case, got in samples.items()
    ] + [
        Row(NAME, f"{case}: puts per second", "msg/s", tuple(r for _, r in got), notes=note)
        for case, got in samples.items()
    ]
    print_table(rows, "Python CPU per Put Message (Azurite)")
    write_json(NAME, rows)
    return {r.metric: r.median for r in rows}


if __name__ == "__main__":
    main()
