"""Write-backs in planned buckets (#31): what a dispatch worker writes back (refused, throttled, held by a release cap)
is never deleted by the plan that produced it, whatever its key, and goes out once the cause passes. On moto, over a
manual clock, at the deployed timing with an inline bound of 40 (``plan_support``): 41 messages stand for the issue's
4,001."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.release_calendar import ReleaseCalendar
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.timebuckets.wheel import FINE
from tests.aws.tier.plan_support import INLINE, Tier, burst, fine, release_calendar
from tests.aws.tier.timer_support import START, message

pytestmark = pytest.mark.moto

DUE = START + timedelta(hours=1, seconds=5)


@pytest.mark.parametrize(("fault", "heal_after"), [("AccessDenied", 5), ("503", 5), ("KMS", 5)])
def test_a_planned_bucket_its_destination_refuses_is_delivered_once_the_fault_passes(
    s3: Any, sqs: Any, tier_bucket: str, fault: str, heal_after: int
) -> None:
    # #31: 4,001 messages (here 41) in one object, planned with one partition; the destination refuses them all;
    # the worker wrote them back under the object's own key (same content), and the finished plan deleted that key:
    # 0 of 4,001 delivered, 0 on the error queue, nothing left in S3
    tier = Tier(s3, sqs, tier_bucket)
    batch = burst(INLINE + 1, DUE)
    tier.store.write(fine(DUE, tier.settings), batch)
    tier.flaky.fail("orders", fault)
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.minute()
    assert tier.total("buckets_planned") == 1
    tier.run_until(DUE - timedelta(seconds=420 - 60 * heal_after))
    assert tier.sent() == {} and tier.total("kept_for_retry") >= INLINE + 1
    tier.flaky.heal("orders")
    tier.run_until(DUE + timedelta(minutes=10))
    sent, errors = tier.sent(), tier.sent("errors")
    figures = f"{len(sent)} of {INLINE + 1} delivered, {len(errors)} on the error queue, {len(tier.left())} key(s) left"
    assert sent == {m.message_id: 1 for m in batch}, figures
    assert errors == {} and tier.left() == [], figures


def test_a_lone_late_message_throttled_once_in_a_planned_bucket_is_delivered(
    s3: Any, sqs: Any, tier_bucket: str
) -> None:
    # #31: a message ingested late into a planned bucket, in an object of its own, its destination throttled once:
    # written back onto its own object's key, deleted with the plan
    tier = Tier(s3, sqs, tier_bucket, destinations=("orders", "billing"))
    bucket = fine(DUE, tier.settings)
    tier.store.write(bucket, burst(INLINE + 1, DUE))
    lone = message(9_999, DUE, destination="billing")
    tier.store.write(bucket, [lone])
    tier.flaky.fail("billing", "503", times=1)
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.run_until(DUE + timedelta(minutes=5))
    assert tier.sent("billing") == {lone.message_id: 1}, f"lone: {tier.sent('billing')}, {tier.left()} left"
    assert sum(tier.sent().values()) == INLINE + 1 and tier.left() == []


@pytest.fixture
def calendar(moto_endpoint: str) -> ReleaseCalendar:
    return release_calendar(moto_endpoint, {"orders": 0.04})


def test_a_capped_destination_under_planned_bursts_loses_nothing(
    s3: Any, sqs: Any, tier_bucket: str, calendar: ReleaseCalendar
) -> None:
    # #31: capped at 4/s, 4,001 due in each of 3 minutes: the third minute's 4,001 were lost (the timer's inline
    # leftovers took the slots, the worker held all, wrote them back onto the plan object's key, which the finished
    # plan deleted); here 41 a minute at 0.04/s (36 slots within SQS's 900 s)
    tier = Tier(s3, sqs, tier_bucket, release=calendar)
    batches = [burst(INLINE + 1, DUE + timedelta(minutes=k), first=1_000 * k) for k in range(3)]
    for batch in batches:
        [due] = {m.due_at for m in batch[:1]}
        tier.store.write(fine(due, tier.settings), batch)
    tier.clock.set(DUE - timedelta(seconds=420))
    every = [m.message_id for batch in batches for m in batch]
    deadline = DUE + timedelta(hours=2)
    while tier.clock.now() < deadline and set(tier.sent()) != set(every):
        tier.minute()
    sent = tier.sent()
    assert set(sent) == set(every), f"{len(set(every) - set(sent))} not delivered"
    assert max(sent.values()) == 1 and tier.sent("errors") == {}
    assert [o for o in tier.store.objects(FINE)] == []


def test_a_write_back_never_lands_on_a_key_of_the_plan_that_wrote_it(s3: Any, sqs: Any, tier_bucket: str) -> None:
    # the rule itself: the one throttled message's write-back has exactly its object's content, and its key is
    # still not one of the plan's
    tier = Tier(
        s3, sqs, tier_bucket, settings=TierSettings(bucket_inline_max_messages=1), destinations=("orders", "billing")
    )
    bucket = fine(DUE, tier.settings)
    keys = {tier.store.write(bucket, [m])[0] for m in [message(1, DUE), message(2, DUE, destination="billing")]}
    tier.flaky.fail("billing", "503")
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.minute()
    written = {o.key for o in tier.store.objects(FINE)} - keys
    assert tier.total("buckets_planned") == 1 and tier.total("kept_for_retry") == 1
    assert len(written) == 1, "written back beside the plan's objects, not over one of them"
