"""The store contract over the in-memory and SQLite stores."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from delayed_delivery import InMemoryDelayedMessageStore, SqliteDelayedMessageStore
from delayed_delivery.ports import DelayedMessageStore
from delayed_delivery.testing.store_contract import (
    DeferringStoreContract,
    MultiProcessStoreContract,
    ReschedulableStoreContract,
    StoreContract,
)


class TestInMemoryStore(StoreContract, ReschedulableStoreContract, DeferringStoreContract):
    claim_timeout = 30.0

    @pytest.fixture
    def store(self) -> InMemoryDelayedMessageStore:
        return InMemoryDelayedMessageStore(claim_timeout=self.claim_timeout)


def _sqlite(path: Path, claim_timeout: float) -> SqliteDelayedMessageStore:
    s = SqliteDelayedMessageStore(path, claim_timeout=claim_timeout)
    s.setup_infrastructure()
    return s


class TestSqliteStore(StoreContract, ReschedulableStoreContract, MultiProcessStoreContract, DeferringStoreContract):
    claim_timeout = 45.0

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SqliteDelayedMessageStore]:
        s = _sqlite(tmp_path / "delays.db", self.claim_timeout)
        yield s
        s.close()

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> Callable[[], DelayedMessageStore]:
        return functools.partial(_sqlite, tmp_path / "delays.db", self.claim_timeout)
