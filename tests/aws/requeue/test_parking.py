"""Visibility parking on the FIFO hop cycle, on moto server, each case of ``aws/requeue.py``'s clock rules.

Compression: native cap and hop 1 s, visibility timeout 1 s (so the return threshold ``T`` is 2 s and no park is
shorter than 4 s), ``max_park_seconds`` 6. A real deployment parks for up to 12 h between 900 s hops.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.fifo_ids import hop_of
from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.requeue import FifoRequeuer, HopOutcome, RecordResult
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.cancellations import (
    CancellationCache,
    InMemoryCancellationStore,
    cancel_request,
    reschedule_request,
)
from delayed_delivery.delivery import DELIVERY_HEADER
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller, LocalLambdaContext, lambda_sqs_record
from tests.aws.conftest import collect, handler_env

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

HOP = 1
MAX_PARK = 6
#: Late by at most the local polls (1 s long polls), one hop's rounding and a loaded CPU.
SLACK = 3.5
EPSILON = 0.25


@pytest.fixture
def sqs_settings() -> SqsSettings:
    """Hop and native cap 1 s, parks of 4–6 s (overrides the 2 s settings of tests/aws/conftest.py)."""
    return SqsSettings(max_native_delay=HOP, fifo_queue_delay=HOP, max_park_seconds=MAX_PARK, long_delay_route="fifo")


class Outcomes:
    """Every result the handler produced, per message id, in order, with the receive count it came with."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_message: dict[str, list[tuple[HopOutcome, int]]] = {}
        self.records: dict[str, dict[str, Any]] = {}

    def record_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            for r in event["Records"]:
                self.records[r["messageId"]] = r

    def add(self, results: list[RecordResult]) -> None:
        with self.lock:
            for r in results:
                count = int(self.records[r.record_id]["attributes"]["ApproximateReceiveCount"])
                for each in r.per_message():
                    self.by_message.setdefault(each.message_id, []).append((each.outcome, count))

    def of(self, message_id: str) -> list[tuple[HopOutcome, int]]:
        with self.lock:
            return list(self.by_message.get(message_id, []))


@pytest.fixture
def run_handler(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings, endpoint: EndpointQueues
) -> Iterator[Callable[..., tuple[LocalEventSourcePoller, Outcomes]]]:
    """Start the real Lambda handler behind the local event source; returns the poller and the outcomes."""
    started: list[LocalEventSourcePoller] = []

    def start(**kwargs: Any) -> tuple[LocalEventSourcePoller, Outcomes]:
        outcomes = Outcomes()
        handler = build_handler(handler_env(settings, sqs_settings), sqs_client=sqs, on_results=outcomes.add)

        def observed(event: dict[str, Any], context: Any) -> Any:
            outcomes.record_event(event)
            return handler(event, context)

        poller = LocalEventSourcePoller(sqs, endpoint.delay_url, endpoint.delay_arn, observed, **kwargs)
        started.append(poller.start())
        return poller, outcomes

    yield start
    for poller in started:
        poller.stop()
    for poller in started:
        assert (poller.stats.handler_errors, poller.stats.poll_errors) == (0, 0), poller.stats


