"""Helpers for the planned-bucket tests (#31): the tier on moto at its deployed timing (fine 60 s, lead 420 s) with a
small inline bound (``INLINE``: a bucket of ``INLINE + 1`` messages is planned, as 4,001 are at the deployed 4,000), a
manual clock, the timer and dispatch workers as the Lambdas run them (a timer run a minute, then every task on the
dispatch queue), and an SQS client whose destination can be made to refuse (AccessDenied), throttle (503) or refuse
its KMS key on demand."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import boto3
from botocore.exceptions import ClientError

from delayed_delivery.aws.release_calendar import ReleaseCalendar, ensure_release_table
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer, TimerResult
from delayed_delivery.aws.tier.worker import PartitionWorker, WorkerResult
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.clock import ManualClock
from delayed_delivery.release import ReleaseRates
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.plans import DispatchTask
from delayed_delivery.timebuckets.wheel import FINE, BucketKey
from tests.aws.tier.timer_support import PREFIX, SETTINGS, START, Recorder, message, queue_url
from tests.fixtures.moto import REGION

#: The inline bound of ``SMALL``: the most messages the timer sends itself.
INLINE = 40
#: The deployed settings but the inline bound and the piece (16 KiB: a few pieces a partition).
SMALL = TierSettings(bucket_inline_max_messages=INLINE, bucket_piece_bytes=16 * 1024)
#: Faults a destination can show: the caller may not use it, SQS is throttling, its KMS key refuses the caller.
FAULTS: dict[str, tuple[str, int]] = {
    "AccessDenied": ("AccessDenied", 403),
    "503": ("ServiceUnavailable", 503),
    "KMS": ("KMS.AccessDeniedException", 400),
    "KMSThrottled": ("KMS.ThrottlingException", 400),
}


class FlakySqs:
    """An SQS client whose calls for the destinations in ``faults`` fail with that fault (changed at any time)."""

    CALLS = ("get_queue_url", "send_message_batch")

    def __init__(self, client: Any) -> None:
        self._client = client
        #: destination -> a key of ``FAULTS``; a fault with a count fails that many calls, then clears.
        self.faults: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.failed = 0

    def fail(self, destination: str, fault: str, times: int | None = None) -> None:
        self.faults[destination] = fault
        if times is not None:
            self.counts[destination] = times

    def heal(self, destination: str) -> None:
        self.faults.pop(destination, None)
        self.counts.pop(destination, None)

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._client, name)
        if name not in self.CALLS:
            return real

        def call(**kwargs: Any) -> Any:
            target = str(kwargs.get("QueueName") or kwargs.get("QueueUrl", "")).rsplit("/", 1)[-1]
            fault = self.faults.get(target)
            if fault is not None and not (name == "get_queue_url" and fault in ("503", "KMSThrottled")):
                left = self.counts.get(target)
                if left is not None:
                    self.counts[target] = left - 1
                    if left - 1 <= 0:
                        self.heal(target)
                self.failed += 1
                code, status = FAULTS[fault]
                error = {"Code": code, "Message": f"{fault} on {name} for {target}"}
                raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, name)
            return real(**kwargs)

        return call


@dataclass
class ListQueue:
    """The dispatch queue, in memory."""

    tasks: list[DispatchTask] = field(default_factory=list)

    def send(self, tasks: Sequence[DispatchTask]) -> None:
        self.tasks.extend(tasks)

    def take(self) -> list[DispatchTask]:
        taken, self.tasks = self.tasks, []
        return taken


@dataclass
class Tier:
    """The tier at ``settings`` on moto: a store, a flaky SQS client, a timer and a dispatch worker per run."""

    s3: Any
    sqs: Any
    bucket: str
    settings: TierSettings = SMALL
    cache: CancellationCache | None = None
    release: ReleaseCalendar | None = None
    destinations: tuple[str, ...] = ("orders",)
    clock: ManualClock = field(default_factory=lambda: ManualClock(START))
    queue: ListQueue = field(default_factory=ListQueue)
    timer_results: list[TimerResult] = field(default_factory=list)
    worker_results: list[WorkerResult] = field(default_factory=list)
    #: Called before each worker run (a test's operator acting while the workers send).
    before_worker: Callable[[Tier, DispatchTask], None] | None = None
    #: Tasks it says True for are lost (a worker that dies at once, every time).
    lose: Callable[[DispatchTask], bool] | None = None

    def __post_init__(self) -> None:
        for name in (*self.destinations, "errors"):
            queue_url(self.sqs, name)
        self.flaky = FlakySqs(self.sqs)
        self.recorder = Recorder(self.clock).attach(self.sqs)
        self.store = S3BucketStore(self.s3, self.bucket, PREFIX, self.settings.levels)

    def timer(self) -> BucketTimer:
        return BucketTimer(
            self.store,
            self.flaky,
            SETTINGS,
            self.clock,
            cancellations=self.cache,
            owner="timer",
            tier=self.settings,
            queue=self.queue,
            release=self.release,
        )

    def worker(self, owner: str = "worker") -> PartitionWorker:
        return PartitionWorker(
            self.store,
            self.flaky,
            SETTINGS,
            self.clock,
            tier=self.settings,
            owner=owner,
            cancellations=self.cache,
            queue=self.queue,
            release=self.release,
        )

    def minute(self, step: float = 60.0) -> None:
        """A timer run, then every dispatch task (as the dispatch function takes them), then ``step`` seconds on."""
        self.timer_results.append(self.timer().run())
        for task in self.queue.take():
            if self.lose is not None and self.lose(task):
                continue
            if self.before_worker is not None:
                self.before_worker(self, task)
            self.worker_results.append(self.worker().run(task))
        self.clock.advance(step)

    def run_until(self, when: Any, step: float = 60.0) -> None:
        while self.clock.now() < when:
            self.minute(step)

    def sent(self, queue: str = "orders") -> Counter[str]:
        """Message id -> times handed to SQS for ``queue``."""
        return Counter(s.message_id or "" for s in self.recorder.to(queue))

    def left(self) -> list[str]:
        """Every key left under the prefix but leases: objects, plans, progress."""
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=PREFIX + "/"):
            keys += [str(item["Key"]) for item in page.get("Contents", []) if "/leases/" not in str(item["Key"])]
        return keys

    def total(self, name: str) -> float:
        """A count summed over every timer and worker run so far."""
        runs: list[Any] = [*self.timer_results, *self.worker_results]
        return sum(getattr(r, name, 0) for r in runs)


def burst(count: int, due: Any, *, first: int = 0, destination: str = "orders") -> list[BucketMessage]:
    """``count`` messages due within the second at ``due``."""
    return [
        message(n, due + timedelta(microseconds=n % 1000), destination=destination) for n in range(first, first + count)
    ]


def fine(due: Any, settings: TierSettings) -> BucketKey:
    """The fine bucket holding ``due``."""
    seconds = settings.bucket_fine_seconds
    start = START + timedelta(seconds=(due - START).total_seconds() // seconds * seconds)
    return BucketKey(FINE, start)


def release_calendar(endpoint: str, rates: dict[str, float]) -> ReleaseCalendar:
    """A release calendar with ``rates`` on a table of its own on moto (default client timeouts: load is slow)."""
    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = f"release-{time.monotonic_ns()}"
    ensure_release_table(client, name)
    return ReleaseCalendar(client, name, ReleaseRates.of(rates))
