"""The SQS handler crash soak: many small endpoints on one moto server, seeded deaths at SQS calls, progress lines.

moto server walks every message of a queue on each call, so the soak keeps each queue shallow: messages are
spread over ``endpoints`` endpoints (an input queue and its ``-delay.fifo`` each, one shared error queue), with
at most ``messages`` on their way per endpoint, topped up as they arrive. Every endpoint has its own container
(a boto3 client, the real handler, the local event source); a crash throws that container away and builds a
fresh one. Delays are drawn from ``DELAYS`` under settings compressed to the same scale (native cap, FIFO hop and
visibility 1 s, parks of at most ``PARK_CAP`` s): short delays only hop, longer ones park and come back, and
several plain records parking together are packed into an envelope instead. Deliveries are drained from the
input queues as the handler forwards them and counted by message id (lost must be 0, duplicates are counted).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from delayed_delivery.aws import DelayedSend, EndpointQueues, HopOutcome, SqsDelayedSender, ensure_endpoint
from delayed_delivery.aws.config import RELEASE_TABLE_ENV
from delayed_delivery.aws.release_calendar import ensure_release_table
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.release import RELEASE_RATES_ENV, ReleaseRates, second_capacity
from delayed_delivery.testing.aws import LocalEventSourcePoller
from tests.fixtures.moto import queue_depth
from tests.reliability.crashlab import InjectedCrash
from tests.reliability.sqslab import (
    LAB_SQS,
    REGION,
    CrashingSqs,
    InvocationFaults,
    SqsSoakResult,
    handler_env,
    lab_settings,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from delayed_delivery.aws import RecordResult

#: Longest park in the lab (``max_park_seconds``), on the scale of the 1 s hop: long delays park more than once.
PARK_CAP = 6
#: Delays drawn per message (whole seconds, both ends included). The shortest park is 4 s (four hops, and twice
#: visibility + hop), so delays up to about 7 s only hop; longer ones park once or twice.
DELAYS = (2, 16)
#: Seconds between progress lines on stderr.
PROGRESS_EVERY = 10.0
#: Seconds between drains of every input queue (forwards lost in a crash mid-batch are found this way).
SWEEP_EVERY = 1.0


#: The lab's compressed SQS settings with parks capped at ``PARK_CAP`` seconds.
SOAK_SQS = LAB_SQS.with_(max_park_seconds=PARK_CAP)


@dataclass
class _Endpoint:
    """One endpoint's queues, its current container and the messages still on their way."""

    index: int
    name: str
    queues: EndpointQueues
    wrapper: CrashingSqs | None = None
    poller: LocalEventSourcePoller | None = None
    on_the_way: set[str] = field(default_factory=set)
    sent: int = 0
    forwarded: bool = False


@dataclass(frozen=True, slots=True)
class Counts:
    """Where a soak stands; ``lost`` is known only once everything has settled (None before)."""

    crashes: int
    delivered: int
    sent: int
    duplicates: int
    parks: int
    lost: int | None = None


