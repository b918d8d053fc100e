"""The S3 time-bucket tier on moto server: lateness end to end, dispatch throughput, dispatcher memory vs pending.

* **Lateness** (real, compressed time: fine buckets 1 s, coarse 10 s, dispatch lead 2 s, the timer every second):
  messages sent at random moments of the first 5 s, due 3 s to ``max_delay`` s later, go through the sender (route
  ``buckets``), the ingest step and the timer to a destination queue drained by a thread; lateness = arrival - due
  (the due time is read from the delivery header). Per run: p50, p99, max and the count that arrived before their
  due time (early); apart, the two parts of it: the whole-second ``DelaySeconds`` rounding (when the timer's
  send plus its DelaySeconds makes the message visible, minus due) and what comes after (arrival minus that).
* **Dispatch throughput**: ``N`` messages of 1 KiB (one attribute) for ten destination queues in the fine buckets
  one timer run finds ready (default levels: the next lead + one fine bucket, 8 buckets at the 420 s lead) sent by
  one ``BucketTimer.run`` (listing, leases, reads,
  SendMessageBatch with DelaySeconds, deletes), against a raw ``SendMessageBatch`` loop of the same entries held
  in memory. The two alternate round by round on fresh queues; the ratio is timer / raw (target >= 0.8). Ten
  queues, because moto's time per send grows with the depth of the queue (2,000 sends into one queue take 85 s).
* **Memory**: the timer's peak Python memory (``tracemalloc``, over its baseline) while one run dispatches the same
  ready set (1,000 messages) with 10 thousand, 1 million and 10 million messages pending in far buckets (a tenth in
  fine buckets later today, the rest in coarse buckets 2 to 366 days ahead, 10,000 messages an object, written
  straight to moto S3). The timer lists only the buckets it needs, so the peak should not grow with pending.

Run: ``python -m benchmarks.bucket_tier [--smoke] [--runs 5] [--parts memory] [--pending 10000 1000000 ...]``.
Starts its own moto server unless ``MOTO_ENDPOINT`` is set. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import tracemalloc
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.common import Row, print_table, write_json
from benchmarks.sqs_hops import _moto
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.provision import ensure_bucket_tier
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock, SystemClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import MAX_OBJECT_MESSAGES, BucketMessage
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, BucketLevel, dispatch_window

NAME = "bucket_tier"
BODY_BYTES = 1024
START = datetime(2030, 1, 1, tzinfo=UTC)
PENDING = (10_000, 1_000_000, 10_000_000)
READY = 1_000
#: Lateness runs send each message at a random moment of their first seconds (so due times fall at any phase of
#: the timer's runs, as real sends do: DelaySeconds is whole seconds, so this phase decides the rounding).
SEND_SECONDS = 5.0
PARTS = ("lateness", "throughput", "memory")
#: Destination queues a dispatch sample spreads over (moto spends time per send in proportion to a queue's depth).
DESTINATIONS = 10


def _client(service: str, endpoint: str) -> Any:
    import boto3

    return boto3.client(
        service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def _tier(endpoint: str, compressed: bool = False) -> tuple[Any, Any, BucketTierConfig, str]:
    """A fresh tier (bucket, ingest queue, error queue) and destination queue: s3, sqs, config, destination URL."""
    run = f"bt{uuid.uuid4().hex[:10]}"
    routing = COMPRESSED_SQS if compressed else SqsSettings()
    s3, sqs = _client("s3", endpoint), _client("sqs", endpoint)
    config = BucketTierConfig(
        bucket_name=run,
        prefix="bench",
        settings=DelayedDeliverySettings(error_queue=f"{run}-errors"),
        sqs_settings=routing.with_(bucket_ingest_queue=f"{run}-ingest", long_delay_route="buckets"),
        tier_settings=COMPRESSED_TIER if compressed else TierSettings(),
    )
    ensure_bucket_tier(s3, sqs, config)
    return s3, sqs, config, sqs.create_queue(QueueName=f"{run}-orders")["QueueUrl"]


def _drop(sqs: Any, config: BucketTierConfig, *urls: str) -> None:
    """Delete the run's queues (moto slows down as it holds more)."""
    names = (
        config.sqs_settings.bucket_ingest_queue,
        f"{config.sqs_settings.bucket_ingest_queue}-dlq",
        config.settings.error_queue,
    )
    for url in [*urls, *(sqs.get_queue_url(QueueName=n)["QueueUrl"] for n in names)]:
        sqs.delete_queue(QueueUrl=url)


