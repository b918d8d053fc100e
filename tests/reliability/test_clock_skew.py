"""Clock faults: senders and dispatchers whose clocks are minutes off, against the emulators.

Which clock decides "due" (and so whether a skewed host can deliver early):

* **SQS**: the broker's. The requeue handler takes elapsed time from ``SentTimestamp`` and
  ``ApproximateFirstReceiveTimestamp``; its own clock is used only for a record the event source redelivered
  (receive count > 1, the seed's rule). Bound: a handler clock ``S`` seconds fast forwards a *redelivered*
  record up to ``S`` seconds early (never more than its remaining delay); first receives are exact.
* **PostgreSQL**: the database's, for ``store_after`` (due = ``now() + delay``) and, with
  ``never_before_database_time=True``, for ``fetch_due`` (``least(at, now())``). Without that option a
  dispatcher clock ``S`` seconds fast delivers up to ``S`` seconds early.
* **Azure**: the hosts'. The sender fixes ``due = its now + delay``; the timer function compares rows with
  *its* clock. Bound: early by the dispatcher's lead plus the sender's lag (see the README).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from delayed_delivery import DelayedDeliverySettings, DelayedMessage, Dispatcher, SystemClock
from tests.fixtures.moto import collect_arrivals

MINUTES_5 = 300.0


class SkewedClock:
    """The real clock, ``offset`` seconds off: a host whose clock is wrong (the clock port)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self._real = SystemClock()

    def now(self) -> datetime:
        """Real time plus the offset."""
        return self._real.now() + timedelta(seconds=self.offset)

    def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        self._real.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait for real."""
        return self._real.wait(event, timeout)


class Arrivals:
    """Real time of every send a dispatcher makes (the destination side)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}
        self.due: dict[str, float] = {}

    def send(self, message: DelayedMessage) -> None:
        with self.lock:
            self.at.setdefault(message.message_id, time.time())
            self.due[message.message_id] = message.due_at.timestamp()

    def margins(self) -> list[float]:
        """Delivery time minus due time, per message (negative = early)."""
        with self.lock:
            return [self.at[m] - self.due[m] for m in self.at]


# -- SQS: the requeue handler on moto ---------------------------------------------------------------------------


def _requeue_run(endpoint_url: str, skew: float, *, fail_first: bool, messages: int = 10) -> list[float]:
    """Send ``messages`` 4 s delays (1 s hops) through a requeue handler whose clock is ``skew`` s off.

    With ``fail_first`` the handler reports every record's first receive as failed (a transient error), so
    each record is processed on its redelivery (receive count 2), where the local clock counts.
    Returns arrival − (send + delay) per message, measured on the real clock.
    """
    from delayed_delivery.aws.queues import ensure_endpoint
    from delayed_delivery.aws.requeue import FifoRequeuer, HopOutcome
    from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
    from delayed_delivery.testing.aws import LocalEventSourcePoller
    from tests.reliability.sqslab import DELAY, LAB_SQS, lab_settings, sqs_client

    client = sqs_client(endpoint_url)
    queue = f"sk{uuid.uuid4().hex[:10]}"
    settings = lab_settings(queue)
    endpoint = ensure_endpoint(client, queue, settings, sqs_settings=LAB_SQS, visibility_timeout=1)
    unpacked = LAB_SQS.with_(pack_bytes=0)
    requeuer = FifoRequeuer(client, settings, sqs_settings=unpacked, clock=SkewedClock(skew))

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event["Records"]
        first = [r for r in records if fail_first and r["attributes"].get("ApproximateReceiveCount") == "1"]
        results = requeuer.process([r for r in records if r not in first])
        failed = [r["messageId"] for r in first] + [r.record_id for r in results if r.outcome is HopOutcome.FAILED]
        return {"batchItemFailures": [{"itemIdentifier": i} for i in failed]}

    poller = LocalEventSourcePoller(client, endpoint.delay_url, endpoint.delay_arn, handler, wait_seconds=0).start()
    ids = [f"sk-{i:03d}" for i in range(messages)]
    sent_at = time.time()
    result = SqsDelayedSender(client, settings, sqs_settings=LAB_SQS).send_delayed_batch(
        [DelayedSend(queue, mid, DELAY, message_id=mid) for mid in ids]
    )
    assert result.ok, result.failures
    try:
        arrived = collect_arrivals(client, endpoint.input_url, ids, timeout=40)
    finally:
        poller.stop()
    assert set(arrived) == set(ids), f"missing {sorted(set(ids) - set(arrived))}"
    return [arrived[m] - (sent_at + DELAY) for m in ids]


@pytest.mark.moto
@pytest.mark.parametrize("skew", [MINUTES_5, -MINUTES_5], ids=["fast", "slow"])
def test_requeue_handler_clock_minutes_off_changes_nothing_on_first_receives(moto_endpoint: str, skew: float) -> None:
    margins = _requeue_run(moto_endpoint, skew, fail_first=False)
    assert min(margins) >= 0, f"early by {-min(margins):.2f} s"
    # broker timestamps decide: a clock 5 minutes off adds no lateness (hops are 1 s, moto polls at ~0.1 s)
    assert max(margins) < 4.0, margins


@pytest.mark.moto
def test_redelivered_records_follow_the_handler_clock_early_by_at_most_its_lead(moto_endpoint: str) -> None:
    lead = 1.5
    margins = _requeue_run(moto_endpoint, lead, fail_first=True)
    # the documented bound: a redelivered record is forwarded at most `lead` seconds early
    assert min(margins) >= -lead - 0.5, f"early by {-min(margins):.2f} s, beyond the handler clock's lead"