def _receive(sqs: SQSClient, endpoint: EndpointQueues, *, expect: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
    """Receive ``expect`` records from the FIFO queue as Lambda records (they stay in flight, undeleted)."""
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(records) < expect and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=endpoint.delay_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        records += [lambda_sqs_record(m, endpoint.delay_arn, "us-east-1") for m in reply.get("Messages", [])]
    assert len(records) == expect, records
    return records


def _delete(sqs: SQSClient, endpoint: EndpointQueues, records: list[dict[str, Any]]) -> None:
    for r in records:
        sqs.delete_message(QueueUrl=endpoint.delay_url, ReceiptHandle=r["receiptHandle"])


def _not_visible(sqs: SQSClient, endpoint: EndpointQueues) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=endpoint.delay_url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesNotVisible"])


def _count_calls(sqs: SQSClient, operation: str) -> list[dict[str, Any]]:
    """The parameters of every ``operation`` call ``sqs`` makes from now on."""
    calls: list[dict[str, Any]] = []
    sqs.meta.events.register(f"provide-client-params.sqs.{operation}", lambda params, **_: calls.append(params))
    return calls


# -- case 1 → 3: first receive parks, a park return parks again, then requeues, then the hop forwards ------------


def test_a_long_delay_parks_parks_again_then_requeues_once_and_arrives_on_time(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, run_handler: Any
) -> None:
    visibility_changes = _count_calls(sqs, "ChangeMessageVisibilityBatch")
    _poller, outcomes = run_handler()
    sent_at = time.time()
    sender.send_delayed("orders", "long", 22, message_id="p1")
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=40, linger=2)
    assert sent_at + 22 - EPSILON <= arrival.at <= sent_at + 22 + SLACK, arrival.at - sent_at
    seen = outcomes.of("p1")
    assert seen[0] == (HopOutcome.PARKED, 1)  # case 1: the first receive parks
    parks = [count for outcome, count in seen if outcome is HopOutcome.PARKED]
    assert len(parks) >= 3 and parks == sorted(parks)  # case 3: park returns (receive count 2, 3, …) park again
    hops = [(outcome, count) for outcome, count in seen if outcome is not HopOutcome.PARKED]
    # case 3 ends in a requeue (never a forward) on a park return; the next receive is a first receive again
    assert hops[0][0] is HopOutcome.REQUEUED and hops[0][1] > 1, seen
    assert hops[-1] == (HopOutcome.FORWARDED, 1), seen
    assert len(hops) <= 3, seen  # instead of ~21 hops of 1 s without parking
    assert len(visibility_changes) == len(parks)
    assert all(e["VisibilityTimeout"] <= MAX_PARK for call in visibility_changes for e in call["Entries"])


def test_a_parked_record_stays_in_flight_undeleted_for_its_park_then_comes_back(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    sender.send_delayed("orders", "hide me", 30, message_id="p2")
    [record] = _receive(sqs, endpoint)
    [result] = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings).process([record])
    parked_at = time.time()
    # ~28.5 s left: 27 s to park before one hop and the margin are left, in 5 even parks of 5 s (≤ 6 s)
    assert result.outcome is HopOutcome.PARKED and result.park_s == 5
    assert result.error is None and result.hop == 0
    assert _not_visible(sqs, endpoint) == 1  # in flight: not deleted, not visible
    assert not sqs.receive_message(QueueUrl=endpoint.delay_url, WaitTimeSeconds=1).get("Messages")
    [back] = _receive(sqs, endpoint, timeout=MAX_PARK + 5)
    assert time.time() - parked_at >= 5 - EPSILON
    assert back["attributes"]["ApproximateReceiveCount"] == "2"
    # the broker's first-receive time is from before the park: only the broker clock shows the park passed
    first = "ApproximateFirstReceiveTimestamp"
    assert back["attributes"][first] == record["attributes"][first]


def test_parking_off_hops_as_before(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    sender.send_delayed("orders", "hop", 30, message_id="p3")
    [record] = _receive(sqs, endpoint)
    [result] = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings.with_(max_park_seconds=0)).process([record])
    assert result.outcome is HopOutcome.REQUEUED and result.park_s is None


def test_a_delay_too_short_for_a_park_hops(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    # 6 s left at the first receive: a park would end with one hop and the margin (1.5 s) left, so it would last
    # 4.5 s → 4 s, the shortest allowed (4 hops, 2 T); 5 s left is too little.
    sender.send_delayed("orders", "short", 6, message_id="p4")
    [record] = _receive(sqs, endpoint)
    [result] = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings).process([record])
    assert result.outcome is HopOutcome.REQUEUED


# -- case 2: a lost visibility change comes back as a plain redelivery and hops ----------------------------------


