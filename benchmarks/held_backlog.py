"""A held backlog drained at its release rate: how many message lines the tier rewrites in all (#31).

A million messages due in one fine bucket for a destination capped at 10 a second take about 28 hours to release.
Before #31 every held message was written back into its bucket and read and rewritten by every timer run, so the
backlog cost the square of its size (the issue counted 63,319 rewrites for about 5,300 held in 25 minutes, and about
8 x 10^8 for a million). Now held messages wait in their destination's held area (``aws/tier/held.py``) and a run
reads only what it can release. This runs the tier's real timer (its plans sent by the timer itself, one partition)
against S3 and SQS held in memory behind real boto3 clients (``fakeaws.py``, no latency charged: only the counts
matter here) and the release calendar's placement rule in memory, one timer run a simulated minute until every
message is sent, counting every message line written into a bucket object or a held object after the backlog was
written. Per run it also counts the lines in the objects the run opened and the messages it sent: the first run
reads the backlog once and writes what it cannot place into the held area; every later run should read no more
than it releases plus one held object (``per_run`` in the JSON). ``--before`` replays the old rule (held messages
written back into their bucket, no held area) at sizes it can finish. Prints a table and writes
``benchmarks/results/held_backlog.json`` (``--json``); run each size in its own process for its peak memory.

    python -m benchmarks.held_backlog                       # --before at 10,000-40,000, then 10,000-1,000,000 at 10/s
    python -m benchmarks.held_backlog --messages 20000 --before
    python -m benchmarks.held_backlog --messages 1000000 --before-messages   # one size, the held area only
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, Row
from benchmarks.fakeaws import FakeAws
from delayed_delivery.aws.release_calendar import Placement
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.held import HeldArea
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.release import ReleaseRates, second_capacity
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import FINE, BucketKey, parse_object_key_count

START = datetime(2031, 1, 1, tzinfo=UTC)
DUE = START + timedelta(hours=1)
BUCKET = "held-backlog"
CHUNK = 10_000
#: The smoke size and rate: over the 900 a 1/s cap places within 900 s, so most are held.
SMOKE_MESSAGES, SMOKE_RATE = 2_400, 1.0


class MemoryCalendar:
    """``ReleaseCalendar``'s placement rule (whole seconds, ``second_capacity``, 900 s ahead) in memory."""

    def __init__(self, rates: ReleaseRates, horizon: int = 900) -> None:
        self.rates = rates
        self.horizon = horizon
        self.taken: Counter[tuple[str, int]] = Counter()

    def capped(self, destination: str) -> bool:
        return self.rates.rate_for(destination) is not None

    def place(self, destination: str, dues_ms: Sequence[int], now_ms: int) -> list[Placement | None]:
        rate = self.rates.rate_for(destination)
        now = now_ms / 1000
        base, phase = math.floor(now), now - math.floor(now)
        out: list[Placement | None] = [None] * len(dues_ms)
        order = sorted(range(len(dues_ms)), key=lambda i: (dues_ms[i], i))
        second = base
        for i in order:
            second = max(second, base, math.ceil(dues_ms[i] / 1000 - phase - 1e-9))
            while second <= base + self.horizon and rate is not None:
                if self.taken[(destination, second)] < second_capacity(rate, second):
                    break
                second += 1
            if second > base + self.horizon:
                break
            self.taken[(destination, second)] += 1
            out[i] = Placement(second - base, max(0.0, second + phase - max(dues_ms[i] / 1000, now)))
        return out


class Lines:
    """Message lines in the bucket and held objects one S3 operation touches (from each key's count), and objects."""

    def __init__(self) -> None:
        self.lines = 0
        self.objects = 0
        self.on = False

    def __call__(self, params: dict[str, Any], **_: Any) -> None:
        key = str(params.get("Key", ""))
        if not self.on or "/leases/" in key or "/plans/" in key or "/seen/" in key:
            return
        try:
            count = parse_object_key_count(key).message_count
        except InvalidMessageError:  # not a bucket object
            return
        self.lines += count or 0
        self.objects += 1


