"""Operators' cancel and reschedule of a message placed ahead on its queue (``placement.py``), by its pop receipt.

A placed row keeps the queue message's id and pop receipt. While the message is hidden nobody can have received
it, so the receipt is still valid: cancel deletes the queue message, then the row; reschedule updates the queue
message (new visibility and content; a new receipt, recorded on the row) or, beyond the 7 days a queue can hide a
message, deletes it and stores the row at its new due time. The queue's answer is the authority: a message that is
visible by now, or was received (its receipt changed), is refused with ``MessagePlacedError`` and never reported
cancelled. Each step that follows a queue change is retried; a row left behind by a failure is swept after due.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableTransactionError, UpdateMode

from .. import logfields as lf
from ..errors import DelayedDeliveryError, MessagePlacedError, TransientError
from ..model import DelayedMessage
from . import rows
from .sdk_errors import is_status, translate
from .storage_queue import MAX_NATIVE_DELAY_SECONDS, StorageQueueTransport
from .table_gateway import CLAIM, TableGateway

__all__ = ["VISIBLE_MARGIN", "PlacedMessages", "is_placed", "unrecorded_placement", "unrecorded_send"]

#: A placed message due within this many seconds counts as visible (clock skew, the time a request takes).
VISIBLE_MARGIN = 2.0
#: The longest visibility an update asks for (the queue's 7 days, less a margin for the request's own time).
_MAX_HIDE = MAX_NATIVE_DELAY_SECONDS - 60
_ROW_ATTEMPTS = 6

_log = logging.getLogger("delayed_delivery.azure.placed_ops")


def is_placed(row: Any) -> bool:
    """Whether ``row`` (a due row as read) is placed on its queue."""
    return row.get("AvailableAt") == rows.PLACED_KEY and bool(row.get(rows.QUEUE_MESSAGE_ID))


def _refusal(message_id: str, row: Any, why: str) -> MessagePlacedError:
    due = rows.due_of_row_key(str(row["RowKey"])).isoformat()
    destination = str(row.get("Destination"))[:80]
    return MessagePlacedError(
        f"message {message_id!r} was placed on queue {destination!r} for {due} and {why}: it can no longer be "
        "cancelled or rescheduled"
    )


def unrecorded_placement(message_id: str, row: Any) -> MessagePlacedError:
    """The refusal for a row whose ``Placing`` mark is set: a copy put on its queue may not be named by the row."""
    return _refusal(
        message_id,
        row,
        "a copy put there may not be recorded (its placer stopped between its put and its record) and may still arrive",
    )


def unrecorded_send(message_id: str, row: Any) -> MessagePlacedError:
    """The refusal for a row whose ``Sending`` mark is set and whose claim has ended: a dispatcher may have put it on
    its queue with no outcome recorded (the wording of the AWS tier's uncertain cancel)."""
    destination = str(row.get("Destination"))[:80]
    return MessagePlacedError(
        f"message {message_id!r} may already be on its way to queue {destination!r} and then is delivered: a "
        "dispatcher took it to send and no outcome of that send is recorded (a send slower than its claim, or a "
        "dispatcher stopped between its put and its record); the next run sends it (again), so it can no longer be "
        "cancelled or rescheduled; have the consumer drop it by id"
    )


class PlacedMessages:
    """Cancel and reschedule of placed rows: the queue message first (by its receipt), then the row."""

    def __init__(self, gateway: TableGateway, queues: StorageQueueTransport | None) -> None:
        self.rows = gateway
        self.queues = queues

    def _check(self, message_id: str, row: Any, now: datetime) -> StorageQueueTransport:
        """The transport, after refusing a message that is visible by now (or when no queue client was given)."""
        if rows.due_of_row_key(str(row["RowKey"])) <= now + timedelta(seconds=VISIBLE_MARGIN):
            raise _refusal(message_id, row, "is visible there by now")
        if self.queues is None:
            raise _refusal(message_id, row, "this process has no queue client to withdraw it with")
        return self.queues

    def _receipt_unchanged(self, message_id: str, pk: str, row: Any) -> None:
        """After the queue refused ``row``'s receipt: refuse if the row still names it (received); else return."""
        fresh = self.rows.read(pk, str(row["RowKey"]), f"reading {message_id!r}")
        if fresh is not None and fresh.get(rows.POP_RECEIPT) == row.get(rows.POP_RECEIPT):
            raise _refusal(message_id, row, "was received from it (or is visible there)")

    def cancel(self, message_id: str, pk: str, row: Any, now: datetime) -> bool | None:
        """Delete the placed message, then its rows: True; None when the row changed meanwhile (look again)."""
        queues = self._check(message_id, row, now)
        if not queues.revoke(str(row["Destination"]), str(row[rows.QUEUE_MESSAGE_ID]), str(row[rows.POP_RECEIPT])):
            self._receipt_unchanged(message_id, pk, row)
            return None
        rk = str(row["RowKey"])
        for attempt in range(_ROW_ATTEMPTS):
            try:
                self.rows.delete_pair(message_id, pk, rk, None)  # False: gone already (swept), as good
                return True
            except TransientError as exc:
                _log.warning(
                    "deleting a cancelled placed row failed; retrying",
                    extra={lf.EVENT: "placed_cancel_retry", lf.MESSAGE_ID: message_id, lf.REASON: repr(exc)},
                )
                time.sleep(0.2 * 2**attempt)
        _log.warning(  # the message is withdrawn; its row is swept after its due time
            "a cancelled placed row stays until swept",
            extra={lf.EVENT: "placed_row_left", lf.MESSAGE_ID: message_id},
        )
        return True

    def reschedule(self, message_id: str, pk: str, old: Any, due_at: datetime, now: datetime) -> bool | None:
        """Move the placed message to ``due_at``: True; None when the row changed meanwhile (look again)."""
        queues = self._check(message_id, old, now)
        message = rows.message_from_entity(old)
        moved = DelayedMessage(
            message.message_id, message.destination, message.body, due_at, message.headers, message.failure_count
        )
        destination, qid, receipt = str(old["Destination"]), str(old[rows.QUEUE_MESSAGE_ID]), str(old[rows.POP_RECEIPT])
        hide = max(0, math.ceil((due_at - now).total_seconds()))
        if hide <= _MAX_HIDE:
            new_receipt = queues.rehide(moved, qid, receipt, hide, sent_at=now)
            if new_receipt is None:
                self._receipt_unchanged(message_id, pk, old)
                return None
            due, new_index = rows.to_entities(moved, rows.shard_of(message_id, self.rows.shards))
            due.update({CLAIM: old.get(CLAIM, ""), **rows.placed_patch(pk, str(due["RowKey"]), qid, new_receipt)})
        else:
            if not queues.revoke(destination, qid, receipt):
                self._receipt_unchanged(message_id, pk, old)
                return None
            due, new_index = rows.to_entities(moved, rows.shard_of(message_id, self.rows.shards))
            try:
                self._write_moved(message_id, pk, old, due, new_index)
            except DelayedDeliveryError:
                self._put_back(message, old, now)
                raise
            return True
        self._write_moved(message_id, pk, old, due, new_index)
        return True

    def _put_back(self, message: DelayedMessage, old: Any, now: datetime) -> None:
        """Place the withdrawn message again at its old due time (its row could not be moved): nothing is lost."""
        assert self.queues is not None
        hide = max(1, math.ceil((message.due_at - now).total_seconds()))
        placed = self.queues.place(message, hide, sent_at=now)
        patch = rows.placed_patch(str(old["PartitionKey"]), str(old["RowKey"]), *placed)
        try:
            self.rows.table.update_entity(patch, mode=UpdateMode.MERGE)
        except AzureError:
            _log.error(  # the row still names the withdrawn message: cancel refuses it; it arrives at its old due
                "a placed message put back could not be recorded",
                extra={lf.EVENT: "placed_put_back_unrecorded", lf.MESSAGE_ID: message.message_id},
            )

    def _write_moved(self, message_id: str, pk: str, old: Any, due: dict[str, Any], index: dict[str, Any]) -> None:
        """Replace the old due row by ``due`` and point the index at it (retried: the queue has already changed)."""
        same = due["RowKey"] == old["RowKey"]
        ops: list[Any] = (
            [("upsert", due, {"mode": UpdateMode.REPLACE})]
            if same
            else [
                ("upsert", due, {"mode": UpdateMode.REPLACE}),
                ("upsert", index, {"mode": UpdateMode.REPLACE}),
                ("delete", dict(old), {}),
            ]
        )
        what = f"rescheduling placed message {message_id!r}"
        for attempt in range(_ROW_ATTEMPTS):
            try:
                self.rows.commit(ops)
                return
            except TableTransactionError as exc:
                if is_status(exc, 404) and not same:
                    ops = ops[:2]  # the old row went meanwhile (swept): write the new one alone
                    continue
                error: DelayedDeliveryError = translate(exc, what)
            except AzureError as exc:
                error = translate(exc, what)
            if not isinstance(error, TransientError):
                raise error
            time.sleep(0.2 * 2**attempt)
        raise TransientError(f"{what}: its queue message was moved but its row could not be rewritten")
