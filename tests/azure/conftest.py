"""Azure test helpers: stores, leases and queues on the session's Azurite, isolated by unique names."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.table_store import TableDelayedMessageStore
from tests.fixtures.azurite import Azurite


def new_name(prefix: str = "t") -> str:
    """A fresh name valid for tables, queues and containers."""
    return prefix + uuid.uuid4().hex[:20]


def make_store(conn: str, table: str, claim_timeout: float = 60.0, **kw: object) -> TableDelayedMessageStore:
    """A store on ``table`` (created if missing); picklable arguments so processes can build their own."""
    store = TableDelayedMessageStore.from_connection_string(conn, table, claim_timeout=claim_timeout, **kw)
    store.setup_infrastructure()
    return store


@pytest.fixture
def table_store(azurite: Azurite) -> Iterator[TableDelayedMessageStore]:
    """An empty single-shard store on a fresh table."""
    store = make_store(azurite.connection_string, new_name())
    yield store
    store.drop()


@pytest.fixture
def queues(azurite: Azurite) -> QueueServiceClient:
    """Queue service client on Azurite."""
    return QueueServiceClient.from_connection_string(azurite.connection_string)


@pytest.fixture
def queue(queues: QueueServiceClient) -> str:
    """A fresh, empty queue on Azurite (its name)."""
    name = new_name("q")
    queues.create_queue(name)
    return name


@pytest.fixture
def blobs(azurite: Azurite) -> BlobServiceClient:
    """Blob service client on Azurite."""
    return BlobServiceClient.from_connection_string(azurite.connection_string)


@pytest.fixture
def tables(azurite: Azurite) -> TableServiceClient:
    """Table service client on Azurite."""
    return TableServiceClient.from_connection_string(azurite.connection_string)
