"""Crash injection for the core dispatcher on the SQLite store.

Two kinds of crash:

* **in-process fault points** (driven by a seed): the dispatcher dies abruptly after claiming
  a batch, after a send but before the removal, or in the middle of a batch; its object is
  thrown away with whatever it had claimed, exactly like a process that vanished;
* **real process kills**: dispatcher subprocesses are SIGKILLed at random moments.

Deliveries go to a sink table in a separate SQLite file (committed before the send returns),
so every delivery that happened is counted, duplicates included.

Soak: ``python -m tests.reliability.crashlab --crashes 10000 --kills 200``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayed_delivery import (
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    ManualClock,
    SqliteDelayedMessageStore,
    SystemClock,
)
from delayed_delivery.clock import Clock
from delayed_delivery.release import ReleaseRates

T0 = datetime(2030, 1, 1, tzinfo=UTC)
CLAIM_TIMEOUT = 0.5


class InjectedCrash(BaseException):
    """Raised at a fault point: not an Exception, so nothing in the dispatcher catches it."""


class SinkTransport:
    """Records each delivery durably in a sink table (one row per send, duplicates kept)."""

    def __init__(self, path: Path, faults: FaultPlan | None = None) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS sink (message_id TEXT NOT NULL, pid INTEGER)")
        self.faults = faults

    def send(self, message: DelayedMessage) -> None:
        if self.faults:
            self.faults.point("before_send")
        self.conn.execute("INSERT INTO sink VALUES (?, ?)", (message.message_id, os.getpid()))
        if self.faults:
            self.faults.point("after_send")


class FaultPlan:
    """Decides, from a seeded RNG, whether to crash at each fault point."""

    def __init__(self, rng: random.Random, probability: float) -> None:
        self.rng = rng
        self.probability = probability
        self.crashes: dict[str, int] = {}

    def point(self, name: str) -> None:
        if self.rng.random() < self.probability:
            self.crashes[name] = self.crashes.get(name, 0) + 1
            raise InjectedCrash(name)


class CrashingStore(SqliteDelayedMessageStore):
    """The SQLite store with fault points after a claim and before a removal."""

    faults: FaultPlan | None = None

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        batch = super().fetch_due(at, limit)
        if batch and self.faults:
            self.faults.point("after_claim")
        return batch

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> Sequence[bool]:
        if self.faults:
            self.faults.point("before_remove")
        return super().remove_many(message_ids, claims)

    def defer(self, deferrals: Sequence[tuple[str, datetime, str]]) -> Sequence[bool]:
        """Release control gives messages back until their slots: a death before, or after, that write."""
        if self.faults:
            self.faults.point("before_defer")
        done = super().defer(deferrals)
        if self.faults:
            self.faults.point("after_defer")
        return done


@dataclass
class SoakResult:
    """What a soak did and found."""

    messages: int
    injected_crashes: int
    crashes_by_point: dict[str, int]
    process_kills: int
    delivered: int
    lost: int
    duplicates: int
    seconds: float


def _seed_store(db: Path, messages: int, now: datetime, spread: float, prefix: str = "m") -> set[str]:
    store = SqliteDelayedMessageStore(db)
    store.setup_infrastructure()
    batch = [
        DelayedMessage(f"{prefix}-{i:06d}", "orders", b"x", now + timedelta(seconds=spread * i / max(1, messages)))
        for i in range(messages)
    ]
    store.store_many(batch)
    store.close()
    return {m.message_id for m in batch}


def _tally(sink: Path, expected: set[str]) -> tuple[int, int, int]:
    conn = sqlite3.connect(sink)
    try:
        rows = conn.execute("SELECT message_id, COUNT(*) FROM sink GROUP BY message_id").fetchall()
    except sqlite3.OperationalError:
        rows = []
    conn.close()
    delivered = len(rows)
    duplicates = sum(n - 1 for _, n in rows)
    lost = len(expected - {mid for mid, _ in rows})
    return delivered, lost, duplicates


def in_process_soak(
    messages: int, crashes: int, seed: int = 1, probability: float = 0.03, *, release_rate: float | None = None
) -> SoakResult:
    """Inject ``crashes`` abrupt dispatcher deaths at fault points; rounds of ``messages`` are added until done.

    ``release_rate``: release control caps the destination at that many messages a second (``release_rates``), so
    deaths also land while messages are deferred to or held for their release slots."""
    started = time.monotonic()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        db, sink = Path(tmp) / "store.db", Path(tmp) / "sink.db"
        clock = ManualClock(T0)
        faults = FaultPlan(rng, probability)
        transport = SinkTransport(sink, faults)
        rates = ReleaseRates.of({"orders": release_rate} if release_rate else None)
        settings = DelayedDeliverySettings(batch_size=8, max_concurrency=1, number_of_retries=1000, release_rates=rates)
        expected: set[str] = set()
        injected, rounds = 0, 0
        probe = SqliteDelayedMessageStore(db)
        probe.setup_infrastructure()
        while True:
            if len(probe) == 0:
                if injected >= crashes and rounds:
                    break
                expected |= _seed_store(db, messages, clock.now(), spread=60, prefix=f"r{rounds}")
                rounds += 1
            armed = injected < crashes
            store = CrashingStore(db, claim_timeout=CLAIM_TIMEOUT)
            store.faults = faults if armed else None
            transport.faults = faults if armed else None
            dispatcher = Dispatcher(store, transport, settings, clock=clock)
            try:
                dispatcher.dispatch_due()
                clock.advance(1)
            except InjectedCrash:
                injected += 1
                clock.advance(CLAIM_TIMEOUT + 0.01)  # the dead dispatcher's claims expire
            finally:
                store.close()
        probe.close()
        delivered, lost, dupes = _tally(sink, expected)
    return SoakResult(
        len(expected), injected, dict(faults.crashes), 0, delivered, lost, dupes, time.monotonic() - started
    )


def _worker(db: str, sink: str) -> None:
    """A real dispatcher process on the real clock, until killed or the store is empty."""
    store = SqliteDelayedMessageStore(db, claim_timeout=CLAIM_TIMEOUT)
    transport = SinkTransport(Path(sink))
    clock: Clock = SystemClock()
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(batch_size=8, max_idle_sleep=0.05), clock=clock)
    while len(store):
        dispatcher.dispatch_due(budget=0.5, wait_for_due=True)


def process_kill_soak(messages: int, kills: int, seed: int = 1, workers: int = 2) -> SoakResult:
    """Run ``workers`` dispatcher processes and SIGKILL one at random moments, ``kills`` times."""
    started = time.monotonic()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        db, sink = Path(tmp) / "store.db", Path(tmp) / "sink.db"
        SinkTransport(sink)  # create the table
        expected = _seed_store(db, messages, SystemClock().now(), spread=max(2.0, kills * 0.06))
        argv = [sys.executable, "-m", "tests.reliability.crashlab", "--worker", str(db), str(sink)]
        root = Path(__file__).resolve().parents[2]
        procs = [subprocess.Popen(argv, cwd=root) for _ in range(workers)]
        probe = SqliteDelayedMessageStore(db)
        done_kills = 0
        deadline = time.monotonic() + 60 + kills * 1.0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.02, 0.25))
            if done_kills < kills:
                victim = rng.randrange(workers)
                if procs[victim].poll() is None:
                    procs[victim].send_signal(signal.SIGKILL)
                    procs[victim].wait()
                    done_kills += 1
                procs[victim] = subprocess.Popen(argv, cwd=root)
            if done_kills >= kills and all(p.poll() is not None for p in procs):
                break
            if done_kills >= kills and len(probe) == 0:
                break
        for p in procs:
            if p.poll() is None:
                p.wait(timeout=10 + CLAIM_TIMEOUT * 4)
        probe.close()
        delivered, lost, dupes = _tally(sink, expected)
    return SoakResult(messages, 0, {}, done_kills, delivered, lost, dupes, time.monotonic() - started)


def main() -> None:
    """Soak command line (or a worker process with --worker DB SINK)."""
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--crashes", type=int, default=10_000, help="in-process crashes at fault points")
    p.add_argument("--kills", type=int, default=200, help="real SIGKILLs of dispatcher processes")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    results = {
        "in_process": asdict(in_process_soak(a.messages, a.crashes, a.seed)),
        "process_kills": asdict(process_kill_soak(max(200, a.kills * 10), a.kills, a.seed)),
    }
    print(json.dumps(results, indent=2))
    if any(r["lost"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
