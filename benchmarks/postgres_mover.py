"""Benchmark: rows/s moved from the PostgreSQL delayed table by 1, 2 and 4 mover processes.

Each run seeds ``--rows`` due rows, then N processes share the table, each calling the batch
mover until nothing is left; the baseline moves the same rows with one plain
``INSERT … SELECT`` + ``DELETE`` transaction on the same database in the same run.

Modes: ``exactly-once`` (one statement per batch: claim with SKIP LOCKED, delete, insert into
the queue table) and ``at-least-once`` (claim, one INSERT per message, one DELETE per batch).

Run: ``python -m benchmarks.postgres_mover [--smoke] [--runs 3] [--rows 20000] [--dsn "host=… dbname=…"]``
(default: a throwaway local cluster, fsync off). Also run by ``python -m benchmarks``.
Prints a table and writes ``benchmarks/results/postgres_mover.json``: medians of ``--runs``; the
ratio is the median of per-run ratios to the baseline measured just before (paired, so load
drift on a shared machine cancels).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from benchmarks.common import Row, print_table, write_json
from delayed_delivery.postgres.cluster import ThrowawayCluster
from delayed_delivery.postgres.mover import PostgresBatchMover
from delayed_delivery.postgres.queue import PostgresQueueTransport
from delayed_delivery.postgres.store import PostgresDelayedMessageStore

MODES = ("exactly-once", "at-least-once")


def _tables(dsn: str) -> tuple[PostgresDelayedMessageStore, PostgresQueueTransport]:
    store = PostgresDelayedMessageStore(dsn, table="bench_delayed")
    queue = PostgresQueueTransport(dsn, table="bench_queue")
    return store, queue


def _seed(dsn: str, rows: int, body_bytes: int) -> None:
    """Fresh tables holding ``rows`` messages, all due (in the past by the database clock)."""
    store, queue = _tables(dsn)
    store.drop_infrastructure()
    queue.drop_infrastructure()
    store.setup_infrastructure()
    queue.setup_infrastructure()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bench_delayed (message_id, destination, body, headers, due_at, available_at)"
            " SELECT 'm-' || i, 'orders', convert_to(repeat('x', %s), 'UTF8'), '{\"k\": \"v\"}',"
            " now() - interval '1 hour' + i * interval '1 millisecond',"
            " now() - interval '1 hour' + i * interval '1 millisecond'"
            " FROM generate_series(1, %s) AS i",
            (body_bytes, rows),
        )
        conn.execute("VACUUM ANALYZE bench_delayed")
    store.close()
    queue.close()


def _worker(dsn: str, mode: str, batch_size: int, start: Any, out: Any) -> None:
    store, queue = _tables(dsn)
    mover = PostgresBatchMover(store, queue, batch_size=batch_size, exactly_once=mode == "exactly-once")
    store.next_due()  # open connections before the clock starts
    queue.count()
    start.wait(120)
    began = time.monotonic()
    moved = 0
    while True:
        part = mover.move_once()
        moved += part.moved
        if part.moved == 0:
            break
    out.put((began, time.monotonic(), moved))
    store.close()
    queue.close()


def _check(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT count(*) FROM bench_delayed").fetchone()
        queued = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM bench_queue").fetchone()
    assert left is not None and queued is not None
    if left[0] != 0 or queued[0] != rows or queued[1] != rows:
        raise SystemExit(f"benchmark invariant broken: {left[0]} left, {queued[0]} queued, {queued[1]} distinct")


def run_movers(dsn: str, mode: str, processes: int, rows: int, batch_size: int, body_bytes: int) -> float:
    """Seed, then time ``processes`` movers draining the table; verify each row moved once; rows/s."""
    _seed(dsn, rows, body_bytes)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(dsn, mode, batch_size, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    _check(dsn, rows)
    if processes > 1 and sum(1 for r in results if r[2]) < 2:
        print(f"note: only one of {processes} {mode} movers got rows", flush=True)
    return rows / (max(r[1] for r in results) - min(r[0] for r in results))


def run_baseline(dsn: str, rows: int, body_bytes: int) -> float:
    """One plain ``INSERT … SELECT`` + ``DELETE`` transaction moving every due row; rows/s."""
    _seed(dsn, rows, body_bytes)
    with psycopg.connect(dsn) as conn:
        began = time.monotonic()
        with conn.transaction():
            conn.execute(
                "INSERT INTO bench_queue (message_id, destination, body, headers, due_at)"
                " SELECT message_id, destination, body, headers, due_at FROM bench_delayed"
                " WHERE due_at <= now() ORDER BY due_at"
            )
            conn.execute("DELETE FROM bench_delayed WHERE due_at <= now()")
        seconds = time.monotonic() - began
    _check(dsn, rows)
    return rows / seconds


def run(
    smoke: bool = False,
    runs: int = 3,
    rows: int = 20_000,
    batch_size: int = 100,
    body_bytes: int = 256,
    processes: Sequence[int] = (1, 2, 4),
    modes: Sequence[str] = MODES,
    dsn: str | None = None,
) -> list[Row]:
    """Measure and return the rows (starts a throwaway cluster unless ``dsn`` is given)."""
    if smoke:
        runs, rows, processes = 1, 1_000, (1, 2)  # every mode, alone and racing; 4 processes only in full runs
    cluster = None
    if dsn is None:
        cluster = ThrowawayCluster().start()
        dsn = cluster.conninfo
    baseline: list[float] = []
    movers: dict[tuple[str, int], list[float]] = {(m, n): [] for m in modes for n in processes}
    try:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        version = str(row[0]).split()[0] if row else "?"
        for _ in range(runs):  # interleaved, so drift on a shared machine hits every figure alike
            baseline.append(run_baseline(dsn, rows, body_bytes))
            for (mode, n), samples in movers.items():
                samples.append(run_movers(dsn, mode, n, rows, batch_size, body_bytes))
    finally:
        if cluster is not None:
            cluster.stop()
    where = f"PostgreSQL {version}" + (" throwaway cluster, fsync off" if cluster is not None else "")
    notes = f"{where}; {rows:,} rows of {body_bytes} B; batch {batch_size}"
    out = [
        Row(
            "postgres mover", "INSERT…SELECT + DELETE, 1 transaction (baseline)", "rows/s", tuple(baseline), notes=notes
        )
    ]
    for (mode, n), samples in movers.items():
        label = f"{mode} batch mover, {n} process{'es' if n > 1 else ''}"
        out.append(
            Row(
                "postgres mover",
                label,
                "rows/s",
                tuple(samples),
                "INSERT…SELECT/DELETE (paired)",
                # each run is divided by the baseline measured just before it, so load drift cancels
                statistics.median(m / b for m, b in zip(samples, baseline, strict=True)),
                notes,
            )
        )
    return out


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one run (CI)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--body-bytes", type=int, default=256)
    p.add_argument("--processes", default="1,2,4", help="comma-separated mover process counts")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--dsn", help="an existing database (default: a throwaway local cluster)")
    a = p.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        p.error(f"--modes takes {', '.join(MODES)}")
    counts = [int(n) for n in a.processes.split(",")]
    rows = run(a.smoke, a.runs, a.rows, a.batch_size, a.body_bytes, counts, modes, a.dsn)
    print_table(rows, "PostgreSQL batch mover")
    print(f"wrote {write_json('postgres_mover' + ('-smoke' if a.smoke else ''), rows)}")


if __name__ == "__main__":
    main()
