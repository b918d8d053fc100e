"""The store contract over the Azure Table store on Azurite (one shard, and three shards).

The dispatcher's side of the contract goes through the lease holder's exclusive view of every shard (what the timer
uses), the operator's through the store, as another host would."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.ports import DelayedMessageStore
from delayed_delivery.testing.store_contract import (
    DeferringStoreContract,
    MultiProcessStoreContract,
    ReschedulableStoreContract,
    StoreContract,
)
from tests.azure.conftest import make_store, new_name
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


def _lease_holder(store: TableDelayedMessageStore) -> TableDelayedMessageStore:
    return store.for_shards(range(store.shards), exclusive=True)


class TestTableStore(StoreContract, ReschedulableStoreContract, MultiProcessStoreContract, DeferringStoreContract):
    claim_timeout = 45.0
    unsettled_claims_refuse_operators = True
    #: The largest body one entity holds beside the contract's id, destination and headers.
    max_body_bytes = 780_000 // 256 * 256
    processes = 3
    messages = 150

    def dispatcher_view(self, store: TableDelayedMessageStore) -> TableDelayedMessageStore:
        return _lease_holder(store)

    @pytest.fixture
    def table_name(self) -> str:
        return new_name()

    @pytest.fixture
    def store(self, azurite: Azurite, table_name: str) -> Iterator[TableDelayedMessageStore]:
        s = make_store(azurite.connection_string, table_name, self.claim_timeout)
        yield s
        s.drop()

    @pytest.fixture
    def store_factory(self, azurite: Azurite, table_name: str) -> Callable[[], DelayedMessageStore]:
        return functools.partial(make_store, azurite.connection_string, table_name, self.claim_timeout)


class TestShardedTableStore(StoreContract, ReschedulableStoreContract, DeferringStoreContract):
    """Three shards, all owned: earliest-first must hold across partitions."""

    claim_timeout = 30.0
    unsettled_claims_refuse_operators = True
    max_body_bytes = 300_000

    def dispatcher_view(self, store: TableDelayedMessageStore) -> TableDelayedMessageStore:
        return _lease_holder(store)

    @pytest.fixture
    def store(self, azurite: Azurite) -> Iterator[TableDelayedMessageStore]:
        s = make_store(azurite.connection_string, new_name(), self.claim_timeout, shards=3)
        yield s
        s.drop()
