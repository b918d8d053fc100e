"""Azure on Azurite: dispatcher throughput beside raw queue puts at the same concurrency, shard scaling, lateness.

* raw Put Message: N envelopes put by ``concurrency`` threads straight through the SDK (the ceiling), with the
  dispatcher's HTTP connection pool;
* one dispatcher: N due rows drained by the lease holder of one shard, exactly as a timer run does it
  (exclusive shard view: one range query per batch and no claim writes, ``concurrency`` parallel puts,
  removal in lean entity-group transactions overlapped with the next batch). Raw and dispatcher runs
  alternate, so a busy machine slows both alike; the ratio is of the medians;
* shards: N due rows spread over 1, 2 and 4 shards, one dispatcher *process* per shard holding that shard's
  lease, all started together; aggregate msg/s from the common start to the last put, and the ratio to 1 shard;
* lateness: rows falling due uniformly within a window while one timer run (``AzureDispatcherHost.run``)
  dispatches; lateness runs from the due time until the put returned (so it includes the put). Per run
  p50/p95/p99/max; rows never sent count as infinitely late; early sends are counted (must be 0).
* requests per message: every HTTP request one lease-holding dispatcher makes while it drains N due rows, counted
  as they leave the process and sorted by kind (Put Message; claim transactions, the in-flight marks; delete
  transactions; table queries; blob lease calls), each divided by N.

The function app's cold import is measured by ``benchmarks.cold_import``.

Run: ``python -m benchmarks.azure_dispatch [--smoke] [--runs 5] [--messages 2000] [--concurrency 16]``.
Starts its own Azurite unless ``AZURITE_CONNECTION_STRING`` is set. Figures: benchmarks/azure.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.storage.queue import QueueServiceClient

from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig, http_transport
from delayed_delivery.azure.rows import shard_of
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import StorageQueueTransport, encode_envelope
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.request_counter import counting_requests as counting

BODY = b"x" * 256
NAME = "azure_dispatch"


def _name(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:16]


@contextmanager
def azurite() -> Iterator[str]:
    """A connection string: ``AZURITE_CONNECTION_STRING`` or a fresh in-memory Azurite on free ports."""
    given = os.environ.get("AZURITE_CONNECTION_STRING")
    if given:
        yield given
        return
    from delayed_delivery.app.emulators import LocalEmulators

    with LocalEmulators(moto=False) as instance:
        yield instance.azure_connection_string


def _host(
    conn: str, concurrency: int, run_seconds: float = 50.0, *, table: str | None = None, shards: int = 1
) -> AzureDispatcherHost:
    table = table or _name("bench")
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        shards=shards,
        lease_seconds=30,
        run_seconds=run_seconds,
        settings=DelayedDeliverySettings(max_concurrency=concurrency, batch_size=100, error_queue="bencherrors"),
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


def _lease_holder(host: AzureDispatcherHost, shard: int) -> tuple[Any, Dispatcher, Any]:
    """What ``AzureDispatcherHost.run_shard`` wires for a shard: its lease, exclusive view and dispatcher."""
    lease = host.lease(shard)
    deadline = time.monotonic() + 60
    while not lease.try_acquire():
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not take the lease of shard {shard}")
        time.sleep(0.5)
    view = host.store.for_shards([shard], exclusive=True)
    dispatcher = Dispatcher(view, host.transport, host.settings, overlap_removal=True)
    return lease, dispatcher, view


def _drain(lease: Any, dispatcher: Dispatcher, n: int) -> int:
    dispatched = 0
    stop = time.monotonic() + 600
    while dispatched < n and time.monotonic() < stop and lease.keep_going():
        dispatched += dispatcher.dispatch_due(None, wait_for_due=False, keep_going=lease.keep_going).dispatched
    return dispatched


def _drained(conn: str, queue: str, n: int, concurrency: int, around: Any = contextlib.nullcontext) -> float:
    """Seconds one lease-holding dispatcher takes to drain ``n`` due rows, inside the context ``around()``."""
    host = _host(conn, concurrency)
    due = datetime.now(UTC) - timedelta(seconds=1)
    host.store.store_many([DelayedMessage(f"m-{i}", queue, BODY, due) for i in range(n)])
    lease, dispatcher, _ = _lease_holder(host, 0)
    try:
        with around():
            start = time.perf_counter()
            dispatched = _drain(lease, dispatcher, n)
            elapsed = time.perf_counter() - start
    finally:
        lease.release()
        dispatcher.close()
    if dispatched != n:
        raise RuntimeError(f"dispatched {dispatched} of {n}")
    host.store.drop()
    return elapsed


def dispatch_throughput(conn: str, queue: str, n: int, concurrency: int) -> float:
    """Messages/s for one lease-holding dispatcher draining ``n`` due rows."""
    return n / _drained(conn, queue, n, concurrency)


def _shard_worker(conn: str, table: str, shards: int, shard: int, concurrency: int, n: int, ready: Any, go: Any) -> Any:
    """One dispatcher process: take the shard's lease, wait for the start, drain; (end time, dispatched)."""
    host = _host(conn, concurrency, table=table, shards=shards)
    lease, dispatcher, _ = _lease_holder(host, shard)
    try:
        ready.put(shard)
        go.wait(120)
        dispatched = _drain(lease, dispatcher, n)
        return time.time(), dispatched
    finally:
        lease.release()
        dispatcher.close()


