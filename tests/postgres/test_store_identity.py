"""PostgreSQL: the id policy on batches and store_after, and a table made before claim tokens."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery import Dispatcher, InMemoryTransport, ManualClock, PostgresDelayedMessageStore
from delayed_delivery.errors import MessageIdConflictError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import claim_of

pytestmark = pytest.mark.postgres

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _msg(i: int, body: bytes = b"x") -> DelayedMessage:
    return DelayedMessage(f"m-{i}", "orders", body, T0 + timedelta(seconds=i))


def test_a_batch_with_the_same_messages_again_is_a_no_op(pg_store: PostgresDelayedMessageStore) -> None:
    pg_store.store_many([_msg(1), _msg(2)])
    pg_store.store_many([_msg(1), _msg(2), _msg(3)])
    assert len(pg_store) == 3


def test_a_batch_with_another_message_under_a_pending_id_is_refused_whole(
    pg_store: PostgresDelayedMessageStore,
) -> None:
    pg_store.store(_msg(1))
    with pytest.raises(MessageIdConflictError, match="m-1"):
        pg_store.store_many([_msg(2), _msg(1, b"other")])
    assert len(pg_store) == 1, "one transaction: nothing of the refused batch is stored"
    assert pg_store.get("m-1") == _msg(1)


def test_store_after_an_id_that_is_pending_is_refused(pg_store: PostgresDelayedMessageStore) -> None:
    first = pg_store.store_after(60, "orders", b"x", message_id="once")
    with pytest.raises(MessageIdConflictError, match="once"):
        pg_store.store_after(60, "orders", b"x", message_id="once")
    assert pg_store.get("once") == first


@pytest.fixture
def old_table(postgres_conninfo: str, postgres_table: str) -> Iterator[PostgresDelayedMessageStore]:
    """A table as the store created it before claim tokens, holding one due message."""
    store = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table, claim_timeout=30.0)
    with store.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {store.qualified_name} (message_id text PRIMARY KEY, destination text NOT NULL,"
            " body bytea NOT NULL, headers json NOT NULL, due_at timestamptz NOT NULL,"
            " available_at timestamptz NOT NULL, failure_count integer NOT NULL DEFAULT 0,"
            " stored_at timestamptz NOT NULL DEFAULT now())"
        )
        cur.execute(
            f"INSERT INTO {store.qualified_name} (message_id, destination, body, headers, due_at, available_at)"
            " VALUES ('old', 'orders', 'kept', '{}', %s, %s)",
            (T0, T0),
        )
    yield store
    store.drop_infrastructure()
    store.close()


def test_a_table_made_before_claim_tokens_is_upgraded_and_its_rows_delivered(
    old_table: PostgresDelayedMessageStore,
) -> None:
    old_table.setup_infrastructure()
    old_table.setup_infrastructure()  # safe to repeat
    [message] = old_table.fetch_due(T0, 10)
    assert message == DelayedMessage("old", "orders", b"kept", T0) and claim_of(message)
    clock = ManualClock(T0 + timedelta(seconds=61))
    transport = InMemoryTransport(clock)
    report = Dispatcher(old_table, transport, clock=clock).dispatch_due()
    assert report.dispatched == 1 and [m.body for m in transport.to("orders")] == [b"kept"]
    assert len(old_table) == 0
