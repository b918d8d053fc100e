"""SQLite: the id policy on batches, and a table made before claim tokens."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delayed_delivery import Dispatcher, InMemoryTransport, ManualClock, SqliteDelayedMessageStore
from delayed_delivery.errors import MessageIdConflictError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import claim_of

T0 = datetime(2030, 1, 1, tzinfo=UTC)
T0_US = int((T0 - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000


def _msg(i: int, body: bytes = b"x") -> DelayedMessage:
    return DelayedMessage(f"m-{i}", "orders", body, T0 + timedelta(seconds=i))


def test_a_batch_with_another_message_under_a_pending_id_is_refused_whole(tmp_path: Path) -> None:
    store = SqliteDelayedMessageStore(tmp_path / "d.db")
    store.setup_infrastructure()
    store.store(_msg(1))
    store.store_many([_msg(1), _msg(2)])  # the same message again: a no-op
    with pytest.raises(MessageIdConflictError, match="m-1"):
        store.store_many([_msg(3), _msg(1, b"other")])
    assert len(store) == 2, "one transaction: nothing of the refused batch is stored"
    assert store.get("m-1") == _msg(1)


def test_a_table_made_before_claim_tokens_gets_the_column_and_its_rows_are_delivered(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE delayed_messages (message_id TEXT PRIMARY KEY, destination TEXT NOT NULL,"
            " body BLOB NOT NULL, headers TEXT NOT NULL, due_at_us INTEGER NOT NULL,"
            " available_at_us INTEGER NOT NULL, failure_count INTEGER NOT NULL DEFAULT 0)"
        )
        conn.execute("INSERT INTO delayed_messages VALUES ('old', 'orders', ?, '{}', ?, ?, 0)", (b"kept", T0_US, T0_US))
    conn.close()
    store = SqliteDelayedMessageStore(path)  # no setup_infrastructure: the first connection adds the column
    [message] = store.fetch_due(T0, 10)
    assert message == DelayedMessage("old", "orders", b"kept", T0) and claim_of(message)
    clock = ManualClock(T0 + timedelta(seconds=61))
    transport = InMemoryTransport(clock)
    report = Dispatcher(store, transport, clock=clock).dispatch_due()
    assert report.dispatched == 1 and [m.body for m in transport.to("orders")] == [b"kept"]
    assert len(store) == 0
    store.close()