def shard_throughput(conn: str, queue: str, n: int, shards: int, concurrency: int) -> float:
    """Aggregate messages/s of ``shards`` dispatcher processes (one per shard) draining ``n`` rows together."""
    host = _host(conn, concurrency, shards=shards)
    table = host.config.table_name
    due = datetime.now(UTC) - timedelta(seconds=1)
    messages = [DelayedMessage(f"s-{i}", queue, BODY, due) for i in range(n)]
    host.store.store_many(messages)
    per_shard = [0] * shards
    for m in messages:
        per_shard[shard_of(m.message_id, shards)] += 1
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        ready, go = manager.Queue(), manager.Event()
        with ctx.Pool(shards) as pool:
            results = [
                pool.apply_async(_shard_worker, (conn, table, shards, s, concurrency, per_shard[s], ready, go))
                for s in range(shards)
            ]
            for _ in range(shards):
                ready.get(timeout=120)
            start = time.time()
            go.set()
            outcomes = [r.get(timeout=900) for r in results]
    dispatched = sum(d for _, d in outcomes)
    if dispatched != n:
        raise RuntimeError(f"{shards} shards dispatched {dispatched} of {n}")
    host.store.drop()
    return n / (float(max(end for end, _ in outcomes)) - start)


#: What each kind of request is, from its method, path and body.
_KINDS = ("put message", "claim transaction", "delete transaction", "other transaction", "table query", "other")


def _kind(request: Any) -> str:
    url, body = str(request.url), request.body or b""
    if request.method == "POST" and "/messages" in url:
        return "put message"
    if "$batch" in url:
        data = body if isinstance(body, bytes) else str(body).encode()
        if b"\nPATCH " in data and b"ClaimToken" in data:
            return "claim transaction"
        if b"\nDELETE " in data and b"\nPATCH " not in data:
            return "delete transaction"
        return "other transaction"
    if request.method == "GET" and "()" in url:
        return "table query"
    return "other"


def counting_requests() -> AbstractContextManager[Counter[Hashable]]:
    """Counts the HTTP requests leaving this process by kind (``_KINDS``) while the block runs."""
    return counting(_kind)


def requests_per_message(conn: str, queue: str, n: int, concurrency: int) -> dict[str, float]:
    """Requests of each kind per message while one lease-holding dispatcher drains ``n`` due rows."""
    counts: Counter[Hashable] = Counter()

    @contextmanager
    def counted() -> Iterator[None]:
        with counting_requests() as seen:
            yield
        counts.update(seen)

    _drained(conn, queue, n, concurrency, counted)
    per = {kind: counts[kind] / n for kind in _KINDS}
    per["all"] = sum(counts.values()) / n
    return per


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