def test_a_lost_visibility_change_fails_the_record_which_comes_back_as_a_plain_redelivery_and_hops(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    from botocore.exceptions import EndpointConnectionError

    sender.send_delayed("orders", "lost", 30, message_id="p5")
    [record] = _receive(sqs, endpoint)
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings)

    def lose(**_: Any) -> None:
        raise EndpointConnectionError(endpoint_url="http://sqs")

    sqs.meta.events.register("before-call.sqs.ChangeMessageVisibilityBatch", lose)
    [result] = requeuer.process([record])
    sqs.meta.events.unregister("before-call.sqs.ChangeMessageVisibilityBatch", lose)
    assert result.outcome is HopOutcome.FAILED and result.error is not None and result.error.retryable
    # not deleted (the event source deletes nothing failed): back after the queue's visibility timeout (1 s)
    [again] = _receive(sqs, endpoint, timeout=5)
    assert again["attributes"]["ApproximateReceiveCount"] == "2"
    [result] = requeuer.process([again])  # less than T after the first receive: plain, decided as before
    assert result.outcome is HopOutcome.REQUEUED and result.hop == 1
    _delete(sqs, endpoint, [again])
    [fresh] = _receive(sqs, endpoint, timeout=5)  # the requeued copy: a first receive, which parks
    assert _hop(fresh) == "p5:1"
    [result] = requeuer.process([fresh])
    assert result.outcome is HopOutcome.PARKED


@pytest.mark.parametrize("refusal", ["stale receipt handle", "no permission"])
def test_a_visibility_change_sqs_refuses_did_not_happen_so_the_record_hops_at_once(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    refusal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from botocore.exceptions import ClientError

    sender.send_delayed("orders", "refused", 30, message_id="p7")
    [record] = _receive(sqs, endpoint)
    event_record = dict(record)

    def deny(**_: Any) -> None:
        error = {
            "Error": {"Code": "AccessDenied", "Message": "not allowed"},
            "ResponseMetadata": {"HTTPStatusCode": 403},
        }
        raise ClientError(error, "ChangeMessageVisibilityBatch")  # type: ignore[arg-type]

    if refusal == "stale receipt handle":
        event_record["receiptHandle"] = "no-longer-valid"  # SQS fails the entry as the sender's fault
    else:
        sqs.meta.events.register("before-call.sqs.ChangeMessageVisibilityBatch", deny)
    env = {**handler_env(settings, sqs_settings), "POWERTOOLS_SERVICE_NAME": f"parking-{time.time_ns()}"}
    results: list[RecordResult] = []
    handler = build_handler(env, sqs_client=sqs, on_results=results.extend)
    capsys.readouterr()
    response = handler({"Records": [event_record]}, LocalLambdaContext())
    sqs.meta.events.unregister("before-call.sqs.ChangeMessageVisibilityBatch", deny)
    # the change certainly did not happen: the record hops as without parking, and is not reported failed
    assert response == {"batchItemFailures": []}
    [result] = results
    assert result.outcome is HopOutcome.REQUEUED and result.reason is not None
    assert result.reason.startswith("hopped instead of parking")
    out = capsys.readouterr().out
    assert '"ParkRefusals"' in out and "parking refused by SQS" in out
    _delete(sqs, endpoint, [record])
    [copy] = _receive(sqs, endpoint, timeout=5)
    assert _hop(copy) == "p7:1"


# -- case 3: a lost delete after the post-park requeue is deduplicated -------------------------------------------


def test_a_lost_delete_after_the_post_park_requeue_repeats_the_same_requeue_which_fifo_drops(
    sqs: SQSClient, endpoint: EndpointQueues, sender: SqsDelayedSender, run_handler: Any
) -> None:
    lost: list[str] = []

    def lose_post_park_requeue(record: dict[str, Any]) -> bool:
        attrs = record["attributes"]
        if not lost and _hop(record) == "p6:0" and int(attrs["ApproximateReceiveCount"]) > 1:
            lost.append(record["messageId"])
            return True
        return False

    _poller, outcomes = run_handler(lose_delete=lose_post_park_requeue)
    sent_at = time.time()
    sender.send_delayed("orders", "once", 14, message_id="p6")
    arrivals = collect(sqs, endpoint.input_url, expect=1, timeout=35, linger=4)
    assert lost, "the post-park requeue's delete was never lost"
    assert len(arrivals) == 1, [a.body for a in arrivals]  # the repeated requeue carried p6:1 again: dropped
    assert sent_at + 14 - EPSILON <= arrivals[0].at <= sent_at + 14 + SLACK + 1.5
    requeues = [count for outcome, count in outcomes.of("p6") if outcome is HopOutcome.REQUEUED]
    assert len(requeues) >= 2 and all(count > 1 for count in requeues[:2]), outcomes.of("p6")


# -- envelopes --------------------------------------------------------------------------------------------------


def test_an_envelope_parks_whole_for_its_soonest_message_and_every_message_arrives_on_time(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    run_handler: Any,
) -> None:
    _poller, outcomes = run_handler()
    delays = {f"e{i}": 14 + 2 * i for i in range(6)}
    packed = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=65_536))
    sent_at = time.time()
    assert packed.send_delayed_batch([DelayedSend("orders", m, d, message_id=m) for m, d in delays.items()]).ok
    arrivals = collect(sqs, endpoint.input_url, expect=len(delays), timeout=45, linger=2)
    assert sorted(a.body for a in arrivals) == sorted(delays)
    for a in arrivals:
        due = sent_at + delays[a.body]
        assert due - EPSILON <= a.at <= due + SLACK, (a.body, a.at - due)
    for message_id in delays:
        assert outcomes.of(message_id)[0] == (HopOutcome.PARKED, 1)  # the whole envelope parked at once
    # No envelope marker or control attribute got through: only the delivery header for the consumer (#16).
    assert all(set(a.attributes) <= {DELIVERY_HEADER} for a in arrivals)
    enveloped = [r for r in outcomes.records.values() if ENVELOPE_ATTRIBUTE in r["messageAttributes"]]
    assert enveloped and len(json.loads(enveloped[0]["body"])["m"]) == len(delays)


