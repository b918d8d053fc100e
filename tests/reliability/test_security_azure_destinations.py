"""The Azure dispatcher sends only to allowed destinations (crafted rows on Azurite, through the timer's host)."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import rows
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.destinations import DestinationPolicy
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

FOREIGN = [
    "https://evil.queue.core.windows.net/orders",
    "http://127.0.0.1:10001/devstoreaccount1/orders",
    "otheraccount/orders",
    "orders?sv=2024&sig=x",
    "Orders",
    "or",
    "or--ders",
    "../orders",
]


@pytest.fixture
def queues(azurite: Azurite) -> QueueServiceClient:
    """Queue service client on Azurite."""
    return QueueServiceClient.from_connection_string(azurite.connection_string)


def _crafted(host: object, destination: str, now: datetime) -> DelayedMessage:
    """Write a due row straight into the table, as anyone with table write access could."""
    message = DelayedMessage(f"c-{uuid.uuid4().hex[:12]}", destination, b"crafted", now - timedelta(seconds=1))
    for entity in rows.to_entities(message, 0):
        host.store.table.upsert_entity(entity)  # type: ignore[attr-defined]
    return message


def test_default_policy_refuses_urls_and_other_accounts_and_sends_the_rest(
    azurite: Azurite, queues: QueueServiceClient
) -> None:
    error_queue, allowed = new_name("e"), new_name("q")
    host = make_host(azurite.connection_string, new_name(), settings=DelayedDeliverySettings(error_queue=error_queue))
    queues.create_queue(allowed)
    with contextlib.suppress(ResourceExistsError):  # "orders" is a common name: another test may have made it
        queues.create_queue("orders")
    queues.get_queue_client("orders").clear_messages()
    now = datetime.now(UTC)
    crafted = {_crafted(host, d, now).message_id: d for d in FOREIGN}
    good = _crafted(host, allowed, now)
    summary = host.run(budget=3)
    assert summary.moved_to_error_queue == len(FOREIGN)
    assert [e.message_id for e in drain(queues, allowed)] == [good.message_id]
    errors = {e.message_id: e for e in drain(queues, error_queue)}
    assert set(errors) == set(crafted)
    for mid, destination in crafted.items():
        assert errors[mid].headers[ORIGINAL_DESTINATION] == destination
        assert "not a queue name of this storage account" in errors[mid].headers[FAILURE_REASON]
        assert errors[mid].headers["DelayedDelivery.FailureCount"] == "1", "refused at once, never retried"
    assert drain(queues, "orders") == [], "a crafted destination reached a queue"
    assert host.store.count() == 0


def test_explicit_allow_list_refuses_an_existing_queue_of_the_same_account(
    azurite: Azurite, queues: QueueServiceClient
) -> None:
    error_queue, prefix = new_name("e"), f"ok{uuid.uuid4().hex[:6]}"
    allowed, other = f"{prefix}-orders", new_name("billing")
    settings = DelayedDeliverySettings(error_queue=error_queue)
    host = make_host(azurite.connection_string, new_name(), settings=settings)
    host.config = replace(host.config, allowed_destinations=(f"{prefix}-*",))
    for q in (allowed, other):
        queues.create_queue(q)
    now = datetime.now(UTC)
    good, refused = _crafted(host, allowed, now), _crafted(host, other, now)
    started = time.monotonic()
    host.run(budget=3)
    assert time.monotonic() - started < 20
    assert [e.message_id for e in drain(queues, allowed)] == [good.message_id]
    assert drain(queues, other) == [], "a queue outside the allow-list received a message"
    [error] = drain(queues, error_queue)
    assert error.message_id == refused.message_id
    assert "DELAYED_DELIVERY_ALLOWED_DESTINATIONS" in error.headers[FAILURE_REASON]


def test_allow_list_setting_is_parsed_and_validated() -> None:
    env = {
        "DELAYED_DELIVERY_ENDPOINT": "orders",
        "DELAYED_DELIVERY_STORAGE_ACCOUNT": "acct",
        "DELAYED_DELIVERY_ALLOWED_DESTINATIONS": " orders , billing-* ,",
        "DELAYED_DELIVERY_ERROR_QUEUE": "dead",
    }
    config = AzureDelayedDeliveryConfig.from_env(env)
    assert config.allowed_destinations == ("orders", "billing-*")
    policy = config.destination_policy
    assert policy.refusal("orders") is None and policy.refusal("billing-eu") is None
    assert policy.refusal("dead") is None, "the error queue is always allowed"
    assert policy.refusal("shipping") is not None
    for bad in ("https://x.queue.core.windows.net/q", "acct/q", "Orders"):
        with pytest.raises(ConfigurationError, match="ALLOWED_DESTINATIONS"):
            AzureDelayedDeliveryConfig.from_env({**env, "DELAYED_DELIVERY_ALLOWED_DESTINATIONS": bad})
    assert DestinationPolicy("error").refusal("any-queue-name") is None
