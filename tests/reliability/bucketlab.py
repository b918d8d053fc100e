"""Crash injection for the S3 time-bucket tier (sender -> ingest -> S3 buckets -> timer -> destination) on moto.

Time is compressed (fine buckets 1 s, coarse 10 s, dispatch lead 2 s) and simulated: one ``ManualClock`` drives the
sender, the ingest step and the timer; each tick the lab polls the ingest queue once (``BucketIngest.process``,
then ``DeleteMessageBatch`` of the records written), runs the timer (``BucketTimer.run``), advances the clock by
a second and drains the destination queue.

Every boto3 call of the ingest step, the lab's ingest poller and the timer goes through ``LabClient``, which names
the step the call belongs to (ingest write, ingest delete, cascade lease/write/delete, dispatch lease/send/delete,
lease release) and can die at it, **before** the request or **after** it took effect. The crash is a
``BaseException`` nothing catches; once dead, every further call of that "process" dies too (so no ``finally``
gets to release a lease), the objects are rebuilt, the ingest records held come back (their visibility timeout
passes) and the clock moves past the lease. One fault point is armed at a time, in a seeded shuffled cycle.

Checked: every message reaches the destination at least once (lost = 0), never early (each successful dispatch's
simulated time plus its ``DelaySeconds`` is at or after the message's due time), nothing reaches the error queue.
Duplicates are counted at the destination. Each repeated dispatch is put down to a crash: the last one since the
message's previous dispatch at a point after which the timer sends again (after the send, before the delete), else
the last crash between the message's send and its first dispatch (a record ingested twice lands in two objects).

Soak: ``python -m tests.reliability.bucketlab --crashes 1000`` (starts its own moto server; JSON on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.provision import ensure_bucket_tier
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from tests.reliability.crashlab import InjectedCrash

REGION = "us-east-1"
STEPS = (
    "ingest_write",
    "ingest_delete",
    "cascade_lease",
    "cascade_write",
    "cascade_delete",
    "dispatch_lease",
    "dispatch_send",
    "dispatch_delete",
    "lease_release",
)
POINTS = tuple(f"{when}_{step}" for step in STEPS for when in ("before", "after"))
#: Simulated seconds a timer's lease holds; after a crash the clock moves past it so the bucket is taken over.
LEASE_SECONDS = 2.0
#: Points after which the timer sends a message again: sent, then died before its object was deleted.
REPEATING_POINTS = (
    "after_dispatch_send",
    "before_dispatch_delete",
    "after_dispatch_rewrite",
    "before_dispatch_rewrite",
)
START = datetime(2030, 1, 1, tzinfo=UTC)


def lab_config(run: str) -> BucketTierConfig:
    """The compressed tier of tier.md (bucket and prefix ``lab``), with per-run queue names."""
    return BucketTierConfig(
        bucket_name=run,
        prefix="lab",
        settings=DelayedDeliverySettings(error_queue=f"{run}-errors"),
        sqs_settings=SqsSettings(
            max_native_delay=2, fifo_queue_delay=2, long_delay_route="buckets", bucket_ingest_queue=f"{run}-ingest"
        ),
        tier_settings=TierSettings(bucket_fine_seconds=1, bucket_coarse_seconds=10, bucket_dispatch_lead_seconds=2),
    )


def client(service: str, endpoint: str) -> Any:
    """A boto3 client for the moto server at ``endpoint``."""
    import boto3

    return boto3.client(
        service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


class Faults:
    """The armed fault point of one lab "process"; once it fires, every later call of the process dies too."""

    def __init__(self, target: str | None, skip: int) -> None:
        self.target = target
        self.skip = skip
        self.fired: str | None = None
        #: The timer's phase, from the last lease it took (a fine write in a dispatch is a write-back).
        self.phase = "cascade"

    def point(self, step: str | None, when: str) -> None:
        """Die here if this is the armed point (or the process already died)."""
        if self.fired is not None:
            raise InjectedCrash(f"dead since {self.fired}")
        name = f"{when}_{step}"
        if step is None or name != self.target:
            return
        if self.skip > 0:
            self.skip -= 1
            return
        self.fired = name
        raise InjectedCrash(name)


class LabClient:
    """A boto3 client whose calls pass the fault points of their step, before and after the request."""

    def __init__(self, inner: Any, role: str, faults: Faults, lab: BucketLab) -> None:
        self._inner = inner
        self._role = role
        self._faults = faults
        self._lab = lab

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            step = self._lab.step_of(self._role, name, kwargs, self._faults)
            self._faults.point(step, "before")
            reply = attr(*args, **kwargs)
            if step == "dispatch_send":
                self._lab.dispatched(kwargs, reply)
            self._faults.point(step, "after")
            return reply

        return call


@dataclass(slots=True)
class LabResult:
    """What a crash run did; ``lost`` and ``early`` must be 0."""

    seed: int
    injected_crashes: int = 0
    crashes_by_point: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    delivered: int = 0
    lost: int = 0
    early: int = 0
    duplicates: int = 0
    duplicates_by_point: dict[str, int] = field(default_factory=dict)
    #: Copies the timer found and skipped itself (the same id twice in one bucket).
    timer_duplicates_skipped: int = 0
    error_queue: int = 0
    ticks: int = 0
    simulated_seconds: float = 0.0
    seconds: float = 0.0
    leftovers: list[str] = field(default_factory=list)


class BucketLab:
    """One tier on moto (bucket, ingest queue, error queue, destination ``orders``) under a shuffled fault cycle."""

    def __init__(self, endpoint: str, seed: int, *, window: int = 40, max_delay: int = 60) -> None:
        self.rng = random.Random(seed)
        self.run = f"bl{uuid.uuid4().hex[:8]}"
        self.config = lab_config(self.run)
        self.settings = self.config.settings
        self.s3, self.sqs = client("s3", endpoint), client("sqs", endpoint)
        tier = ensure_bucket_tier(self.s3, self.sqs, self.config)
        self.ingest_url, self.error_url = tier.ingest_url, tier.error_url
        self.dest_url = self.sqs.create_queue(QueueName=f"{self.run}-orders")["QueueUrl"]
        self.clock = ManualClock(START)
        self.sender = SqsDelayedSender(self.sqs, self.settings, sqs_settings=self.config.sqs_settings, clock=self.clock)
        self.window, self.max_delay = window, max_delay
        self.result = LabResult(seed)
        self.due_ms: dict[str, int] = {}
        self.sent_ok: Counter[str] = Counter()
        self.arrived: Counter[str] = Counter()
        self.crash_log: list[str] = []
        #: Crash-log lengths at each message's send, first dispatch and latest dispatch.
        self.send_mark: dict[str, int] = {}
        self.first_mark: dict[str, int] = {}
        self.crash_mark: dict[str, int] = {}
        self.cycle: list[str] = []
        self.held: list[str] = []
        self.build(None)

    # --- the "process": ingest, its poller and the timer, rebuilt after every crash ---------------------------------
    def build(self, target: str | None) -> None:
        """Fresh clients, store, ingest step and timer, with ``target`` armed."""
        self.faults = Faults(target, self.rng.randint(0, 2))
        s3_ingest = LabClient(self.s3, "ingest", self.faults, self)
        s3_timer = LabClient(self.s3, "timer", self.faults, self)
        self.poller = LabClient(self.sqs, "poller", self.faults, self)
        self.ingest = BucketIngest(
            S3BucketStore.from_config(s3_ingest, self.config), self.sqs, self.settings, self.clock
        )
        store = S3BucketStore.from_config(s3_timer, self.config)
        sqs_timer = LabClient(self.sqs, "timer", self.faults, self)
        owner = f"timer-{len(self.crash_log)}"
        self.timer = BucketTimer(
            store,
            sqs_timer,
            self.settings,
            self.clock,
            owner=owner,
            lease_seconds=LEASE_SECONDS,
            send_phase_ms=self.config.tier_settings.bucket_send_phase_ms,
        )

    def next_target(self) -> str:
        """The next fault point of the seeded shuffled cycle."""
        if not self.cycle:
            self.cycle = list(POINTS)
            self.rng.shuffle(self.cycle)
        return self.cycle.pop()

    def step_of(self, role: str, op: str, kwargs: dict[str, Any], faults: Faults) -> str | None:
        """The step a call belongs to (``None``: not a fault point)."""
        if role == "ingest":
            return "ingest_write" if op == "put_object" else None
        if role == "poller":
            return "ingest_delete" if op == "delete_message_batch" else None
        if op == "put_object":
            key = str(kwargs.get("Key", ""))
            if "/leases/" in key:
                faults.phase = "cascade" if "/leases/coarse/" in key else "dispatch"
                return f"{faults.phase}_lease"
            return "cascade_write" if faults.phase == "cascade" else "dispatch_rewrite"
        if op == "delete_objects":
            keys = [str(o["Key"]) for o in kwargs["Delete"]["Objects"]]
            return "cascade_delete" if any("/coarse/" in k for k in keys) else "dispatch_delete"
        if op == "delete_object":
            return "lease_release"
        if op == "send_message_batch":
            return "dispatch_send" if kwargs.get("QueueUrl") == self.dest_url else "error_send"
        return None

    def dispatched(self, request: dict[str, Any], reply: Any) -> None:
        """Check each entry SQS took: simulated now + DelaySeconds never before the due time; count repeats."""
        ok = {s["Id"] for s in reply.get("Successful", [])}
        now_ms = epoch_ms(self.clock.now())
        for entry in request["Entries"]:
            if entry["Id"] not in ok:
                continue
            message_id = entry["MessageBody"]
            if now_ms + int(entry.get("DelaySeconds", 0)) * 1000 < self.due_ms[message_id]:
                self.result.early += 1
            if self.sent_ok[message_id]:
                cause = self.cause(message_id)
                self.result.duplicates_by_point[cause] = self.result.duplicates_by_point.get(cause, 0) + 1
            else:
                self.first_mark[message_id] = len(self.crash_log)
            self.sent_ok[message_id] += 1
            self.crash_mark[message_id] = len(self.crash_log)

    def cause(self, message_id: str) -> str:
        """The crash a repeated dispatch is put down to (see the module docstring)."""
        since = self.crash_log[self.crash_mark[message_id] :]
        repeats = [p for p in since if p in REPEATING_POINTS]
        if repeats:
            return repeats[-1]
        before = self.crash_log[self.send_mark[message_id] : self.first_mark[message_id]]
        return before[-1] if before else "no_crash"

    # --- one tick --------------------------------------------------------------------------------------------------
    def send_round(self) -> None:
        """Ten messages due 3 s to ``max_delay`` s (simulated, to the ms) from now, in one to three batches."""
        start = self.result.messages
        ids = [f"m{n}" for n in range(start, start + 10)]
        now_ms = epoch_ms(self.clock.now())
        sends = []
        for message_id in ids:
            delay_ms = self.rng.randint(3_000, self.max_delay * 1_000)  # any phase of the second: sends go in waves
            delay = timedelta(milliseconds=delay_ms)
            self.due_ms[message_id] = now_ms + delay_ms
            self.send_mark[message_id] = len(self.crash_log)
            sends.append(DelayedSend(f"{self.run}-orders", message_id, delay, message_id=message_id))
        cuts = sorted(self.rng.sample(range(1, 10), self.rng.randint(0, 2)))
        for first, last in zip([0, *cuts], [*cuts, 10], strict=True):
            self.sender.send_delayed_batch(sends[first:last]).raise_for_failures()
        self.result.messages += len(ids)

    def ingest_once(self) -> None:
        """What the event source does: receive up to 10 ingest records, hand them over, delete those written."""
        reply = self.poller.receive_message(
            QueueUrl=self.ingest_url, MaxNumberOfMessages=10, VisibilityTimeout=60, MessageAttributeNames=["All"]
        )
        messages = reply.get("Messages", [])
        if not messages:
            return
        self.held = [m["ReceiptHandle"] for m in messages]
        records = [
            {"messageId": m["MessageId"], "body": m["Body"], "messageAttributes": _lambda_attributes(m)}
            for m in messages
        ]
        result = self.ingest.process(records)
        done = [m for m in messages if m["MessageId"] not in result.failures]
        if done:
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(done)]
            self.poller.delete_message_batch(QueueUrl=self.ingest_url, Entries=entries)
        self.held = []

    def drain(self) -> None:
        """Receive and delete everything visible at the destination, counting arrivals by body (the id)."""
        while True:
            reply = self.sqs.receive_message(QueueUrl=self.dest_url, MaxNumberOfMessages=10)
            messages = reply.get("Messages", [])
            if not messages:
                return
            for m in messages:
                self.arrived[m["Body"]] += 1
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
            self.sqs.delete_message_batch(QueueUrl=self.dest_url, Entries=entries)

    def tick(self) -> None:
        """Ingest, timer, a simulated second, drain; a crash rebuilds the process with the next point armed."""
        self.result.ticks += 1
        try:
            self.ingest_once()
            self.result.timer_duplicates_skipped += self.timer.run().duplicates_skipped
        except InjectedCrash:
            self.crashed()
        self.clock.advance(1)
        self.drain()

    def crashed(self) -> None:
        """Count the crash, let the held records' visibility pass and the lease expire, rebuild."""
        point = self.faults.fired or "unknown"
        self.crash_log.append(point)
        self.result.injected_crashes += 1
        self.result.crashes_by_point[point] = self.result.crashes_by_point.get(point, 0) + 1
        for handle in self.held:
            with contextlib.suppress(ClientError):  # deleted before the crash
                self.sqs.change_message_visibility(QueueUrl=self.ingest_url, ReceiptHandle=handle, VisibilityTimeout=0)
        self.held = []
        self.clock.advance(LEASE_SECONDS)
        self.build(self.next_target())

    def unsent(self) -> int:
        """Messages not yet dispatched successfully."""
        return sum(1 for message_id in self.due_ms if not self.sent_ok[message_id])


