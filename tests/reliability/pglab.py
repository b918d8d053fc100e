"""SIGKILL of core dispatcher processes on the PostgreSQL store.

Several dispatcher subprocesses (the core ``Dispatcher`` over ``PostgresDelayedMessageStore``, claim
timeout 0.5 s, real clock) work one table; one is SIGKILLed at random moments (often mid-batch: between its
claim, its sends and its removal) and restarted. Deliveries are written durably to a SQLite sink before the
send returns, so lost messages and duplicates are counted.

Soak: ``python -m tests.reliability.pglab --messages 3000 --kills 200`` (starts a throwaway cluster).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

from delayed_delivery import DelayedDeliverySettings, DelayedMessage, Dispatcher, SystemClock
from delayed_delivery.postgres import PostgresDelayedMessageStore
from tests.reliability.crashlab import CLAIM_TIMEOUT, SinkTransport, SoakResult, _tally

ROOT = Path(__file__).resolve().parents[2]


def _worker(conninfo: str, table: str, sink: str) -> None:
    """A real dispatcher process on the real clock, until killed or the table is empty."""
    store = PostgresDelayedMessageStore(conninfo, table=table, claim_timeout=CLAIM_TIMEOUT)
    transport = SinkTransport(Path(sink))
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(batch_size=8, max_idle_sleep=0.05))
    while len(store):
        dispatcher.dispatch_due(budget=0.5, wait_for_due=True)


def process_kill_soak(
    conninfo: str, messages: int, kills: int, seed: int = 1, workers: int = 3
) -> tuple[SoakResult, int]:
    """Run ``workers`` dispatcher processes on one table and SIGKILL one at random moments, ``kills`` times.

    A victim has delivered at least once (or is 5 s old), so kills land while it works. Also returns how many
    killed processes had delivered something before they died.
    """
    started = time.monotonic()
    rng = random.Random(seed)
    table = f"crash_{uuid.uuid4().hex[:10]}_delayed"
    with tempfile.TemporaryDirectory() as tmp:
        sink = Path(tmp) / "sink.db"
        SinkTransport(sink)  # create the table
        store = PostgresDelayedMessageStore(conninfo, table=table)
        store.setup_infrastructure()
        now = SystemClock().now()
        # due over 2 s per kill, from when the workers have started (under load a start takes seconds): every
        # kill lands while messages are still due (at 1.2 s per kill, a loaded run emptied the store after 9 of 10)
        spread, start = max(3.0, kills * 2.0), now + timedelta(seconds=3)
        batch = [
            DelayedMessage(f"pg-{i:06d}", "orders", b"x", start + timedelta(seconds=spread * i / messages))
            for i in range(messages)
        ]
        store.store_many(batch)
        expected = {m.message_id for m in batch}
        argv = [sys.executable, "-m", "tests.reliability.pglab", "--worker", conninfo, table, str(sink)]
        procs = [subprocess.Popen(argv, cwd=ROOT) for _ in range(workers)]
        born = [time.monotonic()] * workers
        probe = sqlite3.connect(sink, timeout=30)
        killed: list[int] = []
        done_kills = 0
        deadline = time.monotonic() + 120 + kills * 3
        try:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.1, 0.6))
                victim = min(range(workers), key=lambda i: born[i])
                working = probe.execute("SELECT 1 FROM sink WHERE pid = ? LIMIT 1", (procs[victim].pid,)).fetchone()
                if done_kills < kills and (working or time.monotonic() - born[victim] >= 5.0):
                    if procs[victim].poll() is None:
                        procs[victim].send_signal(signal.SIGKILL)
                        procs[victim].wait()
                        killed.append(procs[victim].pid)
                        done_kills += 1
                    procs[victim] = subprocess.Popen(argv, cwd=ROOT)
                    born[victim] = time.monotonic()
                elif all(p.poll() is not None for p in procs) or len(store) == 0:
                    break
            for p in procs:
                if p.poll() is None:
                    p.wait(timeout=30)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            probe.close()
            store.drop_infrastructure()
            store.close()
        delivered, lost, dupes = _tally(sink, expected)
        conn = sqlite3.connect(sink)
        senders = {pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM sink")}
        conn.close()
    result = SoakResult(messages, 0, {}, done_kills, delivered, lost, dupes, time.monotonic() - started)
    return result, len(senders & set(killed))


def main() -> None:
    """Soak command line (starts a throwaway PostgreSQL cluster), or a worker with --worker CONNINFO TABLE SINK."""
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--conninfo", help="an existing server (default: start a throwaway cluster)")
    a = p.parse_args()
    from tests.fixtures.services import ServiceProcess

    conninfo, cluster, service = a.conninfo, None, None
    if conninfo is None:
        from delayed_delivery.postgres.cluster import ThrowawayCluster

        cluster = ThrowawayCluster()
        cluster.init()
        service = ServiceProcess("postgres", cluster.argv, [cluster.port]).start()
        cluster.wait_ready(90)
        conninfo = cluster.conninfo
    try:
        soak, productive = process_kill_soak(conninfo, a.messages, a.kills, a.seed)
        result = {**asdict(soak), "killed_after_delivering": productive}
    finally:
        if cluster is not None and service is not None:
            cluster.stop()
            service.stop()
    print(json.dumps({"postgres_process_kills": result}, indent=2))
    if result["lost"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
