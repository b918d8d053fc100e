"""Release control on the S3 time-bucket tier, on moto (#25): the timer (and the dispatch workers, through the same
sends) takes each capped destination's slots from the release calendar the FIFO route shares and sends with
``DelaySeconds`` to the slot; what has no slot within SQS's 900 s waits in its destination's held area (#31)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import boto3
import pytest

from delayed_delivery.aws.config import RELEASE_TABLE_ENV
from delayed_delivery.aws.release_calendar import ReleaseCalendar, ensure_release_table
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.release import RELEASE_RATES_ENV, ReleaseRates, busiest_window
from delayed_delivery.timebuckets.wheel import FINE
from tests.aws.tier.timer_support import SETTINGS, START, Recorder, make_store, message, queue_url, run_for, total
from tests.fixtures.moto import REGION

pytestmark = pytest.mark.moto


@pytest.fixture
def calendar_table(moto_endpoint: str) -> tuple[Any, str]:
    client = boto3.client(
        "dynamodb",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = f"release-{time.monotonic_ns()}"
    ensure_release_table(client, name)
    return client, name


def test_a_capped_burst_leaves_at_the_rate_and_what_has_no_slot_is_held(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, calendar_table: tuple[Any, str]
) -> None:
    client, table = calendar_table
    clock = ManualClock(START)
    queue_url(sqs, "orders"), queue_url(sqs, "billing"), queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    # 100 to orders, capped at 0.1/s: 900 s of SQS delay hold about 90 slots, so about 10 wait for later runs;
    # 10 to billing, uncapped, due at the same time
    due = START + timedelta(seconds=3)
    burst = [message(n, due + timedelta(milliseconds=n)) for n in range(100)]
    free = [message(100 + n, due, destination="billing") for n in range(10)]
    store.write_due([*burst, *free], START)
    calendar = ReleaseCalendar(client, table, ReleaseRates.of({"orders": 0.1}))
    timer = BucketTimer(store, sqs, SETTINGS, clock, owner="t", lease_seconds=5, tier=tier_settings, release=calendar)
    first = run_for(timer, clock, 5)
    sent = recorder.to("orders")
    held = 100 - len(sent)
    # the rest waits in its destination's held area (#31: written back into its bucket, read again every run)
    assert 85 <= len(sent) <= 92 and total(first, "held_written") == held > 0, "the rest is held"
    assert all(s.delay_seconds <= 900 for s in sent)
    assert max(r.release_held for r in first) == held, "held back each run until a slot comes within reach"
    assert max(r.release_lag_max_seconds for r in first) > 800
    arrivals = [s.arrives.timestamp() for s in sent]
    assert busiest_window(arrivals, 10) <= 2, "at most one a 10 s window (+ a second's rounding)"
    order = [int((s.message_id or "m-0")[2:]) for s in sent]
    by_arrival = [n for _, n in sorted(zip(arrivals, order, strict=True))]
    assert by_arrival == sorted(by_arrival), "due order kept"
    assert all(s.arrives >= due for s in sent), "never early"
    billing = recorder.to("billing")
    assert len(billing) == 10 and all(s.arrives - due < timedelta(seconds=1) for s in billing), "not slowed"
    # later runs, as the calendar's seconds come within reach, send the rest: nothing lost, nothing twice
    run_for(timer, clock, 200, step=20)
    ids = Counter(s.message_id for s in recorder.to("orders"))
    assert sorted(ids) == sorted(m.message_id for m in burst) and max(ids.values()) == 1
    assert list(store.objects(FINE)) == []


def test_release_rates_without_a_table_is_one_clear_error() -> None:
    env = {"DELAYED_DELIVERY_BUCKET_NAME": "tier-bucket", RELEASE_RATES_ENV: '{"orders": 10}'}
    config = BucketTierConfig.from_env(env)
    with pytest.raises(ConfigurationError, match=RELEASE_TABLE_ENV):
        config.release_calendar(None)
    assert BucketTierConfig.from_env({**env, RELEASE_TABLE_ENV: "slots"}).release_table == "slots"
    assert BucketTierConfig.from_env({"DELAYED_DELIVERY_BUCKET_NAME": "b-1"}).release_calendar(None) is None
