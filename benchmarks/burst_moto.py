"""Burst on moto: 100,000 messages of 1 KiB in one fine bucket, sent by 4 dispatch workers beside the timer (#24).

Against a real moto server (S3 and SQS over HTTP, started the project's way unless ``MOTO_ENDPOINT`` is set):

* **The burst.** ``--messages`` 1 KiB JSON order documents (``costs.tier.order_body``), ids ``m<n>``, due within one
  second 30 s into one fine bucket (the minute ``B0``), written to moto S3 with the tier's writer
  (``S3BucketStore.write``) in objects of 10,000 messages, as the cascade writes them; plus one message due one fine
  bucket later (``B1``, "the next minute": its own object, its own destination queue). The burst goes to
  ``--destinations`` queues (100: moto's time per send grows with the depth of the queue it sends to, so 100,000
  messages into 10 queues would measure moto, not the tier).
* **The tier's own code, in separate processes.** The real ``BucketTimer`` runs every ``--timer-seconds`` in its own
  process: its first run plans ``B0`` (it is too big to send inline) and enqueues one dispatch task per partition on
  a moto SQS dispatch queue; its later runs look after the plan, send ``B1`` inline when it is ready, and delete the
  burst's objects once every partition is done. ``--workers`` dispatch workers, each its own process (so each peak
  memory is its own), loop as the dispatch function's event source would: receive a task, ``PartitionWorker.run`` it
  (deadline: the dispatch function's 180 s timeout; a worker near it records its progress and enqueues its task
  again), delete it. ``bucket_dispatch_concurrency`` is ``--workers``, so the plan has one partition per worker.
* **Time.** Every process reads the same injected clock: the system clock shifted to a fixed date, so that the
  first timer run comes half a timer period after ``B0`` becomes ready (``lead`` seconds before it starts). It runs
  at the real rate, because moto holds a message for its ``DelaySeconds`` in real seconds. The full run compresses
  nothing: fine buckets of 60 s, the 420 s dispatch lead, the timer every 60 s (``--smoke``: fine buckets of 2 s,
  lead 6 s, the timer every second, and the bucket planned from 500 messages, pieces of 256 KiB).

Measured: **lost and duplicates** twice: at the senders (every ``SendMessageBatch`` entry SQS accepted, by the id in
its delivery header) and at the destination queues (drained after the run, ids counted from the delivery header;
``--no-drain`` skips it); **completion** (the first timer run to the burst's last send); the burst's **lateness**
(send time + ``DelaySeconds`` - due: when SQS makes it visible); **the next minute's message**: when its bucket
became ready, when the timer sent it (during the burst or not), its lateness at SQS and on arrival (received by a
watcher), against one timer period; each **worker's and the timer's peak memory** (``VmHWM``, the whole process:
interpreter, boto3 and the send records included, as Lambda's "Max Memory Used"); the **requests** per operation.

Run: ``python -m benchmarks.burst_moto [--messages 100000] [--workers 4] [--destinations 100] [--no-drain]
[--smoke]``. Prints a table and writes ``benchmarks/results/burst_moto[-smoke].json``. Figures: benchmarks/aws.md
("Bursts on moto").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import Row, print_table, rss_mib, write_json
from benchmarks.costs.tier import order_body
from benchmarks.sqs_hops import _moto
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.plan_store import PlanStore, SqsTaskQueue
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.aws.tier.worker import PartitionWorker
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import MAX_OBJECT_MESSAGES, BucketMessage
from delayed_delivery.timebuckets.plans import decode_task
from delayed_delivery.timebuckets.wheel import FINE, BucketKey

NAME = "burst_moto"
#: The burst's fine bucket starts here (on the clock every process reads).
START = datetime(2031, 3, 3, 9, 0, tzinfo=UTC)
NEXT_ID = "next-minute"
#: The dispatch function's and the timer's timeouts (infra/aws/buckets.py DISPATCH_TIMEOUT, TIMER_TIMEOUT).
DISPATCH_TIMEOUT_S = 180.0
TIMER_TIMEOUT_S = 300.0
#: Seconds between the go and the first timer run (every process is ready by then).
STARTUP_S = 0.5
#: Seconds between two progress lines on stderr.
PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True, slots=True)
class Shape:
    """One burst run's sizes and settings."""

    messages: int = 100_000
    workers: int = 4
    destinations: int = 100
    fine_seconds: int = 60
    coarse_seconds: int = 86_400
    lead_seconds: int = 420
    timer_seconds: float = 60.0
    inline_max_messages: int = 4_000
    piece_bytes: int = 4 * 2**20
    drain: bool = True
    timeout_s: float = 3_600.0

    def tier(self, dispatch_queue: str) -> TierSettings:
        """The tier's settings: one partition per worker."""
        return TierSettings(
            bucket_fine_seconds=self.fine_seconds,
            bucket_coarse_seconds=self.coarse_seconds,
            bucket_dispatch_lead_seconds=self.lead_seconds,
            bucket_inline_max_messages=self.inline_max_messages,
            bucket_piece_bytes=self.piece_bytes,
            bucket_partition_messages=min(25_000, -(-self.messages // self.workers)),
            bucket_dispatch_concurrency=self.workers,
            bucket_dispatch_queue=dispatch_queue,
        )

    @property
    def burst_bucket(self) -> BucketKey:
        """``B0``, the burst's fine bucket."""
        return BucketKey(FINE, START)

    @property
    def next_bucket(self) -> BucketKey:
        """``B1``, the next fine bucket."""
        return BucketKey(FINE, START + timedelta(seconds=self.fine_seconds))

    @property
    def due(self) -> datetime:
        """The burst's due second (its messages at ``+ n % 1000`` ms), half a bucket in."""
        return START + timedelta(seconds=self.fine_seconds // 2)


SMOKE = Shape(1_000, 2, 10, 2, 20, 6, 1.0, 250, 128 * 1024, True, 120.0)


class ShiftedClock:
    """The system clock moved by ``offset`` seconds: time runs at its real rate (SQS delays are real seconds)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> datetime:
        """The shifted time."""
        return datetime.fromtimestamp(time.time() + self.offset, UTC)

    def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        time.sleep(max(0.0, seconds))

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait for real."""
        return event.wait(max(0.0, timeout))


def _client(service: str, endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(max_pool_connections=32, retries={"mode": "standard", "max_attempts": 10}),
    )


# --- what a process sends and asks ------------------------------------------------------------------------------------
class Sends:
    """Every message SQS accepted from this process's SendMessageBatch calls: index, send time (the request's start)
    and lateness at SQS (send time + ``DelaySeconds`` - due)."""

    def __init__(self, clock: ShiftedClock) -> None:
        self.clock = clock
        self.index = array("q")
        self.sent = array("d")
        self.late = array("d")
        self.other: list[dict[str, Any]] = []
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()

    def attach(self, client: Any) -> None:
        """Watch ``client``'s requests."""
        client.meta.events.register("before-send", self._count)
        if client.meta.service_model.service_name == "sqs":
            client.meta.events.register("before-parameter-build.sqs.SendMessageBatch", self._before)
            client.meta.events.register("after-call.sqs.SendMessageBatch", self._after)

    def _count(self, event_name: str = "", **_: Any) -> None:
        with self._lock:
            self.requests[".".join(event_name.split(".")[1:3])] += 1

    def _before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        entries = {}
        for entry in params.get("Entries", []):
            header = entry.get("MessageAttributes", {}).get(DELIVERY_HEADER, {}).get("StringValue")
            info = decode_delivery(header)
            if info.message_id is not None and info.due_ms is not None:
                entries[entry["Id"]] = (info.message_id, info.due_ms, int(entry.get("DelaySeconds", 0)))
        context["burst_entries"] = entries
        context["burst_sent"] = self.clock.now().timestamp()  # the request starts: SQS holds it for DelaySeconds

    def _after(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        entries = context.get("burst_entries") or {}
        now = float(context.get("burst_sent", 0.0))
        with self._lock:
            for ok in parsed.get("Successful", []):
                if ok["Id"] not in entries:
                    continue
                message_id, due_ms, delay = entries[ok["Id"]]
                late = now + delay - due_ms / 1000
                if message_id.startswith("m") and message_id[1:].isdigit():
                    self.index.append(int(message_id[1:]))
                    self.sent.append(now)
                    self.late.append(late)
                else:
                    self.other.append({"id": message_id, "sent": now, "late": late, "delay": delay})

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly."""
        return {
            "index": self.index.tolist(),
            "sent": self.sent.tolist(),
            "late": self.late.tolist(),
            "other": self.other,
            "requests": dict(self.requests),
        }


def _vm(field: str) -> float:
    """``VmHWM`` or ``VmRSS`` of this process in MiB."""
    with Path("/proc/self/status").open() as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --- the children: the timer and the dispatch workers --------------------------------------------------------------
def _child(spec: dict[str, Any]) -> None:
    """One timer or worker process: loops until SIGTERM, then writes what it did to ``spec["out"]``."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    threading.Thread(target=_orphaned, args=(parent, stop), daemon=True).start()
    shape = Shape(**spec["shape"])
    clock = ShiftedClock(0.0)
    sends = Sends(clock)
    s3, sqs = _client("s3", spec["endpoint"]), _client("sqs", spec["endpoint"])
    sends.attach(s3)
    sends.attach(sqs)
    store = S3BucketStore(s3, spec["bucket"], "bench", shape.tier(spec["dispatch"]).levels)
    settings = DelayedDeliverySettings(error_queue=spec["errors"])
    tier = shape.tier(spec["dispatch"])
    queue = SqsTaskQueue(sqs, spec["dispatch"])
    timer = BucketTimer(store, sqs, settings, clock, owner="timer", tier=tier, queue=queue)
    worker = PartitionWorker(store, sqs, settings, clock, tier=tier, owner=spec["role"], queue=queue)
    url = sqs.get_queue_url(QueueName=spec["dispatch"])["QueueUrl"]
    rss_ready = _vm("VmRSS")
    work = Path(spec["out"]).parent
    (work / f"{spec['role']}.ready").touch()
    while not (work / "go.json").exists():  # the clock is set once every process is ready
        if stop.wait(0.05):
            return
    go = json.loads((work / "go.json").read_text())
    clock.offset = go["offset"]
    if spec["role"] == "timer":
        runs = _timer_loop(timer, clock, go["first_run"], shape.timer_seconds, stop)
    else:
        runs = _worker_loop(worker, sqs, url, stop)
    out = {"role": spec["role"], "runs": runs, "rss_ready_mib": rss_ready, "peak_rss_mib": _vm("VmHWM")}
    Path(spec["out"]).write_text(json.dumps({**out, **sends.as_dict()}))


def _orphaned(parent: int, stop: threading.Event) -> None:
    """Stop when the benchmark that started this process is gone (killed, interrupted)."""
    while not stop.wait(2.0):
        if os.getppid() != parent:
            stop.set()
            os._exit(3)  # in the middle of a run: nobody is left to read what it did


def _timer_loop(
    timer: BucketTimer, clock: ShiftedClock, first: float, period: float, stop: threading.Event
) -> list[dict[str, Any]]:
    """A timer run at ``first`` (real epoch seconds) and every ``period`` after; a tick missed is skipped."""
    runs = []
    at = first
    while not stop.wait(max(0.0, at - time.time())):
        started, began = clock.now().timestamp(), time.monotonic()
        try:
            counts = {k: v for k, v in asdict(timer.run(deadline=began + TIMER_TIMEOUT_S)).items() if v}
        except Exception as exc:  # as the timer's handler: counted and logged, the next run starts over
            counts = {"failed": repr(exc)[:500]}
        runs.append({"at": started, "seconds": time.monotonic() - began, **counts})
        while at <= time.time():
            at += period
    return runs


def _worker_loop(worker: PartitionWorker, sqs: Any, url: str, stop: threading.Event) -> list[dict[str, Any]]:
    """The dispatch function's event source: receive a task, run it, delete it (batch size 1)."""
    runs: list[dict[str, Any]] = []
    while not stop.is_set():
        try:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1).get("Messages", [])
        except Exception:  # the emulator busy or restarting: poll again, as the event source does
            stop.wait(1.0)
            continue
        for message in got:
            task = decode_task(message["Body"])
            began = time.monotonic()
            try:
                counts = {k: v for k, v in asdict(worker.run(task, began + DISPATCH_TIMEOUT_S)).items() if v}
            except Exception as exc:  # as the dispatch handler: a batch failure, SQS hands the task out again
                runs.append(
                    {"partition": task.partition, "seconds": time.monotonic() - began, "failed": repr(exc)[:500]}
                )
                continue
            runs.append({"partition": task.partition, "seconds": time.monotonic() - began, **counts})
            with contextlib.suppress(Exception):  # not deleted: handed out again, and skipped (the partition is done)
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return runs


# --- the run ---------------------------------------------------------------------------------------------------------
def _messages(shape: Shape, destinations: list[str]) -> Iterator[list[BucketMessage]]:
    """The burst, in objects of 10,000 messages."""
    due = epoch_ms(shape.due)
    sent = due - 30 * 86_400_000
    batch: list[BucketMessage] = []
    for n in range(shape.messages):
        body = order_body(n).encode()
        batch.append(BucketMessage(f"m{n}", destinations[n % len(destinations)], body, due + n % 1000, {}, 0, sent))
        if len(batch) == MAX_OBJECT_MESSAGES:
            yield batch
            batch = []
    if batch:
        yield batch


class _Watcher(threading.Thread):
    """Receives the next minute's message from its queue as soon as SQS lets it go: its arrival (clock seconds)."""

    def __init__(self, sqs: Any, url: str, clock: ShiftedClock) -> None:
        super().__init__(daemon=True)
        self.sqs, self.url, self.clock = sqs, url, clock
        self.arrivals: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            got = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            for m in got.get("Messages", []):
                self.arrivals.append(self.clock.now().timestamp())
                self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])


class Burst:
    """One burst on one moto server: set up, run the timer and the workers, count."""

    def __init__(self, endpoint: str, shape: Shape, work: Path) -> None:
        self.endpoint, self.shape, self.work = endpoint, shape, work
        self.run_id = f"bm{uuid.uuid4().hex[:8]}"
        self.s3, self.sqs = _client("s3", endpoint), _client("sqs", endpoint)
        self.bucket = self.run_id
        self.names = [f"{self.run_id}-orders-{d}" for d in range(shape.destinations)]
        self.next_queue, self.dispatch, self.errors = (f"{self.run_id}-{n}" for n in ("next", "dispatch", "errors"))
        self.urls: dict[str, str] = {}
        #: Wall seconds of each phase: queues, write (the objects), start (the children ready after it), run, drain.
        self.phases: dict[str, float] = {}
        self.store = S3BucketStore(self.s3, self.bucket, "bench", shape.tier(self.dispatch).levels)

    def setup(self) -> None:
        """The bucket and the queues."""
        began = time.monotonic()
        self.s3.create_bucket(Bucket=self.bucket)
        for name in (*self.names, self.next_queue, self.errors):
            self.urls[name] = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        attributes = {"VisibilityTimeout": str(int(2 * DISPATCH_TIMEOUT_S))}  # as the construct's dispatch queue
        self.urls[self.dispatch] = self.sqs.create_queue(QueueName=self.dispatch, Attributes=attributes)["QueueUrl"]
        self.phases["queues_s"] = time.monotonic() - began

    def write(self) -> dict[str, float]:
        """The burst's objects and the next minute's, as the tier's writer writes them; objects and seconds."""
        began = time.monotonic()
        objects = 0
        for batch in _messages(self.shape, self.names):
            objects += len(self.store.write(self.shape.burst_bucket, batch))
        due = epoch_ms(self.shape.due) + self.shape.fine_seconds * 1000
        nxt = BucketMessage(NEXT_ID, self.next_queue, b'{"next":"minute"}', due, {}, 0, due - 86_400_000)
        objects += len(self.store.write(self.shape.next_bucket, [nxt]))
        self.phases["write_s"] = time.monotonic() - began
        return {"objects": objects, "seconds": self.phases["write_s"]}

    def _spawn(self, role: str) -> tuple[subprocess.Popen[bytes], Path]:
        out = self.work / f"{role}.json"
        spec = {"role": role, "endpoint": self.endpoint, "bucket": self.bucket, "dispatch": self.dispatch,
                "errors": self.errors, "out": str(out), "shape": asdict(self.shape)}  # fmt: skip
        log = (self.work / f"{role}.log").open("wb")
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.burst_moto", "--child", json.dumps(spec)],
            cwd=Path(__file__).resolve().parents[1],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return child, out

    def go(self) -> dict[str, Any]:
        """Start the timer and the workers, wait until the tier is done with both buckets, stop them, count."""
        shape = self.shape
        roles = ["timer", *(f"worker-{k}" for k in range(shape.workers))]
        children = {role: self._spawn(role) for role in roles}  # they start while the objects are written
        clock = ShiftedClock(0.0)
        watcher = _Watcher(self.sqs, self.urls[self.next_queue], clock)
        first_clock = shape.burst_bucket.start - timedelta(seconds=shape.lead_seconds - shape.timer_seconds / 2)
        try:
            wrote = self.write()
            print(f"{NAME}: wrote {wrote}", file=sys.stderr, flush=True)
            began = time.monotonic()
            self._ready(children)
            self.phases["start_s"] = time.monotonic() - began
            first_run = time.time() + STARTUP_S
            clock.offset = offset = first_clock.timestamp() - first_run
            (self.work / "go.tmp").write_text(json.dumps({"offset": offset, "first_run": first_run}))
            (self.work / "go.tmp").replace(self.work / "go.json")
            watcher.start()
            finished = self._wait(children, first_run, watcher)
            self.phases["run_s"] = finished - first_run
        finally:
            for child, _ in children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child, _ in children.values():
                child.wait(timeout=120)
            watcher.stop.set()
            watcher.join(timeout=10)
        results = {role: json.loads(out.read_text()) for role, (_, out) in children.items()}
        return {"wrote": wrote, "first_run_clock": first_clock.timestamp(), "finished_clock": finished + offset,
                "arrivals": watcher.arrivals, "children": results}  # fmt: skip

    def _ready(self, children: dict[str, tuple[subprocess.Popen[bytes], Path]]) -> None:
        """Until every child has built its clients and objects."""
        began = time.monotonic()
        while not all((self.work / f"{role}.ready").exists() for role in children):
            self._alive(children)
            if time.monotonic() - began > 300:
                raise RuntimeError("the timer and workers did not start within 300 s")
            time.sleep(0.1)

    def _alive(self, children: dict[str, tuple[subprocess.Popen[bytes], Path]]) -> None:
        for role, (child, _) in children.items():
            if child.poll() is not None:
                log = (self.work / f"{role}.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{role} stopped (exit {child.returncode}):\n{log}")

    def _wait(
        self, children: dict[str, tuple[subprocess.Popen[bytes], Path]], first_run: float, watcher: _Watcher
    ) -> float:
        """Until both buckets' objects and the plan are gone and the next minute's message arrived: the real time."""
        plans = PlanStore(self.store)
        told = time.monotonic()
        while True:
            time.sleep(1.0)
            self._alive(children)
            if time.time() - first_run > self.shape.timeout_s:
                raise RuntimeError(f"not done after {self.shape.timeout_s:.0f} s")
            if time.monotonic() - told >= PROGRESS_EVERY_S:
                told = time.monotonic()
                print(f"{NAME}: {time.time() - first_run:.0f} s: {self._progress(plans)}", file=sys.stderr, flush=True)
            if time.time() < first_run or not watcher.arrivals:
                continue
            if not any(True for _ in self.store.objects(FINE)) and plans.read_plan(self.shape.burst_bucket) is None:
                return time.time()

    def _progress(self, plans: PlanStore) -> str:
        """What the partitions' progress objects say."""
        plan = plans.read_plan(self.shape.burst_bucket)
        if plan is None:
            return "no plan (not planned yet, or done)"
        states = [plans.read_progress(plan, k).progress for k in range(plan.partitions)]
        sent = sum(p.counts.sent for p in states if p is not None)
        done = sum(1 for p in states if p is not None and p.done)
        return f"{sent:,} of {self.shape.messages:,} sent, {done}/{plan.partitions} partitions done"

    def drain(self) -> tuple[bytearray, int]:
        """Receive every message of the burst's queues: copies per index, and messages that are not the burst's."""
        copies = bytearray(self.shape.messages)
        strangers = 0
        lock = threading.Lock()

        def one(name: str) -> None:
            nonlocal strangers
            url = self.urls[name]
            while got := self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=600
            ).get("Messages", []):
                for m in got:
                    header = m.get("MessageAttributes", {}).get(DELIVERY_HEADER, {}).get("StringValue")
                    mid = decode_delivery(header).message_id or ""
                    with lock:
                        if mid.startswith("m") and mid[1:].isdigit() and int(mid[1:]) < len(copies):
                            copies[int(mid[1:])] = min(255, copies[int(mid[1:])] + 1)
                        else:
                            strangers += 1
                entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)]
                self.sqs.delete_message_batch(QueueUrl=url, Entries=entries)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(one, self.names))
        return copies, strangers

    def waiting(self, names: list[str]) -> int:
        """Messages the queues still hold (visible, delayed or in flight)."""
        keys = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible"]  # fmt: skip
        total = 0
        for name in names:
            got = self.sqs.get_queue_attributes(QueueUrl=self.urls[name], AttributeNames=keys)["Attributes"]
            total += sum(int(got.get(k, 0)) for k in keys)
        return total

    def cleanup(self) -> None:
        """Delete the run's queues and objects (moto slows down as it holds more)."""
        for url in self.urls.values():
            with contextlib.suppress(Exception):  # best effort
                self.sqs.delete_queue(QueueUrl=url)
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})
        self.s3.delete_bucket(Bucket=self.bucket)


