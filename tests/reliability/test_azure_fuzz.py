"""Fuzzing garbage rows into the Azure delays table (Azurite), read by the dispatcher the timer function runs.

Each example writes one good row and one corrupted row straight into the table (missing or garbage
properties, bad JSON headers, body chunks that do not add up, a RowKey with no readable due time, a missing
index row, a destination that is not a queue name, or another queue of the account). The dispatcher, with the
store, the Storage Queue transport and the destination guard the timer function wires up, must deliver the good
row, put the corrupted one on the error queue with a reason (or deliver it with exactly the body its row holds, when
the row is still well-formed: a chunk replaced by other bytes is a valid row, since nothing records the original;
to the queue the row names, when that is another queue of the account, which the guard allows), leave no row
behind, and never stop. The module has an Azurite of its own; whether a named queue (``error``) exists is still
read before each dispatch, never assumed.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueServiceClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from delayed_delivery import DelayedMessage, Dispatcher, ManualClock
from delayed_delivery.azure import rows
from delayed_delivery.azure.destinations import GuardedTransport
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.headers import FAILURE_REASON, ORIGINAL_DESTINATION, UNREADABLE
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


@pytest.fixture(scope="module")
def azurite(own_azurite: Azurite) -> Azurite:
    """This module's own Azurite (tests/fixtures/azurite.py: 30 examples of 6-8 queue calls each)."""
    return own_azurite


@pytest.fixture
def queues(azurite: Azurite) -> QueueServiceClient:
    """Queue service client on Azurite."""
    return QueueServiceClient.from_connection_string(azurite.connection_string)


EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "60")) // 2

_hosts: dict[str, tuple[AzureDispatcherHost, str, str]] = {}

#: Another queue of the account, which every run has (``_host`` creates it): a row naming it is delivered there.
OTHER_QUEUE = "fuzz-other-queue"
#: Due parts of a RowKey that cannot be read but sort before today's (keys after "d_9" are never read: README).
BAD_DUE_KEYS = ["-1", "0", "1999", "20201301000000000000", "2020-01", "!"]
PROPS = ["MessageId", "Destination", "Headers", "BodyChunks", "Body00", "Body01", "FailureCount"]
values = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=10),
    st.booleans(),
    st.sampled_from(["", " ", "[]", "5", "null", "{", '{"a":1}', '{"":"x"}', '{"a":"b"}', "x" * 200]),
    st.sampled_from(["https://other.queue.core.windows.net/q", "other/q", "UPPER", "ab", "a--b", "error", OTHER_QUEUE]),
)
corruptions = st.lists(
    st.one_of(
        st.tuples(st.just("drop"), st.sampled_from(PROPS), st.none()),
        st.tuples(st.just("set"), st.sampled_from(PROPS), values),
        st.tuples(st.just("due"), st.none(), st.sampled_from(BAD_DUE_KEYS)),
        st.tuples(st.just("no_index"), st.none(), st.none()),
    ),
    min_size=1,
    max_size=3,
)


def _host(conn: str) -> tuple[AzureDispatcherHost, str, str]:
    """One host, destination and error queue for the whole run (every example leaves the table empty)."""
    if conn not in _hosts:
        error_queue = new_name("e")
        host = make_host(conn, new_name(), settings=DelayedDeliverySettings(error_queue=error_queue, batch_size=10))
        destination = new_name("q")
        host.transport.create_queue(destination)
        host.transport.create_queue(OTHER_QUEUE)
        _hosts[conn] = (host, destination, error_queue)
    return _hosts[conn]


def _write(host: AzureDispatcherHost, message: DelayedMessage, changes: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    """Write ``message``'s rows with ``changes`` applied; returns the due row as written."""
    due, index = rows.to_entities(message, 0)
    write_index = True
    for kind, prop, value in changes:
        if kind == "drop":
            due.pop(prop, None)
        elif kind == "set":
            due[prop] = value
        elif kind == "due":
            due["RowKey"] = f"{rows.DUE_PREFIX}{value}_{rows.id_hash(message.message_id)}"
            index["DueRowKey"] = due["RowKey"]
        else:
            write_index = False
    host.store.table.upsert_entity(due)
    if write_index:
        host.store.table.upsert_entity(index)
    return due


def _other_queue(queues: QueueServiceClient, host: AzureDispatcherHost, row: dict[str, Any], ours: str) -> str | None:
    """The queue ``row`` names when it is another existing queue of the account that the host's guard lets the
    dispatcher send to, emptied of what earlier tests left in it; ``None`` otherwise."""
    named = row.get("Destination")
    policy = host.config.destination_policy
    if not isinstance(named, str) or named in (ours, policy.error_queue) or policy.refusal(named) is not None:
        return None
    try:
        queues.get_queue_client(named).get_queue_properties()
    except ResourceNotFoundError:
        return None
    drain(queues, named)  # hidden for 5 minutes: what is read after the dispatch is this example's
    return named


def _message_rows(host: AzureDispatcherHost) -> list[Any]:
    """Every row but the table's layout row (the shard count `azure setup` records)."""
    return [e for e in host.store.table.list_entities() if e["PartitionKey"] != "layout"]


def _dispatch(host: AzureDispatcherHost, now: datetime) -> None:
    clock = ManualClock(now)
    guarded = GuardedTransport(host.transport, host.config.destination_policy)
    dispatcher = Dispatcher(host.store, guarded, host.settings, clock=clock)
    dispatcher.dispatch_due(budget=30)  # manual clock: a stuck fetch would end the budget, not hang
    dispatcher.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=corruptions)
