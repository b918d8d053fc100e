"""Emulator outages mid-run: PostgreSQL and Azurite stopped and restarted, moto cut off behind a TCP proxy.

Each scenario starts its own service instance (never the session fixtures), runs a dispatcher on the real
clock with compressed breaker times, takes the service away for ``down`` seconds and brings it back:

* ``postgres_outage``: core ``Dispatcher`` on ``PostgresDelayedMessageStore``. The server is stopped like
  a crash (``pg_ctl stop -m immediate``) **while a send is in flight**, so the removal after it fails; an
  application keeps calling ``Dispatcher.store`` through the outage. Restarted on the same port, data kept.
* ``azure_outage``: ``AzureDispatcherHost`` runs back to back (like the timer); Azurite (data on disk) is
  stopped with SIGTERM and restarted on the same ports.
* ``sqs_transport_outage``: core ``Dispatcher`` (embedded SQLite store) sending through ``SqsTransport``
  to moto behind a ``TcpProxy`` that is cut and restored (moto loses its state when restarted).
* ``sqs_requeue_outage``: the FIFO requeue handler behind the local event-source poller, both on the
  proxied client; the destination is drained on a direct client.

Every scenario reports breaker trips (seconds after the outage began), when dispatching resumed after
the service came back, delivered/lost/duplicates counted at the destination, and the earliest delivery
relative to its due time (``min_margin_s`` < 0 would be an early delivery).

Soak: ``python -m tests.reliability.outagelab --outages 5 --messages 1000`` (starts its own services).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayed_delivery import DelayedDeliverySettings, DelayedMessage, Dispatcher
from delayed_delivery import logfields as lf
from delayed_delivery.errors import CircuitBreakerTrippedError, DelayedDeliveryError

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: Compressed breaker time (the default is 30 s).
TRIP = 1.5


@dataclass
class OutageResult:
    """What one outage scenario did and found."""

    scenario: str
    messages: int
    outages: int
    down_seconds: float
    delivered: int = 0
    lost: int = 0
    duplicates: int = 0
    error_queue: int = 0
    #: breaker name → seconds from the start of the outage to the trip (first outage)
    trips: dict[str, float] = field(default_factory=dict)
    critical_errors: int = 0
    #: seconds from the service coming back to the next delivery, per outage
    resume_seconds: list[float] = field(default_factory=list)
    #: smallest (delivery time - due time); negative would be early
    min_margin_s: float = 0.0
    failed_runs: int = 0
    poll_errors: int = 0
    dispatcher_died: str | None = None
    seconds: float = 0.0


class DeliveryLog:
    """Wall-clock time of every delivery (duplicates kept); the destination side of the count."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[tuple[str, float, float]] = []  # (id, sent at, due at)

    def add(self, message_id: str, due_at: float) -> None:
        with self.lock:
            self.sent.append((message_id, time.time(), due_at))

    def first_after(self, at: float) -> float | None:
        with self.lock:
            return min((t for _, t, _ in self.sent if t >= at), default=None)

    def tally(self, result: OutageResult, expected: set[str]) -> None:
        with self.lock:
            ids = Counter(mid for mid, _, _ in self.sent)
            margins = [t - due for _, t, due in self.sent]
        result.delivered = len(set(ids) & expected)
        result.lost = len(expected - set(ids))
        result.duplicates = sum(n - 1 for n in ids.values())
        result.min_margin_s = round(min(margins, default=0.0), 3)


class GatedTransport:
    """Records each send; the send of ``gate`` blocks until released, so an outage can start mid-send."""

    def __init__(self, log: DeliveryLog, gate: str | None = None) -> None:
        self.log = log
        self.gate = gate
        self.reached = threading.Event()
        self.release = threading.Event()

    def send(self, message: DelayedMessage) -> None:
        if message.message_id == self.gate and not self.reached.is_set():
            self.reached.set()
            self.release.wait(60)
        self.log.add(message.message_id, message.due_at.timestamp())