def lateness(conn: str, queue: str, n: int, window: float, concurrency: int, seed: int) -> list[float]:
    """Seconds late of the rows (``n`` due uniformly within ``window`` s) sent during one timer run."""
    lead = 3.0
    host = _host(conn, concurrency, run_seconds=lead + window + 5.0)
    stamping = _Stamping(host.transport)
    host.transport = stamping  # type: ignore[assignment]
    rng = random.Random(seed)
    start = datetime.now(UTC) + timedelta(seconds=lead)
    dues = {f"l-{i}": start + timedelta(seconds=rng.uniform(0, window)) for i in range(n)}
    host.store.store_many([DelayedMessage(mid, queue, BODY, due) for mid, due in dues.items()])
    host.run()
    host.store.drop()
    late = [(stamping.sent[mid] - due).total_seconds() for mid, due in dues.items() if mid in stamping.sent]
    return late + [math.inf] * (n - len(late))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def run(
    smoke: bool = False,
    runs: int = 5,
    messages: int = 2000,
    concurrency: int = 16,
    late: int = 400,
    window: float = 20.0,
    shard_counts: tuple[int, ...] = (1, 2, 4),
) -> list[Row]:
    """Measure and return the rows."""
    if smoke:
        runs, messages, late, window, shard_counts = 1, 60, 30, 3.0, (1, 2)
    raw: list[float] = []
    ours: list[float] = []
    scaled: dict[int, list[float]] = {n: [] for n in shard_counts}
    late_runs: list[list[float]] = []
    counted: list[dict[str, float]] = []
    with azurite() as conn:
        queues = QueueServiceClient.from_connection_string(conn)
        queues.create_queue("bencherrors")
        for i in range(runs):
            queue = _name("q")  # queues are kept: deleting one holding thousands of messages slows Azurite for minutes
            queues.create_queue(queue)
            late_runs.append(lateness(conn, queue, late, window, concurrency, seed=i))
            raw.append(raw_puts(conn, queue, messages, concurrency))
            ours.append(dispatch_throughput(conn, queue, messages, concurrency))
            counted.append(requests_per_message(conn, queue, messages, concurrency))
            for n in shard_counts:
                scaled[n].append(shard_throughput(conn, queue, messages, n, concurrency))

    note = f"{messages} msgs of {len(BODY)} B, {concurrency} parallel puts, Azurite in memory"
    rows = [
        Row(NAME, f"raw Azurite Put Message, concurrency {concurrency}", "msg/s", tuple(raw), notes=note),
        Row(
            NAME,
            f"one dispatcher (lease holder), concurrency {concurrency}",
            "msg/s",
            tuple(ours),
            baseline="raw puts",
            ratio_to_baseline=statistics.median(ours) / statistics.median(raw),
            notes=note,
        ),
    ]
    one = statistics.median(scaled[shard_counts[0]])
    for n in shard_counts:
        rows.append(
            Row(
                NAME,
                f"{n} shard(s), one dispatcher process each (aggregate)",
                "msg/s",
                tuple(scaled[n]),
                baseline=f"{shard_counts[0]} shard",
                ratio_to_baseline=statistics.median(scaled[n]) / one,
                notes=f"{messages} msgs spread over {n} shards, processes started together",
            )
        )
    count_note = f"{messages} msgs drained by one lease holder, batch 100; counted as they leave the process"
    for kind in (*_KINDS, "all"):
        rows.append(
            Row(NAME, f"requests per message: {kind}", "req/msg", tuple(c[kind] for c in counted), notes=count_note)
        )
    late_note = f"{late} msgs due uniformly within {window:.0f} s while one timer run dispatches; median of runs"
    for label, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0)):
        rows.append(Row(NAME, f"lateness {label}", "s", tuple(_pct(r, q) for r in late_runs), notes=late_note))
    rows += [
        Row(NAME, "sent early (must be 0)", "msgs", tuple(float(sum(1 for s in r if s < 0)) for r in late_runs)),
        Row(
            NAME, "not sent within the run", "msgs", tuple(float(sum(1 for s in r if s == math.inf)) for r in late_runs)
        ),
    ]
    return rows


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--late", type=int, default=400)
    p.add_argument("--window", type=float, default=20.0)
    a = p.parse_args()
    rows = run(a.smoke, a.runs, a.messages, a.concurrency, a.late, a.window)
    print_table(rows, "Azure on Azurite")
    path = write_json(f"{NAME}-smoke" if a.smoke else NAME, rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
