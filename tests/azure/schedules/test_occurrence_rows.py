"""Occurrence markers on Azurite: an occurrence written once stays written after it is sent; rows written before
markers keep the id rule; expired markers are swept, the rest kept; readers of the delays table do not see them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery.azure import rows
from delayed_delivery.azure.schedules.occurrence_rows import MARKER_END, MARKER_PREFIX, OccurrenceRows
from delayed_delivery.errors import MessageIdConflictError
from delayed_delivery.model import DelayedMessage
from tests.azure.schedules.conftest import Endpoint

pytestmark = pytest.mark.azurite


def _occurrence(n: int, queue: str, body: bytes = b"tick") -> DelayedMessage:
    return DelayedMessage(f"s@2026-01-01T00:0{n}:00Z", queue, body, datetime.now(UTC) + timedelta(hours=1))


def _markers(endpoint: Endpoint) -> list[str]:
    found = endpoint.host.store.table.query_entities(
        "RowKey ge @lo and RowKey lt @hi", parameters={"lo": MARKER_PREFIX, "hi": MARKER_END}, select=["RowKey"]
    )
    return [str(e["RowKey"]) for e in found]


def test_an_occurrence_sent_and_written_again_is_not_stored_again(endpoint: Endpoint) -> None:
    store = endpoint.host.store
    writer = OccurrenceRows(store)
    keep = datetime.now(UTC) + timedelta(days=1)
    message = _occurrence(1, endpoint.queue)
    writer.store_occurrence(message, keep)
    writer.store_occurrence(message, keep)  # still pending: a no-op
    assert store.get(message.message_id) is not None and store.count() == 1
    assert store.remove(message.message_id)  # what the dispatcher does once it sent it
    writer.store_occurrence(message, keep)
    assert store.get(message.message_id) is None, "written again after it was sent"
    assert len(_markers(endpoint)) == 1 and store.count() == 0  # pending counts rows, never markers


def test_a_row_written_before_markers_keeps_the_id_rule_and_gains_a_marker(endpoint: Endpoint) -> None:
    store = endpoint.host.store
    writer = OccurrenceRows(store)
    keep = datetime.now(UTC) + timedelta(days=1)
    old = _occurrence(2, endpoint.queue)
    store.store(old)  # today's rows without markers (an older timer)
    writer.store_occurrence(old, keep)
    assert _markers(endpoint) and store.count() == 1
    writer.store_occurrence(_occurrence(3, endpoint.queue), keep)
    with pytest.raises(MessageIdConflictError):  # other content, another marker key (a changed window): the id rule
        writer.store_occurrence(_occurrence(3, endpoint.queue, b"other"), keep + timedelta(seconds=1))


def test_expired_markers_are_swept_and_the_rest_kept(endpoint: Endpoint) -> None:
    writer = OccurrenceRows(endpoint.host.store)
    now = datetime.now(UTC)
    for n in range(5):
        writer.store_occurrence(_occurrence(n, endpoint.queue), now + timedelta(minutes=n - 2))  # 2 expired
    shards = endpoint.host.store.shards
    swept = sum(writer.sweep(now, turn) for turn in range(shards))
    assert swept == 2
    kept = _markers(endpoint)
    assert len(kept) == 3 and all(k[len(MARKER_PREFIX) :][:20] >= rows.due_key(now) for k in kept)
