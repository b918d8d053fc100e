"""The Azure delays table as a migration target (``azure-table:TABLE``): full entity-group transactions, several in
flight (docs/pipelines.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigurationError
from ..model import DelayedMessage

__all__ = ["AzureTableTarget"]

#: Keep a transaction's payload well under the service's 4 MiB.
_MAX_TRANSACTION_BYTES = 3 * 1024 * 1024


class AzureTableTarget:
    """The Azure delays table, written for bulk: full entity-group transactions, several in flight.

    Each message becomes its due row and index row (``rows.to_entities``) in its shard's partition.
    ``write`` buffers them per partition and sends a transaction as soon as a partition holds 50
    messages (100 operations, at most 3 MiB); ``flush`` sends the rest and waits for every
    transaction, so one batch's writes are all acknowledged before the ledger calls it completed.
    A transaction creates the index rows and upserts the due rows, so a first write never reads.
    When an id is already there (a rerun, or a message migrated twice) the transaction fails as a
    whole and that group goes through the store's ``store_many``, which replaces each message and
    moves its due row when the due time changed: a rerun overwrites, never duplicates. Up to
    ``in_flight`` transactions run at once on one pooled HTTP session.
    """

    can_undo = True
    checkpoint_rows = 0
    #: Messages per transaction: two operations each (index row, due row), 100 at most.
    GROUP = 50

    def __init__(self, connection_string: str, table: str, *, shards: int = 1, in_flight: int = 4) -> None:
        from azure.data.tables import TableServiceClient

        from ..azure.config import http_transport
        from ..azure.table_store import TableDelayedMessageStore

        if in_flight < 1:
            raise ConfigurationError(f"azure-table in_flight must be at least 1, got {in_flight}")
        service = TableServiceClient.from_connection_string(connection_string, transport=http_transport(in_flight + 2))
        self.table = service.get_table_client(table)
        self.store = TableDelayedMessageStore(self.table, shards=shards)
        self.shards = shards
        self.in_flight = in_flight
        self._pool: Any = None
        self._running: list[Any] = []
        self._pending: dict[str, dict[str, tuple[DelayedMessage, dict[str, Any], dict[str, Any]]]] = {}
        self._pending_bytes: dict[str, int] = {}
        #: Transactions sent and groups that had to be replaced one by one (counters for benchmarks).
        self.transactions = 0
        self.conflicts = 0

    def prepare(self) -> None:
        """Create the table if missing; its recorded shard count must be the target's (recorded now if it has none)."""
        from ..azure.layout import table_layout

        self.store.setup_infrastructure()
        recorded = table_layout(self.table, self.shards, configured=False).shards
        if recorded != self.shards:
            name = self.table.table_name
            raise ConfigurationError(
                f"the delays table {name!r} records {recorded} shard(s): give the target as "
                f"azure-table:{name}?shards={recorded}"
            )

    def write(self, messages: Sequence[DelayedMessage]) -> Sequence[tuple[str, str]]:
        """Buffer the messages per partition, sending every full transaction; refuse what cannot fit an entity."""
        from ..azure import rows
        from ..errors import InvalidMessageError

        refused: list[tuple[str, str]] = []
        for m in messages:
            try:
                due, index = rows.to_entities(m, rows.shard_of(m.message_id, self.shards))
            except InvalidMessageError as exc:
                refused.append((m.message_id, str(exc)))
                continue
            pk = due["PartitionKey"]
            size = rows.entity_size(due) + rows.entity_size(index)
            pending = self._pending.setdefault(pk, {})
            if m.message_id not in pending and (
                len(pending) >= self.GROUP or self._pending_bytes.get(pk, 0) + size > _MAX_TRANSACTION_BYTES
            ):
                self._send(pk)
                pending = self._pending.setdefault(pk, {})
            pending[m.message_id] = (m, due, index)  # a repeated id replaces its buffered row
            self._pending_bytes[pk] = self._pending_bytes.get(pk, 0) + size
        return refused

    def flush(self) -> None:
        """Send every buffered message and wait until all transactions are acknowledged."""
        for pk in list(self._pending):
            self._send(pk)
        running, self._running = self._running, []
        for future in running:
            future.result()  # re-raises a failed transaction

    def _send(self, pk: str) -> None:
        group = list(self._pending.pop(pk, {}).values())
        self._pending_bytes.pop(pk, None)
        if not group:
            return
        if self.in_flight == 1:
            self._submit(group)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="azure-migrate")
        self._running.append(self._pool.submit(self._submit, group))
        if len(self._running) >= 2 * self.in_flight:  # bound the queue: wait for the oldest
            self._running.pop(0).result()

    def _submit(self, group: list[tuple[DelayedMessage, dict[str, Any], dict[str, Any]]]) -> None:
        from azure.core.exceptions import AzureError
        from azure.data.tables import TableTransactionError, UpdateMode

        from ..azure import transactions
        from ..azure.sdk_errors import is_status, translate

        ops: list[Any] = []
        for _, due, index in group:
            ops.append(("create", index, {}))
            ops.append(("upsert", due, {"mode": UpdateMode.REPLACE}))
        try:
            transactions.submit(self.table, ops)  # a lean body; anything but a clean commit: the SDK decides
            self.transactions += 1
        except TableTransactionError as exc:
            if not is_status(exc, 409):
                raise translate(exc, "migrating delayed messages") from exc
            self.conflicts += 1  # some ids are already there: let the store replace them
            self.store.store_many([m for m, _, _ in group])
        except AzureError as exc:
            raise translate(exc, "migrating delayed messages") from exc

    def undo(self, message_ids: Sequence[str]) -> int:
        """Remove the ids; count those that were still there."""
        return sum(1 for removed in self.store.remove_many(message_ids) if removed) if message_ids else 0

    def close(self) -> None:
        """Stop the sender threads and close the HTTP session (what was never flushed is not sent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.table.close()
