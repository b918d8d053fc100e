"""SIGKILL of the Azure lease holder: several dispatcher-host processes race for one shard's blob lease (Azurite).

Each process runs ``AzureDispatcherHost`` runs back to back (lease 15 s, the Azure minimum). Rows fall due
every 0.1 s, so the lease holder sends continuously; the lab SIGKILLs whichever process sent last (the
holder) and measures the takeover: from the kill to the next send by another process (bound: lease duration
+ one 1 s tick). Every delivery is counted from the destination queue: lost must be 0; a duplicate can only
come from a row the dead holder had started sending and not yet removed when it died. The lab counts those rows
itself: each worker records every send it starts and every message its dispatcher logs as ``dispatched`` (sent,
then removed from the table), so for a killed holder ``started - dispatched`` is what it left unsettled, however
fast or slow the machine let it run. Its dispatcher bounds that set by its pipeline: the batch being sent and the
one whose removal runs beside it (``2 * BATCH``). Each worker appends its records to a file of its own, so a
worker stopped or killed mid-write never holds up another.

Soak: ``python -m tests.reliability.azurelab --kills 20`` (starts its own Azurite).

``--faults break|stop|none`` runs ``lease_fault_soak`` instead: ``--processes`` hosts on ``--shards`` shards with
rows falling due at ``--rate`` per second for at least ``--seconds``; ``--count`` times, the lease holder of a
random shard is disturbed: **break** breaks its lease from outside (``BlobLeaseClient.break_lease(0)``, as an
operator or another tool could), **stop** SIGSTOPs the holder process (all its shards) until its leases have
expired, then SIGCONTs it. Measured per disturbed shard: the dispatch gap (fault → next send on that shard, by
anyone) and whether another process took over; duplicates counted at the destination. ``none`` is the healthy
race: duplicates must be 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayed_delivery import DelayedDeliverySettings, DelayedMessage
from delayed_delivery import logfields as lf
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import StorageQueueTransport, decode_envelope

ROOT = Path(__file__).resolve().parents[2]
LEASE = 15
TICK = 1.0
#: Parallel sends per shard in each host (``max_concurrency``).
CONCURRENCY = 4
#: Rows each host's dispatcher fetches at a time (``batch_size``).
BATCH = 100


def _host(conn: str, name: str, shards: int) -> AzureDispatcherHost:
    config = AzureDelayedDeliveryConfig(
        table_name=name,
        container_name=name,
        connection_string=conn,
        lease_seconds=LEASE,
        run_seconds=30.0,
        claim_timeout=20.0,
        shards=shards,
        settings=DelayedDeliverySettings(batch_size=BATCH, max_concurrency=CONCURRENCY, error_queue=f"{name}e"),
    )
    host = AzureDispatcherHost(config)
    host.setup_infrastructure()
    return host


class TimedSink:
    """Wraps the real transport and appends each send's start and end to this process's own record file.

    One file per process (``<folder>/<pid>.log``), one ``os.write`` per line, nothing shared with another process.
    ``started <id>`` is written before the send, so no message reaches the queue unrecorded; ``sent <id> <wall
    time>`` after it; ``settled <id>`` when the dispatcher logs the message as dispatched (``SettledLog``).
    """

    def __init__(self, inner: StorageQueueTransport, folder: Path) -> None:
        self.inner = inner
        self._fd = os.open(folder / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def send(self, message: DelayedMessage) -> None:
        self._record(f"started {message.message_id}")
        self.inner.send(message)
        self._record(f"sent {message.message_id} {time.time()!r}")

    def settled(self, message_id: str) -> None:
        self._record(f"settled {message_id}")

    def _record(self, line: str) -> None:
        os.write(self._fd, f"{line}\n".encode())

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class SettledLog(logging.Handler):
    """Records each message the dispatcher logs as ``dispatched`` (sent, then removed from the table)."""

    def __init__(self, sink: TimedSink) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, lf.EVENT, None) == lf.EVENT_DISPATCHED:
            self.sink.settled(str(getattr(record, lf.MESSAGE_ID)))


class SinkRecords:
    """What the workers' ``TimedSink`` files in ``folder`` say so far (complete lines only)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _records(self, pid: int | None = None) -> Iterator[tuple[int, list[str]]]:
        for path in self.folder.glob("*.log" if pid is None else f"{pid}.log"):
            for line in path.read_text().splitlines(keepends=True):
                if line.endswith("\n"):
                    yield int(path.stem), line.split()

    def sends(self, since: float = 0.0) -> list[tuple[str, int, float]]:
        """(message id, pid, wall time) of every finished send at or after ``since``, in time order."""
        found = [(r[1], pid, float(r[2])) for pid, r in self._records() if r[0] == "sent"]
        return sorted((s for s in found if s[2] >= since), key=lambda s: s[2])

    def unsettled(self, pid: int) -> set[str]:
        """Messages process ``pid`` started sending and never logged as dispatched (sent and removed)."""
        records = list(self._records(pid))
        started = {r[1] for _, r in records if r[0] == "started"}
        return started - {r[1] for _, r in records if r[0] == "settled"}