@dataclass
class Runs:
    """Per timer run: lines read (objects opened) and written, messages sent, wall seconds."""

    read: list[int] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    def add(self, read: int, written: int, sent: int, wall: float) -> None:
        self.read.append(read)
        self.written.append(written)
        self.sent.append(sent)
        self.wall.append(wall)

    def bound(self) -> dict[str, Any]:
        """The first run (the backlog read once and written into the held area) and the most any later run did."""
        later = range(1, len(self.read))
        spare = max((self.read[i] - self.sent[i] for i in later), default=0)
        tenth = max(1, len(later) // 10)
        walls = self.wall[1:]
        return {
            "first_run": {"lines_read": self.read[0], "lines_written": self.written[0], "sent": self.sent[0]},
            "later_runs_max_lines_read": max((self.read[i] for i in later), default=0),
            "later_runs_max_lines_written": max((self.written[i] for i in later), default=0),
            "later_runs_max_sent": max((self.sent[i] for i in later), default=0),
            "later_runs_max_lines_read_beyond_sent": spare,
            "later_runs_wall_ms_median_first_tenth": round(1000 * statistics.median(walls[:tenth] or [0.0]), 1),
            "later_runs_wall_ms_median_last_tenth": round(1000 * statistics.median(walls[-tenth:] or [0.0]), 1),
            "first_run_wall_seconds": round(self.wall[0], 1),
        }


def measure(messages: int, rate: float, *, before: bool) -> dict[str, Any]:
    """Write the backlog, then a timer run a simulated minute until every message is sent."""
    fake = FakeAws(latency={"s3": 0.0, "sqs": 0.0})
    s3, sqs = fake.client("s3"), fake.client("sqs")
    for name in ("orders", "errors"):
        fake.create_queue(name)
    lines, reads = Lines(), Lines()
    s3.meta.events.register("provide-client-params.s3.PutObject", lines)
    s3.meta.events.register("provide-client-params.s3.GetObject", reads)
    # one send thread: the in-memory SQS has no latency to overlap, and a pool started per send only costs thread
    # starts (waits for a CPU on a loaded machine); what is read and written does not depend on it
    tier = TierSettings(bucket_partition_max_messages=1_000_000, bucket_dispatch_concurrency=1, bucket_send_threads=1)
    store = S3BucketStore(s3, BUCKET, "dd/buckets", tier.levels)
    bucket = BucketKey(FINE, DUE)
    due_ms = epoch_ms(DUE)
    for first in range(0, messages, CHUNK):
        batch = [
            BucketMessage(f"m-{n:07d}", "orders", b"x", due_ms + n % 1000, sent_at_ms=epoch_ms(START))
            for n in range(first, min(messages, first + CHUNK))
        ]
        store.write(bucket, batch)
    clock = ManualClock(DUE - timedelta(seconds=420))
    calendar = MemoryCalendar(ReleaseRates.of({"orders": rate}))
    settings = DelayedDeliverySettings(error_queue="errors")
    timer = BucketTimer(store, sqs, settings, clock, owner="t", tier=tier, release=calendar)  # type: ignore[arg-type]
    real_hold = HeldArea.hold
    if before:  # the old rule: held messages written back into their bucket (read again by every run)

        def write_back(area: HeldArea, held: Sequence[BucketMessage], now: datetime) -> int:
            area.store.write_due(held, now)
            return len(held)

        HeldArea.hold = write_back  # type: ignore[method-assign]  # the timer's and the workers'
        timer._release_held = lambda deadline, tally: None  # type: ignore[method-assign]
    try:
        return _drain(fake, store, timer, clock, (lines, reads), messages, rate, before)
    finally:
        HeldArea.hold = real_hold  # type: ignore[method-assign]


def _drain(
    fake: FakeAws,
    store: S3BucketStore,
    timer: BucketTimer,
    clock: ManualClock,
    counters: tuple[Lines, Lines],
    messages: int,
    rate: float,
    before: bool,
) -> dict[str, Any]:
    lines, reads = counters
    lines.on = reads.on = True
    started, cpu, runs, sent, per_run = time.monotonic(), time.process_time(), 0, 0, Runs()
    limit = math.ceil(messages / rate / 60) + 30
    while runs < limit:
        read0, written0, run0 = reads.lines, lines.lines, time.monotonic()
        result = timer.run()
        per_run.add(reads.lines - read0, lines.lines - written0, result.dispatched, time.monotonic() - run0)
        runs += 1
        sent += result.dispatched
        if sent >= messages and not list(store.objects(FINE)) and not list(HeldArea(store).objects()):
            break
        clock.advance(60)
    queued = Counter(body for items in fake.queues["orders"] for body in [items[1]])
    return {
        "mode": "before (written back into the bucket)" if before else "held area",
        "messages": messages,
        "rate_per_second": rate,
        "timer_runs": runs,
        "sent": sent,
        "delivered": sum(queued.values()),
        "lines_rewritten": lines.lines,
        "objects_written": lines.objects,
        "rewrites_per_message": round(lines.lines / messages, 3),
        "lines_read": reads.lines,
        "wall_seconds": round(time.monotonic() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "peak_rss_mib_so_far": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "per_run": per_run.bound(),
    }


def run(smoke: bool = False) -> list[Row]:
    """The ``python -m benchmarks`` entry: lines rewritten per message held, the held area and the old rule."""
    sizes, rate = ([SMOKE_MESSAGES], SMOKE_RATE) if smoke else ([20_000, 100_000], 10.0)
    rows = []
    for before in (False, True):
        for n in sizes[:1] if before else sizes:  # the old rule is the square: its smallest size only
            got = measure(n, rate, before=before)
            mode = "before" if before else "held"
            rows.append(
                Row(
                    "held_backlog",
                    f"{mode}_{n}_lines_rewritten_per_message",
                    "lines/message",
                    (got["rewrites_per_message"],),
                    notes=f"{n:,} due at once, {rate:g}/s, {got['timer_runs']} runs, {got['lines_rewritten']:,} lines",
                )
            )
            bound = got["per_run"]
            rows.append(
                Row(
                    "held_backlog",
                    f"{mode}_{n}_lines_read_beyond_sent_per_run",
                    "lines",
                    (bound["later_runs_max_lines_read_beyond_sent"],),
                    notes=f"the most a run after the first read beyond what it sent (read at most "
                    f"{bound['later_runs_max_lines_read']:,}, sent at most {bound['later_runs_max_sent']:,})",
                )
            )
    return rows


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/held_backlog.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--before", action="store_true", help="the old rule only (small sizes)")
    parser.add_argument("--before-messages", type=int, nargs="*", default=[10_000, 20_000, 40_000])
    parser.add_argument("--json", default=str(RESULTS / "held_backlog.json"))
    args = parser.parse_args()
    plan = [(n, True) for n in (args.messages if args.before else args.before_messages)]
    plan += [] if args.before else [(n, False) for n in args.messages]
    print(
        f"{'mode':<40} {'messages':>10} {'runs':>6} {'sent':>10} {'lines rewritten':>16} {'per message':>12}"
        f" {'max read/run':>13} {'max sent/run':>13} {'wall s':>8} {'peak MiB':>9}"
    )
    rows = []
    for n, before in plan:  # the old rule first (small sizes), then the held area; the JSON after each row
        row = measure(n, args.rate, before=before)
        rows.append(row)
        bound = row["per_run"]
        print(
            f"{row['mode']:<40} {row['messages']:>10,} {row['timer_runs']:>6,} {row['sent']:>10,} "
            f"{row['lines_rewritten']:>16,} {row['rewrites_per_message']:>12} "
            f"{bound['later_runs_max_lines_read']:>13,} {bound['later_runs_max_sent']:>13,} "
            f"{row['wall_seconds']:>8,} {row['peak_rss_mib_so_far']:>9,}",
            flush=True,
        )
        Path(args.json).write_text(json.dumps({"benchmark": "held_backlog", "rows": rows}, indent=2), "utf-8")


if __name__ == "__main__":
    main()
