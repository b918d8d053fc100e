"""One view of the delayed-message table: its shards, writes and reads, the claiming fetch and its claims in memory.

Row design in ``rows.py``, storage primitives in ``table_gateway.py``; settling what a view fetched, and operators'
changes, in ``table_store.py`` (``TableDelayedMessageStore``, the store built on this view).

Settings: ``shards`` (partitions the rows are spread over; fixed for a table's lifetime),
``fetch_shards`` (which of them this instance claims from; default all), ``claim_timeout``.

Guarantees:

* ``fetch_due`` claims rows with ETag-conditional merges (batched in transactions of at most 100
  operations, one partition each; a transaction that loses a race falls back to one conditional
  update per row), so no two callers get the same row while its claim lasts. An unsettled claim
  expires after ``claim_timeout`` seconds and the row is fetched again: nothing is lost.
* Finding due rows reads only rows due by then (a RowKey range inside each shard's partition).
* Every fetch writes its claim (``ClaimToken`` and ``AvailableAt``) on the rows it returns, the lease holder's
  exclusive view too: that is the in-flight mark operators see.
* Every azure.core exception is re-raised as a core error (``TransientError`` for throttling and
  timeouts, ``ConfigurationError`` for a missing table, ``PermanentError`` otherwise).
"""

from __future__ import annotations

import heapq
import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from .. import logfields as lf
from ..clock import utc
from ..errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError
from ..model import DelayedMessage
from ..ports import ClaimedMessage
from . import rows
from .placed_ops import PlacedMessages
from .storage_queue import StorageQueueTransport
from .table_gateway import Operation, Pair, TableGateway

__all__ = ["CONFLICT_RETRIES", "TableView", "available_of"]

#: Attempts of an operation that lost a race with a concurrent writer, before it gives up (transient).
CONFLICT_RETRIES = 5

#: The store's logger (``table_store.py`` logs under the same name).
_log = logging.getLogger("delayed_delivery.azure.table_store")


