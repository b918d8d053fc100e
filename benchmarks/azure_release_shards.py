"""Azure release control across shards: a burst to one capped queue, and how long the cap takes to release it.

N messages fall due at one instant to a queue capped at R messages a second, so the ideal completion is N / R (the
last slot at (N - 1) / R). Scenarios, on one delays table on Azurite:

* **one shard of S holds everything**: the message ids are picked so they all hash into shard 0;
* **random ids over S shards**;
* **1 shard** (the reference).

Every shard runs its own dispatcher, ``AzureDispatcherHost.run_shard`` (its lease, its exclusive view, its own
simulated clock: waiting costs no wall time), all at once in threads, booking their slots from the table's one
release schedule (a blob, written with ETag conditions, so the shards really contend for it). A message arrives when
it becomes visible on the queue: its send time on its shard's clock plus the visibility timeout the dispatcher asked
for. Measured per scenario: completion (the last arrival less the due time) against N / R, the busiest second
(the cap allows R + 1), arrivals before their due time, messages not sent and sent twice (each must be 0), and the
warnings the dispatchers logged (a storage error's back-off delays the placements held at that moment: later, never
earlier).

``--split even`` runs the schedule of earlier versions instead for comparison: each shard books cap / S in a
schedule of its own (``BlobReleaseState``).

Run: ``python -m benchmarks.azure_release_shards [--smoke] [--messages 2000] [--rate 100] [--shards 16] [--runs 3]
[--split shared|even]``; writes ``benchmarks/results/azure_release_shards.json``. Figures: benchmarks/azure.md.
"""

from __future__ import annotations

import argparse
import logging
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.azure_dispatch import azurite
from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.release_state import BlobReleaseState
from delayed_delivery.azure.rows import shard_of
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.clock import ManualClock
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import ReleaseStateStore
from delayed_delivery.release import busiest_window
from delayed_delivery.settings import DelayedDeliverySettings

NAME = "azure_release_shards"
#: Simulated seconds each shard's dispatcher runs: the burst is placed (visibility timeouts) within the first.
RUN_SECONDS = 5.0


class _Arrivals:
    """The host's transport, noting when each message becomes visible: its shard's clock at the send plus the delay."""

    def __init__(self, inner: Any, clock: ManualClock, seen: list[tuple[str, float]], lock: threading.Lock) -> None:
        self.inner, self.clock, self.seen, self.lock = inner, clock, seen, lock

    @property
    def max_delay_seconds(self) -> int:
        return int(self.inner.max_delay_seconds)

    def send(self, message: DelayedMessage) -> None:
        self.send_delayed(message, 0)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self.inner.send_delayed(message, delay_seconds)
        with self.lock:
            self.seen.append((message.message_id, self.clock.now().timestamp() + delay_seconds))


class _EvenHost(AzureDispatcherHost):
    """The split of earlier versions: each shard books cap / shards in a schedule of its own."""

    def release_schedule(self, shard: int) -> tuple[ReleaseStateStore, float]:
        return BlobReleaseState(self.container, shard, self.config.shards, clock=self.clock), 1.0 / self.config.shards


def _ids(n: int, shards: int, one_shard: bool, seed: int) -> list[str]:
    rng = random.Random(seed)
    ids: list[str] = []
    while len(ids) < n:
        candidate = f"m-{rng.getrandbits(64):016x}"
        if not one_shard or shard_of(candidate, shards) == 0:
            ids.append(candidate)
    return ids


