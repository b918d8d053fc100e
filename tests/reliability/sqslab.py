"""Crash injection for the SQS FIFO-requeue handler on moto server.

The real Lambda handler (``delayed_delivery.aws.requeue.handler.build_handler``) is driven by the local event source
(``LocalEventSourcePoller``), with compressed times (native cap and FIFO hop 1 s, visibility timeout 1 s).
Two kinds of crash:

* **in-process fault points** (driven by a seed; the soak itself is ``sqssoak.py``) in an SQS client wrapper
  shared by the poller and the handler: right after a receive, before a ``SendMessageBatch``, in the middle of
  one (the first half of the entries sent, then death), after it, after a ``ChangeMessageVisibilityBatch`` (a
  park), and before the ``DeleteMessageBatch``. The crash is a ``BaseException`` nothing catches; the handler
  and poller are thrown away and rebuilt, as a Lambda container that died would be. The records it held come
  back after the visibility timeout (a parked one after its park).
* **real process kills**: poller+handler subprocesses are SIGKILLed at random moments and restarted.

Each message's body is its id; the destination queue is drained by the lab, so every delivery is counted
(lost must be 0; duplicates are repeated hand-overs, which at-least-once allows).

Soak: ``python -m tests.reliability.sqslab --crashes 10000 --kills 30`` (starts its own moto server; progress
on stderr every 10 s, the JSON result on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayed_delivery.aws.queues import EndpointQueues, ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller
from tests.fixtures.moto import queue_depth
from tests.reliability.crashlab import FaultPlan, InjectedCrash

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
#: Compressed: 1 s native cap and FIFO hop; a 4 s delay takes about three FIFO hops, then a native remainder.
CAP = 1
DELAY = 4
POINTS = ("after_receive", "before_send", "mid_batch", "after_send", "after_park", "before_delete")


def sqs_client(endpoint_url: str) -> SQSClient:
    """A boto3 SQS client for the moto server at ``endpoint_url``."""
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


#: Compressed SQS settings: native cap and FIFO hop of ``CAP`` seconds.
LAB_SQS = SqsSettings(max_native_delay=CAP, fifo_queue_delay=CAP, long_delay_route="fifo")


def lab_settings(queue: str) -> DelayedDeliverySettings:
    """The core settings with a per-run error queue."""
    return DelayedDeliverySettings(error_queue=f"{queue}-errors")


def handler_env(settings: DelayedDeliverySettings, sqs_settings: SqsSettings = LAB_SQS) -> dict[str, str]:
    """What the CDK construct sets on the Lambda."""
    return {
        "DELAYED_DELIVERY_MAX_NATIVE_DELAY": str(sqs_settings.max_native_delay),
        "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": str(sqs_settings.fifo_queue_delay),
        "DELAYED_DELIVERY_ERROR_QUEUE": settings.error_queue,
        "DELAYED_DELIVERY_MAX_PARK_SECONDS": str(sqs_settings.max_park_seconds),
        "POWERTOOLS_SERVICE_NAME": "requeue-crashlab",
        "POWERTOOLS_METRICS_NAMESPACE": "DelayedDeliveryCrashlab",
    }


class InvocationFaults(FaultPlan):
    """Seeded deaths per invocation: one in ``probability`` is doomed at its receive and dies at one fault point.

    A doomed invocation dies at each fault point with chance ``per_point``, and at its delete at the latest. A
    chance per SQS call instead would all but never let an invocation that forwards a big envelope (dozens of
    calls) finish, and the soak would only repeat those forwards.
    """

    def __init__(self, rng: random.Random, probability: float, per_point: float = 0.3) -> None:
        super().__init__(rng, probability)
        self.per_point = per_point
        self.doomed = False

    def begin(self) -> None:
        """An invocation starts (its receive returned records): doom it, or not."""
        self.doomed = self.rng.random() < self.probability

    def strikes(self, name: str) -> bool:
        """Whether the invocation dies at fault point ``name`` (counted when it does)."""
        if not self.doomed or (name != "before_delete" and self.rng.random() >= self.per_point):
            return False
        self.doomed = False
        self.crashes[name] = self.crashes.get(name, 0) + 1
        return True

    def point(self, name: str) -> None:
        """Raise ``InjectedCrash`` when the invocation dies here."""
        if self.strikes(name):
            raise InjectedCrash(name)


class CrashingSqs:
    """Wraps a boto3 SQS client; dies (``InjectedCrash``) at seeded points around receives, sends, parks, deletes."""

    def __init__(self, client: SQSClient, faults: InvocationFaults | None) -> None:
        self._client = client
        self.faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _point(self, name: str) -> None:
        if self.faults is not None:
            self.faults.point(name)

    def receive_message(self, **kwargs: Any) -> Any:
        reply = self._client.receive_message(**kwargs)
        if reply.get("Messages") and self.faults is not None:
            self.faults.begin()
            self._point("after_receive")
        return reply

    def send_message_batch(self, **kwargs: Any) -> Any:
        self._point("before_send")
        entries = kwargs["Entries"]
        if self.faults is not None and len(entries) > 1 and self.faults.strikes("mid_batch"):
            self._client.send_message_batch(QueueUrl=kwargs["QueueUrl"], Entries=entries[: len(entries) // 2])
            raise InjectedCrash("mid_batch")
        reply = self._client.send_message_batch(**kwargs)
        self._point("after_send")
        return reply

    def change_message_visibility_batch(self, **kwargs: Any) -> Any:
        reply = self._client.change_message_visibility_batch(**kwargs)
        self._point("after_park")
        return reply

    def delete_message_batch(self, **kwargs: Any) -> Any:
        self._point("before_delete")
        return self._client.delete_message_batch(**kwargs)


@dataclass
class SqsSoakResult:
    """What a soak did and found."""

    messages: int
    injected_crashes: int
    crashes_by_point: dict[str, int]
    process_kills: int
    delivered: int
    lost: int
    duplicates: int
    error_queue: int
    seconds: float
    invocations: int = 0
    leftovers: list[str] = field(default_factory=list)
    #: Records (or inner messages) the handler reported ``parked``.
    parks: int = 0
    #: Handler outcomes per inner message (``HopOutcome`` values).
    outcomes: dict[str, int] = field(default_factory=dict)
    endpoints: int = 1
    #: Release control on: seconds of the release calendar holding more than their capacity (must be 0).
    release_overfull: int = 0


class Lab:
    """One endpoint on moto: send messages, drain the destination and the error queue, count."""

    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url
        self.client = sqs_client(endpoint_url)
        self.queue = f"rel{uuid.uuid4().hex[:10]}"
        self.settings = lab_settings(self.queue)
        self.endpoint: EndpointQueues = ensure_endpoint(
            self.client, self.queue, self.settings, sqs_settings=LAB_SQS, visibility_timeout=1
        )
        self.sender = SqsDelayedSender(self.client, self.settings, sqs_settings=LAB_SQS)
        self.expected: set[str] = set()
        self.arrivals: Counter[str] = Counter()
        self.errors = 0

    def send(self, count: int, prefix: str) -> None:
        ids = [f"{prefix}-{i:05d}" for i in range(count)]
        for start in range(0, count, 10):
            batch = [DelayedSend(self.queue, mid, DELAY, message_id=mid) for mid in ids[start : start + 10]]
            result = self.sender.send_delayed_batch(batch)
            assert result.ok, result.failures
        self.expected |= set(ids)

    def drain(self) -> int:
        """Receive and delete what reached the destination (and the error queue); returns how many."""
        got = 0
        for url, is_error in ((self.endpoint.input_url, False), (self.endpoint.error_url, True)):
            reply = self.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            messages = reply.get("Messages", [])
            for m in messages:
                if is_error:
                    self.errors += 1
                else:
                    self.arrivals[m["Body"]] += 1
            if messages:
                self.client.delete_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
            got += len(messages)
        return got

    def depth(self, url: str) -> int:
        """Visible + in flight + delayed messages."""
        return queue_depth(self.client, url)

    def settled(self) -> bool:
        """Everything arrived and nothing is left anywhere (so no late duplicate can still come)."""
        if not self.expected <= set(self.arrivals):
            return False
        return all(self.depth(u) == 0 for u in (self.endpoint.delay_url, self.endpoint.input_url))

    def result(
        self, injected: int, faults: dict[str, int], kills: int, started: float, invocations: int
    ) -> SqsSoakResult:
        lost = sorted(self.expected - set(self.arrivals))
        return SqsSoakResult(
            messages=len(self.expected),
            injected_crashes=injected,
            crashes_by_point=faults,
            process_kills=kills,
            delivered=len(set(self.arrivals) & self.expected),
            lost=len(lost),
            duplicates=sum(n - 1 for n in self.arrivals.values()),
            error_queue=self.errors,
            seconds=round(time.monotonic() - started, 1),
            invocations=invocations,
            leftovers=lost[:10],
        )


def _worker(endpoint_url: str, queue: str) -> None:
    """A poller+handler process on the real clock, until killed."""
    client = sqs_client(endpoint_url)
    settings = lab_settings(queue)
    delay_url = client.get_queue_url(QueueName=f"{queue}-delay.fifo")["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=delay_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    handler = build_handler(handler_env(settings), sqs_client=client)
    poller = LocalEventSourcePoller(client, delay_url, arn, handler, wait_seconds=1)
    while True:
        poller.poll_once()


def process_kill_soak(
    endpoint_url: str, messages: int, kills: int, seed: int = 1, workers: int = 2, timeout: float = 1800
) -> SqsSoakResult:
    """Run ``workers`` poller processes and SIGKILL one at random moments, ``kills`` times."""
    started = time.monotonic()
    rng = random.Random(seed)
    lab = Lab(endpoint_url)
    argv = [sys.executable, "-m", "tests.reliability.sqslab", "--worker", endpoint_url, lab.queue]
    env = {**os.environ, "POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)

    procs = [spawn() for _ in range(workers)]
    per_round = max(10, messages // max(1, kills))
    sent, done_kills = 0, 0
    deadline = started + timeout
    next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
    try:
        while time.monotonic() < deadline:
            if sent < messages and (done_kills * per_round >= sent or not lab.depth(lab.endpoint.delay_url)):
                n = min(per_round, messages - sent)
                lab.send(n, f"k{sent}")
                sent += n
            if done_kills < kills and time.monotonic() >= next_kill:
                victim = rng.randrange(workers)
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                done_kills += 1
                procs[victim] = spawn()
                next_kill = time.monotonic() + rng.uniform(0.5, 3.0)
            if not lab.drain():
                if done_kills >= kills and sent >= messages and lab.settled():
                    break
                time.sleep(0.1)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    return lab.result(0, {}, done_kills, started, 0)


def main() -> None:
    """Soak command line (starts a moto server), or a worker process with ``--worker ENDPOINT QUEUE``."""
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--crashes", type=int, default=10_000, help="in-process crashes at fault points")
    p.add_argument("--endpoints", type=int, default=8, help="endpoints the crash soak spreads its messages over")
    p.add_argument("--messages", type=int, default=20, help="messages on their way per endpoint in the crash soak")
    p.add_argument("--probability", type=float, default=0.5, help="chance that an invocation dies (at one fault point)")
    p.add_argument("--kills", type=int, default=30, help="SIGKILLs of poller processes")
    p.add_argument("--kill-messages", type=int, default=300, help="messages of the kill soak")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--crash-minutes", type=float, help="end the crash phase after this long (fewer crashes)")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds before the crash soak gives up")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--endpoint", help="an already running moto server (default: start one)")
    a = p.parse_args()
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from tests.fixtures.services import ServiceProcess, free_port
    from tests.reliability.sqssoak import in_process_soak

    service = None
    endpoint = a.endpoint
    if endpoint is None:
        port = free_port()
        exe = str(Path(sys.executable).parent / "moto_server")
        service = ServiceProcess("moto", [exe, "-H", "127.0.0.1", "-p", str(port)], [port]).start()
        endpoint = f"http://127.0.0.1:{port}"
    progress = None if a.quiet else sys.stderr
    try:
        results = {}
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the handler's log and metric lines
            if a.crashes:
                soak = in_process_soak(
                    endpoint,
                    a.messages,
                    a.crashes,
                    a.seed,
                    a.probability,
                    a.timeout,
                    endpoints=a.endpoints,
                    progress=progress,
                    crash_seconds=None if a.crash_minutes is None else a.crash_minutes * 60,
                )
                results["sqs_in_process"] = asdict(soak)
            if a.kills:
                results["sqs_process_kills"] = asdict(process_kill_soak(endpoint, a.kill_messages, a.kills, a.seed))
    finally:
        if service is not None:
            service.stop()
    print(json.dumps(results, indent=2))
    if any(r["lost"] or r["error_queue"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
