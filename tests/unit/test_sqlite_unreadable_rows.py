"""Rows written into the SQLite store by hand that it cannot read: error queue, never a blocked batch.

Found by ``tests/reliability/test_sql_store_fuzz.py``: a row with a text body (or headers that were not a JSON
object) raised out of ``fetch_due`` after the whole batch had been claimed, so the good rows claimed with it
were never delivered; an integer body was delivered as that many zero bytes; a row whose claim time was text
was never fetched at all.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery import DelayedMessage, Dispatcher, InMemoryTransport, ManualClock, SqliteDelayedMessageStore
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION, UNREADABLE
from delayed_delivery.settings import DelayedDeliverySettings

NOW = datetime(2030, 1, 1, tzinfo=UTC)
DUE_US = int((NOW - timedelta(seconds=2) - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


@pytest.fixture
def store(tmp_path: Path) -> SqliteDelayedMessageStore:
    """An SQLite store with one good row due before and one due after the row each test writes."""
    s = SqliteDelayedMessageStore(tmp_path / "delays.db")
    s.setup_infrastructure()
    s.store_many(
        [
            DelayedMessage("good-1", "orders", b"first", NOW - timedelta(seconds=3)),
            DelayedMessage("good-2", "orders", b"last", NOW - timedelta(seconds=1)),
        ]
    )
    return s


def _insert(store: SqliteDelayedMessageStore, **columns: Any) -> None:
    """Write a row by hand: the columns given, the rest those of a valid row due 2 s ago."""
    row: dict[str, Any] = {
        "message_id": "bad",
        "destination": "orders",
        "body": b"bad body",
        "headers": "{}",
        "due_at_us": DUE_US,
        "available_at_us": DUE_US,
        "failure_count": 0,
    }
    row.update(columns)
    with sqlite3.connect(store.path) as conn:
        conn.execute(
            f"INSERT INTO {store.table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
        )


def _dispatch(store: SqliteDelayedMessageStore) -> InMemoryTransport:
    """Dispatch everything due, three rows to a batch."""
    clock = ManualClock(NOW)
    transport = InMemoryTransport(clock)
    Dispatcher(store, transport, DelayedDeliverySettings(batch_size=3), clock=clock).dispatch_due(budget=30)
    return transport


@pytest.mark.parametrize(
    ("columns", "reason", "body"),
    [
        ({"body": "text, not a blob"}, "not a BLOB", b"text, not a blob"),
        ({"body": 7}, "not a BLOB", b""),
        ({"headers": "[1, 2]"}, "not an object", b"bad body"),
        ({"headers": '{"k": 1}'}, "str value", b"bad body"),
        ({"message_id": None}, "message_id", b"bad body"),
        ({"due_at_us": "soon", "available_at_us": "soon"}, "due time", b"bad body"),
    ],
    ids=["text-body", "integer-body", "headers-array", "header-not-str", "null-id", "text-times"],
)
def test_unreadable_sqlite_row_goes_to_the_error_queue_and_its_batch_is_delivered(
    store: SqliteDelayedMessageStore, columns: dict[str, Any], reason: str, body: bytes
) -> None:
    _insert(store, **columns)
    transport = _dispatch(store)
    assert [m.body for m in transport.to("orders")] == [b"first", b"last"]
    [error] = transport.to("error")
    assert reason in error.headers[UNREADABLE] and "unreadable store row" in error.headers[FAILURE_REASON]
    assert error.headers[ORIGINAL_DESTINATION] == "orders"
    assert error.body == body
    assert len(store) == 0


def test_sqlite_text_that_is_not_utf8_is_an_unreadable_row_with_its_bytes_salvaged(
    store: SqliteDelayedMessageStore,
) -> None:
    with sqlite3.connect(store.path) as conn:
        conn.execute(
            f"INSERT INTO {store.table} (message_id, destination, body, headers, due_at_us, available_at_us,"
            " failure_count) VALUES ('bad', 'orders', CAST(? AS TEXT), '{}', ?, ?, 0)",
            (b"\xff\xfe", DUE_US, DUE_US),
        )
    transport = _dispatch(store)
    assert len(transport.to("orders")) == 2
    [error] = transport.to("error")
    assert error.body == b"\xff\xfe" and "not a BLOB" in error.headers[UNREADABLE]