def _worker(conn: str, name: str, shards: int, sink: str) -> None:
    host = _host(conn, name, shards)
    timed = TimedSink(host.transport, Path(sink))
    host.transport = timed  # type: ignore[assignment]
    dispatcher_log = logging.getLogger("delayed_delivery.dispatcher")
    dispatcher_log.setLevel(logging.INFO)
    dispatcher_log.addHandler(SettledLog(timed))
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
    #: per kill: how many messages the killed holder had started sending and not settled (``unsettled``)
    unsettled_at_kill: list[int] = field(default_factory=list)
    #: ids delivered more than once that no killed holder had left unsettled (the mechanism says: none)
    unexplained_duplicates: list[str] = field(default_factory=list)
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
    killed: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        sink = Path(tmp)
        probe = SinkRecords(sink)
        argv = [sys.executable, "-m", "tests.reliability.azurelab", "--worker", conn, name, str(shards), str(sink)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        procs = {p.pid: p for p in (subprocess.Popen(argv, cwd=ROOT, env=env) for _ in range(processes))}
        deadline = started + (timeout or 120 + span * 2)
        try:
            for _ in range(kills):
                time.sleep(rng.uniform(3.0, 6.0))
                sends = probe.sends()
                while not sends and time.monotonic() < deadline:
                    time.sleep(0.5)
                    sends = probe.sends()
                assert sends, "nobody dispatched"
                holder = procs.pop(sends[-1][1])
                holder.send_signal(signal.SIGKILL)
                holder.wait()
                killed_at = time.time()
                killed.append(holder.pid)
                new = subprocess.Popen(argv, cwd=ROOT, env=env)
                procs[new.pid] = new
                while time.monotonic() < deadline:
                    nxt = min((at for _, pid, at in probe.sends(killed_at) if pid != holder.pid), default=None)
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
        left = [probe.unsettled(pid) for pid in killed]
    client = queues.get_queue_client(dest)
    ids: Counter[str] = Counter()
    while batch := list(client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300)):
        ids.update(decode_envelope(m.content).message_id for m in batch)
    expected = {f"a-{i:06d}" for i in range(count)}
    explained = set().union(*left)
    return LeaseSoakResult(
        messages=count,
        shards=shards,
        processes=processes,
        holder_kills=len(takeovers),
        delivered=len(set(ids) & expected),
        lost=len(expected - set(ids)),
        duplicates=sum(n - 1 for n in ids.values()),
        takeover_seconds=takeovers,
        unsettled_at_kill=[len(ids_left) for ids_left in left],
        unexplained_duplicates=sorted(mid for mid, n in ids.items() if n > 1 and mid not in explained),
        seconds=round(time.monotonic() - started, 1),
    )


