"""Recurring schedules on AWS: a burst at 09:00 in five zones, the timer's memory over a million schedules, the cost.

The product's own schedule timer (``aws/schedules``) runs against DynamoDB and SQS answered in this process behind
real boto3 clients (``benchmarks/fakedynamo.py``, ``benchmarks/fakeaws.py``): every request is built and counted,
charged AWS's latency (``aws_costs.LATENCY``: DynamoDB 10 ms, SQS 20 ms) plus the client CPU the in-memory answer
skips (measured against moto), on a simulated clock.

* **Burst** (``--burst N``, default 100,000): N schedules ``0 9 * * *`` in Europe/Berlin, Paris, Madrid, Rome and
  Warsaw (all +01:00 on 2031-03-03: one UTC instant, 08:00Z, the hard case), 1 KiB bodies, ten destination queues,
  as the timer leaves them after the day before (rows, and due pages packed 1,000 entries a page). The timer runs
  every minute from 08:50Z; each run is a simulated Lambda invocation at ``--memory-mb`` (1,769 MB: one vCPU) with
  ``--lanes`` shards worked side by side (8): a lane's shards one after another, each shard pass its own simulated
  clock starting when its lane is free, its CPU seconds multiplied by the lanes (they share the one vCPU). Lateness
  per occurrence: when it becomes visible (send time + ``DelaySeconds``) minus its fire time. Lost, duplicates,
  early are counted per occurrence.
* **Memory** (``--stored N``, default 1,000,000): N schedules stored (100,000 of them due at 09:00, the rest spread
  over the day from 07:00Z) in a SQLite file (outside the measured process's memory); one timer run at 07:55Z (the
  burst, and the hour of spread ones before it) and one at 07:00Z (a quiet minute), each in a fresh process: the
  resident high-water mark's growth over the run (``VmHWM`` reset before it) and the peak of Python allocations
  (``tracemalloc``), target ≤ 128 MiB.
* **Cost**: per million occurrences from the requests and request units counted (SQS per request; DynamoDB reads
  per 4 KB, half for eventually consistent, writes per 1 KB of the larger of the old and new item, twice in a
  transaction; Lambda per invocation and GB-second of the simulated wall time), at the burst and at a steady 1,000
  occurrences a minute (60,000 hourly schedules spread over the minutes, 20 minutes), plus the fixed cost of the
  idle passes (every shard, every minute) per month. List prices: ``delayed_delivery.cost`` and
  ``timebuckets.cost`` (us-east-1), DynamoDB on-demand writes $0.625 per million units. EventBridge Scheduler:
  $1.00 per million invocations plus the send ($1.40 as ``aws_costs`` counts it).

Run: ``python -m benchmarks.schedules [--smoke] [--burst 100000] [--stored 1000000]``; prints a table and
writes ``benchmarks/results/schedules[-smoke].json``. ``--memory-only [--stored N] [--traced]`` runs the memory
part alone (the RSS runs; ``--traced`` adds the ``tracemalloc`` ones) and writes ``schedules-memory.json``.
Figures: benchmarks/aws.md and docs/schedules.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.aws_costs import LATENCY, SCHEDULER
from benchmarks.common import Row, print_table, rss_mib, write_json
from benchmarks.costs.tier import order_body
from benchmarks.fakeaws import FakeAws, Sends, SimClock, SimTime, calibrate_client_cpu
from benchmarks.fakedynamo import FakeDynamo
from benchmarks.sqs_hops import _moto
from delayed_delivery.aws.schedules.layout import (
    SHARDS,
    entry_of,
    minute_key,
    page_item,
    row_item,
    row_pk,
    shard_of,
)
from delayed_delivery.aws.schedules.sends import OccurrenceSender
from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
from delayed_delivery.aws.schedules.timer import ScheduleTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.timebuckets.cost import (
    DYNAMODB_READ_PRICE,
    LAMBDA_PRICE_PER_GB_SECOND,
    LAMBDA_PRICE_PER_INVOCATION,
    STANDARD_PRICE_PER_REQUEST,
)

NAME = "schedules"
#: DynamoDB on-demand, us-east-1: per million write request units (Nov 2024 list price).
DYNAMODB_WRITE_PRICE = 0.000000625
ZONES = ("Europe/Berlin", "Europe/Paris", "Europe/Madrid", "Europe/Rome", "Europe/Warsaw")
#: 09:00 in all five zones (+01:00 on this Monday).
NINE = datetime(2031, 3, 3, 8, 0, tzinfo=UTC)
DESTINATIONS = 10
TABLE = "schedules-bench"
LEAD = 300
TIMEOUT_S = 120.0
FULL_CORE_MB = 1_769
MINUTES_A_MONTH = 43_200
TARGET_P99_S = 5.0
TARGET_MIB = 128.0
TARGET_USD = 0.30
PAGE = 1000


# -- the table as the timer leaves it ----------------------------------------------------------------------------


#: A schedule's id, its next occurrence, its shape and how to build it: schedules of one shape differ only in their
#: id, so their rows and due-page entries are the same but for the keys (``load`` builds each shape's row once, and
#: every ``SAMPLE``-th schedule in full to check it).
Stored = tuple[str, datetime, tuple[Any, ...], Callable[[], Schedule]]
SAMPLE = 997


def _schedules(n: int, start: int = 0) -> Iterator[Stored]:
    """Schedule ``b<i>`` (daily at 09:00 in one of the zones) fired yesterday, and its next occurrence."""
    body = {i: order_body(i).encode() for i in range(16)}
    since = NINE - timedelta(days=7)
    definitions = {z: ScheduleDefinition("0 9 * * *", start=since, zone=z) for z in ZONES}
    templates = {(d, b): MessageTemplate(f"reports-{d}", body[b]) for d in range(DESTINATIONS) for b in range(16)}
    for i in range(start, start + n):
        sid, zone, shape = f"b{i:07d}", ZONES[i % len(ZONES)], (i % DESTINATIONS, i % 16)
        yield sid, NINE, ("b", zone, *shape), partial(
            Schedule, sid, definitions[zone], templates[shape], cursor=NINE - timedelta(days=1), next_at=NINE,
            version=2, fired=1, last_fired=NINE - timedelta(days=1),
        )  # fmt: skip


def _spread(n: int, start: int) -> Iterator[Stored]:
    """Schedules ``q<i>``: daily at a minute spread over the day (UTC), 100-byte bodies, next one after 07:00Z."""
    since = NINE - timedelta(days=7)
    minutes: dict[int, tuple[ScheduleDefinition, datetime]] = {}
    templates = {d: MessageTemplate(f"reports-{d}", b"x" * 100) for d in range(DESTINATIONS)}
    for i in range(start, start + n):
        minute = (i * 7) % 1440
        if minute not in minutes:
            at = NINE.replace(hour=minute // 60, minute=minute % 60) + timedelta(days=1 if minute < 420 else 0)
            minutes[minute] = (ScheduleDefinition(f"{minute % 60} {minute // 60} * * *", start=since), at)
        definition, at = minutes[minute]
        sid = f"q{i:07d}"
        yield sid, at, ("q", minute, i % DESTINATIONS), partial(
            Schedule, sid, definition, templates[i % DESTINATIONS], cursor=at - timedelta(days=1), next_at=at,
            version=2, fired=1,
        )  # fmt: skip


def _hourly(n: int) -> Iterator[Stored]:
    """Schedules ``h<i>``: hourly at minute ``i % 60`` (1,000 a minute at 60,000), 1 KiB bodies."""
    since = NINE - timedelta(days=7)
    body = {i: order_body(i).encode() for i in range(16)}
    for i in range(n):
        minute = i % 60
        at = NINE.replace(minute=minute)
        definition = ScheduleDefinition(f"{minute} * * * *", start=since)
        s = Schedule(f"h{i:07d}", definition, MessageTemplate(f"reports-{i % DESTINATIONS}", body[i % 16]),
                     cursor=at - timedelta(hours=1), next_at=at, version=2, fired=1)  # fmt: skip
        yield s.schedule_id, at, ("h", i), partial(lambda s: s, s)  # every one its own shape (60,000 at most)


def load(fake: FakeDynamo, schedules: Iterator[Stored], chunk: int = 20_000) -> int:
    """Write rows and packed due pages (1,000 entries a page per shard and minute), as the timer writes them.

    A shape's row and entry are built once (``row_item``: 0.2 ms a schedule, most of a million schedules' load) and
    copied with each schedule's keys; every ``SAMPLE``-th schedule's row is built in full and must equal its copy.
    """
    pages: dict[tuple[int, str], dict[str, Any]] = {}
    shapes: dict[tuple[Any, ...], tuple[dict[str, Any], Any]] = {}
    rows: list[dict[str, Any]] = []
    count, seq = 0, 0

    def flush_pages(everything: bool) -> None:
        nonlocal seq
        items = []
        for key in [k for k, v in pages.items() if everything or len(v) >= PAGE]:
            seq += 1
            items.append(page_item(key[0], f"{key[1]}#m.bench{seq:08d}", 0, pages.pop(key)))
        fake.put_many(items)

    for sid, at, shape, build in schedules:
        shard = shard_of(sid)
        if shape not in shapes:
            schedule = build()
            shapes[shape] = (row_item(schedule, 1), entry_of(schedule, 1))
        row, entry = shapes[shape]
        row = {**row, "pk": {"S": row_pk(shard)}, "sk": {"S": sid}}
        if count % SAMPLE == 0:
            schedule = build()
            if (schedule.schedule_id, row, entry) != (sid, row_item(schedule, 1), entry_of(schedule, 1)):
                raise AssertionError(f"schedule {sid}: its shape {shape} does not give its row")
        rows.append(row)
        pages.setdefault((shard, minute_key(at)), {})[sid] = entry
        count += 1
        if len(rows) >= chunk:
            fake.put_many(rows)
            rows = []
            flush_pages(False)
    fake.put_many(rows)
    flush_pages(True)
    return count


# -- timer runs as simulated invocations --------------------------------------------------------------------------


def _index_of(entry: dict[str, Any]) -> int:
    header = entry.get("MessageAttributes", {}).get(DELIVERY_HEADER, {}).get("StringValue")
    oid = decode_delivery(header).message_id or ""
    sid = oid.split("@", 1)[0]
    return int(sid[1:]) if sid[1:].isdigit() else -1


class Model:
    """The timer's invocations against the fakes, each shard pass on its own simulated clock."""

    def __init__(self, fake: FakeDynamo, count: int, client_cpu: float, memory_mb: int, lanes: int) -> None:
        self.fake = fake
        self.sends = Sends(count)
        self.aws = FakeAws(latency=LATENCY, client_cpu=client_cpu, message_index=_index_of, sends=self.sends)
        fake.client_cpu = client_cpu
        self.sqs = self.aws.client("sqs")
        for q in (*(f"reports-{d}" for d in range(DESTINATIONS)), "errors"):
            self.aws.create_queue(q)
        self.dynamodb = fake.client()
        self.lanes = lanes
        self.memory_mb = memory_mb
        self.cpu_scale = FULL_CORE_MB / min(memory_mb, FULL_CORE_MB) * lanes
        self.billed_seconds = 0.0
        self.invocations = 0
        self.results: list[Any] = []

    def invoke(self, at: datetime) -> float:
        """One timer invocation at ``at``: the shards over the lanes; its billed seconds.

        A lane's clock runs its shards' CPU ``lanes`` times slower (all lanes computing at once share the vCPU: the
        send times, so the lateness, err late). The billed time is the longer of the longest lane at full speed
        and the CPU of every lane together (one vCPU).
        """
        self.invocations += 1
        free = [0.0] * self.lanes
        fast = [0.0] * self.lanes
        cpu_total = 0.0
        for shard in range(SHARDS):
            lane = min(range(self.lanes), key=free.__getitem__)
            sim = SimTime(at + timedelta(seconds=free[lane]), self.cpu_scale)
            self.aws.sim = self.fake.sim = sim
            clock = SimClock(sim)
            store = DynamoDbScheduleStore(self.dynamodb, TABLE, clock=clock, lease_seconds=150)  # type: ignore[arg-type]
            sender = OccurrenceSender(self.sqs, "errors", clock, send_threads=4)  # type: ignore[arg-type]
            self.aws.send_threads = 4
            timer = ScheduleTimer(store, sender, clock, lead_seconds=LEAD, shard_threads=1, owner=f"inv-{at}",
                                  monotonic=lambda s=sim, f=free[lane]: f + s.seconds())  # type: ignore[misc]  # fmt: skip
            cpu0 = time.process_time()
            self.results.append(timer.run_shard(shard, deadline=TIMEOUT_S))
            cpu = (time.process_time() - cpu0) * self.cpu_scale / self.lanes
            free[lane] += sim.seconds()
            fast[lane] += sim.waited + cpu
            cpu_total += cpu
        self.aws.sim = self.fake.sim = None
        billed = max(max(fast), cpu_total)
        self.billed_seconds += billed
        return billed


