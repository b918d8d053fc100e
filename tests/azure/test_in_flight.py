"""An operator's cancel or reschedule while the real ``AzureDispatcherHost`` holds the message (Azurite).

The send is parked deterministically: the host's transport blocks on the message until the test lets it go, or,
with release control, the host's clock blocks while the message waits in the dispatcher for its due time (fetched
up to a second ahead). Meanwhile another "host" (a store of its own, and the real CLI) cancels and reschedules it:
both must be refused as in flight (``MessageInFlightError``, exit 1 "being delivered right now; try again"), the
message must then arrive exactly once, at its old time, and nothing may be left in the table. Before the lease
holder marked its rows in the table both answered "done" (docs/identity.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.runner import AzureDispatcherHost, RunSummary
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.clock import SystemClock
from delayed_delivery.errors import MessageInFlightError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.naming import azure_delays_table_name
from delayed_delivery.settings import DelayedDeliverySettings
from tests.app.cli.conftest import run
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

#: How long the test waits for the host to reach the parked point (a loaded machine starts slowly).
REACH = 60.0


class Parking:
    """The host's transport; sends of ``message_id`` wait until ``go`` is set (``parked`` says one is waiting)."""

    def __init__(self, inner: Any, message_id: str) -> None:
        self.inner, self.message_id = inner, message_id
        self.parked, self.go = threading.Event(), threading.Event()

    @property
    def max_delay_seconds(self) -> int:
        return int(self.inner.max_delay_seconds)

    def _park(self, message: DelayedMessage) -> None:
        if message.message_id == self.message_id:
            self.parked.set()
            assert self.go.wait(REACH), "the test never let the send go"

    def send(self, message: DelayedMessage) -> None:
        self._park(message)
        self.inner.send(message)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self._park(message)
        self.inner.send_delayed(message, delay_seconds)


class HostClock(SystemClock):
    """The wall clock for the host, that can end its run at once (``finish``) and can hold its first wait."""

    def __init__(self) -> None:
        self.shift = 0.0
        self.parked, self.go = threading.Event(), threading.Event()
        self.hold = False
        #: Waits before this instant are not held: the host's idle polls before it can fetch the held message.
        self.park_from: datetime | None = None

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.shift)

    def monotonic(self) -> float:
        return time.monotonic() + self.shift

    def wait(self, event: threading.Event, timeout: float) -> bool:
        ready = self.park_from is None or super().now() >= self.park_from
        if self.hold and ready and not self.go.is_set():  # the dispatcher waits for a held message's due time: park
            self.parked.set()
            assert self.go.wait(REACH), "the test never let the dispatcher go on"
        return super().wait(event, min(timeout, 0.2))

    def finish(self) -> None:
        self.shift += 3600.0


@pytest.fixture
def endpoint(azurite: Azurite, queues: QueueServiceClient) -> Iterator[str]:
    name = new_name("ep")
    yield name
    queues.delete_queue(f"{name}e")


def _host(azurite: Azurite, endpoint: str, clock: HostClock, rates: dict[str, float] | None) -> AzureDispatcherHost:
    table = azure_delays_table_name(endpoint)
    settings = DelayedDeliverySettings(
        max_concurrency=4,
        error_queue=f"{endpoint}e",
        release_rates=rates or {},  # type: ignore[arg-type]
    )
    return make_host(
        azurite.connection_string, table, run=600.0, settings=settings, clock=clock, monotonic=clock.monotonic
    )


def _refused_everywhere(
    azurite: Azurite, endpoint: str, action: str, store: TableDelayedMessageStore, message_id: str
) -> None:
    """The API (another host's store) and the CLI are both told the message is in flight; nothing changes."""
    with pytest.raises(MessageInFlightError, match=message_id):
        if action == "cancel":
            store.remove(message_id)
        else:
            store.reschedule(message_id, datetime.now(UTC) + timedelta(hours=1))
    where = ["--cloud", "azure", "--connection-string", azurite.connection_string, "--endpoint", endpoint]
    extra = ["--delay", "1h"] if action == "reschedule" else []
    result = run(action, message_id, *where, *extra, "--json")
    assert result.exit_code == 1, result.output
    assert "being delivered right now; try again" in result.stderr, result.stderr
    assert store.get(message_id) is not None, "still there, unchanged"


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + REACH
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("action", ["cancel", "reschedule"])
@pytest.mark.parametrize("mode", ["send", "paced send", "held for its due time"])
def test_an_operator_is_told_the_message_is_in_flight_and_it_arrives_once(
    azurite: Azurite, queues: QueueServiceClient, queue: str, endpoint: str, action: str, mode: str
) -> None:
    clock = HostClock()
    host = _host(azurite, endpoint, clock, {queue: 5.0} if mode != "send" else None)
    parking = Parking(host.transport, "m-1")
    host.transport = parking  # type: ignore[assignment]
    now = datetime.now(UTC)
    # due 3 s ahead, parked from 0.5 s before it: the host fetches it up to 1 s ahead (the pacer's look-ahead) and
    # holds it; at 0.5 s ahead a host slow to start under load fetched it already due and sent it without holding
    due = now + timedelta(seconds=3) if mode == "held for its due time" else now - timedelta(seconds=1)
    clock.park_from = due - timedelta(seconds=0.5)
    host.store.store(DelayedMessage("m-1", queue, b"hello", due))
    gate = clock if mode == "held for its due time" else parking
    clock.hold = gate is clock
    summary: list[RunSummary] = []
    runner = threading.Thread(target=lambda: summary.append(host.run()), daemon=True)
    runner.start()
    try:
        assert gate.parked.wait(REACH), "the host never reached the parked point"
        operator = TableDelayedMessageStore.from_connection_string(azurite.connection_string, host.config.table_name)
        _refused_everywhere(azurite, endpoint, action, operator, "m-1")
    except BaseException:
        clock.finish()  # end the host's run too
        raise
    finally:
        clock.go.set()
        parking.go.set()
    _until(lambda: operator.get("m-1") is None, "the dispatcher to remove the row it sent")
    clock.finish()
    runner.join(REACH)
    assert not runner.is_alive() and summary[0].dispatched == 1
    arrived = drain(queues, queue)
    assert [(e.message_id, e.body) for e in arrived] == [("m-1", b"hello")], "delivered once, at its old time"
    assert host.store.count() == 0, "the settle step removed exactly the row it sent"
    assert operator.remove("m-1") is False, "and afterwards there is nothing to cancel: the truth"