@dataclass
class LeaseFaultResult:
    """What a sustained multi-shard lease race with injected lease faults did and found."""

    faults: str
    messages: int
    shards: int
    processes: int
    injected: int
    delivered: int
    lost: int
    duplicates: int
    #: per disturbed shard: the longest pause in its sends after the fault (the takeover time)
    takeover_seconds: list[float] = field(default_factory=list)
    #: how many of those pauses ended with a send by another process than the disturbed holder
    taken_by_other: int = 0
    #: sends by a holder after it was disturbed while another process had already sent on that shard
    stale_sends: int = 0
    seconds: float = 0.0

    @property
    def max_takeover(self) -> float:
        return max(self.takeover_seconds, default=0.0)


def _sends(probe: SinkRecords, shards: int, since: float) -> list[tuple[str, int, float, int]]:
    """(message id, pid, time, shard) of every send at or after ``since``, in time order."""
    from delayed_delivery.azure import rows

    return [(mid, pid, at, rows.shard_of(mid, shards)) for mid, pid, at in probe.sends(since)]


def _holders(probe: SinkRecords, shards: int) -> dict[int, int]:
    """shard → pid of its last sender (the lease holder as seen from the destination)."""
    out: dict[int, int] = {}
    for _, pid, _, shard in reversed(_sends(probe, shards, time.time() - 5.0)):
        out.setdefault(shard, pid)
    return out


def _gap(probe: SinkRecords, shards: int, shard: int, since: float, until: float) -> tuple[float, int | None]:
    """Longest pause in sends on ``shard`` within [since, until] (from ``since``), and who sent after it."""
    times = [(at, pid) for _, pid, at, s in _sends(probe, shards, since) if s == shard and at <= until]
    longest, after, last = 0.0, None, since
    for at, pid in times:
        if at - last > longest:
            longest, after = at - last, pid
        last = at
    if until - last > longest:
        longest, after = until - last, None
    return round(longest, 2), after


def _stale(probe: SinkRecords, shards: int, shard: int, holder: int, since: float) -> int:
    """Sends by ``holder`` on ``shard`` after another process had sent there (since ``since``)."""
    sends = [(pid, at) for _, pid, at, s in _sends(probe, shards, since) if s == shard]
    other = min((at for pid, at in sends if pid != holder), default=None)
    return 0 if other is None else sum(1 for pid, at in sends if pid == holder and at > other)


