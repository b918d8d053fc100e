"""Release control: 10,000 messages due at once to a destination capped at 200/s, on SQLite, Azure (Azurite, 4
shards) and the SQS ``-delay.fifo`` route (moto), each beside an uncapped destination.

Measured per route, from one run: the most arrivals at the capped destination in any 10 s window (target at most
1.05 x rate x 10 + one batch), when the burst's last message arrives after its due time (target within 5 % of N / r),
the uncapped neighbour's p99 lateness beside the burst and alone (target unchanged within noise), and messages lost.

Simulated clock (``ManualClock``): waiting costs no wall time, so 50 s of releases take seconds, not a minute per
route; the work itself (store reads and writes, queue puts, DynamoDB calls) is real, on the real store or emulator.
An arrival is when the message becomes visible at its destination: the dispatcher's send time on the simulated clock
plus any delay it asked the queue for (Azure's visibility timeout, SQS ``DelaySeconds``), which is exactly what the
emulator is told; the emulators' own timers would make the messages visible that much later in real time.

* SQLite: one core dispatcher (a file store), sends recorded by the transport.
* Azure: the delays table and the queues on Azurite, 4 shards each with its own dispatcher (one simulated clock per
  shard, run one after the other: shards share nothing but the table and the queues), each placing its share of the
  cap with the visibility timeout.
* SQS: the requeue function's ``FifoRequeuer`` on Lambda-shaped records of the burst's last hop (the records the
  event source would hand it, their broker timestamps on the simulated clock: each message was sent 960 s before
  due and is received 60 s before due, in 1,000 invocations of 10 spread over 5 s), 8 invocations at a time against
  the release calendar on moto's DynamoDB, forwarding to moto's SQS with ``DelaySeconds``.

Run: ``python -m benchmarks.release_control [--smoke] [--messages 10000] [--rate 200]``; writes
``benchmarks/results/release_control.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import Row, print_table, write_json
from delayed_delivery.clock import ManualClock
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.model import DelayedMessage
from delayed_delivery.release import busiest_window
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore

NAME = "release_control"
#: The capped and the uncapped destination (valid on every route).
CAPPED, FREE = "orders", "audit"
#: The uncapped neighbour: one message every 100 ms for 60 s, due from the burst's due time on.
NEIGHBOURS, NEIGHBOUR_STEP = 600, 0.1


@dataclass(slots=True)
class Outcome:
    """One route's run: arrivals (simulated epoch seconds) at the capped destination and the neighbours' lateness."""

    due: float
    capped: list[float] = field(default_factory=list)
    neighbour_lateness: list[float] = field(default_factory=list)
    lost: int = 0
    wall_s: float = 0.0


class _Arrivals:
    """A transport recording when each message becomes visible: send time on the simulated clock plus its delay."""

    def __init__(self, clock: ManualClock, inner: Any = None) -> None:
        self.clock = clock
        self.inner = inner
        self.seen: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    @property
    def max_delay_seconds(self) -> int:
        return int(self.inner.max_delay_seconds)

    def send(self, message: DelayedMessage) -> None:
        self._note(message, 0)
        if self.inner is not None:
            self.inner.send(message)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self.inner.send_delayed(message, delay_seconds)
        self._note(message, delay_seconds)

    def _note(self, message: DelayedMessage, delay: int) -> None:
        with self._lock:
            self.seen.append((message.message_id, message.destination, self.clock.now().timestamp() + delay))


def _messages(n: int, due: datetime, neighbours: bool, burst: bool = True) -> list[DelayedMessage]:
    out = [DelayedMessage(f"c-{i:05d}", CAPPED, b"x" * 64, due) for i in range(n if burst else 0)]
    if neighbours:
        step = timedelta(seconds=NEIGHBOUR_STEP)
        out += [DelayedMessage(f"f-{i:04d}", FREE, b"y" * 64, due + i * step) for i in range(NEIGHBOURS)]
    return out


def _outcome(seen: list[tuple[str, str, float]], due: datetime, n: int, started: float) -> Outcome:
    out = Outcome(due.timestamp(), wall_s=time.monotonic() - started)
    neighbour_due = {f"f-{i:04d}": due.timestamp() + i * NEIGHBOUR_STEP for i in range(NEIGHBOURS)}
    ids: set[str] = set()
    for mid, destination, at in seen:
        ids.add(mid)
        if destination == CAPPED:
            out.capped.append(at)
        elif mid in neighbour_due:
            out.neighbour_lateness.append(at - neighbour_due[mid])
    out.lost = sum(1 for i in range(n) if f"c-{i:05d}" not in ids)
    return out


# -- SQLite: one core dispatcher -----------------------------------------------------------------------------------


def sqlite_route(n: int, rate: float, *, burst: bool = True) -> Outcome:
    """The burst and the neighbours through one dispatcher on a SQLite file."""
    started = time.monotonic()
    due = datetime(2030, 1, 1, tzinfo=UTC)
    clock = ManualClock(due - timedelta(seconds=1))
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteDelayedMessageStore(Path(folder) / "delays.db")
        store.setup_infrastructure()
        store.store_many(_messages(n, due, neighbours=True, burst=burst))
        transport = _Arrivals(clock)
        settings = DelayedDeliverySettings(release_rates={CAPPED: rate})  # type: ignore[arg-type]
        dispatcher = Dispatcher(store, transport, settings, clock=clock)
        dispatcher.dispatch_due(n / rate * 1.2 + 70, wait_for_due=True)
        dispatcher.close()
        store.close()
    return _outcome(transport.seen, due, n if burst else 0, started)


# -- Azure: shards on Azurite ------------------------------------------------------------------------------------


@contextmanager
def _azurite() -> Iterator[str]:
    given = os.environ.get("AZURITE_CONNECTION_STRING")
    if given:
        yield given
        return
    from delayed_delivery.app.emulators import LocalEmulators

    with LocalEmulators(moto=False) as instance:
        yield instance.azure_connection_string


def azure_route(conn: str, n: int, rate: float, shards: int, *, burst: bool = True) -> Outcome:
    """The burst and the neighbours from the delays table, ``shards`` dispatchers each placing its share."""
    from azure.storage.queue import QueueServiceClient

    from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
    from delayed_delivery.azure.runner import AzureDispatcherHost

    started = time.monotonic()
    table = "rc" + uuid.uuid4().hex[:16]
    queues = QueueServiceClient.from_connection_string(conn)
    capped, free = "q" + uuid.uuid4().hex[:12], "q" + uuid.uuid4().hex[:12]
    for name in (capped, free):
        queues.create_queue(name)
    renames = {CAPPED: capped, FREE: free}
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        lease_seconds=60,
        run_seconds=59,
        claim_timeout=600.0,
        shards=shards,
        settings=DelayedDeliverySettings(
            max_concurrency=16,
            error_queue="rcerrors",
            release_rates={capped: rate},  # type: ignore[arg-type]
        ),
    )
    loader = AzureDispatcherHost(config, heartbeat=False)
    loader.setup_infrastructure()
    messages = [
        DelayedMessage(m.message_id, renames[m.destination], m.body, m.due_at)
        for m in _messages(n, due, neighbours=True, burst=burst)
    ]
    for start in range(0, len(messages), 2000):
        loader.store.store_many(messages[start : start + 2000])
    seen: list[tuple[str, str, float]] = []
    budget = n / rate * 1.2 + 70
    for shard in range(shards):  # each shard its own process in the cloud: its own simulated clock here
        clock = ManualClock(due - timedelta(seconds=1))
        host = AzureDispatcherHost(
            config,
            clock=clock,
            monotonic=lambda c=clock: c.now().timestamp(),
            heartbeat=False,  # type: ignore[misc]
        )
        arrivals = _Arrivals(clock, host.transport)
        host.transport = arrivals  # type: ignore[assignment]
        host.run_shard(shard, clock.now().timestamp() + budget)
        seen += [(mid, {capped: CAPPED, free: FREE}[d], at) for mid, d, at in arrivals.seen]
    loader.store.drop()
    return _outcome(seen, due, n if burst else 0, started)


# -- SQS: the requeue function's last hop on moto ----------------------------------------------------------------


@contextmanager
def _moto() -> Iterator[str]:
    given = os.environ.get("MOTO_ENDPOINT")
    if given:
        yield given
        return
    from delayed_delivery.app.emulators import LocalEmulators

    with LocalEmulators(azurite=False) as emulators:
        yield emulators.sqs_endpoint


class _At:
    """A clock stopped at one instant: one invocation's view of the time."""

    def __init__(self, when: datetime) -> None:
        self.when = when

    def now(self) -> datetime:
        return self.when

    def sleep(self, seconds: float) -> None:
        return None

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.is_set()


