"""The S3 time-bucket tier counted per step at moto: sender, ingest Lambda, timer Lambda, under a manual clock.

Time is compressed (``SETTINGS``: fine buckets of 1 s for a minute, coarse of 10 s for a day, dispatch lead 2 s); a
timer run happens at every fine step of the clock, as the real one runs every minute. Traffic is explicit:
a number of messages a minute, all with one delay, sent in ``SENDS_PER_MINUTE`` batch calls a minute (one
``send_delayed_batch`` per 20 s of traffic) for a number of sends; the ingest queue's event source is simulated as
Lambda runs it (``EventSource``): it receives what arrives and invokes the ingest handler when it holds 1,000
records or 6 MB of them, or when its oldest record has waited the batching window (the CDK's, 300 s; the records
still held when the traffic stops wait for it too). Bodies (``BODIES``): ``order``, a 1 KiB JSON order
document; ``random``, 1 KiB of random URL-safe text (6 bits per character). ``near`` (1 d: due within the coarse
horizon) is written once; ``far`` (1 y: 365 coarse buckets ahead) twice, coarse then fine. The clock jumps over the
idle year: idle timer runs are the tier's fixed cost, counted apart (``idle`` runs before any message).
"""

from __future__ import annotations

import json
import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.costs.steps import StepCounter
from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import INGEST_WINDOW_SECONDS, BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer, TimerResult
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.clock import ManualClock
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws.poller import LocalLambdaContext, lambda_sqs_record

__all__ = ["BODIES", "LAMBDA_GB", "SCENARIOS", "SENDS_PER_MINUTE", "TierRun", "measure_tier", "order_body"]

FINE, COARSE, LEAD = 1, 10, 2
#: The delays, compressed: ``near`` = one coarse bucket (1 d), ``far`` = 365 coarse buckets (1 y).
SCENARIOS = {"near": COARSE, "far": 365 * COARSE}
#: The sender's batch calls per minute: each carries 20 s of traffic.
SENDS_PER_MINUTE = 3
#: The ingest event source's limits: records and bytes per invocation (Lambda's), and its batching window in sends.
INGEST_BATCH_RECORDS = 1_000
INGEST_BATCH_BYTES = 6 * 1024 * 1024
WINDOW_SENDS = INGEST_WINDOW_SECONDS * SENDS_PER_MINUTE // 60
#: Both functions get 512 MB in the CDK construct (infra/aws/buckets.py).
LAMBDA_GB = 0.5
BODY_BYTES = 1024
IDLE_RUNS = 5
#: What the measured messages carry.
BODIES = ("order", "random")


@dataclass(slots=True)
class TierRun:
    """What one run counted: billed requests per ``phase.step``, invocations and their seconds, timer results."""

    scenario: str
    messages: int
    #: The sender's batch calls (``SENDS_PER_MINUTE`` a minute).
    sends: int
    delay_seconds: int
    body: str = "order"
    steps: dict[str, dict[str, float]] = field(default_factory=dict)
    ingest_invocations: int = 0
    ingest_seconds: float = 0.0
    ingest_cpu: float = 0.0
    timer_runs: int = 0
    timer_seconds: float = 0.0
    timer_cpu: float = 0.0
    idle_runs: int = 0
    idle_seconds: float = 0.0
    idle_cpu: float = 0.0
    idle_lists: float = 0.0
    stored_bytes: int = 0
    stored_objects: int = 0
    timer: dict[str, float] = field(default_factory=dict)
    delivered: int = 0
    object_bytes: int = 0
    objects_written: dict[str, int] = field(default_factory=dict)


class _Phase:
    """The step group calls are counted under (``None``: set-up and checks, not counted)."""

    def __init__(self) -> None:
        self.name: str | None = None

    def __call__(self) -> str | None:
        return self.name


_WORDS = (
    "please",
    "leave",
    "at",
    "the",
    "back",
    "door",
    "ring",
    "twice",
    "gift",
    "wrap",
    "fragile",
    "handle",
    "with",
    "care",
    "deliver",
    "after",
    "noon",
    "call",
    "on",
    "arrival",
    "second",
    "floor",
    "blue",
    "gate",
    "no",
    "substitutions",
    "express",
    "partial",
    "shipment",
    "allowed",
)
_SKUS = ("desk lamp", "usb-c cable 2 m", "notebook a5 dotted", "espresso beans 1 kg", "wool socks", "phone case")