def burst(conn: str, n: int, rate: float, shards: int, *, one_shard: bool, split: str, seed: int) -> dict[str, float]:
    """One burst on a fresh table: completion, ideal, busiest second, early and lost."""
    table = "rs" + uuid.uuid4().hex[:16]
    queue = "q" + uuid.uuid4().hex[:12]
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        lease_seconds=60,
        run_seconds=59,
        claim_timeout=600.0,
        shards=shards,
        settings=DelayedDeliverySettings(
            max_concurrency=8,
            error_queue="rserrors",
            release_rates={queue: rate},  # type: ignore[arg-type]
        ),
    )
    loader = AzureDispatcherHost(config, heartbeat=False)
    loader.setup_infrastructure()
    loader.transport.create_queue(queue)
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    ids = _ids(n, shards, one_shard, seed)
    for start in range(0, n, 2000):
        loader.store.store_many([DelayedMessage(i, queue, b"x", due) for i in ids[start : start + 2000]])
    seen: list[tuple[str, float]] = []
    lock = threading.Lock()
    troubles = _Troubles()
    kind = _EvenHost if split == "even" else AzureDispatcherHost

    def shard_run(shard: int) -> int:
        clock = ManualClock(due)  # each shard its own process in the cloud: its own simulated clock here
        host = kind(config, clock=clock, monotonic=lambda: clock.now().timestamp(), heartbeat=False)
        host.transport = _Arrivals(host.transport, clock, seen, lock)  # type: ignore[assignment]
        return host.run_shard(shard, clock.now().timestamp() + RUN_SECONDS).report.dispatched

    started = time.monotonic()
    logging.getLogger("delayed_delivery").addHandler(troubles)
    try:
        with ThreadPoolExecutor(shards) as pool:
            list(pool.map(shard_run, range(shards)))
    finally:
        logging.getLogger("delayed_delivery").removeHandler(troubles)
    wall = time.monotonic() - started
    loader.store.drop()
    epoch = due.timestamp()
    times = [t for _, t in seen]
    ids = {m for m, _ in seen}
    return {
        "completion_s": max(times) - epoch if times else float("inf"),
        "ideal_s": n / rate,
        "busiest_1s": float(busiest_window(times, 1.0)),
        "early": float(sum(1 for t in times if t < epoch)),
        "unsent": float(n - len(ids)),
        "duplicates": float(len(seen) - len(ids)),
        "storage_errors": float(troubles.count),
        "wall_s": wall,
    }


class _Troubles(logging.Handler):
    """Counts the warnings the dispatchers log (storage errors, failed bookings) during a burst."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def run(
    smoke: bool = False,
    *,
    messages: int = 2000,
    rate: float = 100.0,
    shards: int = 16,
    runs: int = 3,
    split: str = "shared",
) -> list[Row]:
    """Measure every scenario ``runs`` times and return the rows."""
    if smoke:
        messages, rate, shards, runs = 200, 50.0, 4, 1
    scenarios = [
        (f"one shard of {shards} holds everything", shards, True),
        (f"random ids over {shards} shards", shards, False),
        ("1 shard", 1, False),
    ]
    rows: list[Row] = []
    with azurite() as conn:
        for label, count, one_shard in scenarios:
            outcomes = [
                burst(conn, messages, rate, count, one_shard=one_shard, split=split, seed=seed) for seed in range(runs)
            ]
            ideal = messages / rate
            note = f"{messages} msgs due at once, cap {rate:g}/s (ideal {ideal:g} s), split {split}"
            completion = tuple(o["completion_s"] for o in outcomes)
            rows += [
                Row(
                    NAME,
                    f"{label}: completion",
                    "s",
                    completion,
                    baseline="N / cap",
                    ratio_to_baseline=max(completion) / ideal,
                    notes=note,
                ),
                Row(
                    NAME,
                    f"{label}: busiest second (cap allows {rate + 1:g})",
                    "msgs",
                    tuple(o["busiest_1s"] for o in outcomes),
                ),
                Row(
                    NAME,
                    f"{label}: early, unsent, duplicates (each must be 0)",
                    "msgs",
                    tuple(o["early"] + o["unsent"] + o["duplicates"] for o in outcomes),
                ),
                Row(NAME, f"{label}: warnings logged", "lines", tuple(o["storage_errors"] for o in outcomes)),
                Row(NAME, f"{label}: wall time", "s", tuple(o["wall_s"] for o in outcomes)),
            ]
    return rows


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--split", choices=("shared", "even"), default="shared")
    a = p.parse_args()
    rows = run(a.smoke, messages=a.messages, rate=a.rate, shards=a.shards, runs=a.runs, split=a.split)
    print_table(rows, "Azure release control across shards")
    suffix = "-smoke" if a.smoke else ("" if a.split == "shared" else "-even")
    print(f"wrote {write_json(NAME + suffix, rows)}")


if __name__ == "__main__":
    main()
