"""The sender on Azurite: native vs table vs cancellable routing, batches, bad input, the off switch."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.sender import AzureDelayedSender, DelayRequest, send_delayed
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.errors import (
    ConfigurationError,
    DelayedDeliveryDisabledError,
    DestinationNotFoundError,
    InvalidMessageError,
)
from delayed_delivery.naming import azure_delays_table_name
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import make_store, new_name
from tests.azure.harness import drain, drain_until
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


@pytest.fixture
def store(table_store: TableDelayedMessageStore) -> TableDelayedMessageStore:
    """The empty table store of this module's tests."""
    return table_store


def sender(
    azurite: Azurite, store: TableDelayedMessageStore, *, enabled: bool = True, **kw: float
) -> AzureDelayedSender:
    transport = StorageQueueTransport.from_connection_string(azurite.connection_string)
    return AzureDelayedSender(transport, store, DelayedDeliverySettings(enabled=enabled), **kw)  # type: ignore[arg-type]


def test_short_delay_goes_natively_with_the_visibility_timeout(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    result = sender(azurite, store).send(queue, b"soon", delay=2, headers={"type": "Ping"})
    assert result.route == "native"
    assert store.count() == 0, "the table is never touched"
    assert drain(queues, queue) == [], "invisible until due"
    (got,) = drain_until(queues, queue, expect=1)
    headers = dict(got.headers)
    assert decode_delivery(headers.pop(DELIVERY_HEADER)).route == "native"  # for the consumer (#16)
    assert (got.message_id, got.body, headers) == (result.message_id, b"soon", {"type": "Ping"})
    props = queues.get_queue_client(queue).get_queue_properties()
    assert props.approximate_message_count == 1


def test_delay_beyond_seven_days_becomes_a_table_row(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    before = datetime.now(UTC)
    result = sender(azurite, store).send(queue, b"later", delay="8d", message_id="order-42")
    assert result.route == "table"
    assert drain(queues, queue) == []
    stored = store.get("order-42")
    assert stored is not None and stored.body == b"later"
    assert before + timedelta(days=8) <= stored.due_at <= datetime.now(UTC) + timedelta(days=8)


def test_exactly_seven_days_is_native_and_one_second_more_is_not(
    azurite: Azurite, store: TableDelayedMessageStore, queue: str
) -> None:
    s = sender(azurite, store)
    assert s.send(queue, b"a", delay=7 * 86400 - 1).route == "native"
    assert s.send(queue, b"b", delay=7 * 86400 + 1).route == "table"


def test_cancellable_short_delay_uses_the_table_and_can_be_cancelled(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    s = sender(azurite, store)
    result = s.send(queue, b"maybe", delay=1, cancellable=True)
    assert result.route == "table"
    assert s.cancel(result.message_id) is True
    assert s.cancel(result.message_id) is False
    assert store.count() == 0
    time.sleep(1.2)
    assert drain(queues, queue) == []


def test_batch_routes_each_message_and_writes_rows_in_transactions(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    requests = [DelayRequest(queue, b"now", delay=0) for _ in range(5)]
    requests += [DelayRequest(queue, f"far {i}".encode(), delay="30d") for i in range(130)]
    results = sender(azurite, store).send_many(requests)
    assert [r.route for r in results].count("native") == 5
    assert store.count() == 130
    assert len(drain(queues, queue)) == 5


def test_bad_input_writes_nothing(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    s = sender(azurite, store)
    good = [DelayRequest(queue, b"ok", delay=0), DelayRequest(queue, b"ok", delay="9d")]
    bad_requests = [
        DelayRequest("Not_A_Queue", b"x", delay=0),
        DelayRequest(queue, "text, not bytes", delay=0),  # type: ignore[arg-type]
        DelayRequest(queue, b"x", delay=-5),
        DelayRequest(queue, b"x", delay="200y"),
        DelayRequest(queue, b"x", at=datetime(2031, 1, 1)),  # naive
        DelayRequest(queue, b"x" * 60_000, delay="9d"),  # over 64 KiB once enveloped
        DelayRequest(queue, b"x"),  # neither delay nor at
    ]
    for bad in bad_requests:
        with pytest.raises((InvalidMessageError, ConfigurationError)) as info:
            s.send_many([*good, bad])
        assert str(info.value)
    with pytest.raises(InvalidMessageError, match="twice"):
        s.send_many([DelayRequest(queue, b"a", delay="9d", message_id="x")] * 2)
    assert store.count() == 0
    assert drain(queues, queue) == []


def test_a_missing_queue_in_a_batch_names_exactly_the_messages_that_were_not_sent(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    # found by tests/reliability/test_sender_fuzz.py: the first failed put ended send_many, and the caller could
    # not tell which of the batch had gone out
    missing = new_name("gone")
    requests = [DelayRequest(queue, b"ok", delay=0, message_id=f"ok-{i}") for i in range(4)]
    requests.insert(2, DelayRequest(missing, b"lost", delay=0, message_id="to-missing"))
    requests.append(DelayRequest(queue, b"far", delay="9d", message_id="far"))
    with pytest.raises(DestinationNotFoundError) as info:
        sender(azurite, store).send_many(requests)
    assert "1 of 6 messages were not accepted" in str(info.value) and "to-missing" in str(info.value)
    assert "ok-" not in str(info.value)
    assert sorted(m.message_id for m in drain(queues, queue)) == [f"ok-{i}" for i in range(4)]
    assert store.count() == 1, "the table-routed message was stored"


def test_off_switch_refuses_table_delays_but_still_sends_native_ones(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str
) -> None:
    s = sender(azurite, store, enabled=False)
    with pytest.raises(DelayedDeliveryDisabledError, match="disabled"):
        s.send(queue, b"far", delay="8d")
    with pytest.raises(DelayedDeliveryDisabledError):
        s.send(queue, b"cancellable", delay=0, cancellable=True)
    with pytest.raises(DelayedDeliveryDisabledError):
        s.send_many([DelayRequest(queue, b"a", delay=0), DelayRequest(queue, b"b", delay="8d")])
    assert store.count() == 0 and drain(queues, queue) == [], "a refused batch writes nothing"
    assert s.send(queue, b"native", delay=0).route == "native"
    assert len(drain(queues, queue)) == 1


def test_send_delayed_uses_the_endpoint_table_by_default(azurite: Azurite, queue: str) -> None:
    endpoint = new_name("endpoint")
    table = azure_delays_table_name(endpoint)
    make_store(azurite.connection_string, table)
    result = send_delayed(azurite.connection_string, queue, b"x", endpoint=endpoint, delay="10d", message_id="a")
    assert result.route == "table"
    assert TableDelayedMessageStore.from_connection_string(azurite.connection_string, table).get("a") is not None
    override = new_name("custom")
    make_store(azurite.connection_string, override)
    send_delayed(
        azurite.connection_string, queue, b"y", endpoint=endpoint, delay="10d", message_id="b", table_name=override
    )
    assert TableDelayedMessageStore.from_connection_string(azurite.connection_string, override).get("b") is not None


def test_sending_to_a_missing_table_is_a_clear_configuration_error(azurite: Azurite, queue: str) -> None:
    config = AzureDelayedDeliveryConfig.for_endpoint(new_name("nope"), connection_string=azurite.connection_string)
    with pytest.raises(ConfigurationError, match="not found"):
        AzureDelayedSender.from_config(config).send(queue, b"x", delay="9d")


@pytest.mark.parametrize(
    "request_",
    [
        DelayRequest("placeholder", b"x", delay="9d", headers={"k\ud800": "v"}),
        DelayRequest("placeholder", b"x", delay="9d", message_id="id\udfff"),
        DelayRequest("placeholder", b"x", delay=1, headers={"k": "\ud800"}, cancellable=True),
    ],
    ids=["header-name", "message-id", "header-value"],
)
def test_lone_surrogate_on_the_table_route_is_invalid_and_writes_nothing(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str, request_: DelayRequest
) -> None:
    # found by tests/reliability/test_sender_fuzz.py: UnicodeEncodeError leaked out of send_many from the row encoder
    good = DelayRequest(queue, b"ok", delay="9d")
    with pytest.raises(InvalidMessageError, match="lone surrogate"):
        sender(azurite, store).send_many([good, replace(request_, destination=queue)])
    assert store.count() == 0
    assert drain(queues, queue) == []


@pytest.mark.parametrize(
    "name",
    ["DelayedDelivery.Unreadable", "DelayedDelivery.FailureReason", "DelayedDelivery.Envelope", "delayeddelivery.a"],
)
@pytest.mark.parametrize("delay", [0, "9d"], ids=["native", "table"])
def test_reserved_headers_are_refused_by_name_and_nothing_is_written(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str, name: str, delay: Any
) -> None:
    with pytest.raises(InvalidMessageError, match=name.replace(".", r"\.")):
        sender(azurite, store).send_many(
            [DelayRequest(queue, b"ok", delay=0), DelayRequest(queue, b"x", delay=delay, headers={name: "x"})]
        )
    assert store.count() == 0 and drain(queues, queue) == []


def test_an_envelope_with_deeply_nested_headers_is_invalid_not_recursion_error() -> None:
    from delayed_delivery.azure.storage_queue import decode_envelope

    with pytest.raises(InvalidMessageError, match="nested"):
        decode_envelope('{"v":1,"id":"a","headers":' + "[" * 5000 + "]" * 5000 + ',"body":""}')
    with pytest.raises(InvalidMessageError, match="not a string"):
        decode_envelope('{"v":1,"id":"a","headers":{"k":1},"body":""}')
    assert decode_envelope('{"v":1,"id":"a","headers":{"k":"v"},"body":"eA=="}').headers == {"k": "v"}


def test_a_sender_built_without_settings_honours_the_environment(
    azurite: Azurite, store: TableDelayedMessageStore, queues: QueueServiceClient, queue: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_ENABLED", "false")
    transport = StorageQueueTransport.from_connection_string(azurite.connection_string)
    s = AzureDelayedSender(transport, store)
    assert s.settings.enabled is False
    with pytest.raises(DelayedDeliveryDisabledError, match="disabled"):
        s.send(queue, b"far", delay="40d")
    assert store.count() == 0 and drain(queues, queue) == []
    assert s.send(queue, b"native", delay=0).route == "native", "disabled still allows native delays"
    explicit = AzureDelayedSender(transport, store, DelayedDeliverySettings())
    assert explicit.send(queue, b"far", delay="40d").route == "table", "explicit settings win over the environment"