class Progress:
    """One line every ``every`` seconds to ``stream``: crashes, deliveries, duplicates, parks, elapsed, ETA."""

    def __init__(self, target: int, stream: TextIO | None, every: float = PROGRESS_EVERY) -> None:
        self.target = target
        self.stream = stream
        self.every = every
        self.started = time.monotonic()
        self._next = self.started + every
        self.settling = False

    def due(self) -> bool:
        """Whether a line is due now."""
        return self.stream is not None and time.monotonic() >= self._next

    def line(self, c: Counts) -> str:
        """The progress line for ``c``."""
        elapsed = time.monotonic() - self.started
        if c.lost is not None:
            eta = "done"
        elif c.crashes >= self.target or self.settling:
            eta = "crashes done, settling"
        elif c.crashes:
            eta = f"ETA {_clock((self.target - c.crashes) * elapsed / c.crashes)}"
        else:
            eta = "ETA unknown"
        lost = f"{c.sent - c.delivered:,} on the way" if c.lost is None else f"{c.lost:,} lost"
        return (
            f"sqs crash soak: {c.crashes:,}/{self.target:,} crashes | {c.delivered:,}/{c.sent:,} delivered "
            f"({lost}) | {c.duplicates:,} duplicates | {c.parks:,} parks | {_clock(elapsed)} elapsed, {eta}"
        )

    def emit(self, c: Counts) -> None:
        """Print the line and schedule the next."""
        if self.stream is not None:
            print(self.line(c), file=self.stream, flush=True)
        self._next = time.monotonic() + self.every


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class CrashSoak:
    """Drives the soak; ``run()`` returns the counts."""

    def __init__(
        self,
        endpoint_url: str,
        *,
        endpoints: int,
        messages: int,
        crashes: int,
        seed: int,
        probability: float,
        release_rate: float | None = None,
        delays: tuple[int, int] = DELAYS,
    ) -> None:
        import boto3

        self.endpoint_url = endpoint_url
        self.session = boto3.session.Session()  # one model cache: a fresh client per container costs ~2 ms
        self.client = self._client()
        self.rng = random.Random(seed)
        self.faults = InvocationFaults(random.Random(seed + 1), probability)
        self.messages = messages
        self.target = crashes
        prefix = f"soak{self.rng.getrandbits(40):010x}"
        self.settings = lab_settings(prefix)
        self.env = handler_env(self.settings, SOAK_SQS)
        self.delays = delays
        #: Release control (``release_rate``): every endpoint capped, its slots in a calendar on moto's DynamoDB.
        self.rates = ReleaseRates.of({"*": release_rate} if release_rate else None)
        self.dynamodb: Any = None
        if self.rates:
            self.dynamodb = self.session.client(
                "dynamodb",
                endpoint_url=endpoint_url,
                region_name=REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
            ensure_release_table(self.dynamodb, f"{prefix}-release")
            self.env |= {RELEASE_RATES_ENV: self.rates.to_json(), RELEASE_TABLE_ENV: f"{prefix}-release"}
        self.sender = SqsDelayedSender(self.client, self.settings, sqs_settings=SOAK_SQS)
        self.arrivals: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.injected = self.invocations = self.errors = 0
        self.crashing = crashes > 0
        self.endpoints = [self._endpoint(i, f"{prefix}-{i}") for i in range(endpoints)]

    def _client(self) -> SQSClient:
        return self.session.client(
            "sqs",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def _endpoint(self, index: int, name: str) -> _Endpoint:
        queues = ensure_endpoint(self.client, name, self.settings, sqs_settings=SOAK_SQS, visibility_timeout=1)
        ep = _Endpoint(index, name, queues)
        self._rebuild(ep)
        return ep

    def _rebuild(self, ep: _Endpoint) -> None:
        """A fresh container for ``ep``: its own client, handler and event source; nothing survives but the queues."""
        ep.wrapper = CrashingSqs(self._client(), self.faults if self.crashing else None)

        def seen(results: list[RecordResult]) -> None:
            for result in results:
                for each in result.per_message():
                    self.outcomes[each.outcome.value] += 1
                    self.outcomes["release_wait"] += each.release_wait
                    self.outcomes["release_slot"] += each.release_lag_s is not None
                    ep.forwarded = ep.forwarded or each.outcome is HopOutcome.FORWARDED

        handler = build_handler(
            self.env,
            sqs_client=ep.wrapper,  # type: ignore[arg-type]
            dynamodb_client=self.dynamodb,
            on_results=seen,
        )
        ep.poller = LocalEventSourcePoller(ep.wrapper, ep.queues.delay_url, ep.queues.delay_arn, handler)  # type: ignore[arg-type]

    def stop_crashing(self) -> None:
        """No more faults and no new messages: what is on its way settles."""
        self.crashing = False
        for ep in self.endpoints:
            if ep.wrapper is not None:
                ep.wrapper.faults = None

    def _top_up(self, ep: _Endpoint) -> None:
        """Send one batch (1-10 messages, one envelope when more than one) if the endpoint has room."""
        room = self.messages - len(ep.on_the_way)
        if room <= 0 or not self.crashing:
            return
        count = min(room, self.rng.randint(1, 10))
        ids = [f"e{ep.index}-{ep.sent + i:07d}" for i in range(count)]
        batch = [DelayedSend(ep.name, mid, self.rng.randint(*self.delays), message_id=mid) for mid in ids]
        result = self.sender.send_delayed_batch(batch)
        assert result.ok, result.failures
        ep.sent += count
        ep.on_the_way.update(ids)

    def _poll(self, ep: _Endpoint) -> int:
        """One event-source poll of ``ep``'s delay queue; a crash rebuilds its container."""
        assert ep.poller is not None
        try:
            records = ep.poller.poll_once(wait_seconds=0)
        except InjectedCrash:
            self.injected += 1
            if self.injected >= self.target:  # the last crash: from now on nothing dies
                self.stop_crashing()
            ep.forwarded = True  # a death mid-batch may have forwarded some
            self._rebuild(ep)
            return 0
        self.invocations += 1 if records else 0
        return records

    def _drain(self, url: str, on_the_way: set[str] | None) -> int:
        """Receive and delete until ``url`` is empty; count bodies (``None``: the error queue)."""
        got = 0
        while True:
            messages = self.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return got
            got += len(messages)
            for m in messages:
                if on_the_way is None:
                    self.errors += 1
                else:
                    self.arrivals[m["Body"]] += 1
                    on_the_way.discard(m["Body"])
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            self.client.delete_message_batch(QueueUrl=url, Entries=entries)  # type: ignore[arg-type]
            if len(messages) < 10:
                return got

    def _settled(self) -> bool:
        """Everything arrived and every delay and input queue is empty (no late duplicate can still come)."""
        if any(ep.on_the_way for ep in self.endpoints):
            return False
        urls = [u for ep in self.endpoints for u in (ep.queues.delay_url, ep.queues.input_url)]
        return all(queue_depth(self.client, u) == 0 for u in urls)

    def _counts(self, lost: int | None = None) -> Counts:
        sent = sum(ep.sent for ep in self.endpoints)
        delivered = sent - sum(len(ep.on_the_way) for ep in self.endpoints)
        duplicates = sum(self.arrivals.values()) - len(self.arrivals)
        return Counts(self.injected, delivered, sent, duplicates, self.outcomes[HopOutcome.PARKED.value], lost)

    def run(self, timeout: float, progress: Progress, crash_seconds: float | None = None) -> SqsSoakResult:
        """Crash until the target (or for ``crash_seconds``), then let everything arrive; give up after ``timeout``."""
        started = time.monotonic()
        next_sweep = started
        while time.monotonic() < started + timeout:
            if self.crashing and crash_seconds is not None and time.monotonic() >= started + crash_seconds:
                self.stop_crashing()
            done = progress.settling = not self.crashing
            busy = 0
            for ep in self.endpoints:
                self._top_up(ep)
                busy += self._poll(ep)
                if progress.due():  # inside the loop: one slow round must not hide progress
                    progress.emit(self._counts())
            sweep = time.monotonic() >= next_sweep
            for ep in self.endpoints:
                if ep.forwarded or sweep:
                    ep.forwarded = False
                    busy += self._drain(ep.queues.input_url, ep.on_the_way)
            if sweep:
                next_sweep = time.monotonic() + SWEEP_EVERY
                self._drain(self.endpoints[0].queues.error_url, None)
            if not busy:
                if done and self._settled():
                    break
                time.sleep(0.05)
        self._drain(self.endpoints[0].queues.error_url, None)
        result = self._result(started)
        progress.emit(self._counts(result.lost))
        return result

    def _result(self, started: float) -> SqsSoakResult:
        expected = {f"e{ep.index}-{n:07d}" for ep in self.endpoints for n in range(ep.sent)}
        lost = sorted(expected - set(self.arrivals))
        return SqsSoakResult(
            messages=len(expected),
            injected_crashes=self.injected,
            crashes_by_point=dict(self.faults.crashes),
            process_kills=0,
            delivered=len(expected & set(self.arrivals)),
            lost=len(lost),
            duplicates=sum(self.arrivals.values()) - len(self.arrivals),
            error_queue=self.errors,
            seconds=round(time.monotonic() - started, 1),
            invocations=self.invocations,
            leftovers=lost[:10],
            parks=self.outcomes[HopOutcome.PARKED.value],
            outcomes=dict(self.outcomes),
            endpoints=len(self.endpoints),
            release_overfull=self._overfull(),
        )

    def _overfull(self) -> int:
        """Seconds of the release calendar holding more than their capacity (must be 0)."""
        if not self.rates:
            return 0
        table = self.env[RELEASE_TABLE_ENV]
        overfull = 0
        for ep in self.endpoints:
            rate = self.rates.rate_for(ep.name)
            assert rate is not None
            items = self.dynamodb.query(
                TableName=table,
                KeyConditionExpression="destination = :d AND #s >= :z",
                ExpressionAttributeNames={"#s": "second"},
                ExpressionAttributeValues={":d": {"S": ep.name}, ":z": {"N": "0"}},
            )["Items"]
            overfull += sum(1 for i in items if int(i["taken"]["N"]) > second_capacity(rate, int(i["second"]["N"])))
        return overfull


def in_process_soak(
    endpoint_url: str,
    messages: int,
    crashes: int,
    seed: int = 1,
    probability: float = 0.5,
    timeout: float = 3600,
    *,
    endpoints: int = 4,
    progress: TextIO | None = None,
    crash_seconds: float | None = None,
    release_rate: float | None = None,
    delays: tuple[int, int] = DELAYS,
) -> SqsSoakResult:
    """Inject ``crashes`` deaths at the fault points over ``endpoints`` endpoints, ``messages`` on the way on each.

    ``crash_seconds`` ends the crash phase early (fewer crashes, reported as such); then everything settles.
    """
    soak = CrashSoak(
        endpoint_url,
        endpoints=endpoints,
        messages=messages,
        crashes=crashes,
        seed=seed,
        probability=probability,
        release_rate=release_rate,
        delays=delays,
    )
    return soak.run(timeout, Progress(crashes, progress), crash_seconds)
