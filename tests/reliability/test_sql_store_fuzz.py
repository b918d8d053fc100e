"""Fuzzing garbage rows in the SQL stores (embedded SQLite, PostgreSQL), read by the core dispatcher.

Each example writes one good row due before and one due after a row with garbage written by SQL straight into
the table: whatever the schema lets through in the columns the store reads (ids and destinations that are not
usable, bodies that are not bytes, headers that are not a JSON object of strings, due and claim times that are
not times, text that is not UTF-8, odd failure counts). The core ``Dispatcher`` with an in-memory transport
must not raise or stop, must deliver both good rows once, must put the garbage row on the error queue with a
``FailureReason`` (or deliver it, when the garbage happened to be harmless), and must leave no row behind.

What the schemas refuse outright (so it is not fuzzed): NULL in any NOT NULL column (SQLite: all but
``message_id``, which as a non-integer primary key may be NULL; PostgreSQL: all), and in PostgreSQL a
``headers`` value that is not JSON, text that is not valid in the database encoding or holds NUL, a negative
``failure_count`` (CHECK constraint) and a body that is not bytes (any ``bytea`` is a valid body).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from delayed_delivery import DelayedMessage, Dispatcher, InMemoryTransport, ManualClock, SqliteDelayedMessageStore
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION, UNREADABLE
from delayed_delivery.ports import DelayedMessageStore
from delayed_delivery.settings import DelayedDeliverySettings

#: Examples per run; the soak sets RELIABILITY_FUZZ_EXAMPLES higher.
EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "60"))
ERRORS = "errors"
DESTINATION = "orders"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class NotUtf8:
    """Bytes stored as TEXT (``CAST(? AS TEXT)``): a text value that is not UTF-8."""

    raw: bytes


#: Microseconds past datetime.max (year 9999): no Python datetime holds them.
PAST_9999_US = 253_402_300_800_000_000
SQLITE_GARBAGE: dict[str, list[Any]] = {
    "message_id": [None, b"\xffid", "", "   ", "x" * 200, 7, NotUtf8(b"id\xff")],
    "destination": ["", "   ", b"orders", 7, 1.5, NotUtf8(b"q\xfe")],
    "body": ["text, not a blob", 7, 1.5, "", NotUtf8(b"\xff\xfe")],
    "headers": [
        "not json",
        "[]",
        "5",
        "null",
        '"text"',
        '{"a": 1}',
        '{"": "x"}',
        '{"a": null}',
        '{"a": {"b": "c"}}',
        '{"a": "\\ud800"}',
        "[" * 5000 + "]" * 5000,
        7,
        b"{}",
        NotUtf8(b'{"a": "\xff"}'),
    ],
    "due_at_us": ["soon", b"\x00", 1.5, 2**62, -(2**62), PAST_9999_US, -1e300],
    "available_at_us": ["soon", b"\x00", 2**62, PAST_9999_US, 1e300],
    "failure_count": [-1, "many", 1.5, 2**63 - 1, b"\x01"],
}
PG_GARBAGE: dict[str, list[Any]] = {
    "message_id": ["", "   ", "x" * 200],
    "destination": ["", "   "],
    "headers": [
        "[]",
        "5",
        "null",
        '"text"',
        '{"a": 1}',
        '{"": "x"}',
        '{"a": null}',
        '{"a": {"b": "c"}}',
        '{"a": "\\ud800"}',
        '{"a": "\\u0000"}',
        "[" * 2000 + "]" * 2000,
    ],
    "due_at": ["infinity", "-infinity", "10000-01-01 00:00:00+00", "4713-01-01 00:00:00+00 BC"],
    "available_at": ["infinity", "10000-01-01 00:00:00+00"],
    "failure_count": [2_147_483_647],
}


def _changes(garbage: dict[str, list[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """One to three columns, each set to a garbage value."""
    column = st.sampled_from(sorted(garbage)).flatmap(lambda c: st.tuples(st.just(c), st.sampled_from(garbage[c])))
    return st.lists(column, min_size=1, max_size=3, unique_by=lambda t: t[0]).map(dict)


def _messages(tag: str) -> tuple[DelayedMessage, DelayedMessage, DelayedMessage]:
    """A good row due before the garbage row, the row to corrupt, and a good row due after it."""
    first = DelayedMessage(f"good-1-{tag}", DESTINATION, b"first", NOW - timedelta(seconds=3))
    bad = DelayedMessage(f"bad-{tag}", DESTINATION, b"bad body", NOW - timedelta(seconds=2), {"k": "v"})
    last = DelayedMessage(f"good-2-{tag}", DESTINATION, b"last", NOW - timedelta(seconds=1))
    return first, bad, last


def _dispatch(store: DelayedMessageStore, batch_size: int) -> InMemoryTransport:
    """Run the core dispatcher on a manual clock until nothing is due; the transport it sent through."""
    clock = ManualClock(NOW)
    transport = InMemoryTransport(clock)
    dispatcher = Dispatcher(
        store, transport, DelayedDeliverySettings(error_queue=ERRORS, batch_size=batch_size), clock=clock
    )
    try:
        dispatcher.dispatch_due(budget=30)  # manual clock: a fetch that keeps failing ends the budget, not the test
    finally:
        dispatcher.close()
    return transport


def _check(transport: InMemoryTransport, first: DelayedMessage, bad: DelayedMessage, last: DelayedMessage) -> None:
    """Good rows delivered once each; the garbage row on the error queue with its reason, or harmlessly delivered."""
    delivered = [s.message for s in transport.sent if s.message.destination != ERRORS]
    errors = transport.to(ERRORS)
    ids = [m.message_id for m in delivered]
    assert ids.count(first.message_id) == 1 and ids.count(last.message_id) == 1, ids
    assert len(delivered) + len(errors) == 3, (delivered, errors)
    event("garbage row: error queue" if errors else "garbage row: harmless, delivered")
    for error in errors:
        assert error.headers[FAILURE_REASON] and ORIGINAL_DESTINATION in error.headers, error
    for message in delivered:
        if message.message_id not in (first.message_id, last.message_id):
            assert message.body == bad.body and UNREADABLE not in message.headers, message


# -- SQLite -----------------------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteDelayedMessageStore]:
    """An empty SQLite store in a temporary file."""
    store = SqliteDelayedMessageStore(tmp_path / "fuzz.db", claim_timeout=60)
    store.setup_infrastructure()
    yield store
    store.close()


def _sqlite_insert(store: SqliteDelayedMessageStore, message: DelayedMessage, changes: dict[str, Any]) -> None:
    """Insert ``message`` as a row with ``changes`` applied, straight through SQL."""
    due = int((message.due_at - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    row: dict[str, Any] = {
        "message_id": message.message_id,
        "destination": message.destination,
        "body": message.body,
        "headers": '{"k": "v"}',
        "due_at_us": due,
        "available_at_us": due,
        "failure_count": 0,
    }
    row.update(changes)
    marks = ["CAST(? AS TEXT)" if isinstance(v, NotUtf8) else "?" for v in row.values()]
    values = [v.raw if isinstance(v, NotUtf8) else v for v in row.values()]
    with sqlite3.connect(store.path) as conn:
        conn.execute(f'INSERT INTO "{store.table}" ({", ".join(row)}) VALUES ({", ".join(marks)})', values)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=_changes(SQLITE_GARBAGE), batch_size=st.sampled_from([1, 2, 10]))
def test_sqlite_garbage_rows_end_on_the_error_queue_and_never_block_the_good_ones(
    sqlite_store: SqliteDelayedMessageStore, changes: dict[str, Any], batch_size: int
) -> None:
    first, bad, last = _messages(uuid.uuid4().hex[:8])
    sqlite_store.store_many([first, last])
    _sqlite_insert(sqlite_store, bad, changes)
    transport = _dispatch(sqlite_store, batch_size)
    left = len(sqlite_store)
    with sqlite3.connect(sqlite_store.path) as conn:
        conn.execute(f'DELETE FROM "{sqlite_store.table}"')  # keep the next example independent of this one
    _check(transport, first, bad, last)
    assert left == 0, f"rows left behind after {changes}"


# -- PostgreSQL ---------------------------------------------------------------------------------------------------


@pytest.fixture
def pg_fuzz_store(postgres_conninfo: str, postgres_table: str) -> Iterator[Any]:
    """An empty PostgreSQL store on its own table."""
    from delayed_delivery.postgres.store import PostgresDelayedMessageStore

    store = PostgresDelayedMessageStore(postgres_conninfo, table=postgres_table, claim_timeout=60)
    store.setup_infrastructure()
    yield store
    store.drop_infrastructure()
    store.close()


def _pg_insert(store: Any, message: DelayedMessage, changes: dict[str, Any]) -> None:
    """Insert ``message`` as a row with ``changes`` applied, straight through SQL (times and JSON as text)."""
    row: dict[str, Any] = {
        "message_id": message.message_id,
        "destination": message.destination,
        "body": message.body,
        "headers": '{"k": "v"}',
        "due_at": message.due_at.isoformat(),
        "available_at": message.due_at.isoformat(),
        "failure_count": 0,
    }
    row.update(changes)
    casts = {"headers": "::json", "due_at": "::timestamptz", "available_at": "::timestamptz"}
    marks = ", ".join(f"%s{casts.get(c, '')}" for c in row)
    with store.cursor() as cur:
        cur.execute(f"INSERT INTO {store.qualified_name} ({', '.join(row)}) VALUES ({marks})", list(row.values()))


@pytest.mark.postgres
@settings(
    max_examples=max(1, EXAMPLES // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=_changes(PG_GARBAGE), batch_size=st.sampled_from([1, 2, 10]))
def test_postgres_garbage_rows_end_on_the_error_queue_and_never_block_the_good_ones(
    pg_fuzz_store: Any, changes: dict[str, Any], batch_size: int
) -> None:
    first, bad, last = _messages(uuid.uuid4().hex[:8])
    pg_fuzz_store.store_many([first, last])
    _pg_insert(pg_fuzz_store, bad, changes)
    transport = _dispatch(pg_fuzz_store, batch_size)
    left = len(pg_fuzz_store)
    with pg_fuzz_store.cursor() as cur:
        cur.execute(f"DELETE FROM {pg_fuzz_store.qualified_name}")  # keep the next example independent of this one
    _check(transport, first, bad, last)
    assert left == 0, f"rows left behind after {changes}"