def _record(message_id: str, delay_arn: str, total_s: int, sent_ms: int, first_ms: int) -> dict[str, Any]:
    """One ``-delay.fifo`` record as Lambda's event source hands it over (the sender's hop 0)."""
    return {
        "messageId": str(uuid.uuid4()),
        "receiptHandle": "rh-" + message_id,
        "body": "x" * 64,
        "attributes": {
            "SentTimestamp": str(sent_ms),
            "ApproximateFirstReceiveTimestamp": str(first_ms),
            "ApproximateReceiveCount": "1",
            "MessageGroupId": message_id,
            "MessageDeduplicationId": f"{message_id}:0",
        },
        "messageAttributes": {
            "DelayedDelivery.DelaySeconds": {
                "dataType": "Number",
                "stringValue": str(total_s),
                "stringListValues": [],
                "binaryListValues": [],
            }
        },
        "eventSource": "aws:sqs",
        "eventSourceARN": delay_arn,
        "awsRegion": "us-east-1",
    }


def sqs_route(endpoint: str, n: int, rate: float, *, burst: bool = True, seed: int = 7) -> Outcome:
    """The burst's last hop and the neighbours' through ``FifoRequeuer`` and the shared release calendar."""
    import boto3
    from botocore.config import Config

    from delayed_delivery.aws.queues import ensure_endpoint
    from delayed_delivery.aws.release_calendar import ReleaseCalendar, ensure_release_table
    from delayed_delivery.aws.requeue import FifoRequeuer
    from delayed_delivery.aws.settings import SqsSettings
    from delayed_delivery.release import ReleaseRates

    started = time.monotonic()
    config = Config(retries={"total_max_attempts": 5, "mode": "standard"}, max_pool_connections=16)
    kw: dict[str, Any] = {"endpoint_url": endpoint, "region_name": "us-east-1", "config": config}
    kw |= {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    sqs, dynamodb = boto3.client("sqs", **kw), boto3.client("dynamodb", **kw)
    suffix = uuid.uuid4().hex[:8]
    capped, free = f"{CAPPED}{suffix}", f"{FREE}{suffix}"
    settings = DelayedDeliverySettings(error_queue=f"errors{suffix}")
    sqs_settings = SqsSettings(max_park_seconds=0, long_delay_route="fifo")  # the -delay.fifo route
    arns = {q: ensure_endpoint(sqs, q, settings, sqs_settings=sqs_settings).delay_arn for q in (capped, free)}
    table = f"release-{suffix}"
    ensure_release_table(dynamodb, table)
    rates = ReleaseRates.of({capped: rate})
    due = datetime(2030, 1, 1, tzinfo=UTC)
    due_ms = int(due.timestamp() * 1000)
    rng = random.Random(seed)
    # (invocation time, records): the capped burst's last hop, 10 records an invocation over 5 s, 60 s before due
    work: list[tuple[datetime, list[dict[str, Any]], dict[str, float]]] = []
    ids = [f"c-{i:05d}" for i in range(n if burst else 0)]
    for start in range(0, len(ids), 10):
        at_ms = due_ms - 60_000 + rng.randint(0, 5_000)
        group = [_record(m, arns[capped], 960, due_ms - 960_000, at_ms) for m in ids[start : start + 10]]
        work.append((datetime.fromtimestamp(at_ms / 1000, UTC), group, {}))
    for i in range(NEIGHBOURS):  # each neighbour reaches its last hop 60 s before its own due time
        mine = due_ms + round(i * NEIGHBOUR_STEP * 1000)
        at_ms = mine - 60_000
        record = _record(f"f-{i:04d}", arns[free], 960, mine - 960_000, at_ms)
        work.append((datetime.fromtimestamp(at_ms / 1000, UTC), [record], {f"f-{i:04d}": mine / 1000}))
    work.sort(key=lambda w: w[0])
    seen: list[tuple[str, str, float]] = []
    lock = threading.Lock()

    def invoke(item: tuple[datetime, list[dict[str, Any]], dict[str, float]]) -> None:
        at, records, _ = item
        calendar = ReleaseCalendar(dynamodb, table, rates)
        requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings, clock=_At(at), release=calendar)
        for result in requeuer.process(records):
            for each in result.per_message():
                if each.remaining_delay_s is None or each.outcome.value != "forwarded":
                    continue
                where = CAPPED if each.destination == capped else FREE
                with lock:
                    seen.append((each.message_id, where, at.timestamp() + each.remaining_delay_s))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(invoke, work))
    return _outcome(seen, due, n if burst else 0, started)