def _lambda_attributes(message: dict[str, Any]) -> dict[str, Any]:
    return {
        name: {"stringValue": value.get("StringValue"), "dataType": value.get("DataType")}
        for name, value in message.get("MessageAttributes", {}).items()
    }


def soak(
    endpoint: str,
    crashes: int,
    seed: int = 1,
    *,
    window: int = 40,
    timeout: float = 3600.0,
    progress: Callable[[LabResult], None] | None = None,
) -> LabResult:
    """Crash the tier ``crashes`` times, then run it without faults until everything arrived (or ``timeout``)."""
    started = time.monotonic()
    lab = BucketLab(endpoint, seed, window=window)
    lab.build(lab.next_target())
    last = started
    while lab.result.injected_crashes < crashes and time.monotonic() - started < timeout:
        if lab.unsent() < lab.window:
            lab.send_round()
        lab.tick()
        if progress is not None and time.monotonic() - last > 10:
            progress(lab.result)
            last = time.monotonic()
    lab.build(None)
    settle_ticks = 0
    while lab.unsent() and settle_ticks < 10 * lab.max_delay and time.monotonic() - started < timeout:
        lab.tick()
        settle_ticks += 1
    _final_drain(lab, deadline=time.monotonic() + 10)
    return _finish(lab, started)


