"""An operator's cancel never answers "cancelled" while a placed copy that the row does not name can still arrive.

The deployed dispatcher identity may only put to destination queues (Azurite enforces no roles, so the placer's
transport here refuses deletes with a 403 as the deployed one does). A placer whose claim expires between its put
and its record cannot withdraw its copy; one that dies there cannot either. The ``Placing`` mark, written with the
placer's claim before its put, makes an operator's cancel in that window a refusal ("may still arrive") instead of
a true that is then delivered. Deterministic interleavings: put done, claim expired, cancel, then the placer resumes
(or never does).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure import rows
from delayed_delivery.azure.placement import PlacementReport, Placer
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.errors import MessageInFlightError, PermanentError
from delayed_delivery.model import DelayedMessage
from tests.azure.conftest import new_name
from tests.azure.test_placement import REACH, _placer, _visible
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


class _PutOnly(StorageQueueTransport):
    """The deployed dispatcher's queue rights: puts only (a delete is refused, 403); ``after_put`` runs per put."""

    def __init__(self, queues: QueueServiceClient, after_put: Any) -> None:
        super().__init__(queues, route="table")
        self.after_put = after_put

    def place(self, message: DelayedMessage, visibility_timeout: int, **kw: Any) -> tuple[str, str]:
        placed = super().place(message, visibility_timeout, **kw)
        self.after_put(message)
        return placed

    def revoke(self, destination: str, queue_message_id: str, pop_receipt: str) -> bool:
        raise PermanentError("deleting a placed message: storage returned 403: AuthorizationPermissionMismatch")


class _Crash(BaseException):
    """The placer's process dies (nothing after it runs)."""


def _place(placer: Placer) -> PlacementReport:
    report = PlacementReport()
    with ThreadPoolExecutor(1) as pool:
        placer.place_batch(pool, lambda: True, report)
    return report


def _await_claim_expiry(store: TableDelayedMessageStore, message_id: str) -> None:
    """Poll (deadline) until the row's claim has expired by this host's clock, as an operator's check sees it."""
    deadline = time.monotonic() + REACH
    while True:
        located = store._rows.locate(message_id)
        assert located is not None
        available = str(store.table.get_entity(*located)["AvailableAt"])
        if available < rows.due_key(datetime.now(UTC)):
            return
        assert time.monotonic() < deadline, "the claim never expired"
        time.sleep(0.1)


def test_a_cancel_between_an_expired_placers_put_and_its_record_is_refused_never_true_then_delivered(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table)
    store.setup_infrastructure()
    operator = TableDelayedMessageStore.from_connection_string(
        azurite.connection_string, table, queues=StorageQueueTransport(queues, route="table")
    )
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
    store.store(DelayedMessage("m-late", queue, b"x", due))
    said_cancelled: set[str] = set()
    refused: list[str] = []

    def cancel(message_id: str) -> None:
        try:
            if operator.remove(message_id):
                said_cancelled.add(message_id)
        except MessageInFlightError:
            refused.append(message_id)

    # 1. put done, claim expired, an operator cancels, then the placer resumes and records
    def slow_record(message: DelayedMessage) -> None:
        _await_claim_expiry(store, message.message_id)
        cancel(message.message_id)

    _place(_placer(store, _PutOnly(queues, slow_record), claim_timeout=1.0, concurrency=1))

    # 2. put done, then the placer dies; its claim expires, an operator cancels; another placer places it again
    def die(message: DelayedMessage) -> None:
        raise _Crash

    store.store(DelayedMessage("m-dead", queue, b"y", due))
    with pytest.raises(_Crash):
        _place(_placer(store, _PutOnly(queues, die), claim_timeout=1.0, concurrency=1))
    _await_claim_expiry(store, "m-dead")
    cancel("m-dead")
    if "m-dead" not in said_cancelled:
        again = _place(_placer(store, StorageQueueTransport(queues, route="table"), claim_timeout=30.0, concurrency=1))
        assert again.placed == 1, again
        cancel("m-dead")  # its row names the second copy only: the first may still arrive, so refused again

    # the recorded placement of m-late carries no mark: now it is cancelled exactly, by its pop receipt
    if "m-late" not in said_cancelled:
        cancel("m-late")
        assert "m-late" in said_cancelled, "a recorded placement clears its mark"

    arrived = _visible(queues, [queue], 2 if "m-dead" not in said_cancelled else 1)
    assert not said_cancelled & set(arrived), f"answered cancelled, then delivered: {sorted(said_cancelled)}"
    assert refused.count("m-dead") == 2 and len(arrived["m-dead"]) == 2, (
        "the dead placer's copy and the second placement both arrive (the crash bound), as the refusals said"
    )
