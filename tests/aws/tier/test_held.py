"""Messages a release cap holds (#31), on moto: they wait in their destination's held area, are not rewritten every
run, leave in due order as slots free up, each once; a run's work is what it can release. Cancel and reschedule
reach them there; ``pending`` counts them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.release_calendar import ReleaseCalendar
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.held import HeldArea
from delayed_delivery.aws.tier.operations import TierOperations
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.timebuckets.wheel import FINE, parse_object_key_count
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.aws.tier.plan_support import Tier, burst, fine, release_calendar
from tests.aws.tier.timer_support import SETTINGS, START

pytestmark = pytest.mark.moto

DUE = START + timedelta(hours=1, seconds=5)
#: A backlog past what the slots up to 900 s ahead hold at the cap: about half of it waits in the held area (481 s
#: of slots from 420 s to 900 s ahead hold 120 at 0.25/s). Backlog and rate scale together (1,000 at 1/s holds the
#: same half back and takes the same minutes); kept small, as every message costs calendar and SQS round trips on
#: moto, and a second of no capacity costs none.
BACKLOG = 250
RATE = 0.25


@pytest.fixture
def calendar(moto_endpoint: str) -> ReleaseCalendar:
    return release_calendar(moto_endpoint, {"orders": RATE})


class Rewrites:
    """Message lines written into bucket objects and held areas (from the keys' counts), after ``start``."""

    def __init__(self, s3: Any) -> None:
        self.lines = 0
        self.on = False
        s3.meta.events.register("provide-client-params.s3.PutObject", self._put)

    def _put(self, params: dict[str, Any], **_: Any) -> None:
        key = str(params["Key"])
        skip = ("/plans/", "/seen/", "/leases/")
        if self.on and ("/fine/" in key or "/coarse/" in key) and not any(part in key for part in skip):
            count = parse_object_key_count(key).message_count
            self.lines += count or 0


def _minutes(tier: Tier, until: Any) -> Iterator[None]:
    while tier.clock.now() < until:
        tier.minute()
        yield


def test_a_held_backlog_costs_its_size_in_rewrites_not_its_square(
    s3: Any, sqs: Any, tier_bucket: str, calendar: ReleaseCalendar
) -> None:
    # #31: held messages were re-read and rewritten into their bucket every run (about 5,300 held meant 63,319
    # rewrites in 25 minutes), and a held backlog over the inline bound was planned again every cycle
    tier = Tier(s3, sqs, tier_bucket, release=calendar)
    batch = [replace(m, due_at_ms=m.due_at_ms + n * 17 % 1_000) for n, m in enumerate(burst(BACKLOG, DUE))]
    tier.store.write(fine(DUE, tier.settings), batch)
    rewrites = Rewrites(s3)
    rewrites.on = True
    tier.clock.set(DUE - timedelta(seconds=420))
    idle = []
    for _ in _minutes(tier, DUE + timedelta(hours=2)):
        if len(tier.sent()) == BACKLOG:
            break
        if getattr(tier.timer_results[-1], "held_released", 0) == 0 and len(tier.timer_results) > 2:
            idle.append(getattr(tier.timer_results[-1], "held_rewritten", 0))
    sent = tier.sent()
    figures = f"{len(sent)} of {BACKLOG} sent, {rewrites.lines:,} lines rewritten in {len(tier.timer_results)} runs"
    assert len(sent) == BACKLOG and max(sent.values()) == 1, figures
    assert rewrites.lines <= 2 * BACKLOG, figures
    assert all(n == 0 for n in idle), "a run that releases nothing rewrites nothing"
    due = {m.message_id: m.due_at for m in batch}
    # release slots are whole seconds: by due time, the second each became visible never goes back
    seconds = [
        int(a.timestamp()) for _, a in sorted((due[s.message_id or ""], s.arrives) for s in tier.recorder.to("orders"))
    ]
    assert seconds == sorted(seconds), "due order kept"
    assert list(tier.store.objects(FINE)) == [] and list(HeldArea(tier.store).objects()) == []


def test_a_held_message_is_cancelled_rescheduled_and_counted_where_it_waits(
    moto_endpoint: str, s3: Any, sqs: Any, tier_bucket: str, calendar: ReleaseCalendar
) -> None:
    client = dynamodb_client(moto_endpoint)
    ensure_cancellation_table(client, "held-records")
    records = DynamoDbCancellationStore(client, "held-records")
    tier = Tier(s3, sqs, tier_bucket, release=calendar, cache=CancellationCache(records, 0))
    tier.store.write(fine(DUE, tier.settings), burst(BACKLOG, DUE))
    tier.clock.set(DUE - timedelta(seconds=420))
    tier.minute()  # planned and sent: the slots up to 900 s ahead at RATE, the rest held
    held = sum(o.count or 0 for o in HeldArea(tier.store).objects())
    assert held > 0 and len(tier.sent()) + held == BACKLOG  # 481 s of slots from 420 s to 900 s ahead
    routes = SqsSettings(long_delay_route="buckets")
    operations = TierOperations(tier.store, sqs, records, SETTINGS, sqs_settings=routes, clock=tier.clock)
    census = operations.census("hour")
    # pending counts the held messages (and the plan's object, listed until the plan is finished)
    assert census.messages == BACKLOG + held
    waiting = [m for o in HeldArea(tier.store).objects() for m in tier.store.read(o.key).messages]
    cancel, move = waiting[-1].message_id, waiting[-2].message_id
    assert operations.cancel("orders", cancel, due=DUE + timedelta(days=1)).record is not None
    later = DUE + timedelta(minutes=30)  # after the last slot of the burst (BACKLOG at RATE: 1,000 s)
    moved = operations.reschedule("orders", move, later, current_due=waiting[-2].due_at)
    assert moved.relocation.found and not moved.relocation.already_sent
    tier.run_until(later + timedelta(minutes=10))
    sent = tier.sent()
    assert cancel not in sent and sent[move] == 1 and len(sent) == BACKLOG - 1 and max(sent.values()) == 1
    [arrival] = [s.arrives for s in tier.recorder.to("orders") if s.message_id == move]
    assert arrival >= later