# -- rows -----------------------------------------------------------------------------------------------------------


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] if ordered else math.nan


def rows_for(route: str, burst: Outcome, alone: Outcome, n: int, rate: float, batch: int) -> list[Row]:
    """The target rows of one route: window, finish, neighbour lateness, lost, wall time."""
    window = float(busiest_window(burst.capped, 10.0))
    bound = 1.05 * rate * 10 + batch
    finish = max(burst.capped) - burst.due if burst.capped else math.inf
    ideal = n / rate
    with_burst, without = _p99(burst.neighbour_lateness), _p99(alone.neighbour_lateness)
    return [
        Row(
            NAME,
            f"{route}: most arrivals in any 10 s window",
            "msgs",
            (window,),
            baseline=f"1.05 x {rate:g}/s x 10 s + one batch of {batch} = {bound:g}",
            ratio_to_baseline=window / bound,
            notes=f"{n} due at once, cap {rate:g}/s; target ratio <= 1",
        ),
        Row(
            NAME,
            f"{route}: last arrival after the due time",
            "s",
            (finish,),
            baseline=f"N / r = {ideal:g} s",
            ratio_to_baseline=finish / ideal,
            notes="target within 5 % (ratio 0.95-1.05)",
        ),
        Row(
            NAME,
            f"{route}: uncapped neighbour p99 lateness beside the burst",
            "s",
            (with_burst,),
            baseline=f"alone: {without:.3f} s",
            ratio_to_baseline=(with_burst / without) if without > 0 else None,
            notes=f"{NEIGHBOURS} messages every {NEIGHBOUR_STEP:g} s to an uncapped queue; target unchanged",
        ),
        Row(NAME, f"{route}: messages lost", "msgs", (float(burst.lost),), notes="target 0"),
        Row(NAME, f"{route}: wall time of the burst run", "s", (burst.wall_s,), notes="simulated clock"),
    ]


