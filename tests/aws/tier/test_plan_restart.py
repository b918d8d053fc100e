"""A dispatch worker that starts again in the middle of a big partition (#31), on moto: it starts from what the last
worker met (its seen snapshot) and reads again only the lines after it, within its deadline, so every invocation
makes progress however long one read of the partition takes. Each object's read is charged 5 s of the invocation
here (a bucket of gigabytes at S3's pace); an invocation has 180 s."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.plan_store import PlanStore, seen_name
from delayed_delivery.aws.tier.worker import PartitionWorker, WorkerResult
from delayed_delivery.timebuckets.format import encoded_line_bytes
from delayed_delivery.timebuckets.plans import DispatchTask
from delayed_delivery.timebuckets.seen import decode_seen
from tests.aws.tier.plan_support import Tier, burst, fine
from tests.aws.tier.timer_support import SETTINGS, START

pytestmark = pytest.mark.moto

DUE = START + timedelta(hours=1, seconds=5)
OBJECTS = 48
PER_OBJECT = 25
READ_SECONDS = 5.0
INVOCATION_SECONDS = 180.0


class Killed(BaseException):
    """A kill: nothing catches it."""


class SlowReads:
    """An S3 client whose GetObject of a bucket object costs ``READ_SECONDS`` of the invocation's time."""

    def __init__(self, client: Any, ticks: list[float]) -> None:
        self._client, self._ticks = client, ticks
        self.reads = 0
        #: The invocation's timeout (the platform kills it there): a read that ends past it dies.
        self.timeout = float("inf")

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._client, name)
        if name != "get_object":
            return real

        def get(**kwargs: Any) -> Any:
            if "/fine/" in str(kwargs.get("Key", "")) and "/plans/" not in str(kwargs.get("Key", "")):
                self._ticks[0] += READ_SECONDS
                self.reads += 1
                if self._ticks[0] > self.timeout:
                    raise Killed
            return real(**kwargs)

        return get


def _planned(tier: Tier) -> None:
    bucket = fine(DUE, tier.settings)
    for k in range(OBJECTS):
        tier.store.write(bucket, burst(PER_OBJECT, DUE, first=k * 1_000))
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.timer_results.append(tier.timer().run())
    assert tier.total("buckets_planned") == 1 and len(tier.queue.tasks) == 1


def _worker(tier: Tier, slow: SlowReads, ticks: list[float]) -> PartitionWorker:
    store = type(tier.store)(slow, tier.store.bucket_name, tier.store.prefix, tier.store.levels)
    return PartitionWorker(store, tier.flaky, SETTINGS, tier.clock, tier=tier.settings, owner="w",
                           queue=tier.queue, monotonic=lambda: ticks[0])  # fmt: skip


def _invocations(tier: Tier, worker: PartitionWorker, ticks: list[float], most: int) -> list[WorkerResult]:
    results: list[WorkerResult] = []
    while tier.queue.tasks and len(results) < most:
        [task] = tier.queue.take()
        results.append(worker.run(task, deadline=ticks[0] + INVOCATION_SECONDS))
        tier.clock.advance(INVOCATION_SECONDS)
    return results


@dataclass(frozen=True)
class KilledMidPartition:
    """A planned partition whose first worker was killed at one of its sends, and what the next ones run with."""

    tier: Tier
    ticks: list[float]
    slow: SlowReads
    worker: PartitionWorker
    task: DispatchTask


