"""Recurring schedules on Azure: a burst at 09:00 in five zones, on Azurite and in a model at Azure's limits.

The issue's target on Azure: N schedules ``0 9 * * *`` in Europe/Berlin, Paris, Madrid, Rome and Warsaw (all +01:00 on
2031-03-03: one UTC instant, 08:00Z, as ``benchmarks/schedules.py`` has it on AWS), 1 KiB bodies, four queues, each
schedule as the timer leaves it after the day before.

* **Azurite** (``--schedules N``, default 2,000): the product's ``AzureScheduleTimer`` (lead 300 s, markers, as the
  function app builds it) and ``AzureDispatcherHost`` (Bicep's defaults: 1 shard, placement 7,200 s ahead) on one
  Azurite, on a clock shifted so that the first timer run starts ``ahead`` seconds before 09:00 (not 280 s: the run
  stays short; a later start only makes the figures worse). The timer runs alone until it has written everything
  or 09:00 is 20 s away (its CPU per occurrence is measured over that stretch: ``time.process_time``), and again
  every 60 s while some are left; then dispatcher runs follow one another beside it until every occurrence was
  received, and a consumer drains the queues. Per occurrence: when its row was written (its transaction returned),
  when it became visible on its queue (the put's time plus its visibility timeout, from the delivery header), lost
  (never received), duplicates (received more than once), early. Requests are counted as they leave this process,
  by thread (timer, dispatcher; the consumer's not) and kind (``azure_dispatch``'s). A probe times a point read and
  a three-row transaction in partitions of growing size (what bounds the emulator, not Azure).
* **Model** (``--burst N``, default 100,000): the same burst second by second at Azure's documented scalability
  targets, 2,000 entities a second per partition and 20,000 requests a second per account, with the timer's CPU per
  occurrence measured above (or ``--timer-cpu-ms``) and the dispatcher's per put (``--put-cpu-ms``, default 3.64 ms:
  ``benchmarks/azure_put_cpu``), both in the function app's one Python process. The timer runs at second 20 of each
  minute for its 50 s budget, ``shard_threads`` shards side by side, each sending its requests in sequence: the
  timer's requests per occurrence measured on Azurite (the schedule row's read and its share of the transactions:
  rows and markers 33 occurrences a transaction, cursors 33 schedules a transaction; 3 before they were batched) at
  ``--latency-ms`` each (assumed, 10 ms: no latency is documented), so ``threads / (requests × latency + CPU)``
  occurrences a second at most; the delays table's partition (1 shard) takes 3 entities per occurrence row (marker,
  index, due), then 4 per row placed ahead (claim, record, sweep of two) or 3 per row sent at due. A row written
  more than 2 s before its fire time is placed ahead and becomes visible at it; a later one becomes visible when
  sent.
* **Costs**: storage requests per occurrence (timer + dispatcher, counted on Azurite) priced as
  ``benchmarks/azure_burst_model`` prices them (assumed list prices, USD 0.00036 per 10,000 table transactions and
  0.004 per 10,000 queue operations, standard LRS; a ``$batch`` request billed as one transaction): no Azure price
  list is in the team's research folder, so check them for your region.

Run: ``python -m benchmarks.schedules_azure_burst [--smoke] [--schedules 2000] [--burst 100000]``; prints a table and
writes ``benchmarks/results/schedules_azure_burst[-smoke].json``. Figures: docs/schedules.md ("Costs and bursts").
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.storage.queue import QueueServiceClient

from benchmarks.azure_burst_azurite import drain_queues
from benchmarks.azure_burst_model import (
    ACCOUNT_REQUESTS_PER_S,
    MIN_AHEAD,
    PARTITION_ENTITIES_PER_S,
    PLACED_ENTITY_OPS,
    SENT_ENTITY_OPS,
)
from benchmarks.azure_dispatch import _KINDS, _kind, _name, azurite
from benchmarks.common import Row, print_table, write_json
from benchmarks.costs.tier import order_body
from benchmarks.schedules import NINE, ZONES
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.schedules import rows as schedule_rows
from delayed_delivery.azure.schedules.config import schedule_table_name
from delayed_delivery.azure.schedules.occurrence_rows import OccurrenceRows
from delayed_delivery.azure.schedules.store import TableScheduleStore
from delayed_delivery.azure.schedules.timer import AzureScheduleTimer
from delayed_delivery.clock import SystemClock
from delayed_delivery.model import DelayedMessage
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.request_counter import counting_requests

NAME = "schedules_azure_burst"
QUEUES = 4
LEAD = 300
PLACE_AHEAD = 7200
#: Entities the timer touches per occurrence in the delays table's partition: marker, index row, due row.
ROW_ENTITIES = 3
TIMER_SECOND, TIMER_BUDGET, DISPATCH_RUN = 20, 50, 50
#: Storage requests the dispatcher makes per message (``azure_burst_model``: about 1.05 with placement).
DISPATCH_REQUESTS = 1.05
TABLE_PRICE, QUEUE_PRICE = 0.00036, 0.004
TARGET_P99_S = 5.0


# -- Azurite ------------------------------------------------------------------------------------------------------


class ShiftedClock(SystemClock):
    """The real clock moved by ``shift`` (sleeping and waiting are real): every part of the run reads it."""

    def __init__(self, shift: timedelta) -> None:
        self.shift = shift

    def now(self) -> datetime:
        """Now, shifted."""
        return datetime.now(UTC) + self.shift


class StampedRows(OccurrenceRows):
    """The timer's writer, noting when each occurrence's transaction returned (shifted clock, epoch seconds)."""

    def __init__(self, host: AzureDispatcherHost, clock: ShiftedClock) -> None:
        super().__init__(host.store)
        self.clock = clock
        self.written: dict[str, float] = {}
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def store_occurrence(self, message: DelayedMessage, keep_until: datetime) -> None:
        """Write as the product does, then note the time."""
        super().store_occurrence(message, keep_until)
        self._stamp([message.message_id])

    def store_occurrences(self, items: Sequence[tuple[DelayedMessage, datetime]]) -> list[Exception | None]:
        """Write as the product does (in transactions), then note the time of those written."""
        out = super().store_occurrences(items)
        self._stamp([m.message_id for (m, _), error in zip(items, out, strict=True) if error is None])
        return out

    def _stamp(self, ids: list[str]) -> None:
        at = self.clock.now().timestamp()
        with self._lock:
            for i in ids:
                self.calls[i] += 1
                self.written.setdefault(i, at)


def _schedules(n: int, queues: list[str]) -> Iterator[Schedule]:
    """Schedule ``b<i>``: 09:00 daily in one of the five zones, fired yesterday, next at 09:00 today."""
    since = NINE - timedelta(days=7)
    definitions = {z: ScheduleDefinition("0 9 * * *", start=since, zone=z) for z in ZONES}
    bodies = [order_body(i).encode() for i in range(16)]
    for i in range(n):
        template = MessageTemplate(queues[i % len(queues)], bodies[i % 16])
        yield Schedule(f"b{i:07d}", definitions[ZONES[i % len(ZONES)]], template, cursor=NINE - timedelta(days=1),
                       next_at=NINE, version=2, fired=1, last_fired=NINE - timedelta(days=1))  # fmt: skip


def load(store: TableScheduleStore, schedules: Iterator[Schedule]) -> int:
    """Each schedule's row and due row, 50 schedules a transaction per partition (setup, not measured)."""
    groups: dict[str, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {}
    count = 0
    for s in schedules:
        due = schedule_rows.due_entity(s)
        assert due is not None
        group = groups.setdefault(schedule_rows.partition_of(s.schedule_id), [])
        group += [("create", schedule_rows.schedule_entity(s), {}), ("create", due, {})]
        count += 1
        if len(group) >= 100:
            store.table.submit_transaction(group)  # type: ignore[arg-type]
            group.clear()
    for group in groups.values():
        if group:
            store.table.submit_transaction(group)  # type: ignore[arg-type]
    return count


def _by_thread(request: Any) -> tuple[str, str]:
    """``(part, kind)`` of a request: the thread's name says timer, consumer, else dispatcher."""
    name = threading.current_thread().name
    part = "timer" if name.startswith(("bench-timer", "schedule-shard")) else (
        "consumer" if name.startswith("bench-consumer") else "dispatcher")  # fmt: skip
    return part, _kind(request)


def _timer_runs(timer: AzureScheduleTimer, n: int, until: float, done: threading.Event) -> dict[str, float]:
    """Timer runs every 60 s (real) from now until ``n`` are written or ``until`` (monotonic)."""
    wall0 = time.monotonic()
    runs = fired = 0
    while fired < n and time.monotonic() < until:
        started = time.monotonic()
        result = timer.run()
        runs, fired = runs + 1, fired + result.fired
        if fired < n:
            time.sleep(max(0.0, 60 - (time.monotonic() - started)))
    done.set()
    return {"runs": runs, "fired": fired, "wall_s": time.monotonic() - wall0}


def _dispatch_until_seen(host: AzureDispatcherHost, clock: ShiftedClock, n: int, seen: list[tuple[str, float]]) -> int:
    """Dispatcher runs (as the function app's, back to back) until every occurrence was received or 10 minutes
    passed; the first run lasts until a little past 09:00, the others 30 s. How many runs."""
    deadline, runs = time.monotonic() + 600, 0
    while len({m for m, _ in seen}) < n and time.monotonic() < deadline:
        first = 1.15 * (max(0.0, NINE.timestamp() - clock.now().timestamp()) + 5 + n / 200)
        host.run(first if runs == 0 else 30.0)
        runs += 1
    return runs


def azurite_burst(conn: str, n: int, ahead: float) -> dict[str, Any]:
    """One burst of ``n`` schedules on Azurite (module docstring); the figures."""
    service = QueueServiceClient.from_connection_string(conn)
    names = [_name("q") for _ in range(QUEUES)]
    for q in names:
        service.create_queue(q)
    table = _name("sched")
    config = AzureDelayedDeliveryConfig(table_name=table, container_name=table, connection_string=conn,
                                        place_ahead=PLACE_AHEAD,
                                        settings=DelayedDeliverySettings(max_concurrency=16))  # fmt: skip
    clock = ShiftedClock(timedelta(0))
    host = AzureDispatcherHost(config, clock=clock, heartbeat=False)
    host.setup_infrastructure()
    store = TableScheduleStore(host.clients.tables.get_table_client(schedule_table_name(table)))
    store.setup_infrastructure()
    load(store, _schedules(n, names))
    clock.shift = NINE - timedelta(seconds=ahead) - datetime.now(UTC)
    rows = StampedRows(host, clock)
    timer = AzureScheduleTimer(store, rows, host.container, clock=clock, lead_seconds=LEAD)
    seen: list[tuple[str, float]] = []
    stop, done = threading.Event(), threading.Event()
    box: dict[str, Any] = {}
    with counting_requests(_by_thread) as counts:
        cpu0 = time.process_time()
        worker = threading.Thread(target=lambda: box.update(t=_timer_runs(timer, n, time.monotonic() + 900, done)),
                                  name="bench-timer")  # fmt: skip
        worker.start()
        # the timer alone (its CPU measured) until it is done or 09:00 is 20 s away; then the dispatcher beside it
        done.wait(max(0.0, NINE.timestamp() - 20 - clock.now().timestamp()))
        box["alone"] = (time.process_time() - cpu0, len(rows.written))
        shifted = lambda: clock.now().timestamp()  # noqa: E731
        consumer = threading.Thread(target=drain_queues, args=(service, names, seen, stop, shifted),
                                    name="bench-consumer")  # fmt: skip
        consumer.start()
        box["dispatcher_runs"] = _dispatch_until_seen(host, clock, n, seen)
        worker.join()
        stop.set()
        consumer.join()
    store.drop()
    host.store.drop()
    cpu, alone = box["alone"]
    timer_figures = {**box["t"], "cpu_ms_per_occurrence": 1000 * cpu / max(1, alone), "written_alone": alone,
                     "dispatcher_runs": box["dispatcher_runs"]}  # fmt: skip
    return _figures(n, ahead, timer_figures, rows, seen, counts)


def lookup_probe(conn: str, sizes: tuple[int, ...], reads: int) -> dict[str, float]:
    """Azurite's point read and three-row transaction (ms) in a partition of each size: whether the emulator's time
    per request grows with the partition (Azure documents a rate per partition, not a cost per row)."""
    from azure.data.tables import TableServiceClient

    table = TableServiceClient.from_connection_string(conn).create_table(_name("probe"))
    out: dict[str, float] = {}
    try:
        for size in sizes:
            pk = f"p{size}"
            for start in range(0, size, 100):
                table.submit_transaction([("create", {"PartitionKey": pk, "RowKey": f"r{i:07d}", "Body": "x" * 200})
                                          for i in range(start, min(size, start + 100))])  # fmt: skip
            started = time.perf_counter()
            for k in range(reads):
                table.get_entity(pk, f"r{(k * 7919) % size:07d}")
            out[f"point_read_ms_partition_{size}"] = 1000 * (time.perf_counter() - started) / reads
            started = time.perf_counter()
            for k in range(reads):  # as an occurrence's rows: three created in one transaction
                table.submit_transaction([("create", {"PartitionKey": pk, "RowKey": f"t{k:05d}{j}"}) for j in "abc"])
            out[f"transaction_ms_partition_{size}"] = 1000 * (time.perf_counter() - started) / reads
    finally:
        table.delete_table()
    return out


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] if values else math.inf