def _final_drain(lab: BucketLab, deadline: float) -> None:
    """Wait (real time) for the last DelaySeconds to pass and drain."""
    while time.monotonic() < deadline:
        lab.drain()
        if all(lab.arrived[m] for m in lab.due_ms) and sum(lab.arrived.values()) >= sum(lab.sent_ok.values()):
            return
        time.sleep(0.2)


def _finish(lab: BucketLab, started: float) -> LabResult:
    result = lab.result
    result.delivered = sum(1 for m in lab.due_ms if lab.arrived[m])
    missing = [m for m in lab.due_ms if not lab.arrived[m]]
    result.lost = len(missing)
    result.leftovers = missing[:20]
    result.duplicates = sum(lab.arrived.values()) - result.delivered
    attrs = lab.sqs.get_queue_attributes(QueueUrl=lab.error_url, AttributeNames=["ApproximateNumberOfMessages"])
    result.error_queue = int(attrs["Attributes"]["ApproximateNumberOfMessages"])
    result.simulated_seconds = (lab.clock.now() - START).total_seconds()
    result.seconds = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    """Soak command line: starts a moto server unless ``--endpoint`` names one; JSON result on stdout."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--crashes", type=int, default=1_000, help="in-process crashes at the tier's fault points")
    p.add_argument("--window", type=int, default=40, help="messages on their way at a time")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds before the soak gives up")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--endpoint", help="an already running moto server (default: start one)")
    a = p.parse_args()
    from tests.fixtures.services import ServiceProcess, free_port

    service = None
    endpoint = a.endpoint
    if endpoint is None:
        port = free_port()
        exe = str(Path(sys.executable).parent / "moto_server")
        service = ServiceProcess("moto", [exe, "-H", "127.0.0.1", "-p", str(port)], [port]).start()
        endpoint = f"http://127.0.0.1:{port}"

    def report(r: LabResult) -> None:
        print(f"crashes {r.injected_crashes} messages {r.messages} ticks {r.ticks}", file=sys.stderr, flush=True)

    try:
        result = soak(
            endpoint, a.crashes, a.seed, window=a.window, timeout=a.timeout, progress=None if a.quiet else report
        )
    finally:
        if service is not None:
            service.stop()
    print(json.dumps(asdict(result), indent=2))
    if result.lost or result.early or result.error_queue:
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    main()