# --- lateness ---------------------------------------------------------------------------------------------------------
COMPRESSED_SQS = SqsSettings(max_native_delay=2, fifo_queue_delay=2)
COMPRESSED_TIER = TierSettings(bucket_fine_seconds=1, bucket_coarse_seconds=10, bucket_dispatch_lead_seconds=2)


class _Arrivals(threading.Thread):
    """Drains the destination queue: message id -> (arrival epoch s, due epoch s), and how many copies came."""

    def __init__(self, sqs: Any, url: str) -> None:
        super().__init__(daemon=True)
        self.sqs, self.url = sqs, url
        self.first: dict[str, tuple[float, float]] = {}
        self.copies = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            reply = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
            messages = reply.get("Messages", [])
            now = time.time()
            for m in messages:
                info = decode_delivery(m.get("MessageAttributes", {}).get(DELIVERY_HEADER, {}).get("StringValue"))
                self.copies += 1
                if info.message_id is not None and info.due_ms is not None:
                    self.first.setdefault(info.message_id, (now, info.due_ms / 1000))
            if messages:
                entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
                self.sqs.delete_message_batch(QueueUrl=self.url, Entries=entries)
            else:
                time.sleep(0.02)


def _ingest_all(sqs: Any, url: str, ingest: BucketIngest) -> None:
    """What the event source does, until the ingest queue is empty."""
    while messages := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30, MessageAttributeNames=["All"]
    ).get("Messages", []):
        records = [
            {
                "messageId": m["MessageId"],
                "body": m["Body"],
                "messageAttributes": {
                    k: {"stringValue": v.get("StringValue"), "dataType": v.get("DataType")}
                    for k, v in m.get("MessageAttributes", {}).items()
                },
            }
            for m in messages
        ]
        failed = ingest.process(records).failures
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(done)]
            sqs.delete_message_batch(QueueUrl=url, Entries=entries)


def _p99(values: Sequence[float]) -> float:
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def lateness_sample(endpoint: str, messages: int, max_delay: int, seed: int) -> dict[str, float]:
    """One end-to-end run in real compressed time: lateness p50/p99/max in seconds, early and lost counts."""
    s3, sqs, config, dest = _tier(endpoint, compressed=True)
    settings, rng = config.settings, random.Random(seed)
    ingest_url = sqs.get_queue_url(QueueName=config.sqs_settings.bucket_ingest_queue)["QueueUrl"]
    store = S3BucketStore.from_config(s3, config)
    ingest = BucketIngest(store, sqs, settings, SystemClock())
    phase = TierSettings().with_(bucket_send_phase_ms=config.tier_settings.bucket_send_phase_ms)
    timer = BucketTimer(store, sqs, settings, SystemClock(), owner="bench", lease_seconds=30, tier=phase)
    arrivals = _Arrivals(_client("sqs", endpoint), dest)
    arrivals.start()
    sender = SqsDelayedSender(sqs, settings, sqs_settings=config.sqs_settings)
    name = dest.rsplit("/", 1)[1]
    planned: dict[str, float] = {}  # message id -> when the timer's DelaySeconds makes it visible

    def dispatching(params: dict[str, Any], **_: Any) -> None:
        if params.get("QueueUrl") == dest:
            for entry in params["Entries"]:
                planned.setdefault(entry["MessageBody"], time.time() + entry.get("DelaySeconds", 0))

    sqs.meta.events.register("before-parameter-build.sqs.SendMessageBatch", dispatching)
    plan = sorted(
        (rng.uniform(0, SEND_SECONDS), DelayedSend(name, f"m{n}", rng.randint(3, max_delay), message_id=f"m{n}"))
        for n in range(messages)
    )
    begin = time.monotonic()
    deadline, next_run = begin + SEND_SECONDS + max_delay + 30, begin
    while len(arrivals.first) < messages and time.monotonic() < deadline:
        due_now = [send for at, send in plan if at <= time.monotonic() - begin]
        plan = plan[len(due_now) :]
        for first in range(0, len(due_now), 10):
            sender.send_delayed_batch(due_now[first : first + 10]).raise_for_failures()
        _ingest_all(sqs, ingest_url, ingest)
        if time.monotonic() >= next_run:
            next_run += 1.0  # the timer's period: one fine bucket
            timer.run()
        time.sleep(0.005)
    arrivals.stop.set()
    arrivals.join()
    _drop(sqs, config, dest)
    late = sorted(arrived - due for arrived, due in arrivals.first.values())
    beyond = sorted(arrived - planned[m] for m, (arrived, _) in arrivals.first.items() if m in planned)
    return {
        "rounding_p99": _p99(sorted(planned[m] - due for m, (_, due) in arrivals.first.items() if m in planned)),
        "beyond_delay_p50": statistics.median(beyond),
        "beyond_delay_p99": _p99(beyond),
        "p50": statistics.median(late),
        "p99": _p99(late),
        "max": late[-1],
        "early": sum(1 for x in late if x < 0),
        "lost": messages - len(arrivals.first),
        "duplicates": arrivals.copies - len(arrivals.first),
    }


