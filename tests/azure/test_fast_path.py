"""The lease holder's fast path on Azurite: one claim transaction per batch (the in-flight marks), lean transactions,
overlapped removal, about 1.04 requests a message."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from azure.data.tables import TableTransactionError
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import rows, transactions
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.azure.table_gateway import CLAIM
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.clock import ManualClock
from delayed_delivery.dispatcher import Dispatcher
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import claim_of
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_dispatch import make_host, msg
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


def due_rows(store: TableDelayedMessageStore) -> dict[str, Any]:
    """Every due row by message id, read straight from the table."""
    return {
        str(e["MessageId"]): e
        for e in store.table.query_entities("RowKey ge @lo and RowKey lt @hi", parameters={"lo": "d_", "hi": "d`"})
    }


@pytest.fixture
def requests_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the HTTP requests leaving this process, by service port (the real calls still go to Azurite)."""
    counts: Counter[str] = Counter()
    original = requests.Session.send

    def counting(self: requests.Session, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        counts[f"{request.method} {'$batch' if '$batch' in str(request.url) else ''}".strip()] += 1
        return original(self, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", counting)
    yield counts


def test_exclusive_view_marks_what_it_hands_out_in_the_table_and_hands_each_row_out_once_until_settled(
    azurite: Azurite,
) -> None:
    table = new_name()
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table, claim_timeout=30)
    store.setup_infrastructure()
    now = datetime.now(UTC)
    store.store_many([msg(i, "orders", now - timedelta(seconds=1)) for i in range(30)])
    view = store.for_shards([0], exclusive=True)
    first = view.fetch_due(now, 20)
    second = view.fetch_due(now, 20)
    assert len(first) == 20
    assert not {m.message_id for m in first} & {m.message_id for m in second}, "no row handed out twice"
    assert len(first) + len(second) == 30
    marked = due_rows(store)
    for m in [*first, *second]:  # the in-flight mark an operator on another host sees
        assert marked[m.message_id][CLAIM] == claim_of(m)
        assert marked[m.message_id]["AvailableAt"] == rows.due_key(now + timedelta(seconds=30))
    assert view.fetch_due(now, 20) == [] and view.next_due() is None, "all 30 are in flight"
    assert all(view.remove_many([m.message_id for m in first], [claim_of(m) for m in first]))
    assert view.release_claims() == 10  # the dispatcher stopped before sending `second`: they come back at once
    assert not any(e.get(CLAIM) for e in due_rows(store).values())
    assert sorted(m.message_id for m in view.fetch_due(now, 20)) == sorted(m.message_id for m in second)
    assert store.count() == 10
    store.drop()


def test_killed_between_put_and_delete_the_next_holder_sends_it_again_once_its_claim_expires(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table, claim_timeout=30)
    store.setup_infrastructure()
    now = datetime.now(UTC)
    store.store_many([msg(i, queue, now) for i in range(5)])
    transport = StorageQueueTransport.from_connection_string(azurite.connection_string)
    victim = store.for_shards([0], exclusive=True)
    for m in victim.fetch_due(now, 10):
        transport.send(m)  # ... and the process dies here, before any removal
    heir_view = store.for_shards([0], exclusive=True)
    assert heir_view.fetch_due(now + timedelta(seconds=29), 10) == [], "still marked in flight by the dead holder"
    clock = ManualClock(now + timedelta(seconds=31))
    heir = Dispatcher(heir_view, transport, DelayedDeliverySettings(), clock=clock, overlap_removal=True)
    report = heir.dispatch_due()
    heir.close()
    assert report.dispatched == 5 and store.count() == 0
    assert Counter(e.message_id for e in drain(queues, queue)) == {f"m-{i}": 2 for i in range(5)}, (
        "sent twice (at least once), never lost"
    )
    store.drop()


def test_lean_transaction_failure_is_judged_by_the_sdk(table_store: TableDelayedMessageStore) -> None:
    now = datetime.now(UTC)
    table_store.store_many([msg(i, "orders", now) for i in range(4)])
    claimed = table_store.fetch_due(now, 10)
    assert len(claimed) == 4
    assert table_store.remove("m-2", claim_of(claimed[2]))  # removed meanwhile: the rest are settled together
    flags = table_store.remove_many([m.message_id for m in claimed], [claim_of(m) for m in claimed])
    assert flags == [True, True, False, True]
    assert table_store.count() == 0
    with pytest.raises(TableTransactionError):
        transactions.submit(table_store.table, [("delete", {"PartitionKey": "s000", "RowKey": "d_missing"}, {})])
    due = rows.to_entities(msg(9, "orders", now), 0)
    table_store.table.create_entity(due[0])
    transactions.submit(table_store.table, [("delete", {"PartitionKey": "s000", "RowKey": due[0]["RowKey"]}, {})])
    assert not list(table_store.table.query_entities("RowKey eq @rk", parameters={"rk": due[0]["RowKey"]}))


def test_one_timer_run_makes_about_one_request_per_message(
    azurite: Azurite, queues: QueueServiceClient, queue: str, requests_sent: Counter[str]
) -> None:
    table = new_name()
    host = make_host(azurite.connection_string, table, run=6.0)
    now = datetime.now(UTC)
    host.store.store_many([DelayedMessage(f"m-{i}", queue, b"x", now - timedelta(seconds=1)) for i in range(150)])
    requests_sent.clear()
    summary = host.run()
    assert summary.dispatched == 150 and host.store.count() == 0
    assert requests_sent["POST"] == 150, f"one Put Message each: {requests_sent}"
    # the in-flight marks: one claim transaction per batch (100 + 50); removal: two for 100 messages, one for 50
    assert requests_sent["POST $batch"] == 2 + 3, requests_sent
    # the rest: one range query per batch, then the idle polls (<= 2 a second), lease acquire/renew/release
    assert sum(requests_sent.values()) - 150 - 5 <= 40, requests_sent
    assert len(drain(queues, queue)) == 150