@pytest.mark.moto
def test_redelivered_records_under_a_slow_handler_clock_are_late_never_early(moto_endpoint: str) -> None:
    lag = 2.0
    margins = _requeue_run(moto_endpoint, -lag, fail_first=True)
    assert min(margins) >= 0, f"early by {-min(margins):.2f} s"
    assert max(margins) < lag + 5.0, margins


# -- PostgreSQL: database clock -----------------------------------------------------------------------------------


class CountingStore:
    """Counts ``fetch_due`` calls of the wrapped store (to see a dispatcher spin)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.fetches = 0

    def fetch_due(self, at: datetime, limit: int) -> Any:
        self.fetches += 1
        return self.inner.fetch_due(at, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def pg_store(postgres_conninfo: str, postgres_table: str) -> Iterator[Any]:
    from delayed_delivery.postgres import PostgresDelayedMessageStore

    store = PostgresDelayedMessageStore(
        postgres_conninfo, table=postgres_table, never_before_database_time=True, claim_timeout=5.0
    )
    store.setup_infrastructure()
    try:
        yield store
    finally:
        store.drop_infrastructure()
        store.close()


def _dispatch_until_empty(store: Any, clock: SkewedClock, timeout: float = 20.0) -> Arrivals:
    arrivals = Arrivals()
    dispatcher = Dispatcher(store, arrivals, DelayedDeliverySettings(max_idle_sleep=0.2), clock=clock)
    deadline = time.monotonic() + timeout
    while len(store.inner if isinstance(store, CountingStore) else store) and time.monotonic() < deadline:
        dispatcher.dispatch_due(budget=0.5, wait_for_due=True)
    dispatcher.close()
    return arrivals


@pytest.mark.postgres
def test_postgres_fast_dispatcher_never_delivers_before_the_database_clock(pg_store: Any) -> None:
    # the sender's clock is irrelevant: store_after fixes the due time on the database clock
    for i in range(10):
        pg_store.store_after(0.5 + i * 0.25, "orders", b"x", message_id=f"pg-{i}")
    counting = CountingStore(pg_store)
    started = time.monotonic()
    arrivals = _dispatch_until_empty(counting, SkewedClock(MINUTES_5))
    elapsed = time.monotonic() - started
    margins = arrivals.margins()
    assert len(margins) == 10
    assert min(margins) >= 0, f"early by {-min(margins):.3f} s"
    assert max(margins) < 1.5, margins
    # a dispatcher 5 minutes fast believes everything is overdue; it must not spin on the database meanwhile
    assert counting.fetches / elapsed < 50, f"{counting.fetches} fetches in {elapsed:.1f} s"


@pytest.mark.postgres
def test_postgres_without_the_database_clock_cap_a_fast_dispatcher_is_early_by_its_lead(
    postgres_conninfo: str, postgres_table: str
) -> None:
    from delayed_delivery.postgres import PostgresDelayedMessageStore

    store = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table, claim_timeout=5.0)
    store.setup_infrastructure()
    try:
        for i in range(5):
            store.store_after(2.0 + i * 0.25, "orders", b"x", message_id=f"pg-{i}")
        lead = 1.0
        margins = _dispatch_until_empty(store, SkewedClock(lead)).margins()
    finally:
        store.drop_infrastructure()
        store.close()
    assert len(margins) == 5
    # the documented bound (and why never_before_database_time exists): early by at most the lead
    assert -lead - 0.3 <= min(margins) < 0, margins


# -- Azure: the hosts' clocks -------------------------------------------------------------------------------------


@pytest.mark.azurite
@pytest.mark.parametrize(("sender_skew", "dispatcher_skew"), [(0.0, 1.5), (-1.5, 0.0), (0.0, -1.5)])
def test_azure_early_delivery_is_bounded_by_the_dispatcher_lead_plus_the_sender_lag(
    azurite_conn: str, unique_name: str, sender_skew: float, dispatcher_skew: float
) -> None:
    from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
    from delayed_delivery.azure.runner import AzureDispatcherHost
    from delayed_delivery.azure.sender import AzureDelayedSender

    config = AzureDelayedDeliveryConfig(
        table_name=unique_name,
        container_name=unique_name,
        connection_string=azurite_conn,
        lease_seconds=15,
        claim_timeout=10.0,
        queue_connect_timeout=1.0,  # a put ends within 4 s: the claim must outlast it (by 2 s)
        queue_read_timeout=2.0,
        send_timeout=4.0,
        settings=DelayedDeliverySettings(error_queue=f"{unique_name}e"),
    )
    host = AzureDispatcherHost(config, clock=SkewedClock(dispatcher_skew))
    host.setup_infrastructure()
    arrivals = Arrivals()
    host.transport = arrivals  # type: ignore[assignment]  # the destination: records real send times
    sender = AzureDelayedSender.from_config(config)
    sender.clock = SkewedClock(sender_skew)
    delay = 3.0
    sent_at = time.time()
    for i in range(6):
        sender.send(f"{unique_name}d", b"x", delay=delay + i * 0.25, message_id=f"az-{i}", cancellable=True)
    host.run(budget=delay + 1.5 + 2 + max(0.0, -dispatcher_skew - sender_skew))
    true_due = {f"az-{i}": sent_at + delay + i * 0.25 for i in range(6)}
    assert set(arrivals.at) == set(true_due)
    early = max(true_due[m] - arrivals.at[m] for m in true_due)
    bound = max(0.0, dispatcher_skew) + max(0.0, -sender_skew)
    assert early <= bound + 0.3, f"early by {early:.2f} s, bound {bound} s"
    if bound == 0:
        assert early <= 0.05, f"early by {early:.2f} s with no fast dispatcher and no slow sender"
