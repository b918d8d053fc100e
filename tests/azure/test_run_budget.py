"""A timer run ends within its budget, including its last batch (Azurite, a slow transport on a virtual clock).

The host's clock and monotonic time are virtual: each send moves them on by ``SEND_SECONDS`` (a slow destination),
and idle waits move them too, so the figures do not depend on the machine's load. A run must stop sending when its
budget ends (what it fetched and did not send is given back at once, sent by the next run: nothing lost, nothing
twice), and must fetch no more than the time left covers (at the time per message measured).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery import logfields as lf
from delayed_delivery.azure.config import AzureClients, AzureDelayedDeliveryConfig
from delayed_delivery.azure.run_budget import RunBudget, SendBound
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import BudgetedRetry
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.clock import SystemClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

#: Virtual seconds one send takes.
SEND_SECONDS = 1.0
#: How far past its budget a run may end (virtual seconds): one send under way, and the run's own bookkeeping.
BOUND = 2.0


class VirtualClock(SystemClock):
    """Wall time plus a virtual offset that sends and waits move on (the host's clock and monotonic time)."""

    def __init__(self) -> None:
        self.shift = 0.0
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.shift += seconds

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.shift)

    def monotonic(self) -> float:
        return time.monotonic() + self.shift

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        self.advance(max(0.0, timeout))
        return event.is_set()


class SlowTransport:
    """The host's transport; every send takes ``SEND_SECONDS`` of virtual time (``later`` from the second on)."""

    def __init__(self, inner: Any, clock: VirtualClock) -> None:
        self.inner, self.clock = inner, clock
        self.sends = 0
        self.later = SEND_SECONDS

    def _take_time(self) -> None:
        self.clock.advance(SEND_SECONDS if self.sends == 0 else self.later)
        self.sends += 1

    @property
    def max_delay_seconds(self) -> int:
        return int(self.inner.max_delay_seconds)

    def send(self, message: DelayedMessage) -> None:
        self._take_time()
        self.inner.send(message)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self._take_time()
        self.inner.send_delayed(message, delay_seconds)


def _host(azurite: Azurite, queue: str, batch: int) -> tuple[AzureDispatcherHost, VirtualClock, SlowTransport]:
    clock = VirtualClock()
    settings = DelayedDeliverySettings(max_concurrency=1, batch_size=batch, error_queue=f"{queue}e")
    host = make_host(
        azurite.connection_string, new_name(), run=20.0, settings=settings, clock=clock, monotonic=clock.monotonic
    )
    slow = SlowTransport(host.transport, clock)
    host.transport = slow  # type: ignore[assignment]
    return host, clock, slow


def _timed_run(host: AzureDispatcherHost, clock: VirtualClock) -> tuple[float, int]:
    start = clock.monotonic()
    summary = host.run()
    return clock.monotonic() - start, summary.dispatched


