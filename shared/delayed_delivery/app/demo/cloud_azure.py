"""The cloud demo's Azure side: Storage Queues, table and leases on Azurite, the registered timer function."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.demo.cloud_model import (
    AZURE_ENDPOINT,
    DEMO_AZURE_CONCURRENCY,
    DESTINATIONS,
    ERROR_QUEUE,
    TIMER_DUTY,
    YEAR,
    CloudDemoConfig,
)
from delayed_delivery.app.demo.cloud_recurring import RECURRING_QUEUE, RecurringSchedule
from delayed_delivery.app.demo.cloud_release import CAPPED_QUEUE, CAPPED_RATE, CappedBurst, ReleaseReports
from delayed_delivery.app.demo.cloud_tracking import Planned, Tracker, message_body
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.release import ReleaseRates
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from delayed_delivery.azure.config import AzureClients
    from delayed_delivery.azure.runner import AzureDispatcherHost
    from delayed_delivery.azure.schedules.store import TableScheduleStore
    from delayed_delivery.azure.schedules.timer import AzureScheduleTimer

__all__ = ["TIMER_FUNCTION", "AzureSide", "registered_timer"]

#: The one function the Azure function app registers (its timer).
TIMER_FUNCTION = "dispatch_delayed_messages"
#: Seconds between schedule-timer passes (the function app's runs every minute; the demo's schedule fires every few
#: seconds) and how far ahead a pass writes occurrence rows.
_SCHEDULE_PASS_EVERY, _SCHEDULE_LEAD = 2.0, 8
#: How azure-functions' ``get_functions()`` starts the notice it logs on the root logger for an app without HTTP.
_AUTH_LEVEL_NOTICE = "Auth level is not applied to non http function app"


class _DropAuthLevelNotice(logging.Filter):
    """Drops azure-functions' auth-level notice (the app has no HTTP function; nothing to act on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_AUTH_LEVEL_NOTICE)


class _LastResort(logging.Handler):
    """Hands a record to ``logging.lastResort``: what the root logger does while it has no handler of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        last = logging.lastResort
        if last is not None and record.levelno >= last.level:
            last.handle(record)


@contextlib.contextmanager
def _without_auth_level_notice() -> Iterator[None]:
    """Within: the root logger drops that one notice; every other record is handled as before."""
    root = logging.getLogger()
    notice_filter = _DropAuthLevelNotice()
    # logging.warning() on a root logger without handlers first calls basicConfig(), which would leave a stderr
    # handler on the root logger for the rest of the process: a stand-in for the last resort avoids that.
    stand_in = _LastResort() if not root.handlers else None
    if stand_in is not None:
        root.addHandler(stand_in)
    root.addFilter(notice_filter)
    try:
        yield
    finally:
        root.removeFilter(notice_filter)
        if stand_in is not None:
            root.removeHandler(stand_in)


def registered_timer(host: AzureDispatcherHost) -> Callable[[Any], Any]:
    """The function app's registered timer function, as the Functions host finds it, running on ``host``."""
    from delayed_delivery.azure import function_host
    from delayed_delivery.azure.app_files import function_app

    # azure-functions lets the registry be read once per process: reset its bindings around our read so
    # that an earlier or a later reader (another harness in the same process) still works.
    function_app.app.functions_bindings = None
    try:
        with _without_auth_level_notice():
            registered = function_app.app.get_functions()
    finally:
        function_app.app.functions_bindings = None
    by_name = {f.get_function_name(): f for f in registered}
    timer: Callable[[Any], Any] = by_name[TIMER_FUNCTION].get_user_function()
    function_host.use_host(host)
    return timer


def _release_host() -> None:
    """The function app goes back to the host it builds from app settings."""
    from delayed_delivery.azure import function_host

    function_host.use_host(None)


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


