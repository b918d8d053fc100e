"""Occurrence rows written once: each occurrence's pair of rows in the delays table with a marker row beside it.

The delays table places a message's rows in the partition of its id's hash, so an occurrence's rows cannot share a
transaction with its schedule's cursor. Instead the timer writes the pair (due row and index row, unchanged) and a
marker row ``o_<keep-until>_<SHA-1 of the id>`` in the same partition, in one entity-group transaction that
*creates* the marker: all three rows or none. The dispatcher deletes the pair when it sends; the marker stays. A
pass that writes the same occurrence again (a timer killed between the rows and the cursor, a frozen lease holder
that woke) finds the marker and does nothing, whether the occurrence is still pending or already sent. A marker is
kept while a pass could plan its occurrence again (its nominal instant plus the schedule's catch-up window, plus an
hour), then swept, one partition a timer run. Readers of the delays table read the ``d_`` and ``i_`` key ranges
only, so markers change nothing they see; rows written before markers existed keep the store's id rule.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from ... import logfields as lf
from ...model import DelayedMessage
from .. import rows, transactions
from ..sdk_errors import is_status, translate
from ..table_store import MAX_TRANSACTION_OPERATIONS, TableDelayedMessageStore
from .groups import chunks, entity_size

__all__ = ["MARKER_PREFIX", "OccurrenceRows", "marker_entity"]

_log = logging.getLogger("delayed_delivery.azure.schedules")

#: RowKey prefix of an occurrence marker (after ``d_`` and ``i_``, which every reader of the table bounds its range to).
MARKER_PREFIX = "o_"
#: One character after ``_``: ``"o_" <= RowKey < "o`"`` selects every marker.
MARKER_END = "o`"
#: Markers swept in one call at most (the rest next time).
SWEEP_LIMIT = 10_000


def marker_entity(partition: str, message_id: str, keep_until: datetime) -> dict[str, Any]:
    """The marker row of an occurrence written to ``partition``, kept until ``keep_until``."""
    key = f"{MARKER_PREFIX}{rows.due_key(keep_until)}_{rows.id_hash(message_id)}"
    return {"PartitionKey": partition, "RowKey": key, "MessageId": message_id}


class OccurrenceRows:
    """Writes occurrences into the delays table of ``store``, each at most once (an ``OccurrenceSink``)."""

    def __init__(self, store: TableDelayedMessageStore) -> None:
        self.store_port = store

    def store(self, message: DelayedMessage) -> None:
        """Keep ``message`` by the store's id rule (no marker: backfill ``--again`` and other callers)."""
        self.store_port.store(message)

    def store_occurrence(self, message: DelayedMessage, keep_until: datetime) -> None:
        """Write the occurrence's rows and its marker in one transaction; nothing when its marker exists already."""
        store = self.store_port
        ops = self._ops(message, keep_until)
        marker = ops[0][1]
        what = f"storing occurrence {message.message_id!r}"
        try:
            transactions.submit(store.table, ops)
            return
        except TableTransactionError as exc:
            if not is_status(exc, 409):
                raise translate(exc, what) from exc
        except AzureError as exc:
            raise translate(exc, what) from exc
        if self._marked(marker, message.message_id):
            return  # written by an earlier pass: pending or sent, never again
        store.store(message)  # a row without a marker (written before markers, or by backfill): the id rule decides
        try:
            store.table.create_entity(marker)
        except ResourceExistsError:
            pass
        except AzureError as exc:
            raise translate(exc, what) from exc

    def store_occurrences(self, items: Sequence[tuple[DelayedMessage, datetime]]) -> list[Exception | None]:
        """``store_occurrence`` for each ``(message, keep_until)``, in few transactions: the rows and markers of one
        partition together (33 occurrences, ``MAX_GROUP_BYTES`` at most each). A transaction that fails changes
        nothing (a marker found, a fault): its occurrences are then written one by one, each finding its own marker.
        Per item: None (written now or before) or the error (``MessageIdConflictError``: pending with other
        content)."""
        out: list[Exception | None] = [None] * len(items)
        groups: dict[str, list[tuple[int, list[Any], int]]] = {}
        for n, (message, keep_until) in enumerate(items):
            ops = self._ops(message, keep_until)
            size = sum(entity_size(entity) for _, entity, _ in ops)
            groups.setdefault(str(ops[0][1]["PartitionKey"]), []).append((n, ops, size))
        for group in groups.values():
            for chunk in chunks(group, lambda item: (len(item[1]), item[2])):
                try:
                    self._submit([op for _, ops, _ in chunk for op in ops])
                except Exception:  # one marker found or a fault: one by one, each judged alone
                    for n, _, _ in chunk:
                        out[n] = self._alone(*items[n])
        return out

    def _submit(self, ops: list[Any]) -> None:
        """Commit one group's operations as one transaction."""
        transactions.submit(self.store_port.table, ops)

    def _alone(self, message: DelayedMessage, keep_until: datetime) -> Exception | None:
        try:
            self.store_occurrence(message, keep_until)
        except Exception as exc:  # this occurrence's failure only: its schedule's cursor stays
            return exc
        return None

    def _ops(self, message: DelayedMessage, keep_until: datetime) -> list[Any]:
        """The occurrence's marker (created), index row (created) and due row (upserted): one partition."""
        due, index = rows.to_entities(message, rows.shard_of(message.message_id, self.store_port.shards))
        marker = marker_entity(str(due["PartitionKey"]), message.message_id, keep_until)
        return [("create", marker, {}), ("create", index, {}), ("upsert", due, {"mode": UpdateMode.REPLACE})]

    def _marked(self, marker: dict[str, Any], message_id: str) -> bool:
        """Whether the occurrence's marker exists (a re-plan computes the same keep-until, so the same key)."""
        try:
            self.store_port.table.get_entity(str(marker["PartitionKey"]), str(marker["RowKey"]), select=["RowKey"])
            return True
        except ResourceNotFoundError:
            return False
        except AzureError as exc:
            raise translate(exc, f"reading the marker of {message_id!r}") from exc

    def sweep(self, now: datetime, turn: int) -> int:
        """Delete the markers kept until before ``now`` in one partition (``turn`` modulo the shard count); how many."""
        table = self.store_port.table
        pk = rows.partition_key(turn % self.store_port.shards)
        hi = MARKER_PREFIX + rows.due_key(now)
        try:
            old = [
                {"PartitionKey": pk, "RowKey": str(e["RowKey"])}
                for _, e in zip(
                    range(SWEEP_LIMIT),
                    table.query_entities(
                        "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                        parameters={"pk": pk, "lo": MARKER_PREFIX, "hi": hi},
                        select=["RowKey"],
                        results_per_page=1000,
                    ),
                    strict=False,
                )
            ]
            for start in range(0, len(old), MAX_TRANSACTION_OPERATIONS):
                group = old[start : start + MAX_TRANSACTION_OPERATIONS]
                try:
                    transactions.submit(table, [("delete", e, {}) for e in group])
                except TableTransactionError:  # another sweeper took some: one by one
                    for entity in group:
                        with contextlib.suppress(ResourceNotFoundError):
                            table.delete_entity(entity["PartitionKey"], entity["RowKey"])
        except AzureError as exc:
            _log.warning("sweeping occurrence markers failed", extra={lf.REASON: repr(exc), lf.SHARD: pk})
            return 0
        return len(old)