def burst(count: int, client_cpu: float, memory_mb: int, lanes: int) -> dict[str, float]:
    """The 09:00 burst (module docstring); the figures."""
    fake = FakeDynamo(":memory:", LATENCY["dynamodb"])
    load(fake, _schedules(count))
    model = Model(fake, count, client_cpu, memory_mb, lanes)
    started = time.process_time()
    first = NINE - timedelta(minutes=10) + timedelta(seconds=2)
    for minute in range(0, 16):
        model.invoke(first + timedelta(minutes=minute))
    cpu = time.process_time() - started
    due = NINE.timestamp()
    late = sorted(v - due for n, v in enumerate(model.sends.first_visible) if model.sends.copies[n])
    requests = model.aws.requests
    million = 1e6 / count
    sqs = requests["sqs.SendMessageBatch"]
    rru, wru = sum(fake.rru.values()), sum(fake.wru.values())
    gb_s = model.billed_seconds * memory_mb / 1024
    return {
        "lateness_p50_s": statistics.median(late) if late else 0.0,
        "lateness_p99_s": late[min(len(late) - 1, int(len(late) * 0.99))] if late else 0.0,
        "lateness_max_s": late[-1] if late else 0.0,
        "early": float(sum(1 for x in late if x < 0)),
        "lost": float(sum(1 for c in model.sends.copies if c == 0)),
        "duplicates": float(sum(max(0, c - 1) for c in model.sends.copies)),
        "completion_s": model.sends.last_send - (NINE - timedelta(minutes=5)).timestamp(),
        "cpu_s": cpu,
        "sqs_requests_per_million": sqs * million,
        "dynamodb_rru_per_million": rru * million,
        "dynamodb_wru_per_million": wru * million,
        "lambda_gb_s_per_million": gb_s * million,
        **_usd(sqs * million, rru * million, wru * million, gb_s * million, model.invocations * million),
    }


