"""A plan lost or expired while a bucket is half sent (#31), on moto: the bucket is planned again and sends only what
the old plan's workers had not handed on. The 7-day lifecycle of ``plans/`` (the CDK construct) is played here by
deleting the plan and its progress objects."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.plan_store import PlanStore
from delayed_delivery.timebuckets.format import encoded_line_bytes
from tests.aws.tier.plan_support import SMALL, Tier, burst, fine
from tests.aws.tier.timer_support import START

pytestmark = pytest.mark.moto

DUE = START + timedelta(hours=1, seconds=5)


def _lifecycle(tier: Tier) -> int:
    """What the ``ExpirePlans`` rule does after 7 days: every object under ``plans/`` goes."""
    keys = [k for k in tier.left() if "/plans/" in k]
    tier.store.delete(keys)
    return len(keys)


def test_an_expired_plan_never_resends_its_finished_partitions(s3: Any, sqs: Any, tier_bucket: str) -> None:
    # #31: the lifecycle removed a stalled bucket's plan and the finished partitions' progress; the timer planned
    # it again and sent every finished partition's messages a second time (1,988 in the repro)
    tier = Tier(s3, sqs, tier_bucket, settings=SMALL.with_(bucket_partition_messages=40, bucket_dispatch_concurrency=3))
    batch = burst(120, DUE)
    tier.store.write(fine(DUE, tier.settings), batch)
    tier.lose = lambda task: task.partition == 2  # one partition stalls: its worker dies every time
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.run_until(DUE + timedelta(minutes=10))
    plan = PlanStore(tier.store).read_plan(fine(DUE, tier.settings))
    assert plan is not None and plan.partitions == 3
    first = tier.sent()
    assert 0 < len(first) < 120 and max(first.values()) == 1
    tier.clock.advance(timedelta(days=7).total_seconds())
    assert _lifecycle(tier) >= 3  # the plan and the two finished partitions' progress
    tier.lose = None  # the cause is fixed
    tier.run_until(tier.clock.now() + timedelta(minutes=10))
    sent = tier.sent()
    resent = sum(sent.values()) - len(sent)
    assert set(sent) == {m.message_id for m in batch}, f"{120 - len(sent)} never sent"
    assert resent == 0, f"{resent} sent twice (of {len(first)} the finished partitions sent)"
    assert tier.left() == []


class Killed(BaseException):
    """A kill: nothing catches it."""


def test_a_plan_lost_after_a_kill_repeats_at_most_the_piece_in_hand(s3: Any, sqs: Any, tier_bucket: str) -> None:
    # #31 (crash-lab soak, seed 41): a worker killed mid-partition had written its progress after every piece but its
    # seen snapshot only on hand-over; the plan then lost (expiry), the next plan's workers inherited only snapshots and
    # sent again every piece since the last one (24 messages in the soak, bound 15; here 375 of one partition)
    tier = Tier(s3, sqs, tier_bucket, settings=SMALL.with_(bucket_partition_messages=10_000))
    batch = [m for k in range(12) for m in burst(50, DUE, first=k * 1_000)]
    bucket = fine(DUE, tier.settings)
    for k in range(12):
        tier.store.write(bucket, batch[k * 50 : (k + 1) * 50])
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.timer_results.append(tier.timer().run())
    [task] = tier.queue.take()
    real_send, calls = tier.flaky.send_message_batch, [0]

    def dies(**kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 42:  # well into the partition (pieces of 16 KiB, about 75 messages), a piece under way
            raise Killed
        return real_send(**kwargs)

    tier.flaky.send_message_batch = dies  # type: ignore[method-assign]
    with pytest.raises(Killed):
        tier.worker().run(task)
    del tier.flaky.send_message_batch
    before = tier.sent()
    pieces = PlanStore(tier.store).read_progress(PlanStore(tier.store).read_plan(bucket), 0).progress  # type: ignore[arg-type]
    assert pieces is not None and pieces.counts.pieces >= 3, "killed after it recorded several pieces"
    tier.clock.advance(timedelta(days=7).total_seconds())
    assert _lifecycle(tier) == 2  # the plan and the partition's progress
    tier.run_until(tier.clock.now() + timedelta(minutes=10))
    sent = tier.sent()
    twice = sum(sent.values()) - len(sent)
    piece = tier.settings.bucket_piece_bytes // encoded_line_bytes(batch[0]) + 1
    figures = f"{len(before)} sent before the kill after {pieces.counts.pieces} pieces, {twice} sent twice"
    assert set(sent) == {m.message_id for m in batch}, figures
    assert twice <= piece, f"at most the piece in hand when it died ({piece}): {figures}"
    assert tier.left() == []
