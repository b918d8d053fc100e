"""A plan lost or expired while a bucket is half sent (#31), on moto: the bucket is planned again and sends only what
the old plan's workers had not handed on. The 7-day lifecycle of ``plans/`` (the CDK construct) is played here by
deleting the plan and its progress objects."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.plan_store import PlanStore
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