class TableView:
    """Rows of one Azure table as one caller sees them: the shards it fetches from and the claims it holds."""

    def __init__(
        self,
        table: TableClient,
        *,
        shards: int = 1,
        fetch_shards: Iterable[int] | None = None,
        claim_timeout: float = 60.0,
        page_size: int = 1000,
        exclusive: bool = False,
        queues: StorageQueueTransport | None = None,
    ) -> None:
        self._rows = TableGateway(table, shards)
        #: Cancel and reschedule of messages placed ahead, by pop receipt (without ``queues`` they are refused).
        self._placed = PlacedMessages(self._rows, queues)
        if claim_timeout <= 0:
            raise ConfigurationError("claim_timeout must be positive")
        owned = tuple(range(shards)) if fetch_shards is None else tuple(sorted(set(fetch_shards)))
        if not owned or any(not 0 <= s < shards for s in owned):
            raise ConfigurationError(f"fetch_shards must be a non-empty subset of 0..{shards - 1}, got {owned}")
        self.fetch_shards = owned
        self.claim_timeout = timedelta(seconds=claim_timeout)
        self.page_size = max(1, min(1000, page_size))
        #: Only this object fetches from ``fetch_shards`` (its caller holds their blob leases): its fetches skip
        #: the rows it has handed out and not settled, without reading them again.
        self.exclusive = exclusive
        #: Each fetched, unsettled message's due row as its claim left it (where it is, the claim's ETag).
        self._held: dict[str, rows.DueRow] = {}
        #: The claim token of each fetched, unsettled message.
        self._tokens: dict[str, str] = {}
        #: Exclusive mode: when each handed-out, unsettled row was fetched.
        self._handed: dict[str, datetime] = {}
        self._lock = threading.Lock()

    @property
    def table(self) -> TableClient:
        """The table client the rows are in."""
        return self._rows.table

    @property
    def placed_queues(self) -> StorageQueueTransport | None:
        """The queue client that cancels and reschedules placed messages (None: they are refused)."""
        return self._placed.queues

    @property
    def shards(self) -> int:
        """The number of partitions the rows are spread over."""
        return self._rows.shards

    def forget_claims(self) -> None:
        """Forget the rows fetched and never settled (their claims in the table expire on their own)."""
        with self._lock:
            self._held.clear()
            self._handed.clear()
            self._tokens.clear()

    def release_claims(self) -> int:
        """Give back the rows fetched and never settled (the dispatcher stopped): fetchable again at once.

        Each release applies only while the row is as this view's claim left it, so a row another dispatcher
        claimed since, or an operator changed, is left alone. A failure is logged: the claims then expire.
        How many rows were released.
        """
        with self._lock:
            unsettled = list(self._held.values())
        self.forget_claims()
        by_partition: dict[str, list[list[Operation]]] = {}
        for row in unsettled:
            if row.etag:
                by_partition.setdefault(row.partition_key, []).append(self._rows.release_ops(row))
        released = 0
        try:
            for pk, changes in by_partition.items():
                released += sum(self._rows.commit_each(pk, changes))
        except DelayedDeliveryError as exc:
            _log.warning("could not give back claimed rows; their claims expire", extra={lf.REASON: repr(exc)})
        return released

    # -- infrastructure ------------------------------------------------------

    def setup_infrastructure(self) -> None:
        """Create the table if missing (a 403 means it is provisioned by infrastructure code: fine)."""
        self._rows.create_table()

    def drop(self) -> None:
        """Delete the table and everything in it."""
        self._rows.delete_table()

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
        planned: list[Pair] = []
        for m in messages:
            if not isinstance(m, DelayedMessage):
                raise InvalidMessageError(f"expected DelayedMessage, got {type(m).__name__}")
            if m.message_id in seen:
                raise InvalidMessageError(f"message id {m.message_id!r} appears twice in one batch")
            seen.add(m.message_id)
            due, index = rows.to_entities(m, rows.shard_of(m.message_id, self.shards))
            planned.append((m, due, index))
        self._rows.write(planned, replace=replace)

    def _replace_unreadable(self, entity: Any, error: Exception, at: datetime) -> Any | None:
        """Swap an unreadable due row for a well-formed one bound for the error queue (``rows.unreadable_message``).

        Returns the new row when it is in the same partition (so this fetch hands it out), else ``None``.
        """
        pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
        message = rows.unreadable_message(entity, error, at)
        try:
            located = self._rows.locate(message.message_id)
            if located is not None and located != (pk, rk):  # the id belongs to another row: do not touch it
                message = rows.unreadable_message({**entity, "MessageId": None}, error, at)
            self._write([message], replace=True)
            due, _ = rows.to_entities(message, rows.shard_of(message.message_id, self.shards))
            if (due["PartitionKey"], due["RowKey"]) != (pk, rk):
                self._rows.delete_replaced(entity)
            return self._rows.get(pk, due["RowKey"]) if due["PartitionKey"] == pk else None
        except (DelayedDeliveryError, AzureError) as exc:
            _log.warning("could not replace an unreadable row", extra={lf.REASON: repr(exc), lf.SHARD: pk})
            return None

    # -- reads and claims --------------------------------------------------------

    def next_due(self) -> datetime | None:
        """Earliest ``AvailableAt`` over the owned shards (reads from the head until the answer is certain)."""
        best: str | None = None
        with self._lock:
            handed = {(self._held[m].partition_key, self._held[m].row_key) for m in self._handed if m in self._held}
        for shard in self.fetch_shards:
            pk = rows.partition_key(shard)
            for entity in self._rows.query(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                {"pk": pk, "lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
                select=["RowKey", "AvailableAt"],
                page_size=100,
            ):
                due = available_of(str(entity["RowKey"]))
                if best is not None and due >= best:
                    break  # every later row is due (hence available) no earlier than `best`
                if (pk, str(entity["RowKey"])) in handed:
                    continue  # fetched by this exclusive view and not settled yet
                available = entity.get("AvailableAt")
                if available == rows.PLACED_KEY:
                    continue  # on its queue already (placement.py)
                if not isinstance(available, str) or len(available) != 20 or not available.isdigit():
                    continue  # garbage: fetch_due replaces the row once it is due
                if best is None or available < best:
                    best = available
        return None if best is None else rows.from_due_key(best)

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Claim up to ``limit`` unclaimed rows due at ``at``, earliest first, across the owned shards.

        An exclusive view (the lease holder) starts each shard's query after the rows it has handed out and not
        settled, and skips them, so they are not read again while their removal runs beside the next fetch.
        """
        if limit < 1:
            return []
        at = utc(at)
        handed, after = self._in_hand(at)
        claim_until = rows.due_key(at + self.claim_timeout)
        token = uuid.uuid4().hex
        claimed: list[rows.DueRow] = []
        for _ in range(CONFLICT_RETRIES * 4):
            need = limit - len(claimed)
            candidates = heapq.merge(
                *(self._due_rows(s, at, need, after.get(rows.partition_key(s))) for s in self.fetch_shards)
            )
            wanted: list[rows.DueRow] = []
            for _, row in candidates:
                if row.message.message_id in handed:
                    continue
                wanted.append(row)
                if len(wanted) >= need:
                    break
            if not wanted:
                break
            # the Sending mark goes on with the claim, before any put; an earlier claim's stays (its copy may arrive)
            marks = {r.row_key: rows.sending_mark(token) for r in wanted if not r.sending}
            won = self._rows.claim(wanted, claim_until, token, marks)
            claimed.extend(won)
            if len(won) == len(wanted):
                break
            # lost some races: rows claimed by others no longer match the query, so look again
        claimed.sort(key=lambda r: (r.row_key[: len(rows.DUE_PREFIX) + 20], r.message.message_id))
        with self._lock:
            for row in claimed:
                self._held[row.message.message_id] = row
                self._tokens[row.message.message_id] = token
                if self.exclusive:
                    self._handed[row.message.message_id] = at
        until = at + self.claim_timeout
        return [ClaimedMessage.of(row.message, token, row.slot, until) for row in claimed]

    def _in_hand(self, at: datetime) -> tuple[set[str], dict[str, str]]:
        """Exclusive view: the ids handed out and not settled (older than ``claim_timeout``: forgotten), and per
        partition the last of their row keys (the next query starts after it). Otherwise nothing."""
        if not self.exclusive:
            return set(), {}
        with self._lock:
            expired = [mid for mid, when in self._handed.items() if when + self.claim_timeout <= at]
            for mid in expired:
                self._handed.pop(mid, None)
                self._held.pop(mid, None)
            handed = {mid: self._held[mid] for mid in self._handed if mid in self._held}
        after: dict[str, str] = {}
        for row in handed.values():
            after[row.partition_key] = max(after.get(row.partition_key, row.row_key), row.row_key)
        return set(handed), after

    def _due_rows(
        self, shard: int, at: datetime, limit: int, after: str | None = None
    ) -> Iterator[tuple[str, rows.DueRow]]:
        pk = rows.partition_key(shard)
        lo, hi = rows.due_range(at)
        now = rows.due_key(at)
        for entity in self._rows.query(
            f"PartitionKey eq @pk and RowKey {'ge' if after is None else 'gt'} @lo and RowKey lt @hi "
            "and AvailableAt le @now",
            {"pk": pk, "lo": lo if after is None else after, "hi": hi, "now": now},
            page_size=min(limit, self.page_size),
        ):
            try:
                message = rows.message_from_entity(entity)
            except (KeyError, ValueError, TypeError) as exc:  # a garbage row must not block the rest
                entity = self._replace_unreadable(entity, exc, at)
                if entity is None:
                    continue
                message = rows.message_from_entity(entity)
            row = rows.DueRow(
                partition_key=pk,
                row_key=str(entity["RowKey"]),
                etag=str(entity.metadata["etag"]),
                available_at=str(entity["AvailableAt"]),
                message=message,
                slot=rows.deferred_slot(entity),
                sending=str(entity.get(rows.SENDING) or ""),
            )
            yield row.row_key, row

    def _settled(self, message_ids: Iterable[str], claim: str | None = None) -> None:
        """Drop the in-memory claims of settled messages (with ``claim``: only if it is still theirs)."""
        with self._lock:
            for mid in message_ids:
                if claim is not None and self._tokens.get(mid) != claim:
                    continue
                self._held.pop(mid, None)
                self._handed.pop(mid, None)
                self._tokens.pop(mid, None)

    # -- operator helpers ------------------------------------------------------

    def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message with this id, claimed or not."""
        located = self._rows.locate(message_id)
        if located is None:
            return None
        entity = self._rows.read(*located, f"reading {message_id!r}")
        return None if entity is None else rows.message_from_entity(entity)

    def count(self) -> int:
        """Number of stored messages (reads every index row: for tests and operators, not the hot path)."""
        return self._rows.count_messages()


def available_of(rk: str) -> str:
    """The due-time key inside a due row's RowKey."""
    return rk[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]