# --- dispatch throughput --------------------------------------------------------------------------------------------
def _ready_messages(count: int, now: datetime, destinations: Sequence[str], prefix: str = "t") -> list[BucketMessage]:
    """``count`` messages of 1 KiB with one attribute, due over the fine buckets a run at ``now`` finds ready (default
    levels: the lead plus one fine bucket), round robin over ``destinations``."""
    due0 = epoch_ms(now) + 1_000
    span_ms = epoch_ms(dispatch_window(now).last.end(BucketLevel())) - due0
    return [
        BucketMessage(
            f"{prefix}{n}",
            destinations[n % len(destinations)],
            f"message {n} ".ljust(BODY_BYTES, "x").encode(),
            due0 + n * span_ms // count,
            {"n": {"DataType": "Number", "StringValue": str(n)}},
            sent_at_ms=due0 - 86_400_000,
        )
        for n in range(count)
    ]


def _raw_batches(messages: Sequence[BucketMessage], urls: dict[str, str]) -> list[tuple[str, list[Any]]]:
    """The raw loop's requests: per destination, batches of 10 entries with the same body, attribute and delay."""
    window = dispatch_window(START)
    grouped: dict[str, list[Any]] = {}
    for m in messages:
        entry = {
            "Id": str(len(grouped.get(m.destination, [])) % 10),
            "MessageBody": m.body.decode(),
            "MessageAttributes": dict(m.attributes),
            "DelaySeconds": window.delay_seconds(m.due_at),
        }
        grouped.setdefault(m.destination, []).append(entry)
    return [(urls[d], e[i : i + 10]) for d, e in grouped.items() for i in range(0, len(e), 10)]


def throughput_sample(endpoint: str, side: str, count: int) -> float:
    """Messages per second for ``side`` (``timer`` or ``raw``) on fresh queues and a fresh S3 bucket."""
    s3, sqs, config, dest = _tier(endpoint)
    names = [f"{dest.rsplit('/', 1)[1]}-{n}" for n in range(DESTINATIONS)]
    urls = {name: sqs.create_queue(QueueName=name)["QueueUrl"] for name in names}
    messages = _ready_messages(count, START, names)
    if side == "timer":
        store = S3BucketStore.from_config(s3, config)
        store.write_due(messages, START)
        timer = BucketTimer(store, sqs, config.settings, ManualClock(START), owner="bench")
        begin = time.perf_counter()
        done = timer.run().dispatched
    else:
        batches = _raw_batches(messages, urls)
        begin = time.perf_counter()
        done = 0
        for url, entries in batches:
            done += len(sqs.send_message_batch(QueueUrl=url, Entries=entries).get("Successful", []))
    elapsed = time.perf_counter() - begin
    _drop(sqs, config, dest, *urls.values())
    if done != count:
        raise RuntimeError(f"{side}: {done} of {count} messages sent")
    return count / elapsed