def _usd(sqs: float, rru: float, wru: float, gb_s: float, invocations: float) -> dict[str, float]:
    parts = {
        "usd_sqs": sqs * STANDARD_PRICE_PER_REQUEST,
        "usd_dynamodb_reads": rru * DYNAMODB_READ_PRICE,
        "usd_dynamodb_writes": wru * DYNAMODB_WRITE_PRICE,
        "usd_lambda": gb_s * LAMBDA_PRICE_PER_GB_SECOND + invocations * LAMBDA_PRICE_PER_INVOCATION,
    }
    return {**parts, "usd_per_million": sum(parts.values())}


def steady(per_minute: int, minutes: int, client_cpu: float, memory_mb: int, lanes: int) -> dict[str, float]:
    """``per_minute`` occurrences a minute (hourly schedules spread over the minutes), and the idle run."""
    fake = FakeDynamo(":memory:", LATENCY["dynamodb"])
    count = per_minute * 60
    load(fake, _hourly(count))
    model = Model(fake, count, client_cpu, memory_mb, lanes)
    for minute in range(-6, minutes):  # from 6 minutes before 08:00: the lead fills first
        model.invoke(NINE + timedelta(minutes=minute, seconds=2))
    sent = sum(1 for c in model.sends.copies if c)
    million = 1e6 / max(1, sent)
    requests = model.aws.requests
    rru, wru = sum(fake.rru.values()), sum(fake.wru.values())
    gb_s = model.billed_seconds * memory_mb / 1024
    # the idle run: a table with nothing due, every shard passed once
    idle_fake = FakeDynamo(":memory:", LATENCY["dynamodb"])
    idle = Model(idle_fake, 1, client_cpu, memory_mb, lanes)
    idle.invoke(NINE)
    idle_month = {
        "fixed_usd_a_month": MINUTES_A_MONTH * (
            sum(idle_fake.rru.values()) * DYNAMODB_READ_PRICE + sum(idle_fake.wru.values()) * DYNAMODB_WRITE_PRICE
            + idle.billed_seconds * memory_mb / 1024 * LAMBDA_PRICE_PER_GB_SECOND + LAMBDA_PRICE_PER_INVOCATION
        ),
        "idle_wru_per_run": float(sum(idle_fake.wru.values())),
        "idle_seconds_per_run": idle.billed_seconds,
    }  # fmt: skip
    usd = _usd(requests["sqs.SendMessageBatch"] * million, rru * million, wru * million, gb_s * million,
               model.invocations * million)  # fmt: skip
    fixed_per_million = idle_month["fixed_usd_a_month"] / (per_minute * MINUTES_A_MONTH) * 1e6
    return {
        "sent": float(sent),
        "duplicates": float(sum(max(0, c - 1) for c in model.sends.copies)),
        "sqs_requests_per_million": requests["sqs.SendMessageBatch"] * million,
        "dynamodb_rru_per_million": rru * million,
        "dynamodb_wru_per_million": wru * million,
        "lambda_gb_s_per_million": gb_s * million,
        **usd,
        **idle_month,
        "usd_per_million_with_fixed": usd["usd_per_million"] + fixed_per_million,
    }