def test_plain_first_receives_that_would_park_are_packed_into_one_envelope_which_parks_next(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    unpacked = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0))
    assert unpacked.send_delayed_batch([DelayedSend("orders", f"b{i}", 40, message_id=f"u{i}") for i in range(3)]).ok
    records = _receive(sqs, endpoint, expect=3)
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings)
    results = requeuer.process(records)
    assert {r.outcome for r in results} == {HopOutcome.REQUEUED}
    assert len({r.envelope_id for r in results}) == 1 and results[0].envelope_id
    _delete(sqs, endpoint, records)
    [envelope] = _receive(sqs, endpoint, timeout=5)
    [result] = requeuer.process([envelope])
    assert result.outcome is HopOutcome.PARKED and len(result.inner) == 3


# -- the in-flight cap and the retention -------------------------------------------------------------------------


def test_the_in_flight_cap_stops_new_parks_but_not_re_parks(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    capped = sqs_settings.with_(park_max_in_flight=2)
    sender.send_delayed("orders", "a", 40, message_id="c1")
    [first] = _receive(sqs, endpoint)
    assert (
        FifoRequeuer(sqs, settings, sqs_settings=capped).process([first])[0].outcome is HopOutcome.PARKED
    )  # 1 in flight: itself
    sender.send_delayed("orders", "b", 40, message_id="c2")
    [second] = _receive(sqs, endpoint)
    # a fresh instance reads the count: 2 in flight (c1 parked, c2 being handled), not below the cap
    [result] = FifoRequeuer(sqs, settings, sqs_settings=capped).process([second])
    assert result.outcome is HopOutcome.REQUEUED
    _delete(sqs, endpoint, [second])
    [copy] = _receive(sqs, endpoint)  # c2's requeued copy: out of the way
    assert _hop(copy) == "c2:1"
    _delete(sqs, endpoint, [copy])
    [back] = _receive(sqs, endpoint, timeout=MAX_PARK + 5)
    assert back["attributes"]["MessageGroupId"] == "c1" and back["attributes"]["ApproximateReceiveCount"] == "2"
    # a park return re-parks whatever the count (it adds nothing in flight)
    [result] = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings.with_(park_max_in_flight=0)).process([back])
    assert result.outcome is HopOutcome.PARKED