def _killed_at_send(s3: Any, sqs: Any, tier_bucket: str, nth: int) -> KilledMidPartition:
    """Plan the partition and run its first worker (no deadline) until it dies at its ``nth`` send to the
    destination, a piece's sends under way."""
    tier = Tier(s3, sqs, tier_bucket)
    _planned(tier)
    ticks = [0.0]
    slow = SlowReads(s3, ticks)
    worker = _worker(tier, slow, ticks)
    real_send = tier.flaky.send_message_batch
    calls = [0]

    def dies(**kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            raise Killed
        return real_send(**kwargs)

    tier.flaky.send_message_batch = dies  # type: ignore[method-assign]
    [task] = tier.queue.take()
    with pytest.raises(Killed):
        worker.run(task, deadline=ticks[0] + 10_000)  # no deadline: it dies first
    del tier.flaky.send_message_batch
    return KilledMidPartition(tier, ticks, slow, worker, task)


def _deltas(tier: Tier) -> list[str]:
    """The keys of the partition's deltas (what one piece met, named by the position it ended at)."""
    plan = PlanStore(tier.store)
    return [k for k in plan.seen_keys(fine(DUE, tier.settings)) if (name := seen_name(k)) and name.position]


def _piece(tier: Tier) -> int:
    """The most messages of one piece (the shortest line gives the most): what a kill may send again."""
    return tier.settings.bucket_piece_bytes // encoded_line_bytes(burst(1, DUE)[0]) + 1


def test_a_worker_continuing_a_big_partition_starts_from_the_last_ones_snapshot(
    s3: Any, sqs: Any, tier_bucket: str
) -> None:
    # #31: a restarted worker read every object before its progress again with no deadline check; when one read pass
    # took longer than an invocation, no invocation made progress (2,601 of 4,800 sent, then 11 invocations with 0)
    tier = Tier(s3, sqs, tier_bucket)
    _planned(tier)
    ticks = [0.0]
    slow = SlowReads(s3, ticks)
    results = _invocations(tier, _worker(tier, slow, ticks), ticks, 12)
    sent = tier.sent()
    figures = f"{len(sent)} of {OBJECTS * PER_OBJECT} sent in {len(results)} invocations: " + ", ".join(
        str(r.dispatched) for r in results
    )
    assert len(sent) == OBJECTS * PER_OBJECT and results[-1].finished == 1, figures
    assert max(sent.values()) == 1 and len(results) <= 3, figures
    assert sum(r.lines_reread for r in results) == 0, "nothing read twice: the snapshot holds it"
    # each object once, plus per invocation the one opened ahead and the snapshot
    assert slow.reads <= OBJECTS + 2 * len(results), f"{slow.reads} object reads for {OBJECTS} objects"


@pytest.mark.parametrize("deltas", ["kept", "gone"])
def test_a_worker_killed_mid_partition_is_followed_by_workers_that_each_make_progress(
    s3: Any, sqs: Any, tier_bucket: str, deltas: str
) -> None:
    # killed without a snapshot: the next worker starts from the deltas the killed one kept after each piece; without
    # them (a partition under way before workers wrote deltas) it reads the lines before the progress again, within
    # its deadline, keeps where it got to as a snapshot, and the one after goes on from there
    killed = _killed_at_send(s3, sqs, tier_bucket, 60)  # well into the partition
    tier, ticks, worker, task = killed.tier, killed.ticks, killed.worker, killed.task
    before = Counter(tier.sent())
    plan = PlanStore(tier.store)
    kept = _deltas(tier)
    assert kept, "the killed worker kept a delta after every piece it recorded"
    if deltas == "gone":
        tier.store.delete(kept)
    tier.clock.advance(200)  # its lease runs out; the task comes back
    tier.queue.send([task])
    ticks[0] += 1_000
    results = _invocations(tier, worker, ticks, 12)
    sent = tier.sent()
    figures = f"{len(sent)} sent, {sum(sent.values()) - len(sent)} twice, invocations: " + ", ".join(
        f"{r.dispatched} sent / {r.lines_reread} read again" for r in results
    )
    assert len(sent) == OBJECTS * PER_OBJECT and results[-1].finished == 1, figures
    assert all(r.dispatched > 0 or r.lines_reread > 0 for r in results), figures
    piece = _piece(tier)
    assert sum(sent.values()) - len(sent) <= piece, f"at most the piece in hand when it died ({piece}): {figures}"
    assert len(before) < OBJECTS * PER_OBJECT
    reread = sum(r.lines_reread for r in results)
    assert (reread > 0) if deltas == "gone" else (reread == 0 and results[0].deltas_read == len(kept)), figures
    seen = [k for k in plan.seen_keys(fine(DUE, tier.settings)) if (name := seen_name(k)) and name.position is None]
    assert len(seen) == 1
    done = decode_seen(s3.get_object(Bucket=tier_bucket, Key=seen[0])["Body"].read())
    assert done.done and len(done.entries) == OBJECTS * PER_OBJECT


def test_a_chain_of_deltas_longer_than_an_invocation_is_loaded_over_several(
    s3: Any, sqs: Any, tier_bucket: str
) -> None:
    # #31: a restarted worker loaded every delta after its snapshot before it looked at its deadline. Killed before
    # its hand-over in invocation after invocation (an SQS brownout: each dies at its timeout), a partition's chain of
    # deltas grows until loading it takes longer than an invocation; from then on every invocation died loading it and
    # none got further. Here one kill, late in the partition, leaves the chain (9 deltas), and an invocation (the
    # platform kills it at its timeout) has time for four object reads (20 s before the worker's 15 s margin).
    killed = _killed_at_send(s3, sqs, tier_bucket, 110)
    tier, ticks, slow, worker, task = killed.tier, killed.ticks, killed.slow, killed.worker, killed.task
    chain = _deltas(tier)
    assert len(chain) * READ_SECONDS > 35.0, f"{len(chain)} deltas: more than one invocation can load"
    runs: list[WorkerResult | None] = []
    while len(runs) < 40 and (runs == [] or tier.queue.tasks):
        tier.clock.advance(200)  # a killed one's lease runs out; its task comes back
        if not tier.queue.tasks:
            tier.queue.send([task])
        [task] = tier.queue.take()
        slow.timeout = ticks[0] + 35.0
        try:
            runs.append(worker.run(task, deadline=slow.timeout))
        except Killed:
            runs.append(None)
            tier.queue.send([task])
    sent = tier.sent()
    figures = f"{len(chain)} deltas; invocations: " + ", ".join(
        "killed" if r is None else f"{r.deltas_read} deltas / {r.dispatched} sent" for r in runs
    )
    assert len(sent) == OBJECTS * PER_OBJECT and runs[-1] is not None and runs[-1].finished == 1, figures
    assert None not in runs, f"no invocation outlived its timeout: {figures}"
    assert sum(sent.values()) - len(sent) <= _piece(tier), figures
    assert sum(r.deltas_read for r in runs if r is not None) == len(chain), f"each delta loaded once: {figures}"


class DiesAfterSnapshot(SlowReads):
    """``SlowReads`` whose process dies at the progress record after the partition's last snapshot (done)."""

    def __init__(self, client: Any, ticks: list[float]) -> None:
        super().__init__(client, ticks)
        self.armed = True
        self.snapshot_written = False

    def __getattr__(self, name: str) -> Any:
        if name != "put_object" or not self.armed:
            return super().__getattr__(name)
        real = getattr(self._client, name)

        def put(**kwargs: Any) -> Any:
            key = str(kwargs.get("Key", ""))
            name_ = seen_name(key) if "/seen/" in key else None
            if name_ is not None and name_.position is None and decode_seen(kwargs["Body"]).done:
                self.snapshot_written = True
            elif "/plans/" in key and self.snapshot_written:
                self.armed = False
                raise Killed  # the snapshot is on S3, the record that names its piece is not
            return real(**kwargs)

        return put


def test_a_worker_killed_between_its_snapshot_and_its_record_repeats_nothing(
    s3: Any, sqs: Any, tier_bucket: str
) -> None:
    # #31 (the crash lab's new point after the seen write): a worker sent the partition's last piece, wrote its whole
    # snapshot (done) and died before the progress record. The snapshot is past the progress, and the next worker
    # left it out: it sent that piece again and rebuilt what was met from the deltas alone, which skip the pieces
    # that ended at a hand-over. Everything in a snapshot was handed on before it was written: it is loaded.
    tier = Tier(s3, sqs, tier_bucket)
    _planned(tier)
    ticks = [0.0]
    dies = DiesAfterSnapshot(s3, ticks)
    worker = _worker(tier, dies, ticks)
    runs: list[WorkerResult] = []
    killed = 0
    while tier.queue.tasks and len(runs) < 12:
        [task] = tier.queue.take()
        try:
            runs.append(worker.run(task, deadline=ticks[0] + INVOCATION_SECONDS))
        except Killed:
            killed += 1
            tier.queue.send([task])
        tier.clock.advance(INVOCATION_SECONDS)
    sent = tier.sent()
    figures = f"{killed} killed; {sum(sent.values()) - len(sent)} sent twice; invocations: " + ", ".join(
        f"{r.dispatched} sent / {r.lines_reread} read again / {r.duplicates_skipped} skipped" for r in runs
    )
    assert killed == 1 and len(sent) == OBJECTS * PER_OBJECT and runs[-1].finished == 1, figures
    assert max(sent.values()) == 1, figures
    assert sum(r.lines_reread for r in runs) == 0, figures