def run(smoke: bool = False, *, messages: int = 10_000, rate: float = 200.0, shards: int = 4) -> list[Row]:
    """Measure every route and return the rows."""
    if smoke:
        messages, rate, shards = 400, 40.0, 2
    rows: list[Row] = []
    rows += rows_for(
        "SQLite", sqlite_route(messages, rate), sqlite_route(messages, rate, burst=False), messages, rate, 100
    )
    with _azurite() as conn:
        burst = azure_route(conn, messages, rate, shards)
        alone = azure_route(conn, messages, rate, shards, burst=False)
    rows += rows_for(f"Azure, {shards} shards", burst, alone, messages, rate, 100)
    with _moto() as endpoint:
        burst = sqs_route(endpoint, messages, rate)
        alone = sqs_route(endpoint, messages, rate, burst=False)
    rows += rows_for("SQS -delay.fifo", burst, alone, messages, rate, 10)
    return rows


def main(argv: list[str] | None = None, runner: Callable[..., list[Row]] = run) -> None:
    """Command-line entry point: prints the table and writes results/release_control.json."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--shards", type=int, default=4)
    a = p.parse_args(argv)
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    rows = runner(a.smoke, messages=a.messages, rate=a.rate, shards=a.shards)
    print_table(rows, "Release control: a burst at a capped destination")
    path = write_json(f"{NAME}-smoke" if a.smoke else NAME, rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
