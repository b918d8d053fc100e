"""An operator's reschedule and cancel in a bucket the dispatch workers are sending (#31), on moto at the deployed
sizes: a reschedule moves the one message and resends nothing else, or says it cannot (in flight: try after the
worker's lease; already handed on: not moved); never "moved" for a message already handed to SQS."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.operations import TierOperations
from delayed_delivery.aws.tier.plan_store import PlanStore
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.errors import MessageInFlightError
from delayed_delivery.timebuckets.plans import PartitionProgress
from delayed_delivery.timebuckets.wheel import FINE
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.aws.tier.plan_support import INLINE, Tier, burst, fine
from tests.aws.tier.timer_support import SETTINGS, START

pytestmark = pytest.mark.moto

DUE = START + timedelta(hours=1, seconds=5)
LATER = DUE + timedelta(hours=1)
TABLE = "tier-plan-operations"


@pytest.fixture
def tier(moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str) -> Tier:
    """41 messages due in one fine bucket (over the inline bound of 40: planned), records in a table on moto."""
    client = dynamodb_client(moto_endpoint)
    ensure_cancellation_table(client, TABLE)
    cache = CancellationCache(DynamoDbCancellationStore(client, TABLE), 0)
    made = Tier(s3, sqs, tier_bucket, cache=cache)
    made.store.write(fine(DUE, made.settings), burst(INLINE + 1, DUE))
    made.clock.set(DUE - timedelta(seconds=420))
    made.operations = TierOperations(  # type: ignore[attr-defined]
        made.store,
        sqs,
        DynamoDbCancellationStore(client, TABLE),
        SETTINGS,
        sqs_settings=SqsSettings(long_delay_route="buckets"),
        clock=made.clock,
    )
    return made


def _operations(tier: Tier) -> TierOperations:
    return tier.operations  # type: ignore[attr-defined, no-any-return]


def test_a_reschedule_after_the_workers_sent_the_message_is_not_moved_and_resends_nothing(tier: Tier) -> None:
    # #31: the Relocator rewrote the plan's object without the message under a new key, which the timer then sent
    # inline as a late object: 4,000 duplicates; the plan and its progress were left for the 7-day expiry; the move
    # answered "moved" for a message its worker had already handed to SQS
    tier.minute()  # planned, and the worker sends the whole partition
    assert sum(tier.sent().values()) == INLINE + 1
    done = _operations(tier).reschedule("orders", "m-5", LATER, current_due=DUE)
    assert done.relocation.found and done.relocation.already_sent and not done.relocation.written
    assert "not moved" in done.note and "already handed it to 'orders'" in done.note
    tier.run_until(LATER + timedelta(minutes=10))
    sent = tier.sent()
    duplicates = sum(sent.values()) - len(sent)
    assert duplicates == 0, f"{duplicates} duplicates"
    assert tier.left() == [] and list(PlanStore(tier.store).buckets()) == [], "the plan is finished, not left"


def test_a_reschedule_ahead_of_its_worker_moves_that_message_only(tier: Tier) -> None:
    # the bucket is planned; its worker has not reached the message: the worker moves it by the record
    tier.timer_results.append(tier.timer().run())  # planned; the task waits on the dispatch queue
    assert tier.total("buckets_planned") == 1 and tier.queue.tasks
    done = _operations(tier).reschedule("orders", "m-5", LATER, current_due=DUE)
    assert done.relocation.found and done.relocation.by_workers and not done.relocation.already_sent
    assert "moves it there" in done.note
    tier.run_until(LATER + timedelta(minutes=10))
    sent = tier.sent()
    assert len(sent) == INLINE + 1 and max(sent.values()) == 1, "each once, nothing resent"
    [moved] = [s for s in tier.recorder.to("orders") if s.message_id == "m-5"]
    assert moved.arrives >= LATER and moved.arrives - LATER < timedelta(seconds=2), "at its new time only"
    assert tier.left() == []


def test_a_reschedule_while_a_worker_sends_its_part_is_refused_with_a_time(tier: Tier) -> None:
    tier.timer_results.append(tier.timer().run())
    plans = PlanStore(tier.store)
    plan = plans.read_plan(fine(DUE, tier.settings))
    assert plan is not None
    now_ms = epoch_ms(tier.clock.now())
    holding = PartitionProgress(plan.bucket, plan.created_ms, 0, plan.partitions, owner="w-1",
                                lease_until_ms=now_ms + 120_000, updated_ms=now_ms)  # fmt: skip
    assert plans.write_progress(holding, None) is not None  # a worker took the partition and is sending
    with pytest.raises(MessageInFlightError, match=r"in flight: .* try after 2031-01-01T00:55:05"):
        _operations(tier).reschedule("orders", "m-5", LATER, current_due=DUE)
    assert [o.key for o in tier.store.objects(FINE)] == [
        f"{tier.store.prefix}/fine/{plan.bucket.iso}/{plan.objects[0]}"
    ]