@example(changes=[("set", "Destination", "error")])  # the failure seen when another test had made queue "error"
@example(changes=[("set", "Destination", OTHER_QUEUE)])
def test_garbage_rows_end_on_the_error_queue_and_never_block_the_good_one(
    azurite: Azurite, queues: QueueServiceClient, changes: list[tuple[str, Any, Any]]
) -> None:
    host, destination, error_queue = _host(azurite.connection_string)
    now = datetime.now(UTC)
    tag = uuid.uuid4().hex[:8]
    good = DelayedMessage(f"good-{tag}", destination, b"good", now - timedelta(seconds=2))
    bad = DelayedMessage(f"bad-{tag}", destination, b"bad" * 1000, now - timedelta(seconds=1), {"k": "v"})
    host.store.store(good)
    written = _write(host, bad, changes)
    other = _other_queue(queues, host, written, destination)
    _dispatch(host, now)
    delivered = drain(queues, destination)
    errors = drain(queues, error_queue)
    elsewhere = drain(queues, other) if other is not None else []
    assert [e.message_id for e in delivered].count(good.message_id) == 1, "the good row was not delivered once"
    assert len(delivered) + len(elsewhere) + len(errors) == 2, (changes, other, delivered, elsewhere, errors)
    for e in errors:
        assert e.headers[FAILURE_REASON] and e.headers[ORIGINAL_DESTINATION]
    for e in delivered + elsewhere:
        if e.message_id != good.message_id:
            # delivered only when the row is still well-formed, and then with exactly the body it holds: a row
            # whose chunk was replaced by other bytes is a valid row (nothing in it says what the body "was")
            assert e.body == rows.message_from_entity(written).body, (changes, e.body[:20])
    left = _message_rows(host)
    for entity in left:  # keep the next example independent of this one
        host.store.table.delete_entity(entity["PartitionKey"], entity["RowKey"])
    assert left == [], f"rows left behind: {left}"


def test_unreadable_row_goes_to_the_error_queue_with_its_reason(azurite: Azurite, queues: QueueServiceClient) -> None:
    host, destination, error_queue = _host(azurite.connection_string)
    now = datetime.now(UTC)
    bad = DelayedMessage(f"bad-{uuid.uuid4().hex[:8]}", destination, b"payload", now - timedelta(seconds=1))
    _write(host, bad, [("set", "Headers", "{not json"), ("no_index", None, None)])
    _dispatch(host, now)
    [error] = drain(queues, error_queue)
    assert error.message_id == bad.message_id and error.body == b"payload"
    assert "JSONDecodeError" in error.headers[UNREADABLE]
    assert "unreadable store row" in error.headers[FAILURE_REASON]
    assert error.headers[ORIGINAL_DESTINATION] == destination
    assert drain(queues, destination) == []


def test_row_too_large_for_any_queue_message_reaches_the_error_queue_without_its_body(
    azurite: Azurite, queues: QueueServiceClient
) -> None:
    host, destination, error_queue = _host(azurite.connection_string)
    now = datetime.now(UTC)
    big = DelayedMessage(f"big-{uuid.uuid4().hex[:8]}", destination, b"x" * 90_000, now - timedelta(seconds=1))
    _write(host, big, [])  # the table holds it; a queue message never could (the sender refuses it up front)
    _dispatch(host, now)
    [error] = drain(queues, error_queue)
    assert error.message_id == big.message_id and error.body == b""
    assert "90000 bytes not kept" in error.headers[FAILURE_REASON]
    assert drain(queues, destination) == [] and _message_rows(host) == []
