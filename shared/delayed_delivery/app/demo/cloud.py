"""The cloud demo: delayed messages through SQS (moto server) and Azure Storage Queues (Azurite), time compressed.

Both clouds get the same mix (0 s to "1 year", jittered), a few poison messages, one cancelled and one
rescheduled message (AWS: records in the cancellation table on moto, applied at the next hop; Azure: the delays
table). AWS: the real Lambda handler (``delayed_delivery.aws.handler``) runs
behind ``LocalEventSourcePoller`` on each ``-delay.fifo`` queue. Azure: the timer function's body
(``AzureDispatcherHost.run``) fires on the function's schedule, compressed. Collectors drain the destination and
error queues and time every arrival. Time is compressed linearly (``year_seconds`` real seconds = 365 days);
the native caps and the FIFO hop length shrink to whole seconds, the smallest both services accept.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.emulators import LocalEmulators
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from delayed_delivery.aws.sender import SqsDelayedSender

__all__ = [
    "CLOUD_DEMO_DELAYS",
    "CloudDemoConfig",
    "CloudDemoResult",
    "CloudProgress",
    "CloudSummary",
    "run_cloud_demo",
]

#: (label, logical delay in seconds) of the messages each cloud gets, in turn.
CLOUD_DEMO_DELAYS: tuple[tuple[str, float], ...] = (
    ("0 s", 0),
    ("90 s", 90),
    ("15 min", 900),
    ("3 h", 3 * 3600),
    ("1 day", 86_400),
    ("8 days", 8 * 86_400),
    ("30 days", 30 * 86_400),
    ("90 days", 90 * 86_400),
    ("1 year", 365 * 86_400),
)
YEAR = 365 * 86_400
DESTINATIONS = ("orders", "billing")
ERROR_QUEUE = "error"
AZURE_ENDPOINT = "demo"
CANCELLATION_TABLE = "delayed-delivery-cancellations"
#: The Functions timer runs every minute for ``run_seconds`` = 50 s: the demo keeps that ratio.
TIMER_DUTY = 50 / 60
#: moto accepts any credentials; fixed ones keep the demo away from real ones.
_EMULATOR_KEY = "testing"
_REGION = "us-east-1"
#: Parallel queue puts of the Azure dispatcher in the demo.
DEMO_AZURE_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class CloudDemoConfig:
    """How big and how compressed the demo is."""

    messages_per_cloud: int = 45
    year_seconds: float = 45.0
    poison_per_cloud: int = 2
    timer_period: float = 6.0
    grace_seconds: float = 20.0
    azure_shards: int = 2
    seed: int = 1
    aws: bool = True
    azure: bool = True

    @property
    def compression(self) -> float:
        """Logical seconds per real second."""
        return YEAR / self.year_seconds

    @classmethod
    def quick(cls) -> CloudDemoConfig:
        """The ``--quick`` size: under two minutes with the emulators' start on 2 cores."""
        return cls(messages_per_cloud=18, year_seconds=25.0, timer_period=5.0, grace_seconds=15.0)


@dataclass(slots=True)
class CloudProgress:
    """Live counts for one cloud."""

    cloud: str
    sent: int = 0
    pending: int = 0
    in_flight: int = 0
    delivered: int = 0
    error_queue: int = 0