def _figures(n: int, ahead: float, timer: dict[str, float], rows: StampedRows, seen: list[tuple[str, float]],
             counts: Counter[Any]) -> dict[str, Any]:  # fmt: skip
    """Lateness of rows written and of messages visible, lost, duplicates, requests per occurrence, CPU."""
    due = NINE.timestamp()
    written = sorted(at - due for at in rows.written.values())
    first: dict[str, float] = {}
    for mid, at in seen:
        first.setdefault(mid, at)
    received = Counter(mid for mid, _ in seen)
    visible = sorted(at - due for at in first.values())
    per: dict[str, float] = {}
    for part in ("timer", "dispatcher"):
        for kind in _KINDS:
            per[f"{part}: {kind}"] = counts[part, kind] / n
        per[f"{part}: all"] = sum(v for (p, _), v in counts.items() if p == part) / n
    queue_ops = per["dispatcher: put message"]
    table_ops = per["timer: all"] + per["dispatcher: all"] - queue_ops
    return {
        "schedules": n, "ahead_s": ahead, "timer_runs": timer["runs"], "timer_wall_s": timer["wall_s"],
        "timer_cpu_ms_per_occurrence": timer["cpu_ms_per_occurrence"], "timer_cpu_sample": timer["written_alone"],
        "dispatcher_runs": timer["dispatcher_runs"],
        "rows_written": len(rows.written), "row_writes_repeated": sum(c - 1 for c in rows.calls.values()),
        "written_last_s": written[-1] if written else math.inf,
        "written_p50_s": _pct(written, 0.5), "written_p99_s": _pct(written, 0.99),
        "visible_last_s": visible[-1] if visible else math.inf,
        "visible_p50_s": _pct(visible, 0.5), "visible_p99_s": _pct(visible, 0.99),
        "lost": n - len(first), "duplicates": sum(c - 1 for c in received.values()),
        "early": sum(1 for v in visible if v < 0), "requests_per_occurrence": per,
        "table_requests_per_occurrence": table_ops, "queue_requests_per_occurrence": queue_ops,
        "usd_per_million": 1e6 * (table_ops * TABLE_PRICE + queue_ops * QUEUE_PRICE) / 10_000,
    }  # fmt: skip


