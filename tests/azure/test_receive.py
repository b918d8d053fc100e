"""Send through each Azure route and read what arrives with the receive helper (#16): id, body, due, hops, route."""

from __future__ import annotations

import base64
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import azure.functions as func
import azure.functions.queue as func_queue
import pytest
from azure.storage.queue import QueueServiceClient
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.receive import ConsumerMetrics, delivered_from_queue_message, observe_lateness
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.sender import AzureDelayedSender
from delayed_delivery.azure.storage_queue import StorageQueueTransport, encode_envelope
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.delivery import DELIVERY_HEADER, DeliveredMessage
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore
from tests.azure.conftest import new_name
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


@pytest.fixture
def store(table_store: TableDelayedMessageStore) -> TableDelayedMessageStore:
    """The empty table store of this module's tests."""
    return table_store


def _receive(queues: QueueServiceClient, name: str, *, expect: int, timeout: float) -> list[DeliveredMessage]:
    """Receive (and delete) until ``expect`` messages arrived, each read by the helper."""
    client = queues.get_queue_client(name)
    got: list[DeliveredMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        for m in client.receive_messages(max_messages=32):
            got.append(delivered_from_queue_message(m, destination=name))
            client.delete_message(m)
        time.sleep(0.1)
    return got


def _check(d: DeliveredMessage, *, message_id: str, body: bytes, due: datetime, route: str, hops: int) -> None:
    assert (d.message_id, d.body, d.route, d.hops) == (message_id, body, route, hops)
    assert d.due_at is not None and abs((d.due_at - due).total_seconds()) <= 1.0, (d.due_at, due)
    assert d.lateness_s is not None and d.lateness_s >= 0, d.lateness_s
    assert DELIVERY_HEADER not in d.headers
    assert d.broker_sent_at is not None and d.cloud == "azure"


def test_native_route_reads_back(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    transport = StorageQueueTransport.from_connection_string(azurite.connection_string)
    sender = AzureDelayedSender(transport, store, DelayedDeliverySettings())
    start = datetime.now(UTC)
    result = sender.send(queue, b"native", delay=1, headers={"k": "v"}, message_id="az-n")
    assert result.route == "native"
    [d] = _receive(queues, queue, expect=1, timeout=8)
    _check(d, message_id="az-n", body=b"native", due=start + timedelta(seconds=1), route="native", hops=0)
    assert d.headers == {"k": "v"}
    assert d.delay_s == pytest.approx(1.0, abs=0.5)


def test_table_route_reads_back(azurite: Azurite, queues: QueueServiceClient, queue: str) -> None:
    table = new_name()
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=azurite.connection_string,
        lease_seconds=15,
        run_seconds=2.0,
        claim_timeout=30.0,
        shards=1,
        settings=DelayedDeliverySettings(error_queue=new_name("e")),
    )
    host = AzureDispatcherHost(config)
    host.setup_infrastructure()
    due = datetime.now(UTC) + timedelta(seconds=0.5)
    host.store.store(DelayedMessage("az-t", queue, b"table", due, {"h": "1"}))
    assert host.run().dispatched == 1
    [d] = _receive(queues, queue, expect=1, timeout=5)
    _check(d, message_id="az-t", body=b"table", due=due, route="table", hops=0)
    assert d.headers == {"h": "1"}


def test_store_route_to_azure_reads_back(
    azurite: Azurite, queues: QueueServiceClient, queue: str, tmp_path: Path
) -> None:
    sqlite = SqliteDelayedMessageStore(tmp_path / "store.db")
    sqlite.setup_infrastructure()
    message = DelayedMessage.create(queue, b"stored", delay=0.3, message_id="az-s")
    sqlite.store(message)
    time.sleep(0.4)
    assert Dispatcher(sqlite, StorageQueueTransport(queues)).dispatch_due(budget=5).dispatched == 1
    [d] = _receive(queues, queue, expect=1, timeout=5)
    _check(d, message_id="az-s", body=b"stored", due=message.due_at, route="store", hops=0)
    assert d.sent_at is None


def test_functions_binding_reads_our_envelope_plain_or_base64() -> None:
    due = datetime(2030, 1, 1, tzinfo=UTC)
    message = DelayedMessage(
        "fn-1", "q", b"payload", due, {DELIVERY_HEADER: "v1;id=fn-1;due=1893456000000;hops=2;route=table"}
    )
    text = encode_envelope(message).encode()
    inserted = datetime(2029, 12, 31, tzinfo=UTC)
    for body in (text, base64.b64encode(text)):
        # What the Functions worker passes a queue trigger (with the broker's insertion time), and the plain type.
        for binding in (
            func_queue.QueueMessage(id="queue-id", body=body, insertion_time=inserted),
            func.QueueMessage(id="queue-id", body=body),
        ):
            d = delivered_from_queue_message(binding)
            assert (d.message_id, d.body, d.due_at, d.hops, d.route) == ("fn-1", b"payload", due, 2, "table")
            assert d.headers == {}
            assert d.broker_sent_at == (inserted if isinstance(binding, func_queue.QueueMessage) else None)


def test_a_foreign_message_is_returned_as_it_is() -> None:
    binding = func.QueueMessage(id="queue-id", body=b"not ours")
    d = delivered_from_queue_message(binding)
    assert (d.message_id, d.body, d.due_at, d.route, d.lateness_s) == ("queue-id", b"not ours", None, None, None)


def test_observe_lateness_records_the_histogram_and_logs_one_consumed_line(caplog: pytest.LogCaptureFixture) -> None:
    reader = InMemoryMetricReader()
    consumer = ConsumerMetrics(MeterProvider(metric_readers=[reader]))
    d = DeliveredMessage(
        message_id="m-1",
        body=b"x",
        headers={},
        due_at=datetime(2030, 1, 1, tzinfo=UTC),
        sent_at=None,
        hops=0,
        route="table",
        received_at=datetime(2030, 1, 1, 0, 0, 1, tzinfo=UTC),
        cloud="azure",
        destination="q",
    )
    with caplog.at_level(logging.INFO, logger="delayed_delivery.consumer"):
        assert observe_lateness(d, consumer) == 1.0
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, Any] = {
        metric.name: list(metric.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    [point] = points["delayed_delivery.consumer_lateness"]
    assert (point.count, point.max, point.attributes) == (1, 1.0, {"destination": "q"})
    [line] = [r for r in caplog.records if r.getMessage() == "consumed"]
    assert (line.event, line.cloud, line.consumer_lateness_s, line.delay_s) == ("consumed", "azure", 1.0, None)  # type: ignore[attr-defined]
