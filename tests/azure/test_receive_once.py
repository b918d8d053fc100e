"""Azure routes with ten (or more) headers: every copy of a message names its delayed id, so ``once`` acts once (#23).

Azure has no attribute limit: the header travels in our envelope beside the user's headers. When the envelope has
no room left for it, the helper falls back to the envelope's own id, the delayed id, never to the queue's id of one
copy; so duplicates are still recognised.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.receive import delivered_from_queue_message
from delayed_delivery.azure.sender import AzureDelayedSender
from delayed_delivery.azure.storage_queue import (
    MAX_QUEUE_MESSAGE_BYTES,
    StorageQueueTransport,
    decode_envelope,
    encode_envelope,
)
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.delivery import DELIVERY_HEADER
from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.idempotency import InMemoryProcessedLog, once
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

TEN = {f"h{i}": f"v{i}" for i in range(10)}


def _consume(queues: QueueServiceClient, name: str, expect: int, timeout: float = 15) -> tuple[Counter[str], list[Any]]:
    """Receive (and delete) ``expect`` messages; act on each through ``once``: the effects per id and the copies."""
    client = queues.get_queue_client(name)
    log, effects, copies = InMemoryProcessedLog(), Counter[str](), []
    deadline = time.monotonic() + timeout
    while len(copies) < expect and time.monotonic() < deadline:
        for m in client.receive_messages(max_messages=32):
            delivered = delivered_from_queue_message(m, destination=name)
            assert delivered.headers == TEN
            copies.append(m)
            once(log, delivered, lambda d=delivered: effects.update([d.message_id]))
            client.delete_message(m)
        time.sleep(0.1)
    return effects, copies


@pytest.fixture
def sender(azurite: Azurite, table_store: TableDelayedMessageStore) -> AzureDelayedSender:
    transport = StorageQueueTransport.from_connection_string(azurite.connection_string)
    return AzureDelayedSender(transport, table_store, DelayedDeliverySettings())


def test_native_route_with_ten_headers_acts_once_on_a_resend(
    sender: AzureDelayedSender, queues: QueueServiceClient, queue: str
) -> None:
    for _ in range(2):  # a producer's retry after a lost reply: a second queue message
        assert sender.send(queue, b"native", delay=0, headers=TEN, message_id="az-n").route == "native"
    effects, copies = _consume(queues, queue, expect=2)
    assert len({c.id for c in copies}) == 2 and effects == Counter({"az-n": 1})


def test_table_route_with_ten_headers_acts_once_when_a_dispatch_is_repeated(
    queues: QueueServiceClient, queue: str
) -> None:
    transport = StorageQueueTransport(queues, route="table")
    message = DelayedMessage.create(queue, b"table", delay=0, headers=TEN, message_id="az-t")
    transport.send(message)
    transport.send(message)  # the dispatcher died after its send, before it removed the row: sent again
    effects, copies = _consume(queues, queue, expect=2)
    assert len(copies) == 2 and effects == Counter({"az-t": 1})


def test_an_envelope_without_room_for_the_header_still_names_its_id(
    sender: AzureDelayedSender, queues: QueueServiceClient, queue: str
) -> None:
    empty = DelayedMessage.create(queue, b"", delay=0, headers=TEN, message_id="az-full")
    body = b"x" * ((MAX_QUEUE_MESSAGE_BYTES - len(encode_envelope(empty))) // 4 * 3)  # base64 fills the rest
    full = DelayedMessage.create(queue, body, delay=0, headers=TEN, message_id="az-full")
    with_header = full.with_headers({DELIVERY_HEADER: "v1;id=az-full;due=1;sent=1;hops=0;route=native"})
    assert len(encode_envelope(full)) <= MAX_QUEUE_MESSAGE_BYTES
    with pytest.raises(InvalidMessageError):
        encode_envelope(with_header)  # no room for the header
    for _ in range(2):
        sender.send(queue, body, delay=0, headers=TEN, message_id="az-full")
    effects, copies = _consume(queues, queue, expect=2)
    assert len(copies) == 2 and effects == Counter({"az-full": 1})
    assert all(DELIVERY_HEADER not in decode_envelope(c.content).headers for c in copies)  # left out: no room