def test_the_in_flight_count_is_read_at_most_once_a_minute_per_instance(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    reads = _count_calls(sqs, "GetQueueAttributes")
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings)
    for i in range(3):
        sender.send_delayed("orders", "x", 40, message_id=f"r{i}")
        [record] = _receive(sqs, endpoint)
        assert requeuer.process([record])[0].outcome is HopOutcome.PARKED
    in_flight = [r for r in reads if "ApproximateNumberOfMessagesNotVisible" in r.get("AttributeNames", [])]
    assert len(in_flight) == 1


def test_no_park_reaches_into_the_retention_headroom(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    sqs.set_queue_attributes(QueueUrl=endpoint.delay_url, Attributes={"MessageRetentionPeriod": "60"})
    sender.send_delayed("orders", "old", 40, message_id="t1")
    [record] = _receive(sqs, endpoint)
    # 60 s retention: age + park + hop (1 s) + margin (0.5 s) must stay within what the headroom leaves. The age is
    # the broker's (first receive - sent: about 1 s on moto, 2 s on LocalStack, at least the 1 s queue delay on
    # AWS), so the headroom is chosen from it to leave exactly a 5 s park
    headroom = 60 - _whole_seconds(_age_ms(record) + 6_500)
    [result] = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings, retention_headroom=headroom).process([record])
    assert result.outcome is HopOutcome.PARKED and result.park_s == 5
    sender.send_delayed("orders", "older", 40, message_id="t2")
    [record] = _receive(sqs, endpoint)
    # with 3 s more kept free a park would be 2 s at most: too short, so the message hops (a fresh send restarts
    # the retention clock)
    headroom = 60 - _whole_seconds(_age_ms(record) + 6_500) + 3
    [result] = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings, retention_headroom=headroom).process([record])
    assert result.outcome is HopOutcome.REQUEUED


def _age_ms(record: dict[str, Any]) -> int:
    """The record's broker age: first receive - sent."""
    attributes = record["attributes"]
    return max(0, int(attributes["ApproximateFirstReceiveTimestamp"]) - int(attributes["SentTimestamp"]))


