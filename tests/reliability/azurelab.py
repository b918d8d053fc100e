"""SIGKILL of the Azure lease holder: several dispatcher-host processes race for one shard's blob lease (Azurite).

Each process runs ``AzureDispatcherHost`` runs back to back (lease 15 s, the Azure minimum). Rows fall due
every 0.1 s, so the lease holder sends continuously; the lab SIGKILLs whichever process sent last (the
holder) and measures the takeover: from the kill to the next send by another process (bound: lease duration
+ one 1 s tick). Every delivery is counted from the destination queue: lost must be 0; a duplicate can only
come from a row the dead holder had claimed (and maybe sent) before it died.

Soak: ``python -m tests.reliability.azurelab --kills 20`` (starts its own Azurite).
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
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayed_delivery import DelayedDeliverySettings, DelayedMessage
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import StorageQueueTransport, decode_envelope

ROOT = Path(__file__).resolve().parents[2]
LEASE = 15
TICK = 1.0


def _host(conn: str, name: str, shards: int) -> AzureDispatcherHost:
    config = AzureDelayedDeliveryConfig(
        table_name=name,
        container_name=name,
        connection_string=conn,
        lease_seconds=LEASE,
        run_seconds=30.0,
        claim_timeout=20.0,
        shards=shards,
        settings=DelayedDeliverySettings(max_concurrency=4, error_queue=f"{name}e"),
    )
    host = AzureDispatcherHost(config)
    host.setup_infrastructure()
    return host


class TimedSink:
    """Wraps the real transport; after each send, records (message id, pid, wall time) in a SQLite sink."""

    def __init__(self, inner: StorageQueueTransport, path: Path) -> None:
        self.inner = inner
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
        self.lock = threading.Lock()
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS sent (message_id TEXT, pid INTEGER, at REAL)")

    def send(self, message: DelayedMessage) -> None:
        self.inner.send(message)
        with self.lock:
            self.conn.execute("INSERT INTO sent VALUES (?, ?, ?)", (message.message_id, os.getpid(), time.time()))

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _worker(conn: str, name: str, shards: int, sink: str) -> None:
    host = _host(conn, name, shards)
    host.transport = TimedSink(host.transport, Path(sink))  # type: ignore[assignment]
    while True:
        host.run(budget=30.0)


@dataclass
class LeaseSoakResult:
    """What a lease race did and found."""

    messages: int
    shards: int
    processes: int
    holder_kills: int
    delivered: int
    lost: int
    duplicates: int
    takeover_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def max_takeover(self) -> float:
        return max(self.takeover_seconds, default=0.0)


def lease_kill_soak(
    conn: str, kills: int, *, processes: int = 3, shards: int = 1, seed: int = 1, timeout: float | None = None
) -> LeaseSoakResult:
    """Race ``processes`` hosts on ``shards`` shards; SIGKILL the sender that sent last, ``kills`` times."""
    from azure.storage.queue import QueueServiceClient

    started = time.monotonic()
    rng = random.Random(seed)
    name = "r" + uuid.uuid4().hex[:16]
    dest = f"{name}d"
    host = _host(conn, name, shards)
    queues = QueueServiceClient.from_connection_string(conn)
    queues.create_queue(dest)
    span = 8 + kills * (LEASE + 8)
    now = datetime.now(UTC)
    count = int(span * 10)
    host.store.store_many(
        [DelayedMessage(f"a-{i:06d}", dest, b"x", now + timedelta(seconds=3 + i / 10)) for i in range(count)]
    )
    takeovers: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        sink = Path(tmp) / "sink.db"
        probe = TimedSink(host.transport, sink).conn
        argv = [sys.executable, "-m", "tests.reliability.azurelab", "--worker", conn, name, str(shards), str(sink)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        procs = {p.pid: p for p in (subprocess.Popen(argv, cwd=ROOT, env=env) for _ in range(processes))}
        deadline = started + (timeout or 120 + span * 2)
        try:
            for _ in range(kills):
                time.sleep(rng.uniform(3.0, 6.0))
                row = probe.execute("SELECT pid, at FROM sent ORDER BY at DESC LIMIT 1").fetchone()
                while row is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                    row = probe.execute("SELECT pid, at FROM sent ORDER BY at DESC LIMIT 1").fetchone()
                assert row is not None, "nobody dispatched"
                holder = procs.pop(int(row[0]))
                holder.send_signal(signal.SIGKILL)
                holder.wait()
                killed_at = time.time()
                new = subprocess.Popen(argv, cwd=ROOT, env=env)
                procs[new.pid] = new
                while time.monotonic() < deadline:
                    nxt = probe.execute(
                        "SELECT MIN(at) FROM sent WHERE at > ? AND pid != ?", (killed_at, holder.pid)
                    ).fetchone()[0]
                    if nxt is not None:
                        takeovers.append(round(nxt - killed_at, 2))
                        break
                    time.sleep(0.2)
            while host.store.count() and time.monotonic() < deadline:
                time.sleep(1.0)
            time.sleep(2.0)
        finally:
            for p in procs.values():
                p.send_signal(signal.SIGKILL)
                p.wait()
            probe.close()
    client = queues.get_queue_client(dest)
    ids: Counter[str] = Counter()
    while batch := list(client.receive_messages(max_messages=32, visibility_timeout=300)):
        ids.update(decode_envelope(m.content).message_id for m in batch)
    expected = {f"a-{i:06d}" for i in range(count)}
    return LeaseSoakResult(
        messages=count,
        shards=shards,
        processes=processes,
        holder_kills=len(takeovers),
        delivered=len(set(ids) & expected),
        lost=len(expected - set(ids)),
        duplicates=sum(n - 1 for n in ids.values()),
        takeover_seconds=takeovers,
        seconds=round(time.monotonic() - started, 1),
    )


def main() -> None:
    """Soak command line (starts Azurite), or a worker with --worker CONN NAME SHARDS SINK."""
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    from tests.fixtures.azurite import start_azurite

    azurite = start_azurite()
    try:
        result = lease_kill_soak(azurite.connection_string, a.kills, processes=a.processes, seed=a.seed)
    finally:
        azurite.process.stop()
    print(json.dumps({**asdict(result), "max_takeover": result.max_takeover}, indent=2))
    if result.lost:
        sys.exit(1)


if __name__ == "__main__":
    main()