# --- the figures ------------------------------------------------------------------------------------------------------
def _p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0.0


def figures(shape: Shape, ran: dict[str, Any], drained: tuple[bytearray, int] | None, left: int) -> dict[str, float]:
    """The run's figures from what the children recorded and what the queues held."""
    children = ran["children"]
    copies = bytearray(shape.messages)
    late: list[float] = []
    sent: list[float] = []
    for child in children.values():
        for index, at, lateness in zip(child["index"], child["sent"], child["late"], strict=True):
            copies[index] = min(255, copies[index] + 1)
            sent.append(at)
            late.append(lateness)
    late.sort()
    timer = children["timer"]
    first_run = timer["runs"][0]["at"] if timer["runs"] else ran["first_run_clock"]
    nexts = [o for child in children.values() for o in child["other"] if o["id"] == NEXT_ID]
    next_due = (shape.due + timedelta(seconds=shape.fine_seconds)).timestamp()
    next_ready = (shape.next_bucket.start - timedelta(seconds=shape.lead_seconds)).timestamp()
    next_sent = min((o["sent"] for o in nexts), default=float("nan"))
    arrival = min(ran["arrivals"], default=float("nan"))
    workers = {role: child for role, child in children.items() if role != "timer"}
    requests: Counter[str] = Counter()
    for child in children.values():
        requests.update(child["requests"])
    million = 1e6 / shape.messages
    out: dict[str, float] = {
        "lost": sum(1 for c in copies if c == 0),
        "duplicates": sum(max(0, c - 1) for c in copies),
        "completion_s": max(sent, default=first_run) - first_run,
        "lateness_p50_s": statistics.median(late) if late else 0.0,
        "lateness_p99_s": _p(late, 0.99),
        "lateness_max_s": late[-1] if late else 0.0,
        "early": sum(1 for x in late if x < 0),
        "next_minute_copies": len(nexts),
        "next_minute_sent_after_ready_s": next_sent - next_ready,
        "next_minute_sent_during_burst": float(next_sent < max(sent, default=0.0)),
        "next_minute_lateness_s": min((o["late"] for o in nexts), default=float("nan")),
        "next_minute_arrival_lateness_s": arrival - next_due,
        "timer_period_s": shape.timer_seconds,
        "timer_runs": len(timer["runs"]),
        "timer_run_max_s": max((r["seconds"] for r in timer["runs"]), default=0.0),
        "timer_peak_rss_mib": timer["peak_rss_mib"],
        "messages_left_in_queues": left,
    }
    if drained is not None:
        received, strangers = drained
        out["drained_lost"] = sum(1 for c in received if c == 0)
        out["drained_duplicates"] = sum(max(0, c - 1) for c in received) + strangers
    for role, child in sorted(workers.items()):
        out[f"{role}_peak_rss_mib"] = child["peak_rss_mib"]
        out[f"{role}_rss_ready_mib"] = child["rss_ready_mib"]
        out[f"{role}_tasks"] = len(child["runs"])
        out[f"{role}_dispatched"] = sum(r.get("dispatched", 0) for r in child["runs"])
    runs = [r for child in workers.values() for r in child["runs"]]
    for key in ("continued", "lost_partition", "skipped", "pieces", "to_error_queue", "kept_for_retry"):
        out[f"worker_{key}"] = sum(r.get(key, 0) for r in runs)
    out["worker_failed_runs"] = sum(1 for r in runs if "failed" in r)
    out["timer_failed_runs"] = sum(1 for r in timer["runs"] if "failed" in r)
    for op in ("sqs.SendMessageBatch", "sqs.ReceiveMessage", "s3.GetObject", "s3.PutObject", "s3.ListObjectsV2"):
        out[f"{op.replace('.', '_')}_per_million"] = requests[op] * million
    return out