# -- the model at Azure's limits ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setup:
    """One way the function app runs (the timer's shards side by side, lead, shards of the delays table)."""

    name: str
    lead: int = LEAD
    shard_threads: int = 4
    delay_shards: int = 1


def model(s: Setup, n: int, timer_cpu: float, put_cpu: float, latency: float, requests: float) -> dict[str, Any]:
    """The burst second by second (module docstring): when rows are written and when messages become visible. The
    timer and the dispatcher share the process's CPU (max-min fair, as threads under one interpreter lock roughly
    do), the partition's entities and the account's requests (in proportion when together they want more)."""
    t = -s.lead + TIMER_SECOND  # the first run whose lead reaches 09:00 (second 20 of 08:55)
    to_write, placeable, to_send = float(n), 0.0, 0.0
    written: list[tuple[float, float]] = []
    visible: list[tuple[float, float]] = []
    entities, account = s.delay_shards * PARTITION_ENTITIES_PER_S, float(ACCOUNT_REQUESTS_PER_S)
    while to_write > 1e-9 or placeable + to_send > 1e-9:
        placing = t < -MIN_AHEAD
        if not placing:
            to_send, placeable = to_send + placeable, 0.0  # placement's window closed: sent at due
        w = d = 0.0
        if to_write > 1e-9 and (t - TIMER_SECOND) % 60 < TIMER_BUDGET:
            w = min(to_write, s.shard_threads / (requests * latency + timer_cpu), entities / ROW_ENTITIES,
                    account / requests)  # fmt: skip
        ops = PLACED_ENTITY_OPS if placing else SENT_ENTITY_OPS
        if t % 60 < DISPATCH_RUN and (placing or t >= 0):
            d = min(placeable if placing else to_send, entities / ops, account / DISPATCH_REQUESTS)
        cpu_w, cpu_d = _fair(w * timer_cpu, d * put_cpu)
        w, d = min(w, cpu_w / timer_cpu), min(d, cpu_d / put_cpu)
        squeeze = max(1.0, (w * ROW_ENTITIES + d * ops) / entities, (w * requests + d * DISPATCH_REQUESTS) / account)
        w, d = w / squeeze, d / squeeze
        if w:
            to_write -= w
            written.append((t + 1.0, w))
            placeable, to_send = (placeable + w, to_send) if t + 1 < -MIN_AHEAD else (placeable, to_send + w)
        if d:
            if placing:
                placeable -= d
            else:
                to_send -= d
            visible.append((max(0.0, t + 1.0), d))
        t += 1
    return {"setup": s.name, **_weighted("written", written, n), **_weighted("visible", visible, n)}