def lease_fault_soak(
    conn: str,
    faults: str,
    count: int,
    *,
    processes: int = 4,
    shards: int = 3,
    seconds: float = 30.0,
    rate: float = 20.0,
    seed: int = 1,
    timeout: float | None = None,
) -> LeaseFaultResult:
    """Race hosts on several shards while rows fall due; break or expire a lease holder's leases ``count`` times."""
    from azure.storage.blob import BlobLeaseClient, BlobServiceClient
    from azure.storage.queue import QueueServiceClient

    from delayed_delivery.azure.blob_lease import lease_blob_name

    if faults not in ("break", "stop", "none"):
        raise ValueError(f"faults must be break, stop or none, got {faults!r}")
    started = time.monotonic()
    rng = random.Random(seed)
    name = "f" + uuid.uuid4().hex[:16]
    dest = f"{name}d"
    host = _host(conn, name, shards)
    queues = QueueServiceClient.from_connection_string(conn)
    queues.create_queue(dest)
    container = BlobServiceClient.from_connection_string(conn).get_container_client(name)
    #: how long after a fault its shards are watched (a stopped holder's lease must expire first)
    window = LEASE + TICK + 6.0 if faults == "stop" else 8.0
    span = max(seconds, 6.0 + count * (window + 3.0))
    now = datetime.now(UTC)
    total = int(span * rate)
    for start in range(0, total, 500):
        host.store.store_many(
            [
                DelayedMessage(f"f-{i:06d}", dest, b"x", now + timedelta(seconds=4 + i / rate))
                for i in range(start, min(total, start + 500))
            ]
        )
    result = LeaseFaultResult(faults, total, shards, processes, 0, 0, 0, 0)
    with tempfile.TemporaryDirectory() as tmp:
        sink = Path(tmp)
        probe = SinkRecords(sink)
        argv = [sys.executable, "-m", "tests.reliability.azurelab", "--worker", conn, name, str(shards), str(sink)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        procs = {p.pid: p for p in (subprocess.Popen(argv, cwd=ROOT, env=env) for _ in range(processes))}
        deadline = started + (timeout or 180 + span * 2)
        t_start = time.time()
        try:
            while len(_holders(probe, shards)) < shards and time.monotonic() < deadline:
                time.sleep(0.5)
            for _ in range(count):
                time.sleep(rng.uniform(1.0, 3.0))
                holders = _holders(probe, shards)
                if not holders:
                    continue
                shard = rng.choice(sorted(holders))
                holder = holders[shard]
                fault_at = time.time()
                if faults == "break":
                    hit = {shard}
                    BlobLeaseClient(container.get_blob_client(lease_blob_name(shard))).break_lease(lease_break_period=0)
                else:
                    hit = {s for s, pid in holders.items() if pid == holder}
                    procs[holder].send_signal(signal.SIGSTOP)
                result.injected += 1
                time.sleep(max(0.0, fault_at + window - time.time()))
                if faults == "stop":
                    procs[holder].send_signal(signal.SIGCONT)
                    time.sleep(2.0)  # a resumed holder must notice its leases expired before sending anything
                for s in hit:
                    gap, after = _gap(probe, shards, s, fault_at, fault_at + window)
                    result.takeover_seconds.append(gap)
                    result.taken_by_other += after is not None and after != holder
                    result.stale_sends += _stale(probe, shards, s, holder, fault_at)
            while time.time() < t_start + seconds and time.monotonic() < deadline:
                time.sleep(0.5)
            while host.store.count() and time.monotonic() < deadline:
                time.sleep(1.0)
            time.sleep(2.0)
        finally:
            for p in procs.values():
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGKILL)
                p.wait()
    client = queues.get_queue_client(dest)
    ids: Counter[str] = Counter()
    while batch := list(client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300)):
        ids.update(decode_envelope(m.content).message_id for m in batch)
    expected = {f"f-{i:06d}" for i in range(total)}
    result.delivered = len(set(ids) & expected)
    result.lost = len(expected - set(ids))
    result.duplicates = sum(n - 1 for n in ids.values())
    result.seconds = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    """Soak command line (starts Azurite), or a worker with --worker CONN NAME SHARDS SINK."""
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", choices=["break", "stop", "none"], help="lease_fault_soak instead of SIGKILLs")
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--count", type=int, default=10, help="faults to inject (with --faults)")
    p.add_argument("--seconds", type=float, default=60.0, help="minimum run time (with --faults)")
    p.add_argument("--rate", type=float, default=20.0, help="rows falling due per second (with --faults)")
    a = p.parse_args()
    from tests.fixtures.azurite import start_azurite

    azurite = start_azurite()
    try:
        if a.faults is None:
            result: LeaseSoakResult | LeaseFaultResult = lease_kill_soak(
                azurite.connection_string, a.kills, processes=a.processes, seed=a.seed
            )
        else:
            result = lease_fault_soak(
                azurite.connection_string,
                a.faults,
                0 if a.faults == "none" else a.count,
                processes=a.processes,
                shards=a.shards,
                seconds=a.seconds,
                rate=a.rate,
                seed=a.seed,
            )
    finally:
        azurite.process.stop()
    print(json.dumps({**asdict(result), "max_takeover": result.max_takeover}, indent=2))
    if result.lost:
        sys.exit(1)


if __name__ == "__main__":
    main()
