"""Fixtures for the PostgreSQL adapter tests: a fresh store (and queue table) per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delayed_delivery.postgres.queue import PostgresQueueTransport
from delayed_delivery.postgres.store import PostgresDelayedMessageStore


@pytest.fixture
def pg_store(postgres_conninfo: str, postgres_table: str) -> Iterator[PostgresDelayedMessageStore]:
    """An empty store on its own table."""
    s = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table, claim_timeout=30.0)
    s.setup_infrastructure()
    yield s
    s.drop_infrastructure()
    s.close()


@pytest.fixture
def pg_queue(postgres_conninfo: str, postgres_table: str) -> Iterator[PostgresQueueTransport]:
    """An empty outbox queue table in the same database."""
    q = PostgresQueueTransport(postgres_conninfo, table=postgres_table.replace("_delayed", "_queue"))
    q.setup_infrastructure()
    yield q
    q.drop_infrastructure()
    q.close()