class Trips:
    """The critical-error callback: remembers when each breaker tripped."""

    def __init__(self) -> None:
        self.at: list[tuple[str, float]] = []

    def __call__(self, error: CircuitBreakerTrippedError) -> None:
        self.at.append((error.breaker, time.time()))

    def first_after(self, down_at: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, t in self.at:
            if t >= down_at and name not in out:
                out[name] = round(t - down_at, 2)
        return out


class LoggedTrips(logging.Handler):
    """Breaker trips and lease losses seen in the product's logs (the Azure host logs critical errors)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: list[tuple[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, lf.BREAKER_STATE, None) == "tripped":
            self.at.append((str(getattr(record, lf.BREAKER, "?")), record.created))
        elif getattr(record, lf.EVENT, None) == "lease_lost":
            self.at.append(("lease_lost", record.created))

    def first_after(self, down_at: float) -> dict[str, float]:
        return Trips.first_after(self, down_at)  # type: ignore[arg-type]


def _settings(**changes: Any) -> DelayedDeliverySettings:
    return DelayedDeliverySettings(
        time_to_trigger_store_circuit_breaker=TRIP,
        time_to_trigger_fetch_circuit_breaker=TRIP,
        time_to_trigger_dispatch_circuit_breaker=TRIP,
        failure_delay=0.1,
        tripped_failure_delay=0.3,
        max_idle_sleep=0.2,
        batch_size=10,
        number_of_retries=1000,
        retry_backoff=0.1,
        max_retry_backoff=0.5,
        **changes,
    )


def _run_in_thread(dispatcher: Dispatcher, stop: threading.Event, died: list[str]) -> threading.Thread:
    def loop() -> None:
        try:
            dispatcher.run(stop)
        except BaseException as exc:  # the dispatcher loop must survive outages: record if it does not
            died.append(repr(exc))

    thread = threading.Thread(target=loop, name="dispatcher", daemon=True)
    thread.start()
    return thread


def _wait(condition: Callable[[], bool], timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


# -- PostgreSQL -------------------------------------------------------------------------------------------------


def postgres_outage(messages: int = 150, outages: int = 1, down: float = 4.0, spread: float = 6.0) -> OutageResult:
    """Stop PostgreSQL mid-send (``outages`` times), keep storing through it, restart; count at the sink."""
    from delayed_delivery.postgres import PostgresDelayedMessageStore
    from tests.fixtures.outage import RestartablePostgres

    started = time.monotonic()
    result = OutageResult("postgres", messages, outages, down)
    pg = RestartablePostgres().start()
    log = DeliveryLog()
    now = datetime.now(UTC)
    span = spread + outages * (down + 4)
    batch = [
        DelayedMessage(f"pg-{i:05d}", "orders", b"x", now + timedelta(seconds=0.5 + span * i / messages))
        for i in range(messages)
    ]
    expected = {m.message_id for m in batch}
    transport = GatedTransport(log)
    trips = Trips()
    stop = threading.Event()
    died: list[str] = []
    store = PostgresDelayedMessageStore(
        pg.conninfo, table="outage_delayed", claim_timeout=2.0, connect_timeout=1.0, statement_timeout=3.0
    )
    try:
        store.setup_infrastructure()
        store.store_many(batch)
        dispatcher = Dispatcher(store, transport, _settings(), on_critical_error=trips)
        thread = _run_in_thread(dispatcher, stop, died)
        for n in range(outages):
            # the outage starts while a send is in flight: its removal then fails
            pending = sorted(expected - {mid for mid, _, _ in list(log.sent)})
            transport.gate = pending[min(len(pending) - 1, 5)] if pending else None
            transport.reached.clear()
            transport.release.clear()
            if transport.gate is not None:
                transport.reached.wait(spread + 10)
            pg.stop()
            down_at = time.time()
            transport.release.set()
            # an application keeps storing through the outage (retrying each message until it is stored)
            late = DelayedMessage(f"late-{n:03d}", "orders", b"x", datetime.now(UTC) + timedelta(seconds=1))
            while time.time() - down_at < down:
                try:
                    dispatcher.store(late)
                    break
                except DelayedDeliveryError:
                    time.sleep(0.1)
            pg.start()
            up_at = time.time()
            dispatcher.store(late)
            expected.add(late.message_id)
            if n == 0:
                result.trips = trips.first_after(down_at)
            _wait(lambda up=up_at: log.first_after(up) is not None, 20)  # type: ignore[misc]
            first = log.first_after(up_at)
            result.resume_seconds.append(round(first - up_at, 2) if first is not None else -1.0)
        _wait(lambda: expected <= {mid for mid, _, _ in list(log.sent)} and len(store) == 0, span + 30)
        stop.set()
        dispatcher.notify(datetime.now(UTC))
        thread.join(10)
        dispatcher.close()
    finally:
        stop.set()
        store.close()
        pg.close()
    result.messages = len(expected)
    result.critical_errors = len(trips.at)
    result.dispatcher_died = died[0] if died else None
    log.tally(result, expected)
    result.seconds = round(time.monotonic() - started, 1)
    return result


# -- Azure ------------------------------------------------------------------------------------------------------


def azure_outage(messages: int = 100, outages: int = 1, down: float = 12.0, spread: float = 6.0) -> OutageResult:
    """Stop Azurite (data on disk) under back-to-back timer runs, restart it; count at the destination queue."""
    from azure.storage.queue import QueueServiceClient

    from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
    from delayed_delivery.azure.runner import AzureDispatcherHost
    from delayed_delivery.azure.storage_queue import decode_envelope
    from tests.fixtures.outage import PersistentAzurite

    started = time.monotonic()
    result = OutageResult("azure", messages, outages, down)
    azurite = PersistentAzurite().start()
    log = DeliveryLog()
    name = "o" + uuid.uuid4().hex[:12]
    dest = f"{name}d"
    config = AzureDelayedDeliveryConfig(
        table_name=name,
        container_name=name,
        connection_string=azurite.connection_string,
        lease_seconds=15,
        run_seconds=30.0,
        claim_timeout=5.0,
        queue_connect_timeout=0.5,  # a put ends within 2 s: the claim must outlast it (by 2 s)
        queue_read_timeout=1.0,
        send_timeout=2.0,
        settings=_settings(error_queue=f"{name}e"),
    )
    stop = threading.Event()
    failures: list[tuple[float, str]] = []
    logged = LoggedTrips()
    product = logging.getLogger("delayed_delivery")
    product.addHandler(logged)
    saved_level = product.level
    product.setLevel(logging.INFO)
    downs: list[float] = []
    try:
        host = AzureDispatcherHost(config)
        host.setup_infrastructure()
        inner = host.transport

        class Recording:
            def send(self, message: DelayedMessage, **kwargs: Any) -> None:
                inner.send(message, **kwargs)
                log.add(message.message_id, message.due_at.timestamp())

            def __getattr__(self, attr: str) -> Any:
                return getattr(inner, attr)

        host.transport = Recording()  # type: ignore[assignment]
        queues = QueueServiceClient.from_connection_string(azurite.connection_string)
        queues.create_queue(dest)
        now = datetime.now(UTC)
        span = spread + outages * (down + 8)
        batch = [
            DelayedMessage(f"az-{i:05d}", dest, b"x", now + timedelta(seconds=1 + span * i / messages))
            for i in range(messages)
        ]
        host.store.store_many(batch)
        expected = {m.message_id for m in batch}

        def timer() -> None:
            while not stop.is_set():
                try:
                    host.run(budget=3.0)
                except Exception as exc:  # a failed invocation: the Functions host logs it and fires again
                    failures.append((time.time(), f"{type(exc).__name__}: {exc}"[:200]))
                    stop.wait(0.5)

        thread = threading.Thread(target=timer, daemon=True)
        thread.start()
        for _ in range(outages):
            _wait(lambda: bool(log.sent), spread + 10)
            time.sleep(1.0)
            azurite.stop()
            down_at = time.time()
            downs.append(down_at)
            time.sleep(down)
            azurite.start()
            up_at = time.time()
            _wait(lambda up=up_at: log.first_after(up) is not None, 40)  # type: ignore[misc]
            first = log.first_after(up_at)
            result.resume_seconds.append(round(first - up_at, 2) if first is not None else -1.0)
            result.failed_runs += sum(1 for t, _ in failures if down_at <= t)
        _wait(lambda: expected <= {mid for mid, _, _ in list(log.sent)} and host.store.count() == 0, span + 40)
        stop.set()
        thread.join(15)
        client = queues.get_queue_client(dest)
        arrived: Counter[str] = Counter()
        while got := list(client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300)):
            arrived.update(decode_envelope(m.content).message_id for m in got)
    finally:
        stop.set()
        product.removeHandler(logged)
        product.setLevel(saved_level)
        azurite.close()
    log.tally(result, expected)
    # the destination queue is the authority on what arrived (the log only times the sends)
    result.delivered = len(set(arrived) & expected)
    result.lost = len(expected - set(arrived))
    result.duplicates = sum(n - 1 for n in arrived.values())
    result.critical_errors = sum(1 for name, _ in logged.at if name != "lease_lost")
    result.seconds = round(time.monotonic() - started, 1)
    if downs:
        result.trips = logged.first_after(downs[0])
        first_failure = min((t for t, _ in failures if t >= downs[0]), default=None)
        if first_failure is not None:
            result.trips["run_failed"] = round(first_failure - downs[0], 2)
    return result


# -- SQS --------------------------------------------------------------------------------------------------------


def _client(endpoint_url: str) -> SQSClient:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=1, read_timeout=5),
    )


def _drain(client: SQSClient, url: str, arrived: Counter[str], at: dict[str, float]) -> int:
    reply = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    messages = reply.get("Messages", [])
    for m in messages:
        arrived[m["Body"]] += 1
        at.setdefault(m["Body"], time.time())
    if messages:
        client.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        )
    return len(messages)


def sqs_transport_outage(
    moto_url: str, messages: int = 100, outages: int = 1, down: float = 4.0, spread: float = 6.0
) -> OutageResult:
    """Core dispatcher (SQLite store) → ``SqsTransport`` → proxy → moto; cut the proxy for ``down`` seconds."""
    from delayed_delivery import SqliteDelayedMessageStore
    from delayed_delivery.aws.queues import ensure_endpoint
    from delayed_delivery.aws.transport import SqsTransport
    from tests.fixtures.outage import TcpProxy

    started = time.monotonic()
    result = OutageResult("sqs-transport", messages, outages, down)
    direct = _client(moto_url)
    queue = f"out{uuid.uuid4().hex[:10]}"
    settings = _settings(error_queue=f"{queue}-errors")
    endpoint = ensure_endpoint(direct, queue, settings, visibility_timeout=5)
    proxy = TcpProxy(int(moto_url.rsplit(":", 1)[1])).start()
    trips = Trips()
    stop = threading.Event()
    died: list[str] = []
    log = DeliveryLog()
    arrived: Counter[str] = Counter()
    arrival_at: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteDelayedMessageStore(Path(tmp) / "store.db", claim_timeout=5.0)
        store.setup_infrastructure()
        now = datetime.now(UTC)
        span = spread + outages * (down + 3)
        batch = [
            DelayedMessage(
                f"sq-{i:05d}", queue, f"sq-{i:05d}".encode(), now + timedelta(seconds=0.5 + span * i / messages)
            )
            for i in range(messages)
        ]
        store.store_many(batch)
        due = {m.message_id: m.due_at.timestamp() for m in batch}
        expected = set(due)
        dispatcher = Dispatcher(store, SqsTransport(_client(proxy.url)), settings, on_critical_error=trips)
        thread = _run_in_thread(dispatcher, stop, died)
        try:
            for n in range(outages):
                _wait(lambda: _drain(direct, endpoint.input_url, arrived, arrival_at) >= 0 and len(arrived) > 5, 10)
                proxy.cut()
                down_at = time.time()
                while time.time() - down_at < down:
                    _drain(direct, endpoint.input_url, arrived, arrival_at)
                    time.sleep(0.2)
                proxy.restore()
                up_at = time.time()
                if n == 0:
                    result.trips = trips.first_after(down_at)
                before = set(arrived)
                _wait(
                    lambda b=before: _drain(direct, endpoint.input_url, arrived, arrival_at) >= 0 and set(arrived) > b,
                    20,
                )  # type: ignore[misc]
                first = min((arrival_at[m] for m in set(arrived) - before), default=None)
                result.resume_seconds.append(round(first - up_at, 2) if first is not None else -1.0)
            _wait(
                lambda: _drain(direct, endpoint.input_url, arrived, arrival_at) >= 0 and expected <= set(arrived),
                span + 30,
            )
            time.sleep(1.0)
            _drain(direct, endpoint.input_url, arrived, arrival_at)
            errors: Counter[str] = Counter()
            _drain(direct, endpoint.error_url, errors, {})
            result.error_queue = sum(errors.values())
        finally:
            stop.set()
            dispatcher.notify(datetime.now(UTC))
            thread.join(15)
            dispatcher.close()
            proxy.close()
            store.close()
    for mid, n in arrived.items():
        for _ in range(n):
            log.sent.append((mid, arrival_at[mid], due.get(mid, 0.0)))
    log.tally(result, expected)
    result.critical_errors = len(trips.at)
    result.dispatcher_died = died[0] if died else None
    result.seconds = round(time.monotonic() - started, 1)
    return result


def sqs_requeue_outage(moto_url: str, messages: int = 40, outages: int = 1, down: float = 4.0) -> OutageResult:
    """FIFO requeue handler + local poller on a proxied client; cut the proxy mid-run, count at the destination."""
    from delayed_delivery.aws.queues import ensure_endpoint
    from delayed_delivery.aws.requeue.handler import build_handler
    from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
    from delayed_delivery.testing.aws import LocalEventSourcePoller
    from tests.fixtures.outage import TcpProxy
    from tests.reliability.sqslab import DELAY, LAB_SQS, handler_env, lab_settings

    started = time.monotonic()
    result = OutageResult("sqs-requeue", messages, outages, down)
    direct = _client(moto_url)
    queue = f"orq{uuid.uuid4().hex[:10]}"
    settings = lab_settings(queue)
    endpoint = ensure_endpoint(direct, queue, settings, sqs_settings=LAB_SQS, visibility_timeout=1)
    proxy = TcpProxy(int(moto_url.rsplit(":", 1)[1])).start()
    proxied = _client(proxy.url)
    handler = build_handler(handler_env(settings), sqs_client=proxied)
    poller = LocalEventSourcePoller(proxied, endpoint.delay_url, endpoint.delay_arn, handler, wait_seconds=0)
    sender = SqsDelayedSender(direct, settings, sqs_settings=LAB_SQS)
    arrived: Counter[str] = Counter()
    arrival_at: dict[str, float] = {}
    sent_at: dict[str, float] = {}
    ids = [f"rq-{i:05d}" for i in range(messages)]
    poller.start()
    try:
        # sent in waves, so the outage catches messages at every stage (first hop, mid-hop, hand-over)
        waves = 4
        for w in range(waves):
            wave = ids[w * messages // waves : (w + 1) * messages // waves]
            for start in range(0, len(wave), 10):
                chunk = wave[start : start + 10]
                t = time.time()
                sent = sender.send_delayed_batch([DelayedSend(queue, mid, DELAY, message_id=mid) for mid in chunk])
                assert sent.ok, sent.failures
                sent_at.update(dict.fromkeys(chunk, t))
            time.sleep(0.5)
        for _ in range(outages):
            proxy.cut()
            down_at = time.time()
            while time.time() - down_at < down:
                _drain(direct, endpoint.input_url, arrived, arrival_at)
                time.sleep(0.2)
            proxy.restore()
            up_at = time.time()
            before = set(arrived)
            _wait(
                lambda b=before: _drain(direct, endpoint.input_url, arrived, arrival_at) >= 0 and set(arrived) > b, 30
            )  # type: ignore[misc]
            first = min((arrival_at[m] for m in set(arrived) - before), default=None)
            result.resume_seconds.append(round(first - up_at, 2) if first is not None else -1.0)
        expected = set(ids)
        _wait(lambda: _drain(direct, endpoint.input_url, arrived, arrival_at) >= 0 and expected <= set(arrived), 60)
        time.sleep(2.0)
        _drain(direct, endpoint.input_url, arrived, arrival_at)
        errors: Counter[str] = Counter()
        _drain(direct, endpoint.error_url, errors, {})
        result.error_queue = sum(errors.values())
    finally:
        poller.stop()
        proxy.close()
    log = DeliveryLog()
    for mid, n in arrived.items():
        for _ in range(n):
            log.sent.append((mid, arrival_at[mid], sent_at.get(mid, 0.0) + DELAY))
    log.tally(result, set(ids))
    result.poll_errors = poller.stats.poll_errors + poller.stats.handler_errors
    result.seconds = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    """Soak command line: every scenario, ``--outages`` outages each; exit 1 on loss or early delivery."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--outages", type=int, default=3)
    p.add_argument("--messages", type=int, default=500)
    p.add_argument("--down", type=float, default=5.0)
    p.add_argument("--only", choices=["postgres", "azure", "sqs-transport", "sqs-requeue"], action="append")
    # the handler's per-message INFO lines would bury the JSON result on stdout (Powertools reads the process env)
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    a = p.parse_args()
    only = set(a.only or ["postgres", "azure", "sqs-transport", "sqs-requeue"])
    results: list[OutageResult] = []
    spread = max(6.0, a.messages / 50)
    if "postgres" in only:
        results.append(postgres_outage(a.messages, a.outages, a.down, spread))
    if "azure" in only:
        results.append(azure_outage(a.messages, a.outages, a.down, spread))
    if only & {"sqs-transport", "sqs-requeue"}:
        from tests.fixtures.moto import _moto_executable
        from tests.fixtures.services import ServiceProcess, free_port

        port = free_port()
        moto = ServiceProcess("moto", [_moto_executable(), "-H", "127.0.0.1", "-p", str(port)], [port]).start()
        try:
            url = f"http://127.0.0.1:{port}"
            if "sqs-transport" in only:
                results.append(sqs_transport_outage(url, a.messages, a.outages, a.down, spread))
            if "sqs-requeue" in only:
                results.append(sqs_requeue_outage(url, min(a.messages, 200), a.outages, a.down))
        finally:
            moto.stop()
    print(json.dumps([asdict(r) for r in results], indent=2))
    if any(r.lost or r.min_margin_s < 0 or r.dispatcher_died for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
