"""The burst model: a million messages of 1 KiB due in the same second, sent by the tier's own code at AWS latency.

The fine bucket holds the burst in objects of 10,000 messages (as the cascade writes them), for ten destination queues.
The tier's real timer plans it (one run, ``lead`` seconds before the due second: 420 s, the dispatch lead, when it was
written ahead as usual, 0 when it is already due, e.g. after an outage) and enqueues its tasks; the tier's real dispatch
workers then send it, ``workers`` at a time (the event source's MaximumConcurrency), each task in a simulated Lambda
invocation (``benchmarks/fakeaws.py``: S3 and SQS in memory behind real boto3 clients; every request charged the latency
``benchmarks/aws_costs.py`` assumes, S3 100 ms and SQS 20 ms, plus the client CPU the in-memory answer skips, measured
against moto; the function's CPU seconds scaled by its share of a core at its memory size (a full core at its 1,769 MB,
0.29 at the timer's 512 MB); a cold start of 1 s per slot's first invocation; a task picked up 0.1 s after it is free).
Invocations of different partitions share nothing but the dispatch queue, so they run one after another in this process,
each on its own simulated clock; the event loop hands each task to the slot free first.

Per run: lateness (visible = send time + DelaySeconds, minus the due time) p50 / p99 / max, lost, duplicates, the
completion time (plan to the last send), the requests and GB-seconds per million messages burst (the cost of the
burst itself). The curve: completion time against worker count.

Run: ``python -m benchmarks.burst_model [--messages 1000000] [--workers 32] [--curve 4 8 16 32 64]
[--curve-messages 1000000] [--lead 420 0] [--smoke]``. Prints a table and writes
``benchmarks/results/burst_model[-smoke].json``. Figures: benchmarks/aws.md ("Bursts").
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from benchmarks.aws_costs import LATENCY
from benchmarks.common import Row, print_table, write_json
from benchmarks.costs.tier import order_body
from benchmarks.fakeaws import FakeAws, Sends, SimClock, SimTime, calibrate_client_cpu
from benchmarks.sqs_hops import _moto
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.plan_store import SqsTaskQueue
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.aws.tier.worker import PartitionWorker, WorkerResult
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import MAX_OBJECT_MESSAGES, BucketMessage
from delayed_delivery.timebuckets.plans import decode_task
from delayed_delivery.timebuckets.wheel import FINE, BucketKey, BucketLevel

NAME = "burst_model"
#: The due second: 30 s into a fine bucket.
DUE = datetime(2031, 3, 3, 9, 0, 30, tzinfo=UTC)
BUCKET = BucketKey(FINE, DUE.replace(second=0))
DESTINATIONS = 10
#: A Lambda gets one full core at 1,769 MB and a share in proportion below.
FULL_CORE_MB = 1_769
DISPATCH_MB = 1_769
TIMER_MB = 512
COLD_START_S = 1.0
PICKUP_S = 0.1
#: The dispatch function's timeout (infra/aws/buckets.py DISPATCH_TIMEOUT).
TIMEOUT_S = 180.0
SETTINGS = DelayedDeliverySettings(error_queue="errors")


def _index(entry: dict[str, Any]) -> int:
    """The message index an entry carries (its id ``m<n>``, read from the delivery header)."""
    header = entry.get("MessageAttributes", {}).get(DELIVERY_HEADER, {}).get("StringValue")
    message_id = decode_delivery(header).message_id
    return int(message_id[1:]) if message_id and message_id.startswith("m") else -1


def _burst(messages: int) -> list[list[BucketMessage]]:
    """The burst in objects of 10,000 messages: 1 KiB JSON order documents, due within the same second."""
    due = epoch_ms(DUE)
    sent = due - 30 * 86_400_000
    batch: list[BucketMessage] = []
    objects = []
    for n in range(messages):
        body = order_body(n).encode()
        batch.append(BucketMessage(f"m{n}", f"orders-{n % DESTINATIONS}", body, due + n % 1000, {}, 0, sent))
        if len(batch) == MAX_OBJECT_MESSAGES:
            objects.append(batch)
            batch = []
    if batch:
        objects.append(batch)
    return objects


class Model:
    """One burst, planned and sent by simulated invocations."""

    def __init__(self, messages: int, workers: int, lead: int, client_cpu: float, objects: Sequence[Any]) -> None:
        self.messages = messages
        self.workers = workers
        self.lead = lead
        self.sends = Sends(messages)
        self.fake = FakeAws(latency=LATENCY, client_cpu=client_cpu, message_index=_index, sends=self.sends)
        self.s3, self.sqs = self.fake.client("s3"), self.fake.client("sqs")
        for name in (*(f"orders-{d}" for d in range(DESTINATIONS)), "errors", "dispatch"):
            self.fake.create_queue(name)
        self.store = S3BucketStore(self.s3, "burst-model", "bench", BucketLevel())
        self.fake.objects.update(objects)
        self.tier = TierSettings(bucket_dispatch_concurrency=workers, bucket_dispatch_queue="dispatch")
        self.fake.send_threads = self.tier.bucket_send_threads
        self.invocations: list[tuple[float, float, WorkerResult]] = []
        self.timer_seconds = 0.0

    def _scale(self, mb: int) -> float:
        return FULL_CORE_MB / min(mb, FULL_CORE_MB)

    def _timer(self, at: float) -> float:
        """One timer run at ``at`` (epoch seconds); its end."""
        sim = SimTime(datetime.fromtimestamp(at, UTC), self._scale(TIMER_MB))
        self.fake.sim = sim
        queue = SqsTaskQueue(self.sqs, "dispatch")
        timer = BucketTimer(self.store, self.sqs, SETTINGS, SimClock(sim), owner="timer", tier=self.tier, queue=queue,
                            monotonic=sim.seconds)  # fmt: skip
        timer.run(deadline=300.0)
        self.timer_seconds += sim.seconds()
        return at + sim.seconds()

    def run(self) -> dict[str, float]:
        """Plan, send, clean up; the figures."""
        plan_at = DUE.timestamp() - self.lead
        self._timer(plan_at)
        tasks: deque[tuple[float, str]] = deque(self.fake.queues.pop("dispatch", []))
        slots = [(plan_at, n, True) for n in range(self.workers)]
        heapq.heapify(slots)
        queue = SqsTaskQueue(self.sqs, "dispatch")
        while tasks:
            enqueued, body = tasks.popleft()
            free, slot, cold = heapq.heappop(slots)
            start = max(free, enqueued) + PICKUP_S + (COLD_START_S if cold else 0.0)
            sim = SimTime(datetime.fromtimestamp(start, UTC), self._scale(DISPATCH_MB))
            self.fake.sim = sim
            worker = PartitionWorker(self.store, self.sqs, SETTINGS, SimClock(sim), tier=self.tier,
                                     owner=f"w{len(self.invocations)}", queue=queue, monotonic=sim.seconds)  # fmt: skip
            result = worker.run(decode_task(body), deadline=TIMEOUT_S)
            end = start + sim.seconds()
            self.invocations.append((start, end, result))
            heapq.heappush(slots, (end, slot, False))
            tasks.extend(self.fake.queues.pop("dispatch", []))
        last = max((end for _, end, _ in self.invocations), default=plan_at)
        self._timer(last + 60)  # the next timer run: the plan is done, its objects and the plan go
        return self._figures(plan_at)

    def _figures(self, plan_at: float) -> dict[str, float]:
        due = DUE.timestamp()
        late = sorted(
            v - (due + (n % 1000) / 1000) for n, v in enumerate(self.sends.first_visible) if self.sends.copies[n]
        )
        lost = sum(1 for c in self.sends.copies if c == 0)
        duplicates = sum(max(0, c - 1) for c in self.sends.copies)
        million = 1e6 / self.messages
        worker_s = sum(end - start for start, end, _ in self.invocations)
        requests = self.fake.requests
        return {
            "lateness_p50_s": statistics.median(late) if late else 0.0,
            "lateness_p99_s": late[min(len(late) - 1, int(len(late) * 0.99))] if late else 0.0,
            "lateness_max_s": late[-1] if late else 0.0,
            "early": sum(1 for x in late if x < 0),
            "lost": lost,
            "duplicates": duplicates,
            "completion_s": self.sends.last_send - plan_at,
            "invocations": len(self.invocations),
            "continued": sum(r.continued for _, _, r in self.invocations),
            "objects_read_per_worker_invocation": statistics.mean(r.objects_read for _, _, r in self.invocations),
            "worker_seconds": worker_s,
            "sqs_send_batch_per_million": requests["sqs.SendMessageBatch"] * million,
            "s3_get_per_million": requests["s3.GetObject"] * million,
            "s3_put_per_million": requests["s3.PutObject"] * million,
            "s3_list_per_million": requests["s3.ListObjectsV2"] * million,
            "lambda_invocations_per_million": (len(self.invocations) + 2) * million,
            "lambda_gb_s_per_million": (worker_s * DISPATCH_MB + self.timer_seconds * TIMER_MB) / 1024 * million,
        }


def _objects(messages: int) -> dict[tuple[str, str], tuple[bytes, str]]:
    """The burst's objects, encoded once by the tier's writer (reused by every run)."""
    fake = FakeAws(latency={"s3": 0.0, "sqs": 0.0})
    store = S3BucketStore(fake.client("s3"), "burst-model", "bench", BucketLevel())
    for batch in _burst(messages):
        store.write(BUCKET, batch)
    return dict(fake.objects)


def _rows(runs: list[tuple[str, int, int, int, dict[str, float]]], client_cpu: float) -> list[Row]:
    rows: list[Row] = []
    for label, messages, workers, lead, f in runs:
        note = (f"{messages:,} messages of 1 KiB due in one second, {workers} workers, planned {lead} s ahead; "
                f"S3 100 ms, SQS 20 ms, client CPU {client_cpu * 1000:.2f} ms a request")  # fmt: skip
        units = {"lateness": "s", "completion": "s", "worker": "s", "early": "messages", "lost": "messages",
                 "duplicates": "messages", "lambda_gb": "GB-s", "invocations": "invocations"}  # fmt: skip
        for key, value in f.items():
            unit = next((u for prefix, u in units.items() if key.startswith(prefix)), "requests")
            rows.append(
                Row(NAME, f"{label}_{key}", unit, (value,), notes=note if key.startswith("lateness_p99") else "")
            )
    return rows


def run(
    smoke: bool = False,
    *,
    messages: int = 1_000_000,
    workers: int = 32,
    leads: Sequence[int] = (420, 0),
    curve: Sequence[int] = (4, 8, 16, 32, 64),
    curve_messages: int = 1_000_000,
) -> list[Row]:
    """The benchmark-runner entry point."""
    if smoke:
        messages, leads, curve, curve_messages = 20_000, (0,), (1, 4), 20_000
    with _moto() as endpoint:
        client_cpu = calibrate_client_cpu(endpoint)
    print(f"{NAME}: client CPU {client_cpu * 1000:.2f} ms a request", file=sys.stderr, flush=True)
    done: list[tuple[str, int, int, int, dict[str, float]]] = []
    built = _objects(messages)
    for lead in leads:
        started = time.monotonic()
        figures = Model(messages, workers, lead, client_cpu, built.items()).run()
        done.append((f"burst_{messages}_workers_{workers}_lead_{lead}", messages, workers, lead, figures))
        print(f"{NAME}: lead {lead} s in {time.monotonic() - started:.0f} s: {figures}", file=sys.stderr, flush=True)
    small = built if curve_messages == messages or not curve else _objects(curve_messages)
    for n in curve:
        started = time.monotonic()
        figures = Model(curve_messages, n, 0, client_cpu, small.items()).run()
        done.append((f"curve_{curve_messages}_workers_{n}", curve_messages, n, 0, figures))
        print(f"{NAME}: {n} workers in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    run.last = {"client_cpu_s": client_cpu, "runs": [list(r) for r in done]}  # type: ignore[attr-defined]
    return _rows(done, client_cpu)


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/burst_model[-smoke].json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=32, help="the dispatch concurrency of the headline runs")
    parser.add_argument("--lead", type=int, nargs="+", default=[420, 0], help="seconds planned ahead of the due time")
    parser.add_argument("--curve", type=int, nargs="*", default=[4, 8, 16, 32, 64], help="worker counts")
    parser.add_argument("--curve-messages", type=int, default=1_000_000)
    a = parser.parse_args()
    rows = run(a.smoke, messages=a.messages, workers=a.workers, leads=a.lead, curve=a.curve,
               curve_messages=a.curve_messages)  # fmt: skip
    print_table(rows, "Burst model: the tier's timer and workers at AWS latency (simulated invocations)")
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, run.last))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