def _whole_seconds(ms: int) -> int:
    return -(-ms // 1000)


# -- the Lambda handler ------------------------------------------------------------------------------------------


def test_the_handler_reports_parked_records_as_failures_logs_and_counts_them_and_never_errors(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    unpacked = SqsDelayedSender(sqs, settings, sqs_settings=sqs_settings.with_(pack_bytes=0))
    unpacked.send_delayed("orders", "parked", 40, message_id="h1")
    [record] = _receive(sqs, endpoint)
    # A fresh service name: Powertools binds its logger to the stdout of the moment (capsys).
    env = {**handler_env(settings, sqs_settings), "POWERTOOLS_SERVICE_NAME": f"parking-{time.time_ns()}"}
    handler = build_handler(env, sqs_client=sqs)
    capsys.readouterr()
    response = handler({"Records": [record]}, LocalLambdaContext())  # the whole batch parked: not an error
    assert response == {"batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
    out = capsys.readouterr().out
    [line] = [json.loads(x) for x in out.splitlines() if '"event":"parked"' in x.replace(" ", "")]
    assert line["message_id"] == "h1" and 4 <= line["park_s"] <= MAX_PARK and line["level"] == "INFO"
    assert '"Parked"' in out


def test_parking_is_on_by_default_in_the_lambda(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    sender.send_delayed("orders", "default", 40, message_id="d1")
    [record] = _receive(sqs, endpoint)
    env = {k: v for k, v in handler_env(settings, sqs_settings).items() if "PARK" not in k}
    results: list[RecordResult] = []
    build_handler(env, sqs_client=sqs, on_results=results.extend)({"Records": [record]}, LocalLambdaContext())
    [result] = results
    # the default max_park_seconds (42,600 s) is cut to this short delay: one hop and the margin before it is due
    assert result.outcome is HopOutcome.PARKED and result.park_s is not None and result.park_s >= 4


# -- cancellation records and parked messages --------------------------------------------------------------------


def _cancellations() -> tuple[InMemoryCancellationStore, CancellationCache]:
    store = InMemoryCancellationStore()
    return store, CancellationCache(store, 0)


def test_a_message_cancelled_while_parked_is_dropped_when_it_returns(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    store, cache = _cancellations()
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings, cancellations=cache)
    sender.send_delayed("orders", "doomed", 40, message_id="x1")
    [record] = _receive(sqs, endpoint)
    assert requeuer.process([record])[0].outcome is HopOutcome.PARKED
    store.put(cancel_request("orders", "x1", now=datetime.now(UTC), max_native_delay=HOP, max_age=0))
    [back] = _receive(sqs, endpoint, timeout=MAX_PARK + 5)
    [result] = requeuer.process([back])
    assert result.outcome is HopOutcome.CANCELLED
    assert store.live("orders") == []  # applied: deleted


def test_a_reschedule_to_an_earlier_time_takes_effect_when_the_message_returns_from_its_park(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    store, cache = _cancellations()
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings, cancellations=cache)
    sender.send_delayed("orders", "sooner", 60, message_id="x2")
    [record] = _receive(sqs, endpoint)
    [parked] = requeuer.process([record])
    parked_at = time.time()
    assert parked.outcome is HopOutcome.PARKED and parked.park_s is not None
    new_due = datetime.now(UTC) + timedelta(seconds=2)  # due long before the park ends
    store.put(reschedule_request("orders", "x2", new_due, now=datetime.now(UTC)))
    [back] = _receive(sqs, endpoint, timeout=MAX_PARK + 5)
    assert time.time() - parked_at >= parked.park_s - EPSILON  # nothing could happen before the return
    [result] = requeuer.process([back])
    # at the return the new plan applies: overdue, so forwarded at once; the record goes
    assert result.outcome is HopOutcome.FORWARDED and result.remaining_delay_s == 0
    assert result.cancellation is not None and store.live("orders") == []
    _delete(sqs, endpoint, [back])
    [arrival] = collect(sqs, endpoint.input_url, expect=1, timeout=5)
    assert arrival.at >= new_due.timestamp() - EPSILON


def test_a_rescheduled_message_is_not_parked_and_its_record_stays_until_a_hop_applies_it(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
) -> None:
    store, cache = _cancellations()
    requeuer = FifoRequeuer(sqs, settings, sqs_settings=sqs_settings, cancellations=cache)
    sender.send_delayed("orders", "later", 40, message_id="x3")
    [parked_record] = _receive(sqs, endpoint)
    assert requeuer.process([parked_record])[0].outcome is HopOutcome.PARKED
    later = datetime.now(UTC) + timedelta(seconds=50)
    store.put(reschedule_request("orders", "x3", later, now=datetime.now(UTC)))
    assert len(store.live("orders")) == 1  # parked: nothing applied the record yet
    [back] = _receive(sqs, endpoint, timeout=MAX_PARK + 5)
    [result] = requeuer.process([back])
    # a message with a record is never parked (the record would have to outlive the park): the requeue carries
    # the new plan, so the record can go
    assert result.outcome is HopOutcome.REQUEUED and result.cancellation is not None
    assert store.live("orders") == []
    remaining = result.remaining_delay_s
    assert remaining is not None and abs(time.time() + remaining - later.timestamp()) <= 1.5


def _hop(record: dict[str, Any]) -> str:
    """``<group id>:<hop>`` of a record (its deduplication id also carries the content fingerprint)."""
    attrs = record["attributes"]
    return f"{attrs['MessageGroupId']}:{hop_of(attrs['MessageDeduplicationId'])}"
