"""Azure on Azurite: one dispatcher's throughput beside raw queue puts at the same concurrency, and lateness.

* raw Put Message throughput: N envelopes put by ``concurrency`` threads straight through the SDK (the ceiling);
* dispatch throughput: N due rows claimed, sent with ``concurrency`` parallel puts and removed by one
  dispatcher holding the shard's blob lease (Table store + lease + Storage Queue transport + core Dispatcher);
* lateness: 1,000 rows falling due uniformly within one minute while one timer run dispatches; lateness is
  the time from due to the put returning (so it includes the put), p50 / p99 / max, and how many were early.

Run: ``python -m benchmarks.azure_dispatch [--smoke] [--runs 3] [--messages 2000] [--concurrency 16]``.
Starts its own Azurite unless ``AZURITE_CONNECTION_STRING`` is set.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from azure.storage.queue import QueueServiceClient

from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig, http_transport
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import StorageQueueTransport, encode_envelope
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings

BODY = b"x" * 256


def _name(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:16]


@contextmanager
def azurite() -> Iterator[str]:
    """A connection string: ``AZURITE_CONNECTION_STRING`` or a fresh in-memory Azurite on free ports."""
    given = os.environ.get("AZURITE_CONNECTION_STRING")
    if given:
        yield given
        return
    from tests.fixtures.azurite import start_azurite

    instance = start_azurite()
    try:
        yield instance.connection_string
    finally:
        instance.process.stop()


def _host(conn: str, concurrency: int, run_seconds: float = 50.0) -> AzureDispatcherHost:
    table = _name("bench")
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        lease_seconds=30,
        run_seconds=run_seconds,
        settings=DelayedDeliverySettings(max_concurrency=concurrency, batch_size=100, error_queue=_name("e")),
    )
    host = AzureDispatcherHost(config)
    host.setup_infrastructure()
    return host


def raw_puts(conn: str, queue: str, n: int, concurrency: int) -> float:
    """Messages/s for ``n`` Put Message calls by ``concurrency`` threads."""
    # the same connection pool as the dispatcher's transport, so the comparison is like for like
    service = QueueServiceClient.from_connection_string(conn, transport=http_transport(concurrency + 4))
    client = service.get_queue_client(queue)
    text = encode_envelope(DelayedMessage("raw", queue, BODY, datetime.now(UTC)))
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: client.send_message(text, time_to_live=-1), range(n)))
    return n / (time.perf_counter() - start)


def dispatch_throughput(conn: str, queue: str, n: int, concurrency: int) -> float:
    """Messages/s for one lease-holding dispatcher draining ``n`` due rows."""
    host = _host(conn, concurrency)
    now = datetime.now(UTC)
    host.store.store_many([DelayedMessage(f"m-{i}", queue, BODY, now - timedelta(seconds=1)) for i in range(n)])
    lease = host.lease(0)
    dispatcher = Dispatcher(host.store.for_shards([0]), host.transport, host.settings)
    dispatched = 0
    try:
        start = time.perf_counter()
        while dispatched < n and time.perf_counter() - start < 600:
            if not lease.try_acquire():  # what a timer run does: retry each second
                time.sleep(1.0)
                continue
            report = dispatcher.dispatch_due(None, wait_for_due=False, keep_going=lease.keep_going)
            dispatched += report.dispatched
            if not report.dispatched:
                time.sleep(0.5)  # the rest are claimed by a lost lease's run: their claims expire
        elapsed = time.perf_counter() - start
    finally:
        lease.release()
        dispatcher.close()
    if dispatched != n:
        raise RuntimeError(f"dispatched {dispatched} of {n}")
    host.store.drop()
    return n / elapsed


class _Stamping:
    """Transport wrapper noting when each put returned."""

    def __init__(self, inner: StorageQueueTransport) -> None:
        self.inner = inner
        self.sent: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def send(self, message: DelayedMessage) -> None:
        self.inner.send(message)
        with self._lock:
            self.sent[message.message_id] = datetime.now(UTC)


def lateness(conn: str, queue: str, n: int, window: float, concurrency: int) -> list[float]:
    """Seconds late for the rows (of ``n`` due uniformly within ``window`` s) sent during one timer run."""
    lead = 5.0
    host = _host(conn, concurrency, run_seconds=lead + window + 10.0)
    stamping = _Stamping(host.transport)
    host.transport = stamping  # type: ignore[assignment]
    rng = random.Random(7)
    start = datetime.now(UTC) + timedelta(seconds=lead)
    dues = {f"l-{i}": start + timedelta(seconds=rng.uniform(0, window)) for i in range(n)}
    host.store.store_many([DelayedMessage(mid, queue, BODY, due) for mid, due in dues.items()])
    host.run()
    host.store.drop()
    return [(stamping.sent[mid] - due).total_seconds() for mid, due in dues.items() if mid in stamping.sent]


def _pct(values: list[float], q: float, total: int) -> float:
    """Percentile over ``total`` messages; ones never sent count as infinitely late."""
    ordered = sorted(values) + [math.inf] * (total - len(values))
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(smoke: bool = False, runs: int = 3, messages: int = 2000, concurrency: int = 16, late: int = 1000) -> list[Row]:
    """Measure and return the rows."""
    window = 60.0
    if smoke:
        runs, messages, late, window = 1, 60, 30, 3.0
    raw: list[float] = []
    ours: list[float] = []
    with azurite() as conn:
        queues = QueueServiceClient.from_connection_string(conn)
        queue = _name("q")
        queues.create_queue(queue)
        seconds = lateness(conn, queue, late, window, concurrency)  # first, on a fresh emulator
        for _ in range(runs):
            queue = _name("q")
            queues.create_queue(queue)
            raw.append(raw_puts(conn, queue, messages, concurrency))
            ours.append(dispatch_throughput(conn, queue, messages, concurrency))
            # queues are kept: deleting a queue holding thousands of messages makes Azurite crawl for minutes
    note = f"{messages} msgs of {len(BODY)} B, {concurrency} parallel puts, Azurite in memory"
    rows = [
        Row("azure_dispatch", "raw Azurite Put Message", "msg/s", tuple(raw), notes=note),
        Row(
            "azure_dispatch",
            "one dispatcher: claim + put + batch delete",
            "msg/s",
            tuple(ours),
            baseline="raw puts",
            ratio_to_baseline=statistics.median(ours) / statistics.median(raw),
            notes=note,
        ),
    ]
    late_note = f"{late} msgs due uniformly within {window:.0f} s, one timer run"
    rows += [
        Row("azure_dispatch", "lateness p50", "s", (_pct(seconds, 0.50, late),), notes=late_note),
        Row("azure_dispatch", "lateness p99", "s", (_pct(seconds, 0.99, late),), notes=late_note),
        Row("azure_dispatch", "lateness max (of those sent)", "s", (max(seconds),), notes=late_note),
        Row("azure_dispatch", "sent early (must be 0)", "msgs", (float(sum(1 for s in seconds if s < 0)),)),
        Row("azure_dispatch", "not sent within the run", "msgs", (float(late - len(seconds)),), notes=late_note),
    ]
    return rows


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--late", type=int, default=1000)
    a = p.parse_args()
    rows = run(a.smoke, a.runs, a.messages, a.concurrency, a.late)
    print_table(rows, "Azure on Azurite")
    path = write_json("azure_dispatch-smoke" if a.smoke else "azure_dispatch", rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