def test_the_last_batch_stops_at_the_budget_and_what_it_did_not_send_goes_next_run(
    azurite: Azurite, queues: QueueServiceClient, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    host, clock, slow = _host(azurite, queue, batch=100)
    host.store.store_many([DelayedMessage(f"m-{i}", queue, b"x", datetime.now(UTC)) for i in range(60)])
    slow.later = 3.0  # the destination slows down after the first send: a batch fetched at 1 s each takes 3 s each

    with caplog.at_level(logging.INFO, logger="delayed_delivery.azure.runner"):
        took, sent = _timed_run(host, clock)
    assert took <= 20.0 + BOUND, f"a run of budget 20 s lasted {took:.1f} s"
    assert 5 <= sent <= 7, sent  # a batch of 60 cut short at 18 s (the tail before 20): 1 s, then 3 s a send
    (run,) = [r for r in caplog.records if getattr(r, lf.EVENT, None) == lf.EVENT_TIMER_RUN]
    assert 0 <= getattr(run, lf.OVERRUN_S) <= BOUND, "the run-overrun alert's figure"

    seen: list[str] = []
    while len(seen) < 60:  # the next runs send the rest: every message once
        before = len(seen)
        _timed_run(host, clock)
        seen += [e.message_id for e in drain(queues, queue)]
        assert len(seen) > before, "a run sent nothing"
    assert sorted(seen) == sorted(f"m-{i}" for i in range(60)), "nothing lost, nothing twice"
    assert host.store.count() == 0


def test_a_run_fetches_no_more_than_its_remaining_budget_covers(
    azurite: Azurite, queues: QueueServiceClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, clock, slow = _host(azurite, queue, batch=6)
    due = datetime.now(UTC)  # in id order, a millisecond apart
    host.store.store_many([DelayedMessage(f"m-{i}", queue, b"x", due + timedelta(milliseconds=i)) for i in range(40)])
    fetched: list[int] = []
    fetch = TableDelayedMessageStore.fetch_due

    def counted(store: TableDelayedMessageStore, at: datetime, limit: int) -> Any:
        got = fetch(store, at, limit)
        fetched.append(len(got))
        return got

    monkeypatch.setattr(TableDelayedMessageStore, "fetch_due", counted)
    # batches of 6 take 6 s each (a little more: the wall clock moves too); the run dispatches until 18 s (a tail of a
    # tenth before its budget of 20): two batches of 6, then the 5 that the time left covers
    took, sent = _timed_run(host, clock)
    assert took <= 20.0 + BOUND, f"a run of budget 20 s lasted {took:.1f} s"
    taken = [n for n in fetched if n]
    assert taken[:2] == [6, 6] and 0 < taken[-1] < 6, f"the last fetch takes what the time left covers: {fetched}"
    assert sum(fetched) == sent == slow.sends, f"nothing fetched and then cut short: {fetched}, {sent}"
    assert sorted(e.message_id for e in drain(queues, queue)) == sorted(f"m-{i}" for i in range(sent))
    assert host.store.count() == 40 - sent


def test_the_queue_clients_retry_back_off_is_capped_by_the_time_left_in_the_run() -> None:
    now = [100.0]
    budget = RunBudget()
    policy = BudgetedRetry(budget)
    assert policy.get_backoff_time({"count": 0}) >= 12.0, "outside a run: the SDK's 15 s (± 3 s jitter)"

    budget.start(104.0, lambda: now[0])
    assert policy.get_backoff_time({"count": 0}) <= 4.0, "4 s left: a back-off of at most 4 s"
    assert policy.get_backoff_time({"count": 2}) <= 4.0
    now[0] = 104.5
    assert policy.get_backoff_time({"count": 0}) == 0.0
    assert policy.increment({"total": 3}, request=None) is False, "the run is over: no retry"

    budget.end()
    assert policy.get_backoff_time({"count": 0}) >= 12.0


def test_a_hosts_queue_client_retries_with_the_budgeted_policy(azurite: Azurite) -> None:
    name = new_name()
    config = AzureDelayedDeliveryConfig(
        table_name=name, container_name=name, connection_string=azurite.connection_string
    )
    clients = AzureClients.create(config)
    policies = [p for p in clients.queues._pipeline._impl_policies if isinstance(p, BudgetedRetry)]
    assert [p.budget for p in policies] == [clients.budget]


def test_a_retry_starts_only_while_a_whole_attempt_still_fits_in_its_send() -> None:
    budget = RunBudget()
    policy = BudgetedRetry(budget)
    settings = {"total": 3, "count": 0, "connect": 3, "read": 3, "status": 3, "history": [], "mode": None}
    with budget.send_within(60.0, attempt=8.0):  # 52 s of room: the SDK's back-off (15 s ± 3) as it is
        room = budget.retry_room()
        assert room is not None and 50.0 < room <= 52.0
        assert policy.get_backoff_time({"count": 0}) >= 12.0
    with budget.send_within(10.0, attempt=8.0):  # 2 s of room: a back-off of at most that, then one attempt
        assert policy.get_backoff_time({"count": 0}) <= 2.0
    with budget.send_within(5.0, attempt=8.0):  # not even one more attempt fits
        assert policy.increment(dict(settings), request=None) is False, "no retry that could outlast its send"
    assert budget.retry_room() is None, "outside a send"


def test_a_hosts_queue_requests_have_the_configured_timeouts_and_its_puts_the_send_bound(azurite: Azurite) -> None:
    name = new_name()
    config = AzureDelayedDeliveryConfig(
        table_name=name,
        container_name=name,
        connection_string=azurite.connection_string,
        queue_connect_timeout=1.5,
        queue_read_timeout=4.0,
        send_timeout=7.0,
    )
    host = AzureDispatcherHost(config, heartbeat=False)
    connection = host.clients.queues._pipeline._transport.connection_config
    assert (connection.timeout, connection.read_timeout) == (1.5, 4.0), "not the SDK's 300 s each"
    assert host.transport.send_timeout == 7.0 and host.transport.bound == config.send_bound


def test_the_send_bound_must_fit_an_attempt_and_leave_the_claim_room() -> None:
    def config(**kw: float) -> AzureDelayedDeliveryConfig:
        return AzureDelayedDeliveryConfig(table_name="tsb", container_name="tsb", connection_string="x", **kw)

    assert config().send_bound.attempt == 8.0 and config().send_timeout == 10.0
    with pytest.raises(ConfigurationError, match=r"DELAYED_DELIVERY_SEND_TIMEOUT .* must be at least"):
        config(queue_connect_timeout=3.0, queue_read_timeout=8.0, send_timeout=10.0)
    with pytest.raises(ConfigurationError, match=r"DELAYED_DELIVERY_CLAIM_TIMEOUT .* must exceed"):
        config(claim_timeout=12.0)
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_QUEUE_READ_TIMEOUT"):
        config(queue_read_timeout=float("nan"))
    env = {
        "DELAYED_DELIVERY_TABLE_NAME": "tsb",
        "DELAYED_DELIVERY_CONTAINER_NAME": "tsb",
        "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING": "x",
        "DELAYED_DELIVERY_QUEUE_CONNECT_TIMEOUT": "1",
        "DELAYED_DELIVERY_QUEUE_READ_TIMEOUT": "2",
        "DELAYED_DELIVERY_SEND_TIMEOUT": "4",
    }
    assert AzureDelayedDeliveryConfig.from_env(env).send_bound == SendBound(4.0, 1.0, 2.0)