# -- memory: one run in a fresh process ---------------------------------------------------------------------------


def _max_rss_mib() -> float:
    with Path("/proc/self/status").open() as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def memory_step(db: str, at: str, count: int, traced: bool) -> dict[str, Any]:
    """One timer run at ``at`` over the table in ``db``: its resident growth and Python peak (MiB)."""
    fake = FakeDynamo(db, 0.0)
    aws = FakeAws(latency={"s3": 0.0, "sqs": 0.0, "dynamodb": 0.0}, message_index=_index_of, sends=Sends(count))
    sqs = aws.client("sqs")
    for q in (*(f"reports-{d}" for d in range(DESTINATIONS)), "errors"):
        aws.create_queue(q)
    clock = ManualClock(datetime.fromisoformat(at))
    store = DynamoDbScheduleStore(fake.client(), TABLE, clock=clock, lease_seconds=600)
    timer = ScheduleTimer(store, OccurrenceSender(sqs, "errors", clock, send_threads=4), clock, lead_seconds=LEAD,
                          shard_threads=8)  # fmt: skip
    for q in range(DESTINATIONS):
        sqs.get_queue_url(QueueName=f"reports-{q}")
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before_rss, before_max = rss_mib(), _max_rss_mib()
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    result = timer.run()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20 if traced else None
    tracemalloc.stop()
    return {"at": at, "fired": result.fired, "failures": result.failures, "seconds": seconds,
            "traced_peak_mib": peak, "rss_growth_mib": _max_rss_mib() - before_rss, "max_rss_mib": _max_rss_mib(),
            "rss_before_mib": before_rss, "hwm_before_mib": before_max}  # fmt: skip