_UNITS = {"lost": "messages", "duplicates": "messages", "drained": "messages", "early": "messages",
          "next_minute_copies": "messages", "messages_left": "messages", "timer_runs": "runs",
          "next_minute_sent_during": "yes=1"}  # fmt: skip


def _unit(key: str) -> str:
    if key.endswith("_s"):
        return "s"
    if key.endswith("_mib"):
        return "MiB"
    if key.endswith("_per_million"):
        return "requests"
    return next((u for prefix, u in _UNITS.items() if key.startswith(prefix)), "count")


def _rows(shape: Shape, f: dict[str, float]) -> list[Row]:
    note = (
        f"{shape.messages:,} x 1 KiB in one fine bucket, {shape.workers} workers, {shape.destinations} queues; "
        f"fine {shape.fine_seconds} s, lead {shape.lead_seconds} s, timer every {shape.timer_seconds:g} s"
    )
    return [Row(NAME, key, _unit(key), (value,), notes=note if key == "lost" else "") for key, value in f.items()]


def measure(endpoint: str, shape: Shape) -> tuple[list[Row], dict[str, Any]]:
    """One burst on the moto server at ``endpoint``: the rows and everything recorded."""
    with tempfile.TemporaryDirectory(prefix="burst-moto-") as work:
        burst = Burst(endpoint, shape, Path(work))
        try:
            burst.setup()
            ran = burst.go()
            left = burst.waiting([*burst.names, burst.errors])
            before = json.dumps(figures(shape, ran, None, left))
            print(f"{NAME}: done, before the drain: {before}", file=sys.stderr, flush=True)
            began = time.monotonic()
            drained = burst.drain() if shape.drain else None
            burst.phases["drain_s"] = time.monotonic() - began
            print(f"{NAME}: phases {burst.phases}", file=sys.stderr, flush=True)
            errors = burst.waiting([burst.errors])
        finally:
            burst.cleanup()
    f = figures(shape, ran, drained, left)
    f["error_queue"] = errors
    requests: Counter[str] = Counter()
    for child in ran["children"].values():
        requests.update(child["requests"])
    extra = {"shape": asdict(shape), "wrote": ran["wrote"], "main_rss_mib": rss_mib(), "phases": burst.phases,
             "requests": dict(requests), "wall": {"first_run_clock": ran["first_run_clock"],
                                                  "finished_clock": ran["finished_clock"]},
             "timer_runs": ran["children"]["timer"]["runs"],
             "worker_runs": {r: c["runs"] for r, c in ran["children"].items() if r != "timer"}}  # fmt: skip
    return _rows(shape, f), {"figures": f, **extra}


