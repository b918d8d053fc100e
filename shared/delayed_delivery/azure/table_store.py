"""Delayed messages in an Azure Storage table (row design in ``rows.py``).

Settings: ``shards`` (partitions the rows are spread over; fixed for a table's lifetime),
``fetch_shards`` (which of them this instance claims from; default all), ``claim_timeout``.

Guarantees:

* ``fetch_due`` claims rows with ETag-conditional merges (batched in transactions of at most 100
  operations, one partition each; a transaction that loses a race falls back to one conditional
  update per row), so no two callers get the same row while its claim lasts. An unsettled claim
  expires after ``claim_timeout`` seconds and the row is fetched again: nothing is lost.
* A message's due row and index row change together in one entity-group transaction; ``reschedule``
  inserts the new due row and deletes the old one in the same transaction.
* Finding due rows reads only rows due by then (a RowKey range inside each shard's partition).
* Every azure.core exception is re-raised as a core error (``TransientError`` for throttling and
  timeouts, ``ConfigurationError`` for a missing table, ``PermanentError`` otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.data.tables import TableServiceClient, TableTransactionError, UpdateMode

from .. import logfields as lf
from ..errors import DelayedDeliveryError, InvalidMessageError, TransientError
from ..model import DelayedMessage
from ..naming import validate_azure_table_name
from ..ports import DelayedMessageStore, id_conflict, same_message
from . import rows
from .sdk_errors import is_status, sdk_errors, translate
from .table_gateway import Operation, if_match
from .table_claims import MAX_TRANSACTION_OPERATIONS
from .table_settle import TableSettling

__all__ = ["MAX_TRANSACTION_OPERATIONS", "TableDelayedMessageStore"]

#: Keep transaction payloads well under the service's 4 MiB.
_MAX_TRANSACTION_BYTES = 3 * 1024 * 1024
_CONFLICT_RETRIES = 5

_log = logging.getLogger("delayed_delivery.azure.table_store")


class TableDelayedMessageStore(TableSettling, DelayedMessageStore):
    """The ``DelayedMessageStore`` on one Azure table (reschedulable, batch-removing, with infrastructure)."""

    @classmethod
    def from_connection_string(cls, connection_string: str, table_name: str, **kwargs: Any) -> TableDelayedMessageStore:
        """A store on ``table_name`` in the account of ``connection_string`` (e.g. Azurite)."""
        validate_azure_table_name(table_name)
        service = TableServiceClient.from_connection_string(connection_string)
        return cls(service.get_table_client(table_name), **kwargs)

    def for_shards(self, shards: Iterable[int], *, exclusive: bool = False) -> TableDelayedMessageStore:
        """A view of the same table that fetches only from ``shards`` (one dispatcher per leased shard).

        ``exclusive=True`` is for a caller holding the shards' blob leases: ``fetch_due`` then writes no claims
        (one query per batch instead of a query and a claim transaction) and keeps its claims in memory.
        """
        return TableDelayedMessageStore(
            self.table,
            shards=self.shards,
            fetch_shards=shards,
            claim_timeout=self.claim_timeout.total_seconds(),
            page_size=self.page_size,
            exclusive=exclusive,
        )

    def forget_claims(self) -> None:
        """Drop the in-memory claims of rows fetched but never settled (the dispatcher stopped): fetch them again."""
        with self._lock:
            self._claimed.clear()
            self._handed.clear()
            self._tokens.clear()

    # -- infrastructure ------------------------------------------------------

    def setup_infrastructure(self) -> None:
        """Create the table if missing (a 403 means it is provisioned by infrastructure code: fine)."""
        try:
            self.table.create_table()
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code != 403:  # 403: least-privilege identity; the table is provisioned (Bicep)
                raise translate(exc, f"creating table {self.table.table_name}") from exc
        except AzureError as exc:
            raise translate(exc, f"creating table {self.table.table_name}") from exc

    def drop(self) -> None:
        """Delete the table and everything in it."""
        with sdk_errors(f"deleting table {self.table.table_name}"):
            self.table.delete_table()

    # -- writes ----------------------------------------------------------------

    def store(self, message: DelayedMessage) -> None:
        """Insert ``message``; the same message again is a no-op, another under a pending id is refused."""
        self._write([message], replace=False)

    def store_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Store many messages: validated first (nothing written on bad input), then transactions per partition.

        A message whose id is pending with other content raises ``MessageIdConflictError``; the partitions'
        transactions are separate, so messages of other partitions may be stored by then.
        """
        self._write(messages, replace=False)

    def _write(self, messages: Sequence[DelayedMessage], *, replace: bool) -> None:
        """``store_many``; with ``replace`` a pending message with the same id is replaced (unreadable rows)."""
        seen: set[str] = set()
        planned: list[tuple[DelayedMessage, dict[str, Any], dict[str, Any]]] = []
        for m in messages:
            if not isinstance(m, DelayedMessage):
                raise InvalidMessageError(f"expected DelayedMessage, got {type(m).__name__}")
            if m.message_id in seen:
                raise InvalidMessageError(f"message id {m.message_id!r} appears twice in one batch")
            seen.add(m.message_id)
            due, index = rows.to_entities(m, rows.shard_of(m.message_id, self.shards))
            planned.append((m, due, index))
        by_partition: dict[str, list[tuple[DelayedMessage, dict[str, Any], dict[str, Any]]]] = {}
        for item in planned:
            by_partition.setdefault(item[1]["PartitionKey"], []).append(item)
        for items in by_partition.values():
            for group in _groups(items, 2, lambda it: rows.entity_size(it[1])):
                ops: list[Operation] = []
                for _, due, index in group:
                    ops.append(("create", index, {}))
                    ops.append(("upsert", due, {"mode": UpdateMode.REPLACE}))
                try:
                    self.table.submit_transaction(ops)
                except TableTransactionError as exc:
                    if not is_status(exc, 409):
                        raise translate(exc, "storing delayed messages") from exc
                    for m, due, index in group:  # some ids already exist: one by one
                        self._store_one(m, due, index, replace)
                except AzureError as exc:
                    raise translate(exc, "storing delayed messages") from exc

    def _store_one(self, message: DelayedMessage, due: dict[str, Any], index: dict[str, Any], replace: bool) -> None:
        what = f"storing delayed message {message.message_id!r}"
        for _ in range(_CONFLICT_RETRIES):
            try:
                current = self.table.get_entity(index["PartitionKey"], index["RowKey"])
            except ResourceNotFoundError:
                try:
                    self.table.submit_transaction(
                        [("create", index, {}), ("upsert", due, {"mode": UpdateMode.REPLACE})]
                    )
                    return
                except TableTransactionError as exc:
                    if is_status(exc, 409):
                        continue
                    raise translate(exc, what) from exc
                except AzureError as exc:
                    raise translate(exc, what) from exc
            except AzureError as exc:
                raise translate(exc, what) from exc
            old_rk = str(current["DueRowKey"])
            if not replace and self._is_pending(message, index["PartitionKey"], old_rk):
                return  # the same message again
            ops: list[Operation] = [
                ("update", index, if_match(current.metadata["etag"], UpdateMode.REPLACE)),
                ("upsert", due, {"mode": UpdateMode.REPLACE}),
            ]
            if old_rk != due["RowKey"]:
                ops.append(("delete", {"PartitionKey": index["PartitionKey"], "RowKey": old_rk}, {}))
            try:
                self.table.submit_transaction(ops)
                return
            except TableTransactionError as exc:
                if is_status(exc, 404, 409, 412):
                    if is_status(exc, 404) and len(ops) == 3:
                        ops.pop()  # the old due row was already gone: just write the new one
                        try:
                            self.table.submit_transaction(ops)
                            return
                        except TableTransactionError:
                            continue
                    continue
                raise translate(exc, what) from exc
            except AzureError as exc:
                raise translate(exc, what) from exc
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    def _replace_unreadable(self, entity: Any, error: Exception, at: datetime) -> Any | None:
        """Swap an unreadable due row for a well-formed one bound for the error queue (``rows.unreadable_message``).

        Returns the new row when it is in the same partition (so this fetch hands it out), else ``None``.
        """
        pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
        message = rows.unreadable_message(entity, error, at)
        try:
            located = self._locate(message.message_id)
            if located is not None and located != (pk, rk):  # the id belongs to another row: do not touch it
                message = rows.unreadable_message({**entity, "MessageId": None}, error, at)
            self._write([message], replace=True)
            due, _ = rows.to_entities(message, rows.shard_of(message.message_id, self.shards))
            if (due["PartitionKey"], due["RowKey"]) != (pk, rk):
                self.table.delete_entity(
                    pk, rk, etag=entity.metadata["etag"], match_condition=MatchConditions.IfNotModified
                )
                self._delete_stale_index(pk, rk)
            return self.table.get_entity(pk, due["RowKey"]) if due["PartitionKey"] == pk else None
        except (DelayedDeliveryError, AzureError) as exc:
            _log.warning("could not replace an unreadable row", extra={lf.REASON: repr(exc), lf.SHARD: pk})
            return None

    def _is_pending(self, message: DelayedMessage, pk: str, due_rk: str) -> bool:
        """True when ``message`` is pending already; ``MessageIdConflictError`` when another one is under its id.

        False when the index row points at no due row (a stale index row, which the caller replaces).
        """
        try:
            pending = self.table.get_entity(pk, due_rk)
        except ResourceNotFoundError:
            return False
        except AzureError as exc:
            raise translate(exc, f"reading {message.message_id!r}") from exc
        try:
            same = same_message(rows.message_from_entity(pending), message)
        except (KeyError, ValueError, TypeError):
            same = False
        if not same:
            raise id_conflict(message.message_id)
        return True

    # -- operator helpers ------------------------------------------------------

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, claimed or not."""
        located = self._locate(message_id)
        if located is None:
            return None
        try:
            return rows.message_from_entity(self.table.get_entity(*located))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, f"reading {message_id!r}") from exc

    def count(self) -> int:
        """Number of stored messages (reads every index row: for tests and operators, not the hot path)."""
        total = 0
        for shard in range(self.shards):
            total += sum(
                1
                for _ in self._query(
                    "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                    {"pk": rows.partition_key(shard), "lo": rows.INDEX_PREFIX, "hi": "i`"},
                    select=["RowKey"],
                )
            )
        return total


def _groups(items: list[Any], ops_per_item: int, size: Any) -> Iterator[list[Any]]:
    """Split ``items`` into transaction-sized groups (≤ 100 operations, ≤ 3 MiB)."""
    group: list[Any] = []
    used = 0
    for item in items:
        n = size(item)
        too_many = (len(group) + 1) * ops_per_item > MAX_TRANSACTION_OPERATIONS
        if group and (too_many or used + n > _MAX_TRANSACTION_BYTES):
            yield group
            group, used = [], 0
        group.append(item)
        used += n
    if group:
        yield group
