"""The cloud demo's AWS side: SQS and DynamoDB on moto server, the requeue handler behind local event sources."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.demo.cloud_buckets import TIER_CLOUD, TierSide
from delayed_delivery.app.demo.cloud_model import (
    CANCELLATION_TABLE,
    DESTINATIONS,
    ERROR_QUEUE,
    FUNCTION_STDOUT_LOCK,
    YEAR,
    CloudDemoConfig,
)
from delayed_delivery.app.demo.cloud_recurring import RECURRING_QUEUE, RecurringSchedule
from delayed_delivery.app.demo.cloud_tracking import Planned, Tracker, message_body, message_id_of
from delayed_delivery.aws.settings import LongDelayRoute, SqsSettings
from delayed_delivery.errors import DelayedDeliveryError
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
    from delayed_delivery.aws.schedules.timer import ScheduleTimer
    from delayed_delivery.aws.sender import SqsDelayedSender

__all__ = ["AwsSide"]

#: moto accepts any credentials; fixed ones keep the demo away from real ones.
_EMULATOR_KEY = "testing"
_REGION = "us-east-1"
#: The demo's schedules table, seconds between schedule-timer passes (the Lambda's rule is every minute; the demo's
#: schedule fires every few seconds) and how far ahead a pass sends occurrences (with DelaySeconds).
_SCHEDULE_TABLE, _SCHEDULE_PASS_EVERY, _SCHEDULE_LEAD = "demo-schedules", 2.0, 8


class AwsSide:
    """SQS on moto server: endpoints, sender, the Lambda handler behind local event sources, collectors."""

    def __init__(self, endpoint_url: str, config: CloudDemoConfig, tracker: Tracker, verbose: bool) -> None:
        from delayed_delivery.testing.aws import RequestCounter

        self.endpoint_url = endpoint_url
        self.config = config
        self.tracker = tracker
        self.verbose = verbose
        cap = max(1, round(900 / config.compression))
        self.settings = DelayedDeliverySettings(error_queue=ERROR_QUEUE)
        # the -delay.fifo route's side (the tier's side is demo_tier's): not whatever long_delay_route defaults to
        self.sqs_settings = SqsSettings(
            max_native_delay=cap, fifo_queue_delay=cap, long_delay_route=LongDelayRoute.FIFO
        )
        self.admin, self.sender_client, self.lambda_client, self.poll_client = (self._sqs() for _ in range(4))
        self.dynamodb: DynamoDBClient = self._client("dynamodb")
        self.record_requests: Counter[str] = Counter()
        # what the handler did, per message (an envelope record counts each message inside it) and per park record
        self.outcomes = Counter[str]()
        self.dynamodb.meta.events.register(
            "before-send.dynamodb.*", lambda **kw: self.record_requests.update([kw["event_name"].rsplit(".", 1)[-1]])
        )
        self.collect_clients = {q: self._sqs() for q in (*DESTINATIONS, RECURRING_QUEUE, ERROR_QUEUE)}
        #: The recurring schedule, sent straight to its queue by the schedule timer.
        self.recurring = RecurringSchedule("aws", config.year_seconds * 0.6)
        self.schedules: DynamoDbScheduleStore | None = None
        self.schedule_timer: ScheduleTimer | None = None
        self.recurring_shard = 0
        self.sends = RequestCounter().attach(self.sender_client)
        self.hops = RequestCounter().attach(self.lambda_client)
        self.polls = RequestCounter().attach(self.poll_client)
        self.pollers: list[Any] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        #: The S3 time-bucket tier beside the FIFO route (its own tracker; ``None`` when the demo leaves it out).
        self.tier: TierSide | None = (
            TierSide(self._client, config, self.settings, self.sqs_settings, verbose) if config.buckets else None
        )

    def _client(self, service: str) -> Any:
        """A boto3 client on moto server with the emulator's fixed credentials."""
        import boto3

        return boto3.client(
            service,  # type: ignore[call-overload]
            endpoint_url=self.endpoint_url,
            region_name=_REGION,
            aws_access_key_id=_EMULATOR_KEY,
            aws_secret_access_key=_EMULATOR_KEY,
        )

    def _sqs(self) -> SQSClient:
        """An SQS client of its own (each role's requests are counted apart)."""
        client: SQSClient = self._client("sqs")
        return client

    @property
    def env(self) -> dict[str, str]:
        """What the CDK stack sets on the function, with the compressed caps."""
        return {
            "DELAYED_DELIVERY_MAX_NATIVE_DELAY": str(self.sqs_settings.max_native_delay),
            "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": str(self.sqs_settings.fifo_queue_delay),
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
        """Create the cancellation table and each destination's queues, and put a poller on each -delay.fifo."""
        from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
        from delayed_delivery.aws.queues import ensure_endpoint
        from delayed_delivery.testing.aws import LocalEventSourcePoller

        ensure_cancellation_table(self.dynamodb, CANCELLATION_TABLE)
        self.records = DynamoDbCancellationStore(self.dynamodb, CANCELLATION_TABLE)
        invoke = self._lambda()
        for queue in DESTINATIONS:
            endpoint = ensure_endpoint(
                self.admin, queue, self.settings, sqs_settings=self.sqs_settings, visibility_timeout=5
            )
            self.pollers.append(
                LocalEventSourcePoller(self.poll_client, endpoint.delay_url, endpoint.delay_arn, invoke)
            )
        self.admin.create_queue(QueueName=RECURRING_QUEUE)
        self.urls = {
            q: self.admin.get_queue_url(QueueName=q)["QueueUrl"] for q in (*DESTINATIONS, RECURRING_QUEUE, ERROR_QUEUE)
        }
        self._provision_schedules()
        self.delay_urls = {q: self.admin.get_queue_url(QueueName=f"{q}-delay.fifo")["QueueUrl"] for q in DESTINATIONS}
        if self.tier is not None:
            self.tier.provision(self.admin)

    def _provision_schedules(self) -> None:
        """The schedules table and the schedule timer (what the every-minute Lambda runs), on moto server."""
        from delayed_delivery.aws.schedules.layout import shard_of
        from delayed_delivery.aws.schedules.sends import OccurrenceSender
        from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
        from delayed_delivery.aws.schedules.timer import ScheduleTimer
        from delayed_delivery.clock import SystemClock

        clock = SystemClock()
        self.schedules = DynamoDbScheduleStore(self._client("dynamodb"), _SCHEDULE_TABLE, clock=clock)
        self.schedules.setup_infrastructure()
        sender = OccurrenceSender(self._sqs(), ERROR_QUEUE, clock)
        self.schedule_timer = ScheduleTimer(self.schedules, sender, clock, lead_seconds=_SCHEDULE_LEAD)
        self.recurring_shard = shard_of(self.recurring.schedule_id)

    def _schedule_passes(self) -> None:
        """A schedule-timer pass every ``_SCHEDULE_PASS_EVERY`` seconds."""
        while self.schedule_timer is not None and not self.stop.is_set():
            with contextlib.suppress(Exception):  # the schedule's own shard only (the Lambda's pass works all 16)
                self.schedule_timer.run(shards=range(self.recurring_shard, self.recurring_shard + 1))
            self.stop.wait(_SCHEDULE_PASS_EVERY)

    def recurring_summary(self) -> dict[str, Any]:
        """The recurring schedule's figures, with the missed count its schedule recorded."""
        stored = self.schedules.get(self.recurring.schedule_id) if self.schedules is not None else None
        return self.recurring.summary(stored.missed if stored is not None else 0)

    def _lambda(self) -> Callable[[dict[str, Any], Any], Any]:
        """The requeue handler, as one Lambda sandbox runs it: one invocation at a time."""
        from delayed_delivery.aws.requeue.handler import build_handler

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

        def one_at_a_time(event: dict[str, Any], context: Any) -> Any:
            with FUNCTION_STDOUT_LOCK, contextlib.redirect_stdout(sink()):
                return handler(event, context)

        return one_at_a_time

    def _count_outcomes(self, results: list[Any]) -> None:
        """Tally one invocation's outcomes per message (called inside the one-at-a-time lock)."""
        self.outcomes.update(str(each.outcome) for r in results for each in r.per_message())
        self.outcomes.update(park_records=sum(1 for r in results if str(r.outcome) == "parked"))

    def start(self) -> None:
        """Start the pollers and a collector per destination and error queue."""
        for poller in self.pollers:
            poller.start()
        if self.tier is not None:
            self.tier.start()
        schedules = threading.Thread(target=self._schedule_passes, name="aws-schedule-timer", daemon=True)
        schedules.start()
        self.threads.append(schedules)
        for queue in (*DESTINATIONS, RECURRING_QUEUE, ERROR_QUEUE):
            thread = threading.Thread(target=self._collect, args=(queue,), name=f"collect-sqs-{queue}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _collect(self, queue: str) -> None:
        from delayed_delivery.aws.receive import delivered_from_boto3, observe_lateness

        client = self.collect_clients[queue]
        while not self.stop.is_set():
            try:
                reply = client.receive_message(
                    QueueUrl=self.urls[queue],
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=1,
                    MessageAttributeNames=["All"],
                    AttributeNames=["All"],
                )
            except Exception:
                time.sleep(0.2)
                continue
            now = time.time()
            messages = reply.get("Messages", [])
            for m in messages:
                if queue == RECURRING_QUEUE:  # an occurrence: its id is in the delivery header (the body is the
                    with contextlib.suppress(DelayedDeliveryError):  # template); logged `consumed` as Azure's is
                        delivered = delivered_from_boto3(m, destination=queue)
                        self.recurring.tracker.arrived(delivered.message_id, now)
                        observe_lateness(delivered)
                    continue
                message_id = message_id_of(m["Body"])
                tracker = self._tracker_of(message_id)
                if queue == ERROR_QUEUE:
                    tracker.errored(message_id)
                else:
                    tracker.arrived(message_id, now)
                    with contextlib.suppress(DelayedDeliveryError):  # counted above; this only logs `consumed`
                        observe_lateness(delivered_from_boto3(m, destination=queue))
            if messages:
                client.delete_message_batch(
                    QueueUrl=self.urls[queue],
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )

    def _tracker_of(self, message_id: str) -> Tracker:
        """The tier's tracker for its messages (ids starting ``aws-tier-``), else the FIFO route's."""
        if self.tier is not None and message_id.startswith(f"{TIER_CLOUD}-"):
            return self.tier.tracker
        return self.tracker

    def send(self, planned: list[Planned]) -> None:
        """Send the mix, the poison messages, one cancelled and one rescheduled message; create the schedule."""
        from delayed_delivery.aws.sender import SqsDelayedSender

        sender = SqsDelayedSender(self.sender_client, self.settings, sqs_settings=self.sqs_settings)
        for p in planned:
            started = time.time()
            body = message_body(p.message_id, p.label)
            receipt = sender.send_delayed(p.destination, body, p.delay, message_id=p.message_id)
            self.tracker.expect(p.message_id, p.label, started + p.delay, receipt.route.value)
        self._send_poison()
        self._cancel_and_reschedule(sender)
        if self.tier is not None:
            self.tier.send()
        if self.schedules is not None:
            self.schedules.create(self.recurring.schedule())

    def _send_poison(self) -> None:
        """Records on a -delay.fifo queue without (or with a malformed) delay attribute: the error queue's."""
        for i in range(self.config.poison_per_cloud):
            message_id = f"aws-poison-{i}-{uuid.uuid4().hex[:8]}"
            attributes: dict[str, Any] = {}
            if i % 2:
                attributes[DELAY_SECONDS_ATTRIBUTE] = {"DataType": "String", "StringValue": "soon"}
            self.sender_client.send_message(
                QueueUrl=self.delay_urls[DESTINATIONS[i % len(DESTINATIONS)]],
                MessageBody=message_body(message_id, "poison"),
                MessageAttributes=attributes,
                MessageGroupId=message_id,
                MessageDeduplicationId=f"{message_id}:0",
            )
            self.tracker.poison.add(message_id)
            self.tracker.expect(message_id, "poison", time.time(), "poison")

    def _cancel_and_reschedule(self, sender: SqsDelayedSender) -> None:
        """One "1 year" message cancelled and one "1 year" message moved to "90 days", by record, at once."""
        from delayed_delivery.cancellations import cancel_request, reschedule_request

        now = datetime.now(UTC)
        cancel_id = f"aws-cancel-{uuid.uuid4().hex[:8]}"
        delay = YEAR / self.config.compression  # surely on the hop cycle, however compressed
        body = message_body(cancel_id, "1 year, cancelled")
        receipt = sender.send_delayed("orders", body, delay, message_id=cancel_id)
        self.tracker.expect(cancel_id, "cancelled", time.time() + delay, receipt.route.value)
        self.records.put(
            cancel_request("orders", cancel_id, now=now, max_native_delay=self.sqs_settings.max_native_delay, max_age=0)
        )
        self.tracker.cancelled.add(cancel_id)
        moved_id = f"aws-reschedule-{uuid.uuid4().hex[:8]}"
        body = message_body(moved_id, "1 year → 90 days")
        receipt = sender.send_delayed("billing", body, YEAR / self.config.compression, message_id=moved_id)
        new_due = datetime.now(UTC) + timedelta(seconds=90 * 86_400 / self.config.compression)
        self.records.put(reschedule_request("billing", moved_id, new_due, now=datetime.now(UTC)))
        self.tracker.rescheduled.add(moved_id)
        self.tracker.expect(moved_id, "rescheduled", new_due.timestamp(), receipt.route.value)

    def close(self) -> None:
        """Stop the pollers and collectors."""
        self.stop.set()
        for poller in self.pollers:
            poller.stop()
        if self.tier is not None:
            self.tier.close()
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