def _fair(a: float, b: float, total: float = 1.0) -> tuple[float, float]:
    """Max-min fair shares of ``total`` for demands ``a`` and ``b``."""
    if a + b <= total:
        return a, b
    half = total / 2
    return (a, total - a) if a < half else (total - b, b) if b < half else (half, half)


def _weighted(label: str, pairs: list[tuple[float, float]], n: int) -> dict[str, float]:
    """Last, p50, p99 of ``(seconds after 09:00, how many)`` (negative: before; lateness counts from 0)."""
    out: dict[str, float] = {}
    for q, key in ((0.5, "p50"), (0.99, "p99"), (1.0, "last")):
        need, seen = q * n - 1e-6, 0.0
        for at, k in pairs:
            seen += k
            if seen >= need:
                out[f"{label}_{key}_s"] = max(0.0, at)
                break
    return out


SETUPS = (
    Setup("the code's default lead 300 s, 4 shards side by side, 1 delays shard"),
    Setup("as deployed (Bicep: lead 900 s, the most), 4 side by side", lead=900),
    Setup("lead 900 s, 16 side by side", lead=900, shard_threads=16),
)


# -- the command --------------------------------------------------------------------------------------------------


def run(smoke: bool = False, *, schedules: int = 2000, burst: int = 100_000, timer_cpu_ms: float | None = None,
        put_cpu_ms: float = 3.64, latency_ms: float = 10.0) -> list[Row]:  # fmt: skip
    """Both parts; the rows (``run.last``: every figure)."""
    if smoke:
        schedules, burst = 20, 2_000
    ahead = (5 if smoke else 30) + schedules * 0.03  # the timer's first run starts this long before 09:00
    with azurite() as conn:
        local = azurite_burst(conn, schedules, ahead)
        local.update(lookup_probe(conn, (50, 500) if smoke else (100, 1000, 10_000), 10 if smoke else 50))
    cpu = (timer_cpu_ms if timer_cpu_ms is not None else local["timer_cpu_ms_per_occurrence"]) / 1000
    requests = local["requests_per_occurrence"]["timer: all"]
    models = [model(s, burst, cpu, put_cpu_ms / 1000, latency_ms / 1000, requests) for s in SETUPS]
    run.last = {"azurite": local, "model": models, "model_inputs": {  # type: ignore[attr-defined]
        "burst": burst, "timer_cpu_ms": cpu * 1000, "put_cpu_ms": put_cpu_ms, "latency_ms": latency_ms,
        "timer_requests_per_occurrence": requests}}  # fmt: skip
    note = f"{schedules:,} schedules at 09:00 in 5 zones on Azurite, first timer run {ahead:.0f} s before"
    rows = [Row(NAME, f"azurite {k}", _unit(k), (float(v),), notes=note if i == 0 else "")
            for i, (k, v) in enumerate(local.items()) if isinstance(v, int | float)]  # fmt: skip
    rows += [Row(NAME, f"azurite requests per occurrence, {k}", "req", (v,)) for k, v in
             local["requests_per_occurrence"].items() if v]  # fmt: skip
    for m in models:
        mnote = (f"{burst:,} at 09:00; timer CPU {cpu * 1000:.2f} ms, put CPU {put_cpu_ms} ms, latency "
                 f"{latency_ms} ms; 2,000 entities/s a partition, 20,000 requests/s")  # fmt: skip
        rows += [Row(NAME, f"model {m['setup']}: {k}", "s", (v,), notes=mnote) for k, v in m.items() if k != "setup"]
    return rows


def _unit(key: str) -> str:
    return "s" if key.endswith("_s") else "ms" if "_ms_" in key else "USD" if key.startswith("usd") else (
        "req" if "requests" in key else "count")  # fmt: skip


def main() -> None:
    """Command line: print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--schedules", type=int, default=2000, help="schedules in the Azurite burst")
    p.add_argument("--burst", type=int, default=100_000, help="schedules in the model's burst")
    p.add_argument("--timer-cpu-ms", type=float, default=None, help="instead of the CPU measured on Azurite")
    p.add_argument("--put-cpu-ms", type=float, default=3.64)
    p.add_argument("--latency-ms", type=float, default=10.0)
    a = p.parse_args()
    rows = run(a.smoke, schedules=a.schedules, burst=a.burst, timer_cpu_ms=a.timer_cpu_ms, put_cpu_ms=a.put_cpu_ms,
               latency_ms=a.latency_ms)  # fmt: skip
    print_table(rows, "Recurring schedules on Azure: a 09:00 burst (Azurite, and a model at Azure's limits)")
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, run.last))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
