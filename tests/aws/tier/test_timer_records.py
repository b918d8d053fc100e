"""The timer meets cancel / reschedule records a careless or hostile writer left in the DynamoDB table (moto).

Each record that cannot be used holds its one message for the error queue (with the reason), and is deleted; the
neighbours in the same bucket go out on time. Before #23 one such record failed its whole bucket every run.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.cancellations import CancellationCache, UnreadableRecord, reschedule_request
from delayed_delivery.clock import ManualClock
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.wheel import COARSE, FINE
from tests.aws.test_cancel_dynamodb import dynamodb_client
from tests.aws.tier.timer_support import (
    START,
    Recorder,
    make_store,
    make_timer,
    message,
    queue_url,
    run_for,
    settled,
    total,
)

pytestmark = pytest.mark.moto

TABLE = "timer-records"
LATER = int((START + timedelta(days=30)).timestamp())
#: Hand-written items, each naming one message: what the old CLI wrote for `--at 1960-...`, a naive request time, a
#: due time past 9000, an unknown kind, a cancel with no expiry, a request time that is no time at all.
BAD_ITEMS = {
    "m-1": {"kind": "reschedule", "requested_at": "2030-12-31T00:00:00+00:00", "due_at": "1960-01-01T00:00:00+00:00"},
    "m-2": {"kind": "cancel", "requested_at": "2030-12-31T00:00:00"},
    "m-3": {"kind": "reschedule", "requested_at": "2030-12-31T00:00:00+00:00", "due_at": "9500-01-01T00:00:00+00:00"},
    "m-4": {"kind": "forget", "requested_at": "2030-12-31T00:00:00+00:00"},
    "m-5": {"kind": "cancel", "requested_at": "2030-12-31T00:00:00+00:00", "expires_at": None},
    "m-6": {"kind": "cancel", "requested_at": "yesterday"},
}


def _put_raw(dynamodb: Any, message_id: str, fields: dict[str, Any], endpoint: str = "orders") -> None:
    item: dict[str, Any] = {"endpoint": {"S": endpoint}, "message_id": {"S": message_id}}
    for name, value in fields.items():
        if value is not None:
            item[name] = {"S": value}
    if "expires_at" not in fields:
        item["expires_at"] = {"N": str(LATER)}
    dynamodb.put_item(TableName=TABLE, Item=item)


@pytest.fixture
def table(moto_endpoint: str) -> tuple[Any, DynamoDbCancellationStore]:
    client = dynamodb_client(moto_endpoint)
    ensure_cancellation_table(client, TABLE)
    return client, DynamoDbCancellationStore(client, TABLE)


@pytest.mark.parametrize("level", [FINE, COARSE])
def test_an_unusable_record_holds_its_one_message_and_the_bucket_goes_out(
    s3: Any,
    sqs: Any,
    tier_bucket: str,
    tier_settings: TierSettings,
    table: tuple[Any, DynamoDbCancellationStore],
    level: str,
) -> None:
    dynamodb, records = table
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    errors = queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    offset = 5 if level == FINE else 25  # fine: the records meet the dispatch; coarse: the cascade first
    sent_at = START - timedelta(seconds=5)
    batch = [message(n, START + timedelta(seconds=offset, milliseconds=n), sent=sent_at) for n in range(1, 10)]
    assert {b.level for b in store.write_due(batch, START)} == {level}
    for message_id, fields in BAD_ITEMS.items():
        _put_raw(dynamodb, message_id, fields)
    records.put(reschedule_request("orders", "m-7", START + timedelta(seconds=40), now=START))  # a good one still works
    timer = make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock))
    results = run_for(timer, clock, 45)
    assert total(results, "buckets_failed") == 0
    sent = {s.message_id: s for s in recorder.to("orders")}
    assert set(sent) == {"m-7", "m-8", "m-9"}
    for n in (8, 9):  # the neighbours: on time, not held back
        assert sent[f"m-{n}"].arrives - batch[n - 1].due_at < timedelta(seconds=1)
    assert sent["m-7"].arrives >= START + timedelta(seconds=40)
    held = {m["Body"]: m["MessageAttributes"] for m in drain(sqs, errors)}
    assert set(held) == {f"body-{n}" for n in range(1, 7)}
    for n in range(1, 7):
        reason = held[f"body-{n}"][FAILURE_REASON]["StringValue"]
        assert f"record for 'm-{n}' on 'orders' cannot be read" in reason, reason
        assert held[f"body-{n}"][ORIGINAL_DESTINATION]["StringValue"] == "orders"
    assert "1960-01-01" in held["body-1"][FAILURE_REASON]["StringValue"]
    assert "naive" in held["body-2"][FAILURE_REASON]["StringValue"]
    assert total(results, "to_error_queue") == 6 and total(results, "rescheduled") == 1
    # every unreadable record is deleted once its message is held; the applied one is settled (#31)
    assert [r.message_id for r in records.live("orders")] == ["m-7"]
    assert settled(records, "orders", START + timedelta(seconds=40))


def test_a_record_is_kept_while_the_error_queue_is_away(
    s3: Any,
    sqs: Any,
    tier_bucket: str,
    tier_settings: TierSettings,
    table: tuple[Any, DynamoDbCancellationStore],
) -> None:
    dynamodb, records = table
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    held, neighbour = (message(n, START + timedelta(seconds=3), sent=START - timedelta(seconds=5)) for n in (1, 2))
    store.write_due([held, neighbour], START)
    _put_raw(dynamodb, "m-1", BAD_ITEMS["m-2"])
    timer = make_timer(store, sqs, tier_settings, clock, CancellationCache(records, 0, clock=clock))
    first = run_for(timer, clock, 6)  # no error queue yet: the message is written back, its record kept
    assert [s.message_id for s in recorder.to("orders")] == ["m-2"]
    assert total(first, "kept_for_retry") >= 1 and total(first, "buckets_failed") == 0
    [kept] = records.live("orders")
    assert isinstance(kept, UnreadableRecord) and "naive" in kept.reason
    errors = queue_url(sqs, "errors")
    run_for(timer, clock, 2)
    assert [m["Body"] for m in drain(sqs, errors)] == ["body-1"]
    assert records.live("orders") == [] and [s.message_id for s in recorder.to("orders")] == ["m-2"]
