"""A message routed to the tier reaches S3 before its bucket's first dispatch, however long it sits in the ingest's
batching window (#24): real bucket sizes, the real sender, ingest and timer on moto, simulated time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import TierSettings, ingest_wait_seconds
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.clock import ManualClock
from delayed_delivery.testing.aws import lambda_sqs_record
from delayed_delivery.timebuckets.wheel import FINE, BucketKey, dispatch_window
from tests.aws.tier.timer_support import SETTINGS, Recorder, make_store, make_timer, queue_url

pytestmark = pytest.mark.moto

ARN = "arn:aws:sqs:us-east-1:123456789012:ingest"
#: A fine bucket (real size: a minute) on the epoch grid.
BUCKET = BucketKey(FINE, datetime(2031, 2, 3, 4, 20, tzinfo=UTC))


def _ingest_everything(sqs: Any, url: str, ingest: BucketIngest) -> int:
    """One ingest invocation over every record waiting (as a batching window gathers them)."""
    records = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
        if not got.get("Messages"):
            break
        records += [lambda_sqs_record(m, ARN, "us-east-1") for m in got["Messages"]]
    result = ingest.process(records)
    assert not result.failures
    return result.ingested


@pytest.mark.parametrize("phase", [0.0, 0.4, 17.0, 59.9])
def test_the_shortest_long_delay_held_for_the_whole_ingest_wait_goes_out_in_its_buckets_first_dispatch(
    s3: Any, sqs: Any, tier_bucket: str, phase: float
) -> None:
    tier = TierSettings()  # the deployed sizes: fine 60 s, dispatch lead 420 s
    routing = SqsSettings(long_delay_route="buckets", bucket_ingest_queue="ingest")  # max_native_delay 900
    delay = routing.max_native_delay + 1
    # the worst case: due at the very end of its bucket, so the bucket starts as soon after the send as it can
    due = BUCKET.end(tier.levels) - timedelta(milliseconds=500)
    sent_at = due - timedelta(seconds=delay)
    wait = ingest_wait_seconds()  # batching window 300 s + timeout 60 s + 60 s
    assert wait == tier.levels.ingest_slack(routing.max_native_delay)  # the defaults use the slack exactly
    ingest_url = queue_url(sqs, "ingest")
    for name in ("orders", "errors"):
        queue_url(sqs, name)
    clock = ManualClock(sent_at)
    receipt = SqsDelayedSender(sqs, SETTINGS, sqs_settings=routing, clock=clock).send_delayed("orders", "x", delay)
    assert receipt.route.value == "buckets"

    store = make_store(s3, tier_bucket, tier)
    timer = make_timer(store, sqs, tier, clock)
    recorder = Recorder(clock).attach(sqs)
    ingested_at = sent_at + timedelta(seconds=wait)
    run_at = sent_at + timedelta(seconds=phase)  # the timer's runs: every minute, at any phase against the send
    ingested = False
    first_ready: datetime | None = None
    while not recorder.to("orders"):
        assert run_at < due, "not sent before its due time"
        if not ingested and run_at >= ingested_at:
            clock.set(ingested_at)
            assert _ingest_everything(sqs, ingest_url, BucketIngest(store, sqs, SETTINGS, clock)) == 1
            ingested = True
        clock.set(run_at)
        if first_ready is None and dispatch_window(run_at, levels=tier.levels).ready(BUCKET):
            first_ready = run_at
            assert ingested, "the bucket's first dispatch came before the message reached S3"
        assert timer.run().dispatched == (1 if recorder.to("orders") else 0)
        run_at += timedelta(minutes=1)
    assert run_at - timedelta(minutes=1) == first_ready  # sent by the bucket's first dispatch, not a run later
    [out] = recorder.to("orders")
    assert out.arrives >= due and 0 < out.delay_seconds <= 900
    assert (BUCKET.start - out.at).total_seconds() > tier.bucket_dispatch_lead_seconds - 60  # a lead to spare


def test_with_the_old_lead_the_window_would_let_such_a_message_miss_its_first_dispatch() -> None:
    from delayed_delivery.aws.tier.config import check_ingest_wait
    from delayed_delivery.errors import ConfigurationError

    old = TierSettings(bucket_dispatch_lead_seconds=600).levels
    with pytest.raises(ConfigurationError, match="lower the dispatch lead or the batching window"):
        check_ingest_wait(old, 900)
    check_ingest_wait(old, 900, window_seconds=20)  # the old 20 s window fitted the old lead
    # and the miss is real: sent 901 s before the end of its bucket, ready for dispatch 240.5 s after the send
    due = BUCKET.end(old) - timedelta(milliseconds=500)
    sent_at = due - timedelta(seconds=901)
    ready_from = BUCKET.start - timedelta(seconds=old.dispatch_lead_seconds)
    assert dispatch_window(ready_from, levels=old).ready(BUCKET)
    assert (ready_from - sent_at).total_seconds() < ingest_wait_seconds()
