"""Big buckets on moto: planned once, sent by partition workers in pieces, each id once across workers; a deadline
stops a worker cleanly and the next sends nothing again; a kill sends at most one piece again; small buckets keep
going out beside a big one."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.plan_store import PlanStore, SqsTaskQueue
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.aws.tier.worker import PartitionWorker
from delayed_delivery.cancellations import CancellationCache, InMemoryCancellationStore, cancel_request
from delayed_delivery.clock import ManualClock
from delayed_delivery.headers import FAILURE_REASON
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.format import BucketMessage, encode_bucket, encoded_line_bytes
from delayed_delivery.timebuckets.plans import DispatchTask, decode_task
from delayed_delivery.timebuckets.wheel import FINE, BucketKey
from tests.aws.tier.test_destinations import Denying
from tests.aws.tier.timer_support import (
    PREFIX,
    SETTINGS,
    START,
    Recorder,
    make_store,
    message,
    queue_url,
    run_for,
    settled,
    total,
)

#: The fine bucket ready at START (dispatch lead 2 s).
BIG = BucketKey(FINE, START + timedelta(seconds=2))
BODY = 2_000
PIECE = 16 * 1024  # about 8 messages of BODY a piece


class Killed(BaseException):
    """A kill: nothing catches it."""


@dataclass
class ListQueue:
    """A dispatch queue in memory."""

    tasks: list[DispatchTask] = field(default_factory=list)

    def send(self, tasks: Sequence[DispatchTask]) -> None:
        self.tasks.extend(tasks)

    def take(self) -> list[DispatchTask]:
        taken, self.tasks = self.tasks, []
        return taken


def _tier(**changes: Any) -> TierSettings:
    base = {"bucket_inline_max_messages": 50, "bucket_piece_bytes": PIECE, "bucket_partition_messages": 40,
            "bucket_dispatch_concurrency": 3}  # fmt: skip
    return TierSettings(**(base | changes))


def _big(count: int, first: int = 0, objects: int = 4) -> list[list[BucketMessage]]:
    batch = [message(n, BIG.start + timedelta(milliseconds=(n * 37) % 1_000), body=f"{n}:" + "x" * BODY)
             for n in range(first, first + count)]  # fmt: skip
    return [batch[i::objects] for i in range(objects)]


@pytest.fixture
def world(s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings) -> dict[str, Any]:
    queue_url(sqs, "orders")
    queue_url(sqs, "errors")
    clock = ManualClock(START)
    store = make_store(s3, tier_bucket, tier_settings)
    return {"store": store, "clock": clock, "recorder": Recorder(clock).attach(sqs)}


def _timer(world: dict[str, Any], sqs: Any, settings: TierSettings, queue: Any, **kw: Any) -> BucketTimer:
    return BucketTimer(world["store"], sqs, SETTINGS, world["clock"], owner="timer", lease_seconds=5, queue=queue,
                       tier=kw.pop("tier", _tier()), **kw)  # fmt: skip


def _worker(world: dict[str, Any], sqs: Any, settings: TierSettings, owner: str, **kw: Any) -> Any:
    return PartitionWorker(world["store"], sqs, SETTINGS, world["clock"], tier=kw.pop("tier", _tier()),
                           owner=owner, lease_seconds=5, **kw)  # fmt: skip


def _sent(world: dict[str, Any]) -> Counter[str]:
    return Counter(s.message_id or "" for s in world["recorder"].to("orders"))


def test_a_big_bucket_is_planned_and_its_partitions_send_each_id_once(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store: S3BucketStore = world["store"]
    for batch in _big(120):
        store.write(BIG, batch)
    store.write(BIG, _big(120)[0][:10])  # ten of them again, in another object: once each all the same
    small = [message(500 + n, BIG.start + timedelta(seconds=1, milliseconds=n)) for n in range(5)]  # next bucket
    store.write_due(small, START)
    queue = ListQueue()
    first = _timer(world, sqs, tier_settings, queue).run()
    assert (first.buckets_planned, first.tasks_enqueued, first.dispatched) == (1, 3, 0)
    world["clock"].advance(1)
    beside = _timer(world, sqs, tier_settings, queue).run()  # the big one is with the workers
    assert beside.dispatched == 5 and beside.tasks_enqueued == 0  # the next bucket went out beside it
    plan = PlanStore(store).read_plan(BIG)
    assert plan is not None and plan.partitions == 3 and len(plan.objects) == 5
    results = [_worker(world, sqs, tier_settings, f"w{t.partition}").run(t) for t in queue.take()]
    assert all(r.finished == 1 for r in results)
    assert sum(r.dispatched for r in results) == 120 and sum(r.duplicates_skipped for r in results) == 10
    assert sum(r.lines_read for r in results) == 3 * 130  # each worker reads the whole bucket for its share
    assert _sent(world) == Counter({f"m-{n}": 1 for n in [*range(120), *range(500, 505)]})
    done = _timer(world, sqs, tier_settings, queue).run()
    assert done.plans_finished == 1 and list(store.objects(FINE)) == []
    assert PlanStore(store).read_plan(BIG) is None and list(PlanStore(store).buckets()) == []


def test_a_worker_at_its_deadline_stops_cleanly_and_the_next_sends_nothing_again(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store = world["store"]
    for batch in _big(100):
        store.write(BIG, batch)
    queue = ListQueue()
    _timer(world, sqs, tier_settings, queue, tier=_tier(bucket_dispatch_concurrency=1)).run()
    [task] = queue.take()
    ticks = [0.0]

    def monotonic() -> float:  # every call a second later: the deadline comes after a few pieces
        ticks[0] += 1
        return ticks[0]

    tier = _tier(bucket_dispatch_concurrency=1)
    runs = []
    while task is not None and len(runs) < 50:
        ticks[0] = 0.0
        worker = _worker(world, sqs, tier_settings, f"w{len(runs)}", tier=tier, queue=queue, monotonic=monotonic,
                         margin_seconds=1)  # fmt: skip
        runs.append(worker.run(task, deadline=8.0))
        task = next(iter(queue.take()), None)
    assert len(runs) >= 3 and all(r.continued == 1 for r in runs[:-1]) and runs[-1].finished == 1
    assert sum(r.dispatched for r in runs) == 100
    # each next worker starts from the last one's seen snapshot: no line read twice (#31; before, each re-read them)
    assert sum(r.lines_reread for r in runs) == 0 and sum(r.snapshots_read for r in runs) == len(runs) - 1
    assert _sent(world) == Counter({f"m-{n}": 1 for n in range(100)})  # nothing sent twice


def test_a_killed_worker_repeats_at_most_one_piece_and_loses_nothing(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = world["store"], world["clock"]
    for batch in _big(100):
        store.write(BIG, batch)
    queue = ListQueue()
    _timer(world, sqs, tier_settings, queue, tier=_tier(bucket_dispatch_concurrency=1)).run()
    [task] = queue.take()
    plans = PlanStore(store)
    real = plans.write_progress
    writes = [0]

    def dies_at_the_third_record(progress: Any, etag: Any) -> Any:
        writes[0] += 1
        if writes[0] == 4:  # the claim, two pieces, then the kill: sent, not recorded
            raise Killed
        return real(progress, etag)

    worker = _worker(world, sqs, tier_settings, "w1", tier=_tier(bucket_dispatch_concurrency=1))
    monkeypatch.setattr(worker.plans, "write_progress", dies_at_the_third_record)
    with pytest.raises(Killed):
        worker.run(task)
    sent_before = sum(_sent(world).values())
    held = _worker(world, sqs, tier_settings, "w2", tier=_tier(bucket_dispatch_concurrency=1)).run(task)
    assert held.skipped == 1  # w1's lease still holds
    clock.advance(6)  # past it
    result = _worker(world, sqs, tier_settings, "w2", tier=_tier(bucket_dispatch_concurrency=1)).run(task)
    assert result.finished == 1
    sent = _sent(world)
    assert set(sent) == {f"m-{n}" for n in range(100)}
    repeated = sum(sent.values()) - 100
    assert 0 < repeated <= PIECE // encoded_line_bytes(_big(1)[0][0]) + 1  # the piece in hand, no more
    assert sent_before > 2 * 7  # two pieces were recorded before the kill


def test_a_lost_partition_stops_its_worker_and_the_new_holder_goes_on(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store, clock = world["store"], world["clock"]
    for batch in _big(60):
        store.write(BIG, batch)
    queue = ListQueue()
    _timer(world, sqs, tier_settings, queue, tier=_tier(bucket_dispatch_concurrency=1)).run()
    [task] = queue.take()
    tier = _tier(bucket_dispatch_concurrency=1)
    slow = _worker(world, sqs, tier_settings, "slow", tier=tier)
    real_dispatch = slow.sqs.dispatch
    calls = [0]

    def overtaken(messages: Any, window: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:  # while sending its second piece, its lease runs out and another worker takes over
            clock.advance(6)
            assert _worker(world, sqs, tier_settings, "fast", tier=tier).run(task).finished == 1
        return real_dispatch(messages, window)

    slow.sqs.dispatch = overtaken  # type: ignore[method-assign]
    result = slow.run(task)
    assert result.lost_partition == 1 and result.finished == 0
    sent = _sent(world)
    assert set(sent) == {f"m-{n}" for n in range(60)}
    assert sum(sent.values()) - 60 <= 9  # the piece in hand when it lost the partition


def test_copies_and_conflicts_across_objects_and_partitions(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store = world["store"]
    batches = _big(80)
    for batch in batches:
        store.write(BIG, batch)
    original = batches[1][0]
    different = BucketMessage(original.message_id, "orders", b"another body", original.due_at_ms, {}, 0, 0)
    store.write(BIG, [different, *batches[2][:3]])
    queue = ListQueue()
    _timer(world, sqs, tier_settings, queue).run()
    results = [_worker(world, sqs, tier_settings, f"w{t.partition}").run(t) for t in queue.take()]
    assert sum(r.duplicates_skipped for r in results) == 3 and sum(r.to_error_queue for r in results) == 1
    assert sum(_sent(world).values()) == 80
    [notice] = drain(sqs, queue_url(sqs, "errors"))
    reason = notice["MessageAttributes"]["DelayedDelivery.FailureReason"]["StringValue"]
    assert original.message_id in reason and reason.count("digest ") == 2


def test_a_cancel_in_a_planned_bucket_drops_the_message_once_recorded(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store, clock = world["store"], world["clock"]
    for batch in _big(60):
        store.write(BIG, batch)
    records = InMemoryCancellationStore()
    records.put(cancel_request("orders", "m-7", now=START, max_native_delay=2, max_age=0))
    queue = ListQueue()
    _timer(world, sqs, tier_settings, queue).run()
    cache = CancellationCache(records, 0, clock=clock)
    results = [_worker(world, sqs, tier_settings, f"w{t.partition}", cancellations=cache).run(t)
               for t in queue.take()]  # fmt: skip
    assert sum(r.cancelled for r in results) == 1 and "m-7" not in _sent(world)
    assert sum(_sent(world).values()) == 59 and settled(records, "orders", BIG.start + timedelta(seconds=1))


def test_without_a_dispatch_queue_the_timer_sends_its_plans_itself(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store = world["store"]
    for batch in _big(100):
        store.write(BIG, batch)
    timer = _timer(world, sqs, tier_settings, None)
    first = timer.run()
    assert first.buckets_planned == 1 and first.dispatched == 100 and first.tasks_enqueued == 0
    assert timer.run().plans_finished == 1 and list(store.objects(FINE)) == []
    assert _sent(world) == Counter({f"m-{n}": 1 for n in range(100)})


def test_keys_that_understate_their_count_cannot_make_the_timer_read_more(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store = world["store"]
    for n, batch in enumerate(_big(100)):  # four objects of 25 messages, each key claiming one
        key = f"{PREFIX}/fine/{BIG.iso}/{n:064x}-1.jsonl.gz"
        s3.put_object(Bucket=tier_bucket, Key=key, Body=encode_bucket(BIG, batch, store.levels))
    queue = ListQueue()
    bound = 10 * encoded_line_bytes(_big(1)[0][0])
    result = _timer(world, sqs, tier_settings, queue, tier=_tier(bucket_inline_max_bytes=bound)).run()
    assert (result.inline_over_bound, result.buckets_planned, result.dispatched) == (1, 1, 0)
    assert len(queue.tasks) == 1  # four listed: one partition


def test_a_worker_whose_piece_sends_outlast_its_lease_keeps_the_partition_and_sends_each_id_once(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    """Found by benchmarks/burst_moto.py: on a slow SQS one piece's sends took longer than the partition's lease, the
    partition was handed to another worker while its holder was still sending, and that piece went out twice."""
    store, clock = world["store"], world["clock"]
    for batch in _big(60):
        store.write(BIG, batch)
    queue = ListQueue()
    tier = _tier(bucket_dispatch_concurrency=1, bucket_piece_bytes=64 * 1024, bucket_send_threads=1)
    _timer(world, sqs, tier_settings, queue, tier=tier).run()
    [task] = queue.take()
    slow = _worker(world, sqs, tier_settings, "slow", tier=tier)
    real_dispatch = slow.sqs.dispatch
    claimed = clock.now()
    rivals: list[Any] = []

    def slow_sends(messages: Any, window: Any) -> Any:
        clock.advance(0.2 * len(messages))  # 0.2 s a message: a 32-message piece takes 6.4 s, past the 5 s lease
        if not rivals and clock.now() - claimed > timedelta(seconds=6):
            rivals.append(_worker(world, sqs, tier_settings, "rival", tier=tier).run(task))
        return real_dispatch(messages, window)

    slow.sqs.dispatch = slow_sends  # type: ignore[method-assign]
    result = slow.run(task)
    assert [r.skipped for r in rivals] == [1]  # the partition was still held: its holder renews it while it sends
    assert (result.finished, result.lost_partition) == (1, 0)
    assert _sent(world) == Counter({f"m-{n}": 1 for n in range(60)})


def test_tasks_travel_through_sqs_and_a_stalled_partition_is_handed_out_again(
    sqs: Any, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    store, clock = world["store"], world["clock"]
    for batch in _big(90):
        store.write(BIG, batch)
    queue = SqsTaskQueue(sqs, "dispatch")
    url = queue_url(sqs, "dispatch")
    assert _timer(world, sqs, tier_settings, queue).run().tasks_enqueued == 3
    tasks = [decode_task(m["Body"]) for m in drain(sqs, url)]
    assert sorted(t.partition for t in tasks) == [0, 1, 2]
    assert _worker(world, sqs, tier_settings, "w0").run(tasks[0]).finished == 1
    clock.advance(200)  # the other two tasks were lost: no progress for longer than STALL_SECONDS
    again = _timer(world, sqs, tier_settings, queue).run()
    assert again.tasks_enqueued == 2
    for task in (decode_task(m["Body"]) for m in drain(sqs, url)):
        assert _worker(world, sqs, tier_settings, "w1").run(task).finished == 1
    assert _timer(world, sqs, tier_settings, queue).run().plans_finished == 1
    assert _sent(world) == Counter({f"m-{n}": 1 for n in range(90)})


def test_workers_keep_the_tiers_rules_on_bad_lines_and_destinations(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, world: dict[str, Any]
) -> None:
    # #23's rules in a planned bucket: a line that cannot be read is one notice, a destination outside the tier's set
    # goes to the error queue, one that refuses is retried only bucket_refused_retry_seconds past due; no piece stalls
    store, clock = world["store"], world["clock"]
    errors = queue_url(sqs, "errors")
    queue_url(sqs, "locked")
    queue_url(sqs, "elsewhere")
    batches = _big(90)
    due = BIG.start + timedelta(milliseconds=500)
    batches[0] += [message(900, due, destination="elsewhere"), message(901, due, destination="locked")]
    for batch in batches:
        store.write(BIG, batch)
    header = json.dumps({"v": 2, "level": "fine", "bucket": BIG.iso, "count": 1})
    crafted = f"{PREFIX}/fine/{BIG.iso}/{'c' * 64}-1.jsonl.gz"
    s3.put_object(Bucket=tier_bucket, Key=crafted, Body=gzip.compress(f'{header}\n{{"id":"p-1"}}\n'.encode(), mtime=0))
    denying = Denying(sqs, "locked", ("send_message_batch",))
    tier = _tier(bucket_refused_retry_seconds=6)
    queue = ListQueue()
    rules = {"destinations": {"orders", "locked"}, "tier": tier}
    assert _timer(world, denying, tier_settings, queue, **rules).run().buckets_planned == 1
    results = [_worker(world, denying, tier_settings, f"w{t.partition}", **rules).run(t) for t in queue.take()]
    assert [r.finished for r in results] == [1, 1, 1]  # nothing stalls on them
    assert sum(r.refused for r in results) == 1 and sum(r.refused_given_up for r in results) == 0
    assert sum(r.to_error_queue for r in results) == 2  # the stray destination and the one notice
    notices = drain(sqs, errors)
    reasons = sorted(n["MessageAttributes"][FAILURE_REASON]["StringValue"] for n in notices)
    assert len(reasons) == 2 and any("not one of the tier's destinations" in r for r in reasons)
    assert any("p-1" in n["Body"] for n in notices)
    assert _sent(world) == Counter({f"m-{n}": 1 for n in range(90)})
    timer = _timer(world, denying, tier_settings, queue, **rules)
    later = run_for(timer, clock, 10)  # the plan is done; the refused message waits in the bucket, retried
    assert total(later, "plans_finished") == 1 and total(later, "refused_given_up") == 1
    [held] = drain(sqs, errors)
    assert held["Body"] == "body-901" and "'locked' refused" in held["MessageAttributes"][FAILURE_REASON]["StringValue"]
    assert list(store.objects(FINE)) == [] and world["recorder"].to("locked") == []
