"""The cloud demo's S3 time-bucket tier on moto: the sender's bucket route, the ingest function behind a local event
source, the timer every ``TIER_TIMER_PERIOD`` seconds, cancel / reschedule records applied by the timer."""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.demo.cloud_model import CANCELLATION_TABLE, FUNCTION_STDOUT_LOCK, YEAR, CloudDemoConfig
from delayed_delivery.app.demo.cloud_tracking import Planned, Tracker, message_body, percentile, plan_messages
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from delayed_delivery.aws.settings import SqsSettings
    from delayed_delivery.aws.tier.config import BucketTierConfig
    from delayed_delivery.aws.tier.timer import TimerResult

__all__ = [
    "TIER_BUCKET",
    "TIER_CLOUD",
    "TIER_INGEST_QUEUE",
    "TIER_TIMER_PERIOD",
    "TierSide",
    "demo_tier",
    "tier_summary_rows",
]

#: The tier's tracker name; its message ids start with it, which is how the AWS collectors tell them apart.
TIER_CLOUD = "aws-tier"
TIER_BUCKET = "delayed-delivery-demo-tier"
TIER_INGEST_QUEUE = "delayed-delivery-ingest"
#: The timer runs every minute in the cloud; here every half second (a fine bucket is 1 s).
TIER_TIMER_PERIOD = 0.5


def demo_tier(settings: DelayedDeliverySettings, sqs_settings: SqsSettings) -> BucketTierConfig:
    """The demo's tier: the bucket route and compressed buckets: fine 1 s, coarse 2 s, dispatch lead 2 s.

    A "1 year" message (8 s or more) is then written to a coarse bucket, split into fine ones 3 to 5 s before it
    is due, and dispatched 2 to 3 s before, with ``DelaySeconds`` for the rest.
    """
    from delayed_delivery.aws.settings import LongDelayRoute
    from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings

    return BucketTierConfig(
        TIER_BUCKET,
        settings=settings,
        sqs_settings=replace(
            sqs_settings, long_delay_route=LongDelayRoute.BUCKETS, bucket_ingest_queue=TIER_INGEST_QUEUE
        ),
        tier_settings=TierSettings(bucket_fine_seconds=1, bucket_coarse_seconds=2, bucket_dispatch_lead_seconds=2),
        cancellation_table=CANCELLATION_TABLE,
    )


