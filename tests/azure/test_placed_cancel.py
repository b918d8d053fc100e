"""Operators cancel and reschedule messages placed ahead on their queues, exactly, by pop receipt (Azurite).

A placed message is hidden, so nobody has received it and its pop receipt (kept on its row) is still valid: cancel
deletes it from the queue, then the row, and says cancelled only when the queue delete succeeded; reschedule
updates it on the queue (new visibility, new receipt recorded) or, beyond the queue's 7 days, takes it off the queue
and stores the row at the new due time. A message visible by now, or whose receipt no longer matches, is refused
(``MessagePlacedError``) and never reported cancelled; a cancel racing placement never says cancelled for a message
that is then delivered.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import rows
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.placement import PlacementReport
from delayed_delivery.azure.sender import AzureDelayedSender
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.errors import MessageInFlightError, MessagePlacedError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.naming import azure_delays_table_name
from tests.app.cli.conftest import run
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.azure.test_placement import _placer, _Transport, _visible
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


def _stores(azurite: Azurite, queues: QueueServiceClient) -> tuple[TableDelayedMessageStore, TableDelayedMessageStore]:
    """The dispatcher's view and an operator's (with the queue client that cancels placed messages)."""
    table = new_name()
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table)
    store.setup_infrastructure()
    operator = TableDelayedMessageStore.from_connection_string(
        azurite.connection_string, table, queues=StorageQueueTransport(queues, route="table")
    )
    return store, operator


def _place(store: TableDelayedMessageStore, transport: StorageQueueTransport, want: int) -> PlacementReport:
    report = PlacementReport()
    with ThreadPoolExecutor(4) as pool:
        _placer(store, transport).place_batch(pool, lambda: True, report)
    assert report.placed == want, report
    return report


def _depth(queues: QueueServiceClient, queue: str) -> int:
    return int(queues.get_queue_client(queue).get_queue_properties().approximate_message_count)


def _row(store: TableDelayedMessageStore, message_id: str) -> Any:
    located = store._rows.locate(message_id)
    return None if located is None else store.table.get_entity(*located)


def test_cancel_of_a_placed_message_deletes_it_from_its_queue_and_refuses_once_the_receipt_is_stale(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    store, operator = _stores(azurite, queues)
    due = datetime.now(UTC) + timedelta(seconds=300)
    store.store_many([DelayedMessage(f"m-{i}", queue, b"x", due) for i in range(3)])
    _place(store, StorageQueueTransport(queues, route="table"), 3)
    assert _depth(queues, queue) == 3

    assert operator.remove("m-0") is True
    assert _depth(queues, queue) == 2, "the placed message is deleted from its queue"
    assert operator.get("m-0") is None and _row(store, "m-0") is None, "and its rows"

    # the queue message's receipt changes behind the row's back (as a receive would): refused, nothing deleted
    row = _row(store, "m-1")
    queues.get_queue_client(queue).update_message(
        row[rows.QUEUE_MESSAGE_ID], row[rows.POP_RECEIPT], visibility_timeout=300
    )
    with pytest.raises(MessagePlacedError, match="m-1"):
        operator.remove("m-1")
    assert _depth(queues, queue) == 2 and operator.get("m-1") is not None, "not cancelled, nothing lost"

    # a store without a queue client still refuses, truthfully
    bare = TableDelayedMessageStore(store.table)
    with pytest.raises(MessagePlacedError, match="no queue client"):
        bare.remove("m-2")


def test_a_placed_message_visible_by_now_is_refused_and_delivered(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    store, operator = _stores(azurite, queues)
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=6)
    store.store(DelayedMessage("m-v", queue, b"x", due))
    _place(store, StorageQueueTransport(queues, route="table"), 1)
    while datetime.now(UTC) < due:
        time.sleep(0.2)
    with pytest.raises(MessagePlacedError, match="visible"):
        operator.remove("m-v")
    with pytest.raises(MessageInFlightError, match="m-v"):
        operator.reschedule("m-v", due + timedelta(hours=1))
    assert sorted(_visible(queues, [queue], 1)) == ["m-v"], "delivered, as the refusal said"


def test_cancels_racing_placement_never_say_cancelled_for_a_message_then_delivered(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    store, operator = _stores(azurite, queues)
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
    ids = [f"m-{i}" for i in range(12)]
    store.store_many([DelayedMessage(mid, queue, b"x", due) for mid in ids])
    cancelled: set[str] = set()
    in_window: list[str] = []

    def cancel(mid: str) -> None:
        try:
            if operator.remove(mid):
                cancelled.add(mid)
        except MessageInFlightError:
            pass

    def between_put_and_record(message: DelayedMessage) -> None:  # an operator cancels in the placer's window
        in_window.append(message.message_id)
        cancel(message.message_id)

    with ThreadPoolExecutor(1) as racer:  # and another cancels the even ones while placement runs
        racing = racer.submit(lambda: [cancel(mid) for mid in ids[::2]])
        report = PlacementReport()
        with ThreadPoolExecutor(4) as pool:
            _placer(store, _Transport(queues, before_record=between_put_and_record)).place_batch(
                pool, lambda: True, report
            )
        racing.result()
    for mid in ids[::3]:  # after placement: these are cancelled by receipt
        cancel(mid)
    assert in_window, "the hook ran between puts and records"
    assert cancelled, "some cancels succeeded"

    expected = sorted(set(ids) - cancelled)
    seen = _visible(queues, [queue], len(expected))
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # anything more arriving would be a cancelled message delivered
        for envelope in drain(queues, queue):
            seen.setdefault(envelope.message_id, []).append((queue, datetime.now(UTC)))
        time.sleep(0.2)
    assert not cancelled & set(seen), "no message said cancelled is delivered"
    assert sorted(seen) == expected, "every message not cancelled is delivered"
    assert all(len(v) == 1 for v in seen.values()), "once"


def test_reschedule_of_a_placed_message_moves_it_on_its_queue_or_back_to_the_table(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    store, operator = _stores(azurite, queues)
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=600)
    store.store_many([DelayedMessage(f"m-{i}", queue, b"x", due) for i in range(3)])
    _place(store, StorageQueueTransport(queues, route="table"), 3)
    old_receipt = _row(store, "m-0")[rows.POP_RECEIPT]

    later = due + timedelta(hours=2)  # within the queue's 7 days: updated on the queue, its new receipt recorded
    assert operator.reschedule("m-0", later) is True
    moved = _row(store, "m-0")
    assert moved["RowKey"] == rows.DUE_PREFIX + rows.due_key(later) + moved["RowKey"][len(rows.DUE_PREFIX) + 20 :]
    assert moved["AvailableAt"] == rows.PLACED_KEY and moved[rows.POP_RECEIPT] != old_receipt
    assert _depth(queues, queue) == 3
    assert operator.remove("m-0") is True and _depth(queues, queue) == 2, "the new receipt cancels it"

    far = due + timedelta(days=30)  # beyond 7 days: off the queue, a plain row at its new due time
    assert operator.reschedule("m-1", far) is True
    row = _row(store, "m-1")
    assert row["AvailableAt"] == rows.due_key(far) and not row.get(rows.QUEUE_MESSAGE_ID)
    assert _depth(queues, queue) == 1
    assert [m.message_id for m in store.fetch_due(far, 10)] == ["m-1"], "the dispatcher sends it then"

    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)  # earlier: visible at its new time
    assert operator.reschedule("m-2", soon) is True
    seen = _visible(queues, [queue], 1)
    assert sorted(seen) == ["m-2"] and seen["m-2"][0][1] >= soon, "visible at the new due time, not before"


def test_pending_counts_placed_messages_and_says_which_are_placed(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    endpoint = new_name("e")
    table = azure_delays_table_name(endpoint)
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table)
    store.setup_infrastructure()
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=300)
    store.store_many([DelayedMessage(f"m-{i}", queue, b"x", due) for i in range(3)])
    store.store(DelayedMessage("later", queue, b"y", due + timedelta(hours=2)))  # beyond the lead: a plain row
    _place(store, StorageQueueTransport(queues, route="table"), 3)

    where = ["--cloud", "azure", "--connection-string", azurite.connection_string, "--endpoint", endpoint]
    result = run("pending", *where, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["pending"], report["placed"], report["claimed_or_retrying"]) == (4, 3, 0), report
    text = run("pending", *where)
    assert "placed on their queues, hidden until due: 3" in text.stdout, text.stdout


def test_the_senders_cancel_withdraws_a_placed_message(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    endpoint = new_name("e")
    config = AzureDelayedDeliveryConfig.for_endpoint(endpoint, connection_string=azurite.connection_string)
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, config.table_name)
    store.setup_infrastructure()
    sender = AzureDelayedSender.from_config(config)
    result = sender.send(queue, b"x", delay="300s", cancellable=True, message_id="s-1")
    assert result.route == "table"
    _place(store, StorageQueueTransport(queues, route="table"), 1)
    assert _depth(queues, queue) == 1

    assert sender.cancel("s-1") is True
    assert _depth(queues, queue) == 0 and store.get("s-1") is None