class AzureSide:
    """Storage Queues, table and leases on Azurite: sender, the registered timer function on a schedule, collectors."""

    def __init__(self, connection_string: str, config: CloudDemoConfig, tracker: Tracker) -> None:
        from azure.storage.queue import QueueServiceClient

        from delayed_delivery.azure.config import AzureDelayedDeliveryConfig

        self.connection_string = connection_string
        self.config = config
        self.tracker = tracker
        self.native_cap = max(1, round(7 * 86_400 / config.compression))
        self.tally = _RequestTally()
        self.azure_config = AzureDelayedDeliveryConfig.for_endpoint(
            AZURE_ENDPOINT,
            connection_string=connection_string,
            shards=config.azure_shards,
            lease_seconds=15,
            run_seconds=config.timer_period * TIMER_DUTY,
            settings=DelayedDeliverySettings(
                error_queue=ERROR_QUEUE,
                max_concurrency=DEMO_AZURE_CONCURRENCY,
                release_rates=ReleaseRates.of({CAPPED_QUEUE: CAPPED_RATE}),
            ),
        )
        #: The capped destination's burst, and the shard runs' reports (its release lags and slots).
        self.capped = CappedBurst()
        self.reports = ReleaseReports()
        #: The recurring schedule, materialized by the schedule timer into the delays table.
        self.recurring = RecurringSchedule("azure", config.year_seconds * 0.6)
        self.schedules: TableScheduleStore | None = None
        self.schedule_timer: AzureScheduleTimer | None = None
        self.sender_clients = self._clients("sender")
        self.host_clients = self._clients("function")
        self.collector = QueueServiceClient.from_connection_string(connection_string)
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.timer_runs = 0
        self.timer_function: Callable[[Any], Any] | None = None

    def _clients(self, role: str) -> AzureClients:
        """What ``AzureClients.create`` builds (same pooled transports), plus a request counter per service."""
        from azure.data.tables import TableServiceClient
        from azure.storage.blob import BlobServiceClient
        from azure.storage.queue import QueueServiceClient

        from delayed_delivery.azure.config import AzureClients, http_transport

        pool = max(10, DEMO_AZURE_CONCURRENCY + 4)
        connection_string, tally = self.connection_string, self.tally
        return AzureClients(
            TableServiceClient.from_connection_string(
                connection_string, transport=http_transport(pool), raw_request_hook=tally.hook(f"{role}.table")
            ),
            BlobServiceClient.from_connection_string(
                connection_string, transport=http_transport(10), raw_request_hook=tally.hook(f"{role}.blob")
            ),
            QueueServiceClient.from_connection_string(
                connection_string, transport=http_transport(pool), raw_request_hook=tally.hook(f"{role}.queue")
            ),
        )

    def provision(self) -> None:
        """Create the table, lease container and queues; the timer function runs on the counted host."""
        from delayed_delivery.azure.runner import AzureDispatcherHost
        from delayed_delivery.azure.sender import AzureDelayedSender
        from delayed_delivery.azure.storage_queue import StorageQueueTransport
        from delayed_delivery.azure.table_store import TableDelayedMessageStore

        self.host = AzureDispatcherHost(self.azure_config, self.host_clients, metrics=self.reports)
        self.host.setup_infrastructure()
        transport = StorageQueueTransport(self.sender_clients.queues)
        for queue in (*DESTINATIONS, CAPPED_QUEUE, RECURRING_QUEUE, ERROR_QUEUE):
            transport.create_queue(queue)
        self._provision_schedules()
        self.store = TableDelayedMessageStore(
            self.sender_clients.tables.get_table_client(self.azure_config.table_name),
            shards=self.azure_config.shards,
            claim_timeout=self.azure_config.claim_timeout,
        )
        self.sender = AzureDelayedSender(
            transport, self.store, self.azure_config.settings, max_native_delay=self.native_cap
        )
        self.timer_function = registered_timer(self.host)
        self.tally.reset()

    def _provision_schedules(self) -> None:
        """The schedules table beside the delays table, and the schedule timer on clients of its own (its requests are
        not counted in the dispatcher's per-message figures)."""
        from delayed_delivery.azure.schedules.config import schedule_table_name
        from delayed_delivery.azure.schedules.occurrence_rows import OccurrenceRows
        from delayed_delivery.azure.schedules.store import TableScheduleStore
        from delayed_delivery.azure.schedules.timer import AzureScheduleTimer
        from delayed_delivery.azure.table_store import TableDelayedMessageStore

        clients = self._clients("schedules")
        table = schedule_table_name(self.azure_config.table_name)
        self.schedules = TableScheduleStore(clients.tables.get_table_client(table))
        self.schedules.setup_infrastructure()
        delays = TableDelayedMessageStore(
            clients.tables.get_table_client(self.azure_config.table_name), shards=self.azure_config.shards
        )
        self.schedule_timer = AzureScheduleTimer(
            self.schedules,
            OccurrenceRows(delays),
            clients.blobs.get_container_client(self.azure_config.container_name),
            lead_seconds=_SCHEDULE_LEAD,
            lease_seconds=15,
            budget_seconds=_SCHEDULE_PASS_EVERY * 3,
        )

    def _schedule_passes(self) -> None:
        """A schedule-timer pass every ``_SCHEDULE_PASS_EVERY`` seconds (the function app's second timer)."""
        from delayed_delivery.azure.schedules.rows import shard_of

        while self.schedule_timer is not None and not self.stop.is_set():
            with contextlib.suppress(Exception):  # the schedule's own shard only (the function's pass works all 16)
                self.schedule_timer.run_shard(shard_of(self.recurring.schedule_id), time.monotonic() + 5)
            self.stop.wait(_SCHEDULE_PASS_EVERY)

    def recurring_summary(self) -> dict[str, Any]:
        """The recurring schedule's figures, with the missed count its schedule row recorded."""
        stored = self.schedules.get(self.recurring.schedule_id) if self.schedules is not None else None
        return self.recurring.summary(stored.missed if stored is not None else 0)

    def start(self) -> None:
        """Start the timers and a collector per destination and error queue."""
        timer = threading.Thread(target=self._timer, name="azure-timer", daemon=True)
        timer.start()
        self.threads.append(timer)
        schedules = threading.Thread(target=self._schedule_passes, name="azure-schedule-timer", daemon=True)
        schedules.start()
        self.threads.append(schedules)
        for queue in (*DESTINATIONS, CAPPED_QUEUE, RECURRING_QUEUE, ERROR_QUEUE):
            thread = threading.Thread(target=self._collect, args=(queue,), name=f"collect-azq-{queue}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _timer(self) -> None:
        """Fire the registered timer function every ``timer_period`` seconds, running on the demo's counted host."""
        from azure.functions.timer import TimerRequest

        if self.timer_function is None:
            return
        next_fire = time.monotonic()
        while not self.stop.is_set():
            self.timer_runs += 1
            with contextlib.suppress(Exception):
                self.timer_function(TimerRequest(past_due=False))
            next_fire += self.config.timer_period
            self.stop.wait(max(0.0, next_fire - time.monotonic()))

    def _collect(self, queue: str) -> None:
        from delayed_delivery.azure.receive import ConsumerMetrics, delivered_from_queue_message, observe_lateness
        from delayed_delivery.azure.storage_queue import decode_envelope

        client = self.collector.get_queue_client(queue)
        tracker = {CAPPED_QUEUE: self.capped.tracker, RECURRING_QUEUE: self.recurring.tracker}.get(queue, self.tracker)
        metrics = ConsumerMetrics()
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
                    tracker.arrived(envelope.message_id, now)
                    with contextlib.suppress(DelayedDeliveryError):  # counted above; this only logs `consumed`
                        observe_lateness(delivered_from_queue_message(m, destination=queue), metrics)
                with contextlib.suppress(Exception):
                    client.delete_message(m)
            if not batch:
                self.stop.wait(0.2)

    def send(self, planned: list[Planned]) -> None:
        """Send the mix, the poison messages, one cancelled and one rescheduled message, the capped burst, and create
        the recurring schedule."""
        for p in planned:
            body = message_body(p.message_id, p.label).encode()
            result = self.sender.send(p.destination, body, delay=p.delay, message_id=p.message_id)
            self.tracker.expect(p.message_id, p.label, result.due_at.timestamp(), result.route)
        for i in range(self.config.poison_per_cloud):
            message_id = f"azure-poison-{i}-{uuid.uuid4().hex[:8]}"
            delay = (30 + 30 * i) * 86_400 / self.config.compression
            result = self.sender.send(
                "no-such-queue",
                message_body(message_id, "poison").encode(),
                delay=delay,
                message_id=message_id,
                cancellable=True,  # the table route: the queue is checked only when the row falls due
            )
            self.tracker.poison.add(message_id)
            self.tracker.expect(message_id, "poison", result.due_at.timestamp(), result.route)
        self._cancel_and_reschedule()
        self.capped.send(self.sender)
        if self.schedules is not None:
            self.schedules.create(self.recurring.schedule())

    def _cancel_and_reschedule(self) -> None:
        """One cancellable "1 year" message cancelled at once, one "1 year" message moved to "90 days"."""
        cancel_id = f"azure-cancel-{uuid.uuid4().hex[:8]}"
        body = message_body(cancel_id, "1 year, cancelled").encode()
        # A year, not 30 days: a cancel that comes when the row is already due races its dispatch (docs/azure.md).
        delay = YEAR / self.config.compression
        result = self.sender.send("orders", body, delay=delay, message_id=cancel_id, cancellable=True)
        self.tracker.expect(cancel_id, "cancelled", result.due_at.timestamp(), result.route)
        if self.sender.cancel(cancel_id):
            self.tracker.cancelled.add(cancel_id)
        moved_id = f"azure-reschedule-{uuid.uuid4().hex[:8]}"
        body = message_body(moved_id, "1 year → 90 days").encode()
        delay = YEAR / self.config.compression
        result = self.sender.send("billing", body, delay=delay, message_id=moved_id, cancellable=True)
        new_due = datetime.now(UTC) + timedelta(seconds=90 * 86_400 / self.config.compression)
        if self.store.reschedule(moved_id, new_due):
            self.tracker.rescheduled.add(moved_id)
            self.tracker.expect(moved_id, "rescheduled", new_due.timestamp(), result.route)
        else:
            self.tracker.expect(moved_id, "rescheduled", result.due_at.timestamp(), result.route)

    def close(self) -> None:
        """Stop the timer and the collectors (a running dispatcher run ends at its budget), release the host."""
        self.stop.set()
        for thread in self.threads:
            thread.join(self.azure_config.run_seconds + 10)
        if self.timer_function is not None:
            _release_host()

    def finish(self) -> dict[str, float]:
        """Stop, then the request counts."""
        self.close()
        counts = self.tally.snapshot()
        capped = self.capped.tracker  # its requests are in the counts: so are its messages
        messages = max(1, len(self.tracker.due) + len(capped.due))
        table_messages = self.tracker.routes.get("table", 0) + capped.routes.get("table", 0)
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
