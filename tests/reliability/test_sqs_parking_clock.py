"""Clock faults with visibility parking: a requeue handler whose clock is 5 minutes off parks and delivers on time.

A parked record comes back with the broker timestamps of the receive before its park, so the elapsed time of a
park return cannot come from the record. ``aws/requeue.py`` takes it from the broker's own clock (``BrokerClock``:
SQS's ``Date`` headers and this batch's first-receive stamps), so the handler's clock offset cancels out: never
early, fast or slow, unlike the plain-redelivery rule (early by up to the handler's lead; test_clock_skew.py).
Without any broker reading the handler falls back to its own clock, with that same documented bound.

Compression: hop and native cap 1 s, visibility 1 s, parks of 4-6 s; delays of 14-20 s park two or three times.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from delayed_delivery.aws.brokerclock import BrokerClock
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.requeue import FifoRequeuer, HopOutcome
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller
from tests.fixtures.moto import collect_arrivals
from tests.reliability.sqslab import sqs_client
from tests.reliability.test_clock_skew import MINUTES_5, SkewedClock

pytestmark = pytest.mark.moto

EPSILON = 0.25


class NoBrokerReadings(BrokerClock):
    """A broker clock that never has a reading: the handler falls back to its own clock."""

    def now_ms(self, local_ms: int | None = None) -> int | None:
        """Never calibrated."""
        return None


def _parked_run(endpoint_url: str, skew: float, *, broker: bool, messages: int = 8) -> tuple[list[float], int]:
    """Send ``messages`` delays of 14-20 s through a parking handler whose clock is ``skew`` s off.

    Returns arrival − (send + delay) per message on the real clock, and how many park returns were handled.
    """
    client = sqs_client(endpoint_url)
    queue = f"pk{uuid.uuid4().hex[:10]}"
    settings = DelayedDeliverySettings(error_queue=f"{queue}-errors")
    sqs_settings = SqsSettings(
        max_native_delay=1, fifo_queue_delay=1, max_park_seconds=6, pack_bytes=0, long_delay_route="fifo"
    )
    endpoint = ensure_endpoint(client, queue, settings, sqs_settings=sqs_settings, visibility_timeout=1)
    clock = SkewedClock(skew)
    broker_clock = None if broker else NoBrokerReadings(clock)
    requeuer = FifoRequeuer(client, settings, sqs_settings=sqs_settings, clock=clock, broker_clock=broker_clock)
    returns: list[int] = []
    lock = threading.Lock()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event["Records"]
        results = requeuer.process(records)
        counts = {r["messageId"]: int(r["attributes"]["ApproximateReceiveCount"]) for r in records}
        with lock:
            returns.extend(1 for r in results if r.outcome is HopOutcome.PARKED and counts[r.record_id] > 1)
        failed = [r.record_id for r in results if r.outcome in (HopOutcome.PARKED, HopOutcome.FAILED)]
        return {"batchItemFailures": [{"itemIdentifier": i} for i in failed]}

    poller = LocalEventSourcePoller(client, endpoint.delay_url, endpoint.delay_arn, handler, wait_seconds=0).start()
    delays = {f"pk-{i:02d}": 14 + (6 * i) // messages for i in range(messages)}
    sent_at = time.time()
    sender = SqsDelayedSender(client, settings, sqs_settings=sqs_settings)
    assert sender.send_delayed_batch([DelayedSend(queue, m, d, message_id=m) for m, d in delays.items()]).ok
    try:
        arrived = collect_arrivals(client, endpoint.input_url, delays, timeout=60)
    finally:
        poller.stop()
    assert set(arrived) == set(delays), f"missing {sorted(set(delays) - set(arrived))}"
    assert poller.stats.handler_errors == 0
    return [arrived[m] - (sent_at + d) for m, d in delays.items()], len(returns)


@pytest.mark.parametrize("skew", [MINUTES_5, -MINUTES_5], ids=["fast", "slow"])
def test_a_parking_handler_clock_minutes_off_is_never_early_nor_stuck(moto_endpoint: str, skew: float) -> None:
    margins, re_parks = _parked_run(moto_endpoint, skew, broker=True)
    assert re_parks >= 8, "messages did not come back from parks and park again"
    assert min(margins) >= -EPSILON, f"early by {-min(margins):.2f} s"
    # a 5-minute-slow clock would otherwise see no park pass (and cycle); fast, it would deliver at once
    assert max(margins) < 4.5, margins


def test_without_broker_readings_a_fast_handler_clock_is_early_by_at_most_its_lead(moto_endpoint: str) -> None:
    lead = 1.5
    margins, _ = _parked_run(moto_endpoint, lead, broker=False)
    # the documented bound of the local-clock fallback, the same as for plain redeliveries
    assert min(margins) >= -lead - 0.5, f"early by {-min(margins):.2f} s, beyond the handler clock's lead"


def test_without_broker_readings_a_slow_handler_clock_is_late_never_early(moto_endpoint: str) -> None:
    lag = 1.5
    margins, _ = _parked_run(moto_endpoint, -lag, broker=False)
    assert min(margins) >= -EPSILON, f"early by {-min(margins):.2f} s"
    assert max(margins) < lag + 5.0, margins