def order_body(i: int) -> str:
    """A 1 KiB JSON order document (customer, address, a few lines, totals, a note), varied by ``i``."""
    r = random.Random(i)
    lines: list[dict[str, Any]] = [
        {"sku": f"SKU-{r.randrange(10**6):06d}", "name": r.choice(_SKUS), "qty": r.randint(1, 5),
         "unitPrice": round(r.uniform(2, 200), 2)}
        for _ in range(r.randint(2, 4))
    ]  # fmt: skip
    doc = {
        "orderId": f"ord-{i:010d}",
        "placedAt": f"2031-01-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{r.randrange(60):02d}Z",
        "status": "PLACED",
        "customer": {"id": f"cus-{r.randrange(10**8):08d}", "name": f"Customer {r.randrange(10**5)}",
                     "email": f"customer{r.randrange(10**6)}@example.com"},
        "shipTo": {"street": f"{r.randint(1, 400)} {r.choice(_WORDS).title()} Street", "city": "Springfield",
                   "postcode": f"{r.randrange(10**5):05d}", "country": "US"},
        "lines": lines,
        "currency": "USD",
        "total": round(sum(x["qty"] * x["unitPrice"] for x in lines), 2),
        "note": "",
    }  # fmt: skip
    text = json.dumps(doc, separators=(",", ":"))
    note = " ".join(r.choice(_WORDS) for _ in range(BODY_BYTES // 3))[: max(0, BODY_BYTES - len(text))]
    return text.replace('"note":""', f'"note":"{note}"', 1)


def _body(i: int, kind: str) -> str:
    """The 1 KiB body of message ``i``: a JSON order document, or random text that does not compress."""
    if kind == "order":
        return order_body(i)
    return (f"message {i} " + secrets.token_urlsafe(BODY_BYTES))[:BODY_BYTES]


def _clients(endpoint: str) -> tuple[Any, Any, Any]:
    import boto3

    kw: dict[str, Any] = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "x",
        "aws_secret_access_key": "x",
    }
    return boto3.client("s3", **kw), boto3.client("sqs", **kw), boto3.client("dynamodb", **kw)


class EventSource:
    """Lambda's SQS event source on the ingest queue, simulated: it receives what arrives and holds it, and invokes
    the handler when it holds ``INGEST_BATCH_RECORDS`` records or ``INGEST_BATCH_BYTES`` of them, or when its oldest
    record has waited ``WINDOW_SENDS`` sends (the batching window); then deletes what the handler did not fail."""

    def __init__(self, sqs: Any, url: str, arn: str, handler: Any) -> None:
        self.sqs, self.url, self.arn, self.handler = sqs, url, arn, handler
        self.held: list[tuple[dict[str, Any], int]] = []
        self.oldest = 0

    def receive(self, now: int) -> None:
        """Take every record waiting in the queue (``now``: the send count, the event source's clock)."""
        while True:
            got = self.sqs.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=10,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                return
            if not self.held:
                self.oldest = now
            for m in got:
                record = lambda_sqs_record(m, self.arn, "us-east-1")
                self.held.append((record, len(json.dumps(record))))

    def due(self, now: int) -> bool:
        """Whether an invocation is due: a limit reached, or the oldest record held for the window."""
        if not self.held:
            return False
        records, size = len(self.held), sum(n for _, n in self.held)
        return records >= INGEST_BATCH_RECORDS or size >= INGEST_BATCH_BYTES or now - self.oldest >= WINDOW_SENDS

    def invoke(self, now: int) -> tuple[int, float, float]:
        """One invocation over the oldest records within the limits; records, wall and CPU seconds."""
        batch: list[dict[str, Any]] = []
        size = 0
        while self.held and len(batch) < INGEST_BATCH_RECORDS and size + self.held[0][1] <= INGEST_BATCH_BYTES:
            record, n = self.held.pop(0)
            batch.append(record)
            size += n
        self.oldest = now
        start, cpu = time.perf_counter(), time.process_time()
        reply = self.handler({"Records": batch}, LocalLambdaContext(function_name="delayed-delivery-bucket-ingest"))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        failed = {f["itemIdentifier"] for f in (reply or {}).get("batchItemFailures", [])}
        done = [r for r in batch if r["messageId"] not in failed]
        for i in range(0, len(done), 10):
            self.sqs.delete_message_batch(
                QueueUrl=self.url,
                Entries=[{"Id": str(j), "ReceiptHandle": r["receiptHandle"]} for j, r in enumerate(done[i : i + 10])],
            )
        return len(batch), seconds, cpu


def measure_tier(
    scenario: str, per_minute: int, sends: int, endpoint: str, *, per_run: bool = False, body: str = "order"
) -> TierRun:
    """One run of ``scenario`` (``near`` or ``far``): ``per_minute`` messages a minute for ``sends`` batch calls
    (``SENDS_PER_MINUTE`` a minute: 3 is a minute, 15 the ingest's 5-minute window), counted per step.

    ``per_run``: cancellation records read once per destination per timer run (a fresh cache each run) instead of
    as the timer handler reads them (a cache of ``max_age`` 0: one query per message per pass).
    """
    phase = _Phase()
    counter = StepCounter(phase)
    with counter.installed():
        rig = _Rig.build(scenario, endpoint, per_run)
        messages = per_minute * sends // SENDS_PER_MINUTE
        run = TierRun(scenario, messages, sends, SCENARIOS[scenario], body)
        for _ in range(IDLE_RUNS):  # the fixed cost: a timer run with nothing to do
            phase.name = "idle"
            seconds, cpu = rig.tick()
            run.idle_seconds, run.idle_cpu, run.idle_runs = (
                run.idle_seconds + seconds,
                run.idle_cpu + cpu,
                run.idle_runs + 1,
            )
        rig.results.clear()
        _send_and_ingest(rig, run, phase)
        phase.name = None
        run.stored_objects, run.stored_bytes = rig.stored()
        _dispatch_all(rig, run, phase)
        phase.name = None
        _finish(rig, run)
    run.steps = counter.snapshot()
    return run


@dataclass(slots=True)
class _Rig:
    """One run's tier on moto: clients, queues, bucket, table, and the real sender, ingest handler and timer."""

    sqs: Any
    s3: Any
    bucket: str
    clock: ManualClock
    dest: str
    dest_url: str
    ingest_url: str
    ingest_arn: str
    handler: Any
    timer: BucketTimer
    sender: SqsDelayedSender
    fresh_cache: Any
    results: list[TimerResult] = field(default_factory=list)

    @classmethod
    def build(cls, scenario: str, endpoint: str, per_run: bool) -> _Rig:
        """Create the bucket, queues and table (not counted), then the tier's pieces under a manual clock."""
        s3, sqs, ddb = _clients(endpoint)
        tag = f"{scenario}-{time.time_ns()}"
        settings = DelayedDeliverySettings(error_queue=f"bench-errors-{tag}")
        routing = SqsSettings(
            max_native_delay=2,
            fifo_queue_delay=2,
            long_delay_route="buckets",
            bucket_ingest_queue=f"bench-ingest-{tag}",
        )
        timing = TierSettings(bucket_fine_seconds=FINE, bucket_coarse_seconds=COARSE, bucket_dispatch_lead_seconds=LEAD)
        bucket, table, dest = f"bench-tier-{tag}", f"bench-cancel-{tag}", f"bench-dest-{tag}"
        s3.create_bucket(Bucket=bucket)
        ensure_cancellation_table(ddb, table)
        queues = (routing.bucket_ingest_queue, settings.error_queue, dest)
        urls = {q: sqs.create_queue(QueueName=q)["QueueUrl"] for q in queues}
        ingest_url = urls[routing.bucket_ingest_queue]
        attrs = sqs.get_queue_attributes(QueueUrl=ingest_url, AttributeNames=["QueueArn"])["Attributes"]
        config = BucketTierConfig(
            bucket_name=bucket, settings=settings, sqs_settings=routing, tier_settings=timing, cancellation_table=table
        )
        clock = ManualClock(START)
        store = DynamoDbCancellationStore(ddb, table)
        timer = BucketTimer(
            S3BucketStore.from_config(s3, config),
            sqs,
            settings,
            clock,
            cancellations=CancellationCache(store, 0, clock=clock),
            owner=f"bench-{tag}",
            tier=TierSettings().with_(bucket_send_phase_ms=timing.bucket_send_phase_ms),
        )
        sender = SqsDelayedSender(sqs, settings, sqs_settings=routing, clock=clock)
        sender.directory.get(dest)  # warm the sender's look-ups, as a long-lived sender has them
        sender.directory.get(routing.bucket_ingest_queue)
        fresh = (lambda: CancellationCache(store, 3_600, clock=clock)) if per_run else None
        handler = build_ingest_handler(config, s3=s3, sqs=sqs, clock=clock)
        arn = attrs["QueueArn"]
        return cls(sqs, s3, bucket, clock, dest, urls[dest], ingest_url, arn, handler, timer, sender, fresh)

    def tick(self) -> tuple[float, float]:
        """One timer run, then the clock one fine bucket on; returns the run's wall and CPU seconds.

        Both include the run's waits for the due second (``bucket_send_phase_ms``): the manual clock skips them, a
        Lambda is billed for them.
        """
        if self.fresh_cache is not None:
            self.timer.cancellations = self.fresh_cache()
        slept = len(self.clock.slept)
        start, cpu = time.perf_counter(), time.process_time()
        self.results.append(self.timer.run())
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        waited = sum(s for s in self.clock.slept[slept:] if s > 0)
        self.clock.advance(FINE)
        return seconds + waited, cpu + waited

    def stored(self) -> tuple[int, int]:
        """The message objects in the bucket now (leases left out), and their bytes, as S3 lists them."""
        objects = size = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for item in page.get("Contents", []):
                if "/leases/" not in item["Key"]:
                    objects, size = objects + 1, size + int(item["Size"])
        return objects, size


#: The traffic starts just after a day boundary, after the idle runs (one fine step each), so the first minutes'
#: messages share one coarse bucket (in the cloud a 5-minute window straddles a day boundary 5 times in 1,440).
START = datetime(2031, 1, 1, 0, 0, 1, tzinfo=UTC) - timedelta(seconds=IDLE_RUNS * FINE)


def _send_and_ingest(rig: _Rig, run: TierRun, phase: _Phase) -> None:
    """Each send (``SENDS_PER_MINUTE`` a minute) its share of the minute's messages in one batch call; the event
    source receives them and invokes the ingest when a limit or its window says so; a timer run every minute. When the
    traffic stops, the records still held wait out the window, the timer running meanwhile."""
    source = EventSource(rig.sqs, rig.ingest_url, rig.ingest_arn, rig.handler)
    per_send = -(-run.messages // max(1, run.sends))
    now = 0
    while now < run.sends or source.held:
        if now < run.sends:
            start = now * per_send
            batch = [
                DelayedSend(rig.dest, _body(i, run.body), run.delay_seconds, message_id=f"m{i}", attributes={"n": i})
                for i in range(start, min(run.messages, start + per_send))
            ]
            phase.name = "send"
            if batch:
                result = rig.sender.send_delayed_batch(batch)
                assert result.ok, result.failures
        phase.name = "ingest"
        source.receive(now)
        while source.due(now):
            _, seconds, cpu = source.invoke(now)
            run.ingest_invocations += 1
            run.ingest_seconds, run.ingest_cpu = run.ingest_seconds + seconds, run.ingest_cpu + cpu
        now += 1
        if now % SENDS_PER_MINUTE == 0 or (now >= run.sends and not source.held):
            phase.name = "timer"
            _timer_run(rig, run)


def _timer_run(rig: _Rig, run: TierRun) -> None:
    seconds, cpu = rig.tick()
    run.timer_seconds, run.timer_cpu, run.timer_runs = (
        run.timer_seconds + seconds,
        run.timer_cpu + cpu,
        run.timer_runs + 1,
    )


def _dispatch_all(rig: _Rig, run: TierRun, phase: _Phase) -> None:
    """Timer runs until every message is dispatched (the far scenario first jumps over its idle year)."""
    if run.scenario == "far":
        due = START + timedelta(seconds=run.delay_seconds)
        rig.clock.set(max(rig.clock.now(), due - timedelta(seconds=2 * COARSE + LEAD + FINE)))
    end = rig.clock.now() + timedelta(seconds=run.delay_seconds + run.sends + 3 * COARSE)
    phase.name = "timer"
    while sum(r.dispatched for r in rig.results) < run.messages and rig.clock.now() < end:
        _timer_run(rig, run)


_TOTALS = (
    "cascaded_objects",
    "cascaded_messages",
    "dispatched",
    "duplicates_skipped",
    "to_error_queue",
    "kept_for_retry",
)


def _finish(rig: _Rig, run: TierRun) -> None:
    """The timer results summed, and the messages that reached the destination (not counted)."""
    totals: Counter[str] = Counter()
    for r in rig.results:
        totals.update({k: float(getattr(r, k)) for k in _TOTALS})
    run.timer = dict(totals)
    time.sleep(LEAD + 1)  # the last dispatches carry DelaySeconds up to the lead
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    attrs = rig.sqs.get_queue_attributes(QueueUrl=rig.dest_url, AttributeNames=names)["Attributes"]
    run.delivered = sum(int(attrs[n]) for n in names)