def run(smoke: bool = False, *, shape: Shape | None = None) -> list[Row]:
    """The benchmark-runner entry point."""
    shape = shape or (SMOKE if smoke else Shape())
    with _moto() as endpoint:
        rows, last = measure(endpoint, shape)
    run.last = last  # type: ignore[attr-defined]
    return rows


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/burst_moto[-smoke].json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2,000 messages, 2 workers, compressed time")
    parser.add_argument("--messages", type=int, help="burst size (100,000)")
    parser.add_argument("--workers", type=int, help="dispatch workers (4)")
    parser.add_argument("--destinations", type=int, help="destination queues the burst is spread over (100)")
    parser.add_argument("--no-drain", action="store_true", help="count at the senders and from queue sizes only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        _child(json.loads(a.child))
        return
    base = SMOKE if a.smoke else Shape()
    changes = {k: v for k, v in (("messages", a.messages), ("workers", a.workers),
                                 ("destinations", a.destinations)) if v is not None}  # fmt: skip
    for key, value in changes.items():
        if value < 1:
            parser.error(f"--{key} must be at least 1")
    shape = Shape(**{**asdict(base), **changes, "drain": base.drain and not a.no_drain})
    begin, load = time.monotonic(), os.getloadavg()
    rows = run(shape=shape)
    print_table(rows, "Burst on moto: one fine bucket sent by the tier's timer and dispatch workers")
    extra = {**run.last, "seconds": time.monotonic() - begin,  # type: ignore[attr-defined]
             "load_average": {"start": load, "end": os.getloadavg()}}  # fmt: skip
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, extra))


if __name__ == "__main__":
    main()
