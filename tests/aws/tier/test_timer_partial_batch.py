"""The timer when SQS fails single entries inside a successful SendMessageBatch (as AWS does; moto refuses the whole
batch, so tests/fixtures/partial_batch.py answers instead): a refused entry reaches the error queue with the reason,
an entry the answer leaves out is kept for a later run, and the neighbours are sent once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.clock import ManualClock
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.wheel import FINE
from tests.aws.tier.timer_support import START, Recorder, make_store, make_timer, message, queue_url
from tests.fixtures.partial_batch import PartialBatch

pytestmark = pytest.mark.moto

REASON = "DelayedDelivery.FailureReason"


def test_a_refused_entry_goes_to_the_error_queue_and_a_missing_one_is_sent_later(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    errors = queue_url(sqs, "errors")
    queue_url(sqs, "orders")
    answer_later = {"lost"}
    wrapped = PartialBatch(
        sqs, lambda e: e["MessageBody"] == "bad", queue="/orders", missing=lambda e: e["MessageBody"] in answer_later
    )
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    due = START + timedelta(seconds=2)
    store.write_due([message(1, due), message(2, due, body="bad"), message(3, due, body="lost")], START)
    timer = make_timer(store, wrapped, tier_settings, clock)
    clock.advance(2)
    first = timer.run()
    assert (first.dispatched, first.to_error_queue, first.kept_for_retry) == (1, 1, 1), first
    [notice] = drain(sqs, errors, expect=1)
    assert notice["Body"] == "bad" and "InvalidMessageContents" in notice["MessageAttributes"][REASON]["StringValue"]
    assert len(list(store.objects(FINE))) == 1  # the one kept for retry, written back
    answer_later.clear()
    clock.advance(1)
    assert timer.run().dispatched == 1
    assert sorted(s.message_id or "" for s in recorder.to("orders")) == ["m-1", "m-3"]  # each once
    assert list(store.objects(FINE)) == []
