"""Destinations on the tier (#23): one outside the configured set is refused at ingest (and at dispatch); one that
refuses the timer (access denied, a key it may not use) is retried for a bounded time past the due time, then the
message goes to the error queue with the reason, counted, while its neighbours go out on time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from delayed_delivery.aws.tier.config import DESTINATIONS_ENV, BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE, encode_ingest
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.headers import FAILURE_REASON
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import FINE
from tests.aws.tier.timer_support import SETTINGS, START, Recorder, make_store, message, queue_url, run_for, total

pytestmark = pytest.mark.moto


class Denying:
    """An SQS client whose caller may not use ``locked``: AccessDenied on ``calls`` for it (the rest goes through)."""

    def __init__(self, client: Any, locked: str, calls: tuple[str, ...]) -> None:
        self._client, self._locked, self._calls = client, locked, calls

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._client, name)
        if name not in self._calls:
            return real

        def denied(**kwargs: Any) -> Any:
            target = str(kwargs.get("QueueName") or kwargs.get("QueueUrl", ""))
            if target.rsplit("/", 1)[-1] == self._locked:
                error = {"Code": "AccessDenied", "Message": f"not authorized to perform {name} on {self._locked}"}
                raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 403}}, name)
            return real(**kwargs)

        return denied


def _record(messages: list[BucketMessage], record_id: str) -> dict[str, Any]:
    attributes = {INGEST_ATTRIBUTE: {"dataType": "String", "stringValue": "1"}}
    return {"messageId": record_id, "body": encode_ingest(messages), "messageAttributes": attributes}


def test_the_configuration_reads_the_destinations_the_construct_sets() -> None:
    env = {"DELAYED_DELIVERY_BUCKET_NAME": "tier-bucket", DESTINATIONS_ENV: " orders , billing,,orders "}
    assert BucketTierConfig.from_env(env).destinations == frozenset({"orders", "billing"})
    assert BucketTierConfig.from_env({"DELAYED_DELIVERY_BUCKET_NAME": "tier-bucket"}).destinations is None
    for bad in ("Bad/Name", "orders.fifo", " , "):
        with pytest.raises(ConfigurationError, match=DESTINATIONS_ENV):
            BucketTierConfig.from_env({"DELAYED_DELIVERY_BUCKET_NAME": "tier-bucket", DESTINATIONS_ENV: bad})


def test_a_destination_outside_the_set_is_refused_at_ingest_and_at_dispatch(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    # #23: an ingest record could name any standard queue; the timer's role may send only to its destinations, so
    # such a message was kept for retry every run for ever
    errors = queue_url(sqs, "errors")
    queue_url(sqs, "orders")
    queue_url(sqs, "elsewhere")  # exists, but is not one of the tier's destinations
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    due = epoch_ms(START + timedelta(seconds=3))
    ok, stray = BucketMessage("ok", "orders", b"fine", due), BucketMessage("stray", "elsewhere", b"no", due)
    ingest = BucketIngest(store, sqs, SETTINGS, clock, destinations={"orders"})
    result = ingest.process([_record([ok, stray], "r1")])
    assert result.ingested == 1 and result.failures == {}
    [poison] = result.poison
    assert poison.message_id == "stray" and poison.sent
    assert "'elsewhere' is not one of the tier's destinations" in poison.reason
    [refused] = drain(sqs, errors)
    assert refused["Body"] == "no" and "'elsewhere'" in refused["MessageAttributes"][FAILURE_REASON]["StringValue"]
    store.write_due([BucketMessage("hand-written", "elsewhere", b"put", due)], START)  # an object put under the prefix
    timer = BucketTimer(store, sqs, SETTINGS, clock, owner="t", lease_seconds=5, destinations={"orders"})
    results = run_for(timer, clock, 4)
    assert [s.message_id for s in recorder.to("orders")] == ["ok"] and recorder.to("elsewhere") == []
    [held] = drain(sqs, errors)
    assert (
        held["Body"] == "put"
        and "not one of the tier's destinations" in held["MessageAttributes"][FAILURE_REASON]["StringValue"]
    )
    assert total(results, "kept_for_retry") == 0 and list(store.objects(FINE)) == []


@pytest.mark.parametrize("calls", [("get_queue_url",), ("send_message_batch",)], ids=["lookup", "send"])
def test_a_destination_that_refuses_the_timer_is_retried_for_a_bounded_time_then_given_up(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, calls: tuple[str, ...]
) -> None:
    # #23: AccessDenied on GetQueueUrl (or on send) was written back every run for ever: kept_for_retry=1, error
    # queue 0, overdue growing
    errors = queue_url(sqs, "errors")
    queue_url(sqs, "orders")
    queue_url(sqs, "locked")
    clock = ManualClock(START)
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    neighbours = [message(n, START + timedelta(seconds=3, milliseconds=n)) for n in range(3)]
    refused = message(9, START + timedelta(seconds=3), destination="locked")
    store.write_due([*neighbours, refused], START)
    denying = Denying(sqs, "locked", calls)
    timer = BucketTimer(  # no send waves: the clock moves only by the runs
        store,
        denying,
        SETTINGS,
        clock,
        owner="t",
        lease_seconds=5,
        tier=TierSettings().with_(bucket_refused_retry_seconds=6, bucket_send_phase_ms=0),
    )
    first = run_for(timer, clock, 8)  # due at +3 s: still within 6 s of its due time, retried
    assert sorted(s.message_id for s in recorder.to("orders")) == sorted(m.message_id for m in neighbours)
    assert all(s.arrives - START <= timedelta(seconds=4) for s in recorder.to("orders"))  # on time, not held back
    assert drain(sqs, errors) == [] and total(first, "refused") >= 5 and total(first, "refused_given_up") == 0
    assert total(first, "kept_for_retry") >= 5
    later = run_for(timer, clock, 3)  # now more than 6 s past due: given up, to the error queue with the reason
    [held] = drain(sqs, errors)
    reason = held["MessageAttributes"][FAILURE_REASON]["StringValue"]
    assert held["Body"] == "body-9" and "AccessDenied" in reason and "'locked' refused" in reason, reason
    assert "6s past its due time" in reason
    assert total(later, "refused_given_up") == 1 and list(store.objects(FINE)) == []
    assert recorder.to("locked") == []


def test_the_refused_retry_setting_is_bounded() -> None:
    assert TierSettings().bucket_refused_retry_seconds == 3600
    name = "DELAYED_DELIVERY_BUCKET_REFUSED_RETRY_SECONDS"
    assert TierSettings.from_env({name: "0"}).bucket_refused_retry_seconds == 0
    for bad in ("-1", "soon"):
        with pytest.raises(ConfigurationError):
            TierSettings.from_env({name: bad})