@dataclass(slots=True)
class CloudSummary:
    """The demo's outcome on one cloud."""

    cloud: str
    sent: int
    expected_deliveries: int
    delivered: int
    lost: int
    duplicates: int
    early: int
    error_queue: int
    expected_error_queue: int
    cancelled: int
    cancelled_but_delivered: int
    rescheduled: int
    lateness_p50: float
    lateness_p99: float
    lateness_max: float
    routes: dict[str, int] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)
    #: Per rescheduled message: arrival minus its new due time (s; negative would be early, None = not arrived).
    rescheduled_lateness: list[float | None] = field(default_factory=list)
    by_delay: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CloudDemoResult:
    """Both clouds' summaries and the run's shape."""

    clouds: list[CloudSummary]
    compression: float
    year_seconds: float
    native_caps: dict[str, int]
    seconds: float

    @property
    def lost(self) -> int:
        """Messages lost across clouds (must be 0)."""
        return sum(c.lost for c in self.clouds)

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing cancelled delivered, every poison message in an error queue."""
        return all(
            c.lost == 0 and c.cancelled_but_delivered == 0 and c.error_queue == c.expected_error_queue
            for c in self.clouds
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        data = asdict(self)
        data["lost"] = self.lost
        data["ok"] = self.ok
        return data


def _percentile(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class _Tracker:
    """What one cloud was asked to do and what arrived where (thread-safe)."""

    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        self.due: dict[str, float] = {}
        self.labels: dict[str, str] = {}
        self.poison: set[str] = set()
        self.cancelled: set[str] = set()
        self.rescheduled: set[str] = set()
        self.routes: Counter[str] = Counter()
        self.arrivals: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.notes: list[str] = []
        self._lock = threading.Lock()

    def expect(self, message_id: str, label: str, due: float, route: str) -> None:
        with self._lock:
            self.due[message_id] = due
            self.labels[message_id] = label
            self.routes[route] += 1

    def arrived(self, message_id: str, when: float) -> None:
        with self._lock:
            self.arrivals.setdefault(message_id, []).append(when)

    def errored(self, message_id: str) -> None:
        with self._lock:
            self.errors[message_id] = self.errors.get(message_id, 0) + 1

    def wanted(self) -> set[str]:
        """Ids that should reach their destination."""
        return set(self.due) - self.poison - self.cancelled

    def done(self) -> bool:
        with self._lock:
            return self.wanted() <= set(self.arrivals) and self.poison <= set(self.errors)

    def progress(self, now: float) -> CloudProgress:
        with self._lock:
            wanted = self.wanted()
            arrived = wanted & set(self.arrivals)
            waiting = wanted - arrived
            return CloudProgress(
                cloud=self.cloud,
                sent=len(self.due),
                pending=sum(1 for m in waiting if self.due[m] > now),
                in_flight=sum(1 for m in waiting if self.due[m] <= now),
                delivered=len(arrived),
                error_queue=sum(self.errors.values()),
            )

    def summary(self, requests: dict[str, float]) -> CloudSummary:
        with self._lock:
            wanted = self.wanted()
            lateness = [self.arrivals[m][0] - self.due[m] for m in wanted if m in self.arrivals]
            return CloudSummary(
                cloud=self.cloud,
                sent=len(self.due),
                expected_deliveries=len(wanted),
                delivered=sum(1 for m in wanted if m in self.arrivals),
                lost=sum(1 for m in wanted if m not in self.arrivals)
                + sum(1 for m in self.poison if m not in self.errors),
                duplicates=sum(len(v) - 1 for v in self.arrivals.values()) + sum(n - 1 for n in self.errors.values()),
                early=sum(1 for x in lateness if x < -0.001),
                error_queue=sum(self.errors.values()),
                expected_error_queue=len(self.poison),
                cancelled=len(self.cancelled),
                cancelled_but_delivered=sum(1 for m in self.cancelled if m in self.arrivals),
                rescheduled=len(self.rescheduled),
                rescheduled_lateness=[
                    round(self.arrivals[m][0] - self.due[m], 3) if m in self.arrivals else None
                    for m in sorted(self.rescheduled)
                ],
                lateness_p50=round(_percentile(lateness, 50), 3),
                lateness_p99=round(_percentile(lateness, 99), 3),
                lateness_max=round(max(lateness, default=0.0), 3),
                routes=dict(self.routes),
                requests=requests,
                by_delay=self._by_delay(wanted),
                notes=list(self.notes),
            )

    def _by_delay(self, wanted: set[str]) -> dict[str, dict[str, float]]:
        """Per delay label: messages, delivered, worst lateness (call with the lock held)."""
        out: dict[str, dict[str, float]] = {}
        for m in sorted(wanted, key=lambda m: self.due[m]):
            row = out.setdefault(self.labels[m], {"messages": 0, "delivered": 0, "lateness_max": 0.0})
            row["messages"] += 1
            if m in self.arrivals:
                row["delivered"] += 1
                row["lateness_max"] = round(max(row["lateness_max"], self.arrivals[m][0] - self.due[m]), 3)
        return out


@dataclass(frozen=True, slots=True)
class _Planned:
    message_id: str
    label: str
    destination: str
    delay: float


def _plan(config: CloudDemoConfig, cloud: str) -> list[_Planned]:
    rng = random.Random(f"{config.seed}:{cloud}")
    out = []
    for i in range(config.messages_per_cloud):
        label, logical = CLOUD_DEMO_DELAYS[i % len(CLOUD_DEMO_DELAYS)]
        logical *= 1 + rng.random() * 0.05 if logical else 1
        destination = DESTINATIONS[i % len(DESTINATIONS)]
        out.append(
            _Planned(f"{cloud}-{i:03d}-{uuid.uuid4().hex[:8]}", label, destination, logical / config.compression)
        )
    return out


def _body(message_id: str, label: str) -> str:
    return json.dumps({"id": message_id, "delay": label})


def _id_of(body: str | bytes) -> str:
    try:
        return str(json.loads(body)["id"])
    except (ValueError, KeyError, TypeError):
        return f"unreadable:{body[:40]!r}"


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the run (what the Lambda configuration would set), then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _registered_timer(host: Any) -> tuple[ModuleType | None, Callable[[Any], Any]]:
    """The Azure function app's registered timer function, running on ``host``.

    ``functions/`` ships beside the package, not in it: when it cannot be imported (an installed package run
    outside a source checkout), the timer's body, ``host.run()``, is called directly instead.
    """
    try:
        function_app = importlib.import_module("functions.azure.function_app")
    except ImportError:
        return None, lambda _timer: host.run()
    function_app.use_host(host)
    # azure-functions lets the registry be read once per process: reset its bindings around our read so
    # that an earlier or a later reader (another harness in the same process) still works.
    function_app.app.functions_bindings = None
    try:
        registered = function_app.app.get_functions()
    finally:
        function_app.app.functions_bindings = None
    by_name = {f.get_function_name(): f for f in registered}
    return function_app, by_name["dispatch_delayed_messages"].get_user_function()


# --------------------------------------------------------------------------------------------------- AWS


class _AwsSide:
    """SQS on moto server: endpoints, sender, the Lambda handler behind local event sources, collectors."""

    def __init__(self, endpoint_url: str, config: CloudDemoConfig, tracker: _Tracker, verbose: bool) -> None:
        import boto3

        from delayed_delivery.testing.aws import RequestCounter

        self.config = config
        self.tracker = tracker
        self.verbose = verbose
        cap = max(1, round(900 / config.compression))
        self.settings = DelayedDeliverySettings(max_native_delay=cap, fifo_queue_delay=cap, error_queue=ERROR_QUEUE)

        def client() -> SQSClient:
            return boto3.client(
                "sqs",
                endpoint_url=endpoint_url,
                region_name=_REGION,
                aws_access_key_id=_EMULATOR_KEY,
                aws_secret_access_key=_EMULATOR_KEY,
            )

        self.admin, self.sender_client, self.lambda_client, self.poll_client = client(), client(), client(), client()
        self.dynamodb = boto3.client(
            "dynamodb",
            endpoint_url=endpoint_url,
            region_name=_REGION,
            aws_access_key_id=_EMULATOR_KEY,
            aws_secret_access_key=_EMULATOR_KEY,
        )
        self.record_requests: Counter[str] = Counter()
        # what the handler did, per message (an envelope record counts each message inside it) and per park record
        self.outcomes = Counter[str]()
        self.dynamodb.meta.events.register(
            "before-send.dynamodb.*", lambda **kw: self.record_requests.update([kw["event_name"].rsplit(".", 1)[-1]])
        )
        self.collect_clients = {q: client() for q in (*DESTINATIONS, ERROR_QUEUE)}
        self.sends = RequestCounter().attach(self.sender_client)
        self.hops = RequestCounter().attach(self.lambda_client)
        self.polls = RequestCounter().attach(self.poll_client)
        self.pollers: list[Any] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    @property
    def env(self) -> dict[str, str]:
        """What the CDK stack sets on the function, with the compressed caps."""
        return {
            "DELAYED_DELIVERY_MAX_NATIVE_DELAY": str(self.settings.max_native_delay),
            "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": str(self.settings.fifo_queue_delay),
            "DELAYED_DELIVERY_ERROR_QUEUE": ERROR_QUEUE,
            "POWERTOOLS_SERVICE_NAME": "delayed-delivery-requeue",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "false" if self.verbose else "true",
            "POWERTOOLS_LOG_LEVEL": "INFO" if self.verbose else "CRITICAL",
            "AWS_EC2_METADATA_DISABLED": "true",
            # 1 s stands for 900 s here: the records are read on every invocation (no cache).
            "DELAYED_DELIVERY_CANCELLATION_TABLE": CANCELLATION_TABLE,
            "DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS": "0",
        }

    def provision(self) -> None:
        from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
        from delayed_delivery.aws.handler import build_handler
        from delayed_delivery.aws.queues import ensure_endpoint
        from delayed_delivery.testing.aws import LocalEventSourcePoller

        ensure_cancellation_table(self.dynamodb, CANCELLATION_TABLE)
        self.records = DynamoDbCancellationStore(self.dynamodb, CANCELLATION_TABLE)

        # Powertools writes logs and EMF metrics to stdout (CloudWatch reads them there); keep the demo's own
        # stdout for its table / JSON: verbose → stderr, otherwise discarded.
        sink: Callable[[], Any] = (lambda: sys.stderr) if self.verbose else io.StringIO
        with contextlib.redirect_stdout(sink()):
            handler = build_handler(
                os.environ,
                sqs_client=self.lambda_client,
                dynamodb_client=self.dynamodb,
                on_results=self._count_outcomes,
            )
        lock = threading.Lock()

        def one_at_a_time(event: dict[str, Any], context: Any) -> Any:
            with lock, contextlib.redirect_stdout(sink()):  # one invocation at a time, as in one Lambda sandbox
                return handler(event, context)

        for queue in DESTINATIONS:
            endpoint = ensure_endpoint(self.admin, queue, self.settings, visibility_timeout=5)
            self.pollers.append(
                LocalEventSourcePoller(self.poll_client, endpoint.delay_url, endpoint.delay_arn, one_at_a_time)
            )
        self.urls = {q: self.admin.get_queue_url(QueueName=q)["QueueUrl"] for q in (*DESTINATIONS, ERROR_QUEUE)}
        self.delay_urls = {q: self.admin.get_queue_url(QueueName=f"{q}-delay.fifo")["QueueUrl"] for q in DESTINATIONS}

    def _count_outcomes(self, results: list[Any]) -> None:
        """Tally one invocation's outcomes per message (called inside the one-at-a-time lock)."""
        self.outcomes.update(str(each.outcome) for r in results for each in r.per_message())
        self.outcomes.update(park_records=sum(1 for r in results if str(r.outcome) == "parked"))

    def start(self) -> None:
        for poller in self.pollers:
            poller.start()
        for queue in (*DESTINATIONS, ERROR_QUEUE):
            thread = threading.Thread(target=self._collect, args=(queue,), name=f"collect-sqs-{queue}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _collect(self, queue: str) -> None:
        client = self.collect_clients[queue]
        while not self.stop.is_set():
            try:
                reply = client.receive_message(QueueUrl=self.urls[queue], MaxNumberOfMessages=10, WaitTimeSeconds=1)
            except Exception:
                time.sleep(0.2)
                continue
            now = time.time()
            messages = reply.get("Messages", [])
            for m in messages:
                message_id = _id_of(m["Body"])
                if queue == ERROR_QUEUE:
                    self.tracker.errored(message_id)
                else:
                    self.tracker.arrived(message_id, now)
            if messages:
                client.delete_message_batch(
                    QueueUrl=self.urls[queue],
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )

    def send(self, planned: list[_Planned]) -> None:
        from delayed_delivery.aws.sender import SqsDelayedSender

        sender = SqsDelayedSender(self.sender_client, self.settings)
        for p in planned:
            started = time.time()
            receipt = sender.send_delayed(p.destination, _body(p.message_id, p.label), p.delay, message_id=p.message_id)
            self.tracker.expect(p.message_id, p.label, started + p.delay, receipt.route.value)
        for i in range(self.config.poison_per_cloud):
            message_id = f"aws-poison-{i}-{uuid.uuid4().hex[:8]}"
            attributes: dict[str, Any] = {}
            if i % 2:
                attributes[DELAY_SECONDS_ATTRIBUTE] = {"DataType": "String", "StringValue": "soon"}
            self.sender_client.send_message(
                QueueUrl=self.delay_urls[DESTINATIONS[i % len(DESTINATIONS)]],
                MessageBody=_body(message_id, "poison"),
                MessageAttributes=attributes,
                MessageGroupId=message_id,
                MessageDeduplicationId=f"{message_id}:0",
            )
            self.tracker.poison.add(message_id)
            self.tracker.expect(message_id, "poison", time.time(), "poison")
        self._cancel_and_reschedule(sender)

    def _cancel_and_reschedule(self, sender: SqsDelayedSender) -> None:
        """One "1 year" message cancelled and one "1 year" message moved to "90 days", by record, at once."""
        from delayed_delivery.cancellations import cancel_request, reschedule_request

        now = datetime.now(UTC)
        cancel_id = f"aws-cancel-{uuid.uuid4().hex[:8]}"
        delay = YEAR / self.config.compression  # surely on the hop cycle, however compressed
        receipt = sender.send_delayed("orders", _body(cancel_id, "1 year, cancelled"), delay, message_id=cancel_id)
        self.tracker.expect(cancel_id, "cancelled", time.time() + delay, receipt.route.value)
        self.records.put(
            cancel_request("orders", cancel_id, now=now, max_native_delay=self.settings.max_native_delay, max_age=0)
        )
        self.tracker.cancelled.add(cancel_id)
        moved_id = f"aws-reschedule-{uuid.uuid4().hex[:8]}"
        receipt = sender.send_delayed(
            "billing", _body(moved_id, "1 year → 90 days"), YEAR / self.config.compression, message_id=moved_id
        )
        new_due = datetime.now(UTC) + timedelta(seconds=90 * 86_400 / self.config.compression)
        self.records.put(reschedule_request("billing", moved_id, new_due, now=datetime.now(UTC)))
        self.tracker.rescheduled.add(moved_id)
        self.tracker.expect(moved_id, "rescheduled", new_due.timestamp(), receipt.route.value)

    def close(self) -> None:
        """Stop the pollers and collectors."""
        self.stop.set()
        for poller in self.pollers:
            poller.stop()
        for thread in self.threads:
            thread.join(5)

    def finish(self) -> dict[str, float]:
        """Stop, then the request counts."""
        self.close()
        # a hop is one message moved on (requeued to the FIFO queue or forwarded to its destination); an envelope
        # record carries many messages, a parked record moves none (it comes back later), poison goes to the error queue
        hops = self.outcomes["requeued"] + self.outcomes["forwarded"]
        sent = self.sends.total
        polls = self.polls.snapshot()
        empty = self.polls.empty_receives
        handler = self.hops.snapshot()
        # a park's own requests (the visibility change, the in-flight reads) are billed to the park, not the hops
        park_requests = handler.get("ChangeMessageVisibilityBatch", 0) + handler.get("GetQueueAttributes", 0)
        received = polls.get("ReceiveMessage", 0) - empty
        hop_requests = self.hops.total - park_requests + polls.get("DeleteMessageBatch", 0) + received
        messages = max(1, len(self.tracker.due))
        return {
            "hops": hops,
            "hops_per_long_message": round(hops / max(1, self.tracker.routes.get("fifo", 0)), 2),
            "send_requests": sent,
            "hop_requests": hop_requests,
            "requests_per_hop": round(hop_requests / hops, 3) if hops else 0.0,
            "park_requests": park_requests,
            "requests_per_message": round((sent + hop_requests + park_requests) / messages, 3),
            "empty_receives": empty,
            "cancellation_queries": self.record_requests.get("Query", 0),
            "cancellation_deletes": self.record_requests.get("DeleteItem", 0),
            "parks": self.outcomes["parked"],
            "park_records": self.outcomes["park_records"],
        }


# --------------------------------------------------------------------------------------------------- Azure


class _RequestTally:
    """Counts storage requests per service (``raw_request_hook``: every request, as the account bills them)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def hook(self, service: str) -> Callable[[Any], None]:
        def count(request: Any) -> None:
            with self._lock:
                self.counts[service] += 1

        return count

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


class _AzureSide:
    """Storage Queues, table and leases on Azurite: sender, the timer function's body on a schedule, collectors."""

    def __init__(self, connection_string: str, config: CloudDemoConfig, tracker: _Tracker) -> None:
        from azure.data.tables import TableServiceClient
        from azure.storage.blob import BlobServiceClient
        from azure.storage.queue import QueueServiceClient

        from delayed_delivery.azure.config import AzureClients, AzureDelayedDeliveryConfig, http_transport

        self.config = config
        self.tracker = tracker
        self.native_cap = max(1, round(7 * 86_400 / config.compression))
        self.tally = _RequestTally()

        def clients(role: str) -> AzureClients:
            """What ``AzureClients.create`` builds (same pooled transports), plus a request counter per service."""
            pool = max(10, DEMO_AZURE_CONCURRENCY + 4)
            return AzureClients(
                TableServiceClient.from_connection_string(
                    connection_string, transport=http_transport(pool), raw_request_hook=self.tally.hook(f"{role}.table")
                ),
                BlobServiceClient.from_connection_string(
                    connection_string, transport=http_transport(10), raw_request_hook=self.tally.hook(f"{role}.blob")
                ),
                QueueServiceClient.from_connection_string(
                    connection_string, transport=http_transport(pool), raw_request_hook=self.tally.hook(f"{role}.queue")
                ),
            )

        self.azure_config = AzureDelayedDeliveryConfig.for_endpoint(
            AZURE_ENDPOINT,
            connection_string=connection_string,
            shards=config.azure_shards,
            lease_seconds=15,
            run_seconds=config.timer_period * TIMER_DUTY,
            settings=DelayedDeliverySettings(error_queue=ERROR_QUEUE, max_concurrency=DEMO_AZURE_CONCURRENCY),
        )
        self.sender_clients = clients("sender")
        self.host_clients = clients("function")
        self.collector = QueueServiceClient.from_connection_string(connection_string)
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.timer_runs = 0

    def provision(self) -> None:
        from delayed_delivery.azure.runner import AzureDispatcherHost
        from delayed_delivery.azure.sender import AzureDelayedSender
        from delayed_delivery.azure.storage_queue import StorageQueueTransport
        from delayed_delivery.azure.table_store import TableDelayedMessageStore

        self.host = AzureDispatcherHost(self.azure_config, self.host_clients)
        self.host.setup_infrastructure()
        transport = StorageQueueTransport(self.sender_clients.queues)
        for queue in (*DESTINATIONS, ERROR_QUEUE):
            transport.create_queue(queue)
        self.store = TableDelayedMessageStore(
            self.sender_clients.tables.get_table_client(self.azure_config.table_name),
            shards=self.azure_config.shards,
            claim_timeout=self.azure_config.claim_timeout,
        )
        self.sender = AzureDelayedSender(
            transport, self.store, self.azure_config.settings, max_native_delay=self.native_cap
        )
        self.tally.reset()

    def start(self) -> None:
        timer = threading.Thread(target=self._timer, name="azure-timer", daemon=True)
        timer.start()
        self.threads.append(timer)
        for queue in (*DESTINATIONS, ERROR_QUEUE):
            thread = threading.Thread(target=self._collect, args=(queue,), name=f"collect-azq-{queue}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _timer(self) -> None:
        """Fire the registered timer function every ``timer_period`` seconds, running on the demo's counted host."""
        from azure.functions.timer import TimerRequest

        function_app, timer_function = _registered_timer(self.host)
        next_fire = time.monotonic()
        while not self.stop.is_set():
            self.timer_runs += 1
            with contextlib.suppress(Exception):
                timer_function(TimerRequest(past_due=False))
            next_fire += self.config.timer_period
            self.stop.wait(max(0.0, next_fire - time.monotonic()))
        if function_app is not None:
            function_app.use_host(None)

    def _collect(self, queue: str) -> None:
        from delayed_delivery.azure.storage_queue import decode_envelope

        client = self.collector.get_queue_client(queue)
        while not self.stop.is_set():
            try:
                batch = list(client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300))
            except Exception:
                batch = []
            now = time.time()
            for m in batch:
                try:
                    envelope = decode_envelope(m.content)
                except Exception:
                    continue
                if queue == ERROR_QUEUE:
                    self.tracker.errored(envelope.message_id)
                else:
                    self.tracker.arrived(envelope.message_id, now)
                with contextlib.suppress(Exception):
                    client.delete_message(m)
            if not batch:
                self.stop.wait(0.2)

    def send(self, planned: list[_Planned]) -> None:
        for p in planned:
            result = self.sender.send(
                p.destination, _body(p.message_id, p.label).encode(), delay=p.delay, message_id=p.message_id
            )
            self.tracker.expect(p.message_id, p.label, result.due_at.timestamp(), result.route)
        for i in range(self.config.poison_per_cloud):
            message_id = f"azure-poison-{i}-{uuid.uuid4().hex[:8]}"
            delay = (30 + 30 * i) * 86_400 / self.config.compression
            result = self.sender.send(
                "no-such-queue",
                _body(message_id, "poison").encode(),
                delay=delay,
                message_id=message_id,
                cancellable=True,  # the table route: the queue is checked only when the row falls due
            )
            self.tracker.poison.add(message_id)
            self.tracker.expect(message_id, "poison", result.due_at.timestamp(), result.route)
        # one cancelled: a cancellable (table-routed) "30 days" message, cancelled at once
        cancel_id = f"azure-cancel-{uuid.uuid4().hex[:8]}"
        result = self.sender.send(
            "orders",
            _body(cancel_id, "30 days, cancelled").encode(),
            delay=30 * 86_400 / self.config.compression,
            message_id=cancel_id,
            cancellable=True,
        )
        self.tracker.expect(cancel_id, "cancelled", result.due_at.timestamp(), result.route)
        if self.sender.cancel(cancel_id):
            self.tracker.cancelled.add(cancel_id)
        # one rescheduled: sent for "1 year", moved to "90 days"
        moved_id = f"azure-reschedule-{uuid.uuid4().hex[:8]}"
        result = self.sender.send(
            "billing",
            _body(moved_id, "1 year → 90 days").encode(),
            delay=YEAR / self.config.compression,
            message_id=moved_id,
            cancellable=True,
        )
        new_due = datetime.now(UTC) + timedelta(seconds=90 * 86_400 / self.config.compression)
        if self.store.reschedule(moved_id, new_due):
            self.tracker.rescheduled.add(moved_id)
            self.tracker.expect(moved_id, "rescheduled", new_due.timestamp(), result.route)
        else:
            self.tracker.expect(moved_id, "rescheduled", result.due_at.timestamp(), result.route)

    def close(self) -> None:
        """Stop the timer and the collectors (a running dispatcher run ends at its budget)."""
        self.stop.set()
        for thread in self.threads:
            thread.join(self.azure_config.run_seconds + 10)

    def finish(self) -> dict[str, float]:
        """Stop, then the request counts."""
        self.close()
        counts = self.tally.snapshot()
        messages = max(1, len(self.tracker.due))
        table_messages = self.tracker.routes.get("table", 0)
        sender_total = sum(v for k, v in counts.items() if k.startswith("sender."))
        function_total = sum(v for k, v in counts.items() if k.startswith("function."))
        return {
            "sender_requests": sender_total,
            "function_requests": function_total,
            "function_table_requests": counts.get("function.table", 0),
            "function_queue_requests": counts.get("function.queue", 0),
            "function_blob_requests": counts.get("function.blob", 0),
            "requests_per_message": round((sender_total + function_total) / messages, 3),
            "function_requests_per_table_message": round(function_total / max(1, table_messages), 3),
            "timer_runs": self.timer_runs,
        }


# --------------------------------------------------------------------------------------------------- run


def _wait(
    trackers: list[_Tracker], config: CloudDemoConfig, on_progress: Callable[[list[CloudProgress]], None] | None
) -> None:
    """Until everything arrived or the last due time plus the grace period has passed."""
    last_due = max((max(t.due.values(), default=0.0) for t in trackers), default=0.0)
    deadline = last_due + config.grace_seconds
    while time.time() < deadline:
        if on_progress:
            on_progress([t.progress(time.time()) for t in trackers])
        if all(t.done() for t in trackers):
            time.sleep(0.5)  # let a late duplicate show up
            break
        time.sleep(0.2)
    if on_progress:
        on_progress([t.progress(time.time()) for t in trackers])


def run_cloud_demo(
    config: CloudDemoConfig | None = None,
    *,
    on_progress: Callable[[list[CloudProgress]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> CloudDemoResult:
    """Start the emulators, run the demo on both clouds, stop the emulators and return the summary."""
    config = config or CloudDemoConfig()
    status = on_status or (lambda _: None)
    started = time.monotonic()
    status("starting moto server and Azurite on loopback …")
    with LocalEmulators(moto=config.aws, azurite=config.azure) as emulators:
        aws_tracker, azure_tracker = _Tracker("aws"), _Tracker("azure")
        trackers = ([aws_tracker] if config.aws else []) + ([azure_tracker] if config.azure else [])
        aws = _AwsSide(emulators.sqs_endpoint, config, aws_tracker, verbose) if config.aws else None
        azure = _AzureSide(emulators.azure_connection_string, config, azure_tracker) if config.azure else None
        env = aws.env if aws else {}
        sides: list[_AwsSide | _AzureSide] = [side for side in (aws, azure) if side is not None]
        with _environment(env):
            try:
                status("provisioning queues, FIFO queues, table, lease container …")
                for side in sides:
                    side.provision()
                for side in sides:
                    side.start()
                status("sending …")
                if aws:
                    aws.send(_plan(config, "aws"))
                if azure:
                    azure.send(_plan(config, "azure"))
                status("dispatching …")
                _wait(trackers, config, on_progress)
                status("stopping …")
                summaries = []
                if aws:
                    summaries.append(aws_tracker.summary(aws.finish()))
                if azure:
                    summaries.append(azure_tracker.summary(azure.finish()))
            finally:
                for side in sides:
                    side.close()
    caps = {}
    if aws:
        caps["sqs_native_and_hop_seconds"] = aws.settings.max_native_delay
    if azure:
        caps["azure_native_seconds"] = azure.native_cap
    return CloudDemoResult(
        clouds=summaries,
        compression=config.compression,
        year_seconds=config.year_seconds,
        native_caps=caps,
        seconds=round(time.monotonic() - started, 1),
    )
