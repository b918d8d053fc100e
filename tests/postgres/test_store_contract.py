"""The core store contract against a real PostgreSQL (4 processes share one table)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest

from delayed_delivery import PostgresDelayedMessageStore
from delayed_delivery.ports import (
    BatchRemovingStore,
    DeferringStore,
    DelayedMessageStore,
    DelayedMessageStoreWithInfrastructure,
    ReschedulableStore,
)
from delayed_delivery.testing.store_contract import (
    DeferringStoreContract,
    MultiProcessStoreContract,
    ReschedulableStoreContract,
    StoreContract,
)

pytestmark = pytest.mark.postgres


def _store(conninfo: str, table: str, claim_timeout: float) -> PostgresDelayedMessageStore:
    s = PostgresDelayedMessageStore(conninfo, table=table, claim_timeout=claim_timeout)
    s.setup_infrastructure()
    return s


class TestPostgresStore(StoreContract, ReschedulableStoreContract, MultiProcessStoreContract, DeferringStoreContract):
    claim_timeout = 45.0
    processes = 4

    @pytest.fixture
    def store(self, postgres_conninfo: str, postgres_table: str) -> Iterator[PostgresDelayedMessageStore]:
        s = _store(postgres_conninfo, postgres_table, self.claim_timeout)
        yield s
        s.drop_infrastructure()
        s.close()

    @pytest.fixture
    def store_factory(self, postgres_conninfo: str, postgres_table: str) -> Callable[[], DelayedMessageStore]:
        return functools.partial(_store, postgres_conninfo, postgres_table, self.claim_timeout)


def test_the_store_implements_every_optional_port(postgres_conninfo: str, postgres_table: str) -> None:
    s = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table)
    assert isinstance(s, DelayedMessageStoreWithInfrastructure)
    assert isinstance(s, ReschedulableStore)
    assert isinstance(s, BatchRemovingStore)
    assert isinstance(s, DeferringStore)