def memory(stored: int, smoke: bool, traced: bool = True) -> dict[str, float]:
    """``stored`` schedules in a SQLite file; a burst run and a quiet run, each in fresh processes (and again under
    ``tracemalloc`` when ``traced``)."""
    burst_n = min(100_000, stored // 10)
    with tempfile.TemporaryDirectory(prefix="schedules-mem-") as tmp:
        db = str(Path(tmp) / "table.db")
        fake = FakeDynamo(db, 0.0)
        started = time.monotonic()
        load(fake, _schedules(burst_n))
        load(fake, _spread(stored - burst_n, burst_n))
        fake.db.close()
        print(f"{NAME}: {stored:,} schedules stored in {time.monotonic() - started:.0f} s "
              f"({Path(db).stat().st_size / 2**20:,.0f} MiB on disk)", file=sys.stderr, flush=True)  # fmt: skip
        out: dict[str, float] = {"stored": float(stored), "due_in_burst": float(burst_n)}
        for label, at in (("busy", (NINE - timedelta(minutes=4, seconds=58)).isoformat()),
                          ("quiet", (NINE - timedelta(minutes=59, seconds=58)).isoformat())):  # fmt: skip
            for under_tracemalloc in (False, True) if traced else (False,):
                copy = Path(tmp) / f"{label}-{under_tracemalloc}.db"
                shutil.copyfile(db, copy)  # each run on the same state
                child = subprocess.run(
                    [sys.executable, "-m", "benchmarks.schedules", "--memory-step", str(copy), at,
                     str(stored), "traced" if under_tracemalloc else "rss"],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                step = json.loads(child.stdout.strip().splitlines()[-1])
                copy.unlink()
                key = "traced_peak_mib" if under_tracemalloc else "rss_growth_mib"
                out[f"{label}_{key}"] = step[key]
                if not under_tracemalloc:
                    out[f"{label}_max_rss_mib"] = step["max_rss_mib"]
                    out[f"{label}_fired"] = float(step["fired"])
                    out[f"{label}_seconds"] = step["seconds"]
    return out


# -- the command ----------------------------------------------------------------------------------------------------


def _memory_met(memory: dict[str, float]) -> float:
    """1.0 when the runs' resident growth and (if measured) Python peak are within ``TARGET_MIB``."""
    keys = ("busy_rss_growth_mib", "busy_traced_peak_mib", "quiet_rss_growth_mib")
    return float(max(memory[k] for k in keys if k in memory) <= TARGET_MIB)


def memory_only(stored: int, traced: bool) -> list[Row]:
    """The memory part alone (``--memory-only``): no calibration, burst or steady run; RSS only unless ``traced``."""
    figures = {"memory": memory(stored, False, traced)}
    figures["targets"] = {"memory_met": _memory_met(figures["memory"])}
    note = {"memory": f"{stored:,} schedules stored (SQLite file); a run at the burst and at a quiet minute"}
    run.last = {"figures": figures}  # type: ignore[attr-defined]
    return _rows(figures, note)


def _rows(figures: dict[str, dict[str, float]], note: dict[str, str]) -> list[Row]:
    rows = []
    for part, values in figures.items():
        first = True
        for key, value in values.items():
            unit = ("s" if key.endswith("_s") else "MiB" if key.endswith("_mib") else "USD" if "usd" in key
                    else "count")  # fmt: skip
            rows.append(Row(NAME, f"{part}_{key}", unit, (value,), notes=note.get(part, "") if first else ""))
            first = False
    return rows


def run(
    smoke: bool = False,
    *,
    burst_count: int = 100_000,
    stored: int = 1_000_000,
    per_minute: int = 1_000,
    memory_mb: int = FULL_CORE_MB,
    lanes: int = 8,
) -> list[Row]:
    """The benchmark-runner entry point."""
    if smoke:
        burst_count, stored, per_minute = 2_000, 20_000, 100
    with _moto() as endpoint:
        client_cpu = calibrate_client_cpu(endpoint)
    print(f"{NAME}: client CPU {client_cpu * 1000:.2f} ms a request", file=sys.stderr, flush=True)
    figures: dict[str, dict[str, float]] = {}
    started = time.monotonic()
    figures["burst"] = burst(burst_count, client_cpu, memory_mb, lanes)
    print(f"{NAME}: burst in {time.monotonic() - started:.0f} s: {figures['burst']}", file=sys.stderr, flush=True)
    started = time.monotonic()
    figures["steady"] = steady(per_minute, 6 if smoke else 20, client_cpu, memory_mb, lanes)
    print(f"{NAME}: steady in {time.monotonic() - started:.0f} s: {figures['steady']}", file=sys.stderr, flush=True)
    figures["memory"] = memory(stored, smoke)
    figures["targets"] = {
        "burst_p99_met": float(figures["burst"]["lateness_p99_s"] <= TARGET_P99_S
                               and figures["burst"]["lost"] == 0 and figures["burst"]["duplicates"] == 0),
        "memory_met": _memory_met(figures["memory"]),
        "cost_met": float(figures["burst"]["usd_per_million"] <= TARGET_USD
                          and figures["steady"]["usd_per_million_with_fixed"] <= TARGET_USD),
        "eventbridge_usd_per_million": SCHEDULER,
    }  # fmt: skip
    note = {
        "burst": f"{burst_count:,} schedules at 09:00 in 5 zones (one UTC instant), 1 KiB, lead {LEAD} s, "
        f"{memory_mb} MB, {lanes} lanes; DynamoDB 10 ms, SQS 20 ms, client CPU {client_cpu * 1000:.2f} ms",
        "steady": f"{per_minute:,} occurrences a minute (hourly schedules spread over the minutes)",
        "memory": f"{stored:,} schedules stored (SQLite file); a run at the burst and at a quiet minute",
    }
    run.last = {"client_cpu_s": client_cpu, "figures": figures}  # type: ignore[attr-defined]
    return _rows(figures, note)


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/schedules[-smoke].json``."""
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-step":
        db, at, count, mode = sys.argv[2:6]
        print(json.dumps(memory_step(db, at, int(count), mode == "traced")))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--burst", type=int, default=100_000)
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--per-minute", type=int, default=1_000)
    parser.add_argument("--memory-mb", type=int, default=FULL_CORE_MB)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--memory-only", action="store_true", help="only the timer's memory over --stored schedules")
    parser.add_argument("--traced", action="store_true", help="with --memory-only: also the tracemalloc runs")
    a = parser.parse_args()
    if a.memory_only:
        rows = memory_only(a.stored, a.traced)
        print_table(rows, f"Recurring schedules on AWS: the timer's memory over {a.stored:,} stored schedules")
        print(write_json(f"{NAME}-memory", rows, run.last))  # type: ignore[attr-defined]
        return
    rows = run(a.smoke, burst_count=a.burst, stored=a.stored, per_minute=a.per_minute, memory_mb=a.memory_mb,
               lanes=a.lanes)  # fmt: skip
    print_table(rows, "Recurring schedules on AWS: burst, memory, cost (simulated invocations, counted requests)")
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, run.last))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