class TierSide:
    """The tier on moto: provisioned, fed by the bucket route, drained by the ingest function and the timer."""

    def __init__(
        self,
        client: Callable[[str], Any],
        config: CloudDemoConfig,
        base: DelayedDeliverySettings,
        base_sqs: SqsSettings,
        verbose: bool,
    ) -> None:
        from delayed_delivery.testing.aws import RequestCounter

        self.config = config
        self.verbose = verbose
        self.tier = demo_tier(base, base_sqs)
        self.settings, self.sqs_settings = self.tier.settings, self.tier.sqs_settings
        self.tracker = Tracker(TIER_CLOUD)
        self.sender_client: SQSClient = client("sqs")
        self.ingest_sqs, self.timer_sqs, self.poll_client = client("sqs"), client("sqs"), client("sqs")
        self.ingest_s3, self.timer_s3 = client("s3"), client("s3")
        self.dynamodb = client("dynamodb")
        self.sends = RequestCounter().attach(self.sender_client)
        self.s3_requests: Counter[str] = Counter()
        self.objects_written: Counter[str] = Counter()
        for s3 in (self.ingest_s3, self.timer_s3):
            s3.meta.events.register("before-send.s3.*", self._count_s3)
            s3.meta.events.register("before-parameter-build.s3.PutObject", self._count_put)
        self.runs: list[TimerResult] = []
        #: Ids the sender routed to the tier, with the due time the tier got (send + whole seconds; epoch s).
        self.bucketed: dict[str, float] = {}
        self.failures: Counter[str] = Counter()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.poller: Any = None

    def _count_s3(self, **kwargs: Any) -> None:
        self.s3_requests[str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]] += 1

    def _count_put(self, **kwargs: Any) -> None:
        key = str(kwargs.get("params", {}).get("Key", ""))
        level = next((name for name in ("coarse", "fine", "leases") if f"/{name}/" in key), "other")
        self.objects_written[level] += 1

    def provision(self, admin: SQSClient) -> None:
        """The S3 bucket and the ingest queue, and a local event source on it running the ingest function."""
        from delayed_delivery.testing.aws import LocalEventSourcePoller

        self.ingest_s3.create_bucket(Bucket=TIER_BUCKET)
        url = admin.create_queue(QueueName=TIER_INGEST_QUEUE, Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
        arn = admin.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.poller = LocalEventSourcePoller(self.poll_client, url, arn, self._ingest_function())

    def _sink(self) -> Any:
        """Where the functions' Powertools output goes: stderr with --verbose, else nowhere."""
        return sys.stderr if self.verbose else io.StringIO()

    def _ingest_function(self) -> Callable[[dict[str, Any], Any], Any]:
        """The ingest Lambda's handler, one invocation at a time."""
        from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler

        with contextlib.redirect_stdout(self._sink()):
            handler = build_ingest_handler(self.tier, s3=self.ingest_s3, sqs=self.ingest_sqs)

        def one_at_a_time(event: dict[str, Any], context: Any) -> Any:
            with FUNCTION_STDOUT_LOCK, contextlib.redirect_stdout(self._sink()):
                return handler(event, context)

        return one_at_a_time

    def start(self) -> None:
        """Start the ingest event source and the timer."""
        self.poller.start()
        self.thread = threading.Thread(target=self._timer_loop, name="tier-timer", daemon=True)
        self.thread.start()

    def _timer_loop(self) -> None:
        """Run the timer every ``TIER_TIMER_PERIOD`` seconds, as its EventBridge schedule does every minute."""
        from delayed_delivery.aws.cancellations import DynamoDbCancellationStore
        from delayed_delivery.aws.tier.config import TierSettings
        from delayed_delivery.aws.tier.store import S3BucketStore
        from delayed_delivery.aws.tier.timer import BucketTimer
        from delayed_delivery.cancellations import CancellationCache
        from delayed_delivery.clock import SystemClock

        records = CancellationCache(DynamoDbCancellationStore(self.dynamodb, CANCELLATION_TABLE), max_age=0)
        timer = BucketTimer(
            S3BucketStore.from_config(self.timer_s3, self.tier),
            self.timer_sqs,
            self.settings,
            SystemClock(),
            cancellations=records,
            owner="demo-timer",
            tier=TierSettings().with_(bucket_send_phase_ms=self.tier.tier_settings.bucket_send_phase_ms),
        )
        while not self.stop.wait(TIER_TIMER_PERIOD):
            try:
                self.runs.append(timer.run())
            except Exception as exc:  # a failed run is retried by the next one, as on the schedule
                self.failures[type(exc).__name__] += 1

    def send(self) -> None:
        """The demo's mix through the bucket route, one cancelled "1 year" and one "90 days" moved to "1 year"."""
        from delayed_delivery.aws.sender import SqsDelayedSender

        sender = SqsDelayedSender(self.sender_client, self.settings, sqs_settings=self.sqs_settings)
        for p in plan_messages(self.config, TIER_CLOUD):
            self._send(sender, p, p.label)
        self._cancel_and_reschedule(sender)

    def _send(self, sender: Any, p: Planned, label: str) -> None:
        started = time.time()
        receipt = sender.send_delayed(
            p.destination, message_body(p.message_id, label), p.delay, message_id=p.message_id
        )
        self.tracker.expect(p.message_id, label, started + p.delay, receipt.route.value)
        if receipt.route.value == "buckets":
            self.bucketed[p.message_id] = started + receipt.delay_seconds

    def _cancel_and_reschedule(self, sender: Any) -> None:
        """Records the timer applies: at the cascade of the "1 year" bucket, at the dispatch of the "90 days" one."""
        from delayed_delivery.aws.cancellations import DynamoDbCancellationStore
        from delayed_delivery.cancellations import cancel_request, reschedule_request, tier_record_ttl

        table = DynamoDbCancellationStore(self.dynamodb, CANCELLATION_TABLE)
        year = YEAR / self.config.compression
        cancelled = Planned(f"{TIER_CLOUD}-cancel-{time.time_ns() % 10**8}", "cancelled", "orders", year)
        self._send(sender, cancelled, "cancelled")
        now = datetime.now(UTC)
        due = now + timedelta(seconds=year)
        table.put(
            cancel_request("orders", cancelled.message_id, now=now, max_native_delay=0, max_age=0,
                           ttl=tier_record_ttl(now, due))
        )  # fmt: skip
        self.tracker.cancelled.add(cancelled.message_id)
        moved = Planned(f"{TIER_CLOUD}-reschedule-{time.time_ns() % 10**8}", "rescheduled", "billing", year / 4)
        self._send(sender, moved, "rescheduled")
        now = datetime.now(UTC)
        new_due = now + timedelta(seconds=year)
        table.put(reschedule_request("billing", moved.message_id, new_due, now=now, ttl=tier_record_ttl(now)))
        self.tracker.rescheduled.add(moved.message_id)
        self.tracker.expect(moved.message_id, "rescheduled", new_due.timestamp(), "buckets")
        self.bucketed[moved.message_id] = new_due.timestamp()

    def close(self) -> None:
        """Stop the event source and the timer."""
        self.stop.set()
        if self.poller is not None:
            self.poller.stop()
        if self.thread is not None:
            self.thread.join(10)

    def finish(self) -> dict[str, Any]:
        """Stop, then the tier's figures: deliveries and lateness, objects, cascades, duplicates, requests."""
        self.close()
        summary = self.tracker.summary({})
        t = self.tracker
        late = [t.arrivals[m][0] - due for m, due in sorted(self.bucketed.items()) if m in t.arrivals]
        total: Counter[str] = Counter()
        for run in self.runs:
            total.update({k: v for k, v in asdict(run).items() if isinstance(v, int) and not isinstance(v, bool)})
        return {
            "messages": summary.sent,
            "expected_deliveries": summary.expected_deliveries,
            "delivered": summary.delivered,
            "lost": summary.lost,
            "duplicates": summary.duplicates,
            "early": summary.early,
            "cancelled": summary.cancelled,
            "cancelled_but_delivered": summary.cancelled_but_delivered,
            "rescheduled": summary.rescheduled,
            "rescheduled_lateness": summary.rescheduled_lateness,
            "error_queue": summary.error_queue,
            "lateness_p50": summary.lateness_p50,
            "lateness_p99": summary.lateness_p99,
            "lateness_max": summary.lateness_max,
            "bucketed": len(self.bucketed),
            "bucketed_lateness_p50": round(percentile(late, 50), 3),
            "bucketed_lateness_p99": round(percentile(late, 99), 3),
            "bucketed_lateness_max": round(max(late, default=0.0), 3),
            "bucketed_early": sum(1 for x in late if x < -0.001),
            "routes": summary.routes,
            "by_delay": summary.by_delay,
            "objects_written": {k: self.objects_written[k] for k in ("coarse", "fine")},
            "cascades": total["cascaded_objects"],
            "cascaded_messages": total["cascaded_messages"],
            "dispatched": total["dispatched"],
            "duplicates_skipped": total["duplicates_skipped"],
            "records_applied": {"cancelled": total["cancelled"], "rescheduled": total["rescheduled"]},
            "to_error_queue": total["to_error_queue"],
            "timer_runs": len(self.runs),
            "timer_failures": dict(self.failures),
            "ingest_invocations": self.poller.stats.invocations if self.poller is not None else 0,
            "s3_requests": dict(sorted(self.s3_requests.items())),
            "send_requests": self.sends.total,
        }


def tier_summary_rows(b: dict[str, Any]) -> list[tuple[str, str]]:
    """The tier's rows of the demo's summary table (label, AWS value) from ``CloudSummary.buckets``."""
    written = b["objects_written"]
    late = ", ".join("-" if x is None else f"{x:+.1f} s" for x in b["rescheduled_lateness"])
    return [
        ("S3 tier: delivered / expected", f"{b['delivered']} / {b['expected_deliveries']}"),
        ("S3 tier: lost, duplicates, early (bucketed)", f"{b['lost']}, {b['duplicates']}, {b['bucketed_early']}"),
        ("S3 tier: bucketed messages (native)", f"{b['bucketed']} ({b['routes'].get('native', 0)})"),
        ("S3 tier: objects written coarse / fine", f"{written['coarse']} / {written['fine']}"),
        ("S3 tier: cascades (messages)", f"{b['cascades']} ({b['cascaded_messages']})"),
        ("S3 tier: dispatched, duplicates skipped", f"{b['dispatched']}, {b['duplicates_skipped']}"),
        ("S3 tier: cancelled (delivered anyway)", f"{b['cancelled']} ({b['cancelled_but_delivered']})"),
        ("S3 tier: rescheduled (after the new due)", f"{b['rescheduled']} ({late})"),
        (
            "S3 tier: bucketed lateness p50 / p99 (s)",
            f"{b['bucketed_lateness_p50']:.2f} / {b['bucketed_lateness_p99']:.2f}",
        ),
        ("S3 tier: timer runs, ingest invocations", f"{b['timer_runs']}, {b['ingest_invocations']}"),
    ]