# --- memory vs pending ----------------------------------------------------------------------------------------------
def _far_messages(first: int, count: int, bucket: BucketKey, span_ms: int) -> list[BucketMessage]:
    start = epoch_ms(bucket.start)
    return [
        BucketMessage(f"far{n}", "orders", b"pending message", start + (n * 7_919) % span_ms, {}, 0, epoch_ms(START))
        for n in range(first, first + count)
    ]


def add_pending(store: S3BucketStore, have: int, want: int) -> int:
    """Write far messages (objects of 10,000) until ``want`` are pending: a tenth fine, later today; the rest coarse."""
    while have < want:
        count = min(MAX_OBJECT_MESSAGES, want - have)
        index = have // MAX_OBJECT_MESSAGES
        if index % 10 == 0:  # fine: one bucket a minute from START + 1 h
            bucket, span = BucketKey(FINE, START + timedelta(hours=1, minutes=index // 10)), 60_000
        else:  # coarse: 2 to 366 days ahead
            bucket, span = BucketKey(COARSE, START + timedelta(days=2 + index % 365)), 86_400_000
        store.write(bucket, _far_messages(have, count, bucket, span))
        have += count
    return have


def memory_sample(store: S3BucketStore, sqs: Any, config: BucketTierConfig, ready: int) -> tuple[float, float, int]:
    """One timer run dispatching the ready set: peak MiB over the baseline, seconds, ListObjectsV2 calls."""
    names = [f"{config.bucket_name}-ready-{n}" for n in range(DESTINATIONS)]
    urls = [sqs.create_queue(QueueName=name)["QueueUrl"] for name in names]
    store.write_due(_ready_messages(ready, START, names, "r"), START)
    lists = [0]

    def count(**_: Any) -> None:
        lists[0] += 1

    store.client.meta.events.register("before-call.s3.ListObjectsV2", count)
    timer = BucketTimer(store, sqs, config.settings, ManualClock(START), owner="bench")
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    begin = time.perf_counter()
    result = timer.run()
    elapsed = time.perf_counter() - begin
    peak = tracemalloc.get_traced_memory()[1] - baseline
    store.client.meta.events.unregister("before-call.s3.ListObjectsV2", count)
    for url in urls:
        sqs.delete_queue(QueueUrl=url)
    if result.dispatched != ready or result.cascaded_messages:
        raise RuntimeError(f"the memory run dispatched {result.dispatched} of {ready} ({result})")
    return peak / 2**20, elapsed, lists[0]


def memory_levels(endpoint: str, pending: Sequence[int], runs: int, ready: int) -> dict[int, list[tuple[float, ...]]]:
    """For each pending level (growing), ``runs`` timer runs: (peak MiB, seconds, list calls, write seconds)."""
    s3, sqs, config, dest = _tier(endpoint)
    sqs.delete_queue(QueueUrl=dest)
    store = S3BucketStore.from_config(s3, config)
    out: dict[int, list[tuple[float, ...]]] = {}
    have = 0
    tracemalloc.start()
    try:
        for want in pending:
            begin = time.perf_counter()
            tracemalloc.stop()  # writing the pending objects is not measured (and runs faster untraced)
            have = add_pending(store, have, want)
            tracemalloc.start()
            wrote = time.perf_counter() - begin
            memory_sample(store, sqs, config, ready)  # warm-up: queue look-ups, connection pool
            out[want] = [(*memory_sample(store, sqs, config, ready), wrote) for _ in range(runs)]
    finally:
        tracemalloc.stop()
    return out


# --- the runner -----------------------------------------------------------------------------------------------------
def _rows_lateness(samples: list[dict[str, float]], messages: int, max_delay: int) -> list[Row]:
    note = f"{messages} messages due 3-{max_delay} s ahead per run; fine 1 s, coarse 10 s, lead 2 s, timer every 1 s"
    units = {
        "p50": "s",
        "p99": "s",
        "max": "s",
        "rounding_p99": "s",
        "beyond_delay_p50": "s",
        "beyond_delay_p99": "s",
        "early": "messages",
        "lost": "messages",
        "duplicates": "messages",
    }
    return [
        Row(
            NAME,
            f"lateness_{key}" if unit == "s" else f"lateness_{key}_count",
            unit,
            tuple(s[key] for s in samples),
            notes=note,
        )
        for key, unit in units.items()
    ]


def _rows_throughput(samples: dict[str, list[float]], count: int) -> list[Row]:
    raw = statistics.median(samples["raw"])
    note = f"{count} messages of {BODY_BYTES} B in 10 fine buckets, batch 10, moto server"
    return [
        Row(NAME, "raw_send_message_batch_messages_per_s", "messages/s", tuple(samples["raw"]), notes=note),
        Row(
            NAME,
            "timer_dispatch_messages_per_s",
            "messages/s",
            tuple(samples["timer"]),
            "raw SendMessageBatch loop, same rounds",
            statistics.median(samples["timer"]) / raw,
            notes="one BucketTimer.run: list, lease, read, send with DelaySeconds, delete",
        ),
    ]


def _rows_memory(levels: dict[int, list[tuple[float, ...]]], ready: int) -> list[Row]:
    rows: list[Row] = []
    smallest = min(levels)
    base = statistics.median(s[0] for s in levels[smallest])
    for pending, samples in levels.items():
        peak = tuple(s[0] for s in samples)
        note = f"{pending:,} pending in far buckets, {ready} ready; pending objects written in {samples[0][3]:.0f} s"
        rows += [
            Row(
                NAME,
                f"timer_peak_mib_pending_{pending}",
                "MiB",
                peak,
                f"pending {smallest:,}",
                statistics.median(peak) / base,
                notes=note,
            ),
            Row(NAME, f"timer_run_s_pending_{pending}", "s", tuple(s[1] for s in samples)),
            Row(NAME, f"timer_list_calls_pending_{pending}", "calls", tuple(s[2] for s in samples)),
        ]
    return rows


def run(
    smoke: bool = False,
    *,
    runs: int = 5,
    messages: int = 200,
    max_delay: int = 30,
    dispatch: int = 2_000,
    pending: Sequence[int] = PENDING,
    parts: Sequence[str] = PARTS,
) -> list[Row]:
    """The benchmark-runner entry point (``parts``: any of lateness, throughput, memory)."""
    if smoke:
        runs, messages, max_delay, dispatch, pending = 1, 20, 5, 200, (1_000, 20_000)  # one sample each
    ready = 100 if smoke else READY
    rows: list[Row] = []
    samples: dict[str, object] = {}
    with _moto() as endpoint:
        if "lateness" in parts:
            late = [lateness_sample(endpoint, messages, max_delay, seed) for seed in range(1 if smoke else runs)]
            samples["lateness"], rows = late, rows + _rows_lateness(late, messages, max_delay)
        if "throughput" in parts:
            speed: dict[str, list[float]] = {"raw": [], "timer": []}
            for _ in range(runs):
                for side in speed:
                    speed[side].append(throughput_sample(endpoint, side, dispatch))
            samples["throughput"], rows = speed, rows + _rows_throughput(speed, dispatch)
        if "memory" in parts:
            memory = memory_levels(endpoint, pending, runs, ready)
            samples["memory"], rows = memory, rows + _rows_memory(memory, ready)
    run.last_samples = samples  # type: ignore[attr-defined]
    return rows


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/bucket_tier[-<parts>].json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200, help="messages per lateness run")
    parser.add_argument("--dispatch", type=int, default=2_000, help="messages per throughput sample")
    parser.add_argument("--pending", type=int, nargs="+", default=list(PENDING), help="pending levels (growing)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs, messages=a.messages, dispatch=a.dispatch, pending=a.pending, parts=a.parts)
    print_table(rows, "S3 time-bucket tier: lateness, dispatch throughput, memory vs pending (moto server)")
    name = NAME + ("" if set(a.parts) == set(PARTS) else "-" + "-".join(a.parts)) + ("-smoke" if a.smoke else "")
    print(write_json(name, rows, {"samples": run.last_samples}))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
