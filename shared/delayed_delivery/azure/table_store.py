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

import heapq
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableServiceClient, TableTransactionError, UpdateMode

from .. import logfields as lf
from ..clock import utc
from ..errors import ConfigurationError, DelayedDeliveryError, InvalidMessageError, TransientError
from ..model import DelayedMessage
from ..naming import validate_azure_table_name
from ..ports import DelayedMessageStore
from . import rows, transactions
from .sdk_errors import is_status, sdk_errors, translate

__all__ = ["MAX_TRANSACTION_OPERATIONS", "TableDelayedMessageStore"]

#: The Table service's limit (and Azurite garbles 101-operation batches instead of refusing them).
MAX_TRANSACTION_OPERATIONS = 100
#: Keep transaction payloads well under the service's 4 MiB.
_MAX_TRANSACTION_BYTES = 3 * 1024 * 1024
_CONFLICT_RETRIES = 5

Operation = tuple[str, dict[str, Any], dict[str, Any]]

_log = logging.getLogger("delayed_delivery.azure.table_store")


class TableDelayedMessageStore(DelayedMessageStore):
    """The ``DelayedMessageStore`` on one Azure table (reschedulable, batch-removing, with infrastructure)."""

    def __init__(
        self,
        table: TableClient,
        *,
        shards: int = 1,
        fetch_shards: Iterable[int] | None = None,
        claim_timeout: float = 60.0,
        page_size: int = 1000,
        exclusive: bool = False,
    ) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= rows.MAX_SHARDS:
            raise ConfigurationError(f"shards must be an integer from 1 to {rows.MAX_SHARDS}, got {shards!r}")
        if claim_timeout <= 0:
            raise ConfigurationError("claim_timeout must be positive")
        validate_azure_table_name(table.table_name)
        self.table = table
        self.shards = shards
        owned = tuple(range(shards)) if fetch_shards is None else tuple(sorted(set(fetch_shards)))
        if not owned or any(not 0 <= s < shards for s in owned):
            raise ConfigurationError(f"fetch_shards must be a non-empty subset of 0..{shards - 1}, got {owned}")
        self.fetch_shards = owned
        self.claim_timeout = timedelta(seconds=claim_timeout)
        self.page_size = max(1, min(1000, page_size))
        #: Only this object fetches from ``fetch_shards`` (its caller holds their blob leases): no claim writes.
        self.exclusive = exclusive
        self._claimed: dict[str, tuple[str, str]] = {}
        #: Exclusive mode: when each handed-out, unsettled row was fetched (an in-memory claim).
        self._handed: dict[str, datetime] = {}
        self._lock = threading.Lock()

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
        """Insert ``message`` or replace the message with the same id (moving its due row atomically)."""
        self.store_many([message])

    def store_many(self, messages: Sequence[DelayedMessage]) -> None:
        """Store many messages: validated first (nothing written on bad input), then transactions per partition."""
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
                    for m, due, index in group:  # some ids already exist: replace them one by one
                        self._store_one(m, due, index)
                except AzureError as exc:
                    raise translate(exc, "storing delayed messages") from exc

    def _store_one(self, message: DelayedMessage, due: dict[str, Any], index: dict[str, Any]) -> None:
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
            ops: list[Operation] = [
                ("update", index, _if_match(current.metadata["etag"], UpdateMode.REPLACE)),
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

    def remove(self, message_id: str) -> bool:
        """Delete the message (due row and index row together); False when it was already gone."""
        with self._lock:
            cached = self._claimed.get(message_id)
        try:
            if cached is not None and self._delete_pair(message_id, cached[0], cached[1]):
                return True
            located = self._locate(message_id)
            if located is None:
                return False
            return self._delete_pair(message_id, *located)
        finally:
            self._settled([message_id])

    def _settled(self, message_ids: Iterable[str]) -> None:
        """Drop the claims of settled messages (only once their rows are gone: an exclusive fetch may be running)."""
        with self._lock:
            for mid in message_ids:
                self._claimed.pop(mid, None)
                self._handed.pop(mid, None)

    def remove_many(self, message_ids: Sequence[str]) -> Sequence[bool]:
        """Delete many messages in transactions of at most 100 operations per partition; one flag per id."""
        result = dict.fromkeys(message_ids, False)
        known: dict[str, list[tuple[str, str]]] = {}
        unknown: list[str] = []
        with self._lock:
            for mid in dict.fromkeys(message_ids):
                cached = self._claimed.get(mid)
                if cached is None:
                    unknown.append(mid)
                else:
                    known.setdefault(cached[0], []).append((mid, cached[1]))
        chunks = [
            (pk, pairs[start : start + MAX_TRANSACTION_OPERATIONS // 2])
            for pk, pairs in known.items()
            for start in range(0, len(pairs), MAX_TRANSACTION_OPERATIONS // 2)
        ]

        def delete_chunk(job: tuple[str, list[tuple[str, str]]]) -> tuple[list[str], bool]:
            pk, chunk = job
            ops: list[Operation] = []
            for mid, rk in chunk:
                ops.append(("delete", {"PartitionKey": pk, "RowKey": rk}, {}))
                ops.append(("delete", {"PartitionKey": pk, "RowKey": rows.index_row_key(mid)}, {}))
            try:
                transactions.submit(self.table, ops)
            except TableTransactionError:  # someone else removed one (or an index row is missing)
                with self._lock:  # settle one by one below, starting from the rows known here
                    self._claimed.update({mid: (pk, rk) for mid, rk in chunk})
                return [mid for mid, _ in chunk], False
            except AzureError as exc:
                raise translate(exc, "removing dispatched messages") from exc
            return [mid for mid, _ in chunk], True

        if len(chunks) > 1:  # independent transactions: run them side by side
            with ThreadPoolExecutor(min(4, len(chunks))) as pool:
                outcomes = list(pool.map(delete_chunk, chunks))
        else:
            outcomes = [delete_chunk(job) for job in chunks]
        for mids, ok in outcomes:
            if ok:
                result.update(dict.fromkeys(mids, True))
                self._settled(mids)
            else:
                unknown.extend(mids)
        for mid in unknown:
            result[mid] = self.remove(mid)
        return [result[mid] for mid in message_ids]

    def increment_failure_count(self, message_id: str) -> bool:
        """Count one failed delivery and make the row fetchable again at its due time."""
        what = f"counting a failure of {message_id!r}"
        for _ in range(_CONFLICT_RETRIES):
            located = self._locate(message_id) or self._restore_index(message_id)
            if located is None:
                return False
            pk, rk = located
            try:
                row = self.table.get_entity(pk, rk, select=["FailureCount"])
                patch = {
                    "PartitionKey": pk,
                    "RowKey": rk,
                    "FailureCount": int(row.get("FailureCount", 0)) + 1,
                    "AvailableAt": rk[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20],
                }
                self.table.update_entity(patch, **_if_match(row.metadata["etag"], UpdateMode.MERGE))
                with self._lock:
                    self._claimed.pop(message_id, None)  # the claim is released
                    self._handed.pop(message_id, None)
                return True
            except (ResourceNotFoundError, ResourceModifiedError):
                continue
            except AzureError as exc:
                raise translate(exc, what) from exc
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        """Move the message to ``due_at`` and release its claim: new row in, old row out, one transaction."""
        due_at = utc(due_at)
        what = f"rescheduling {message_id!r}"
        for _ in range(_CONFLICT_RETRIES):
            pk = rows.partition_key(rows.shard_of(message_id, self.shards))
            irk = rows.index_row_key(message_id)
            try:
                index = self.table.get_entity(pk, irk)
                old = self.table.get_entity(pk, str(index["DueRowKey"]))
            except ResourceNotFoundError:
                if self._locate(message_id) is None:
                    return False
                continue
            except AzureError as exc:
                raise translate(exc, what) from exc
            moved = rows.to_entities(
                _with(rows.message_from_entity(old), due_at=due_at), rows.shard_of(message_id, self.shards)
            )
            new_due, new_index = moved
            ops: list[Operation] = []
            if new_due["RowKey"] == old["RowKey"]:
                patch = {"PartitionKey": pk, "RowKey": old["RowKey"], "AvailableAt": rows.due_key(due_at)}
                ops.append(("update", patch, _if_match(old.metadata["etag"], UpdateMode.MERGE)))
            else:
                ops.append(("create", new_due, {}))
                ops.append(("update", new_index, _if_match(index.metadata["etag"], UpdateMode.REPLACE)))
                ops.append(("delete", dict(old), _if_match(old.metadata["etag"], None)))
            try:
                self.table.submit_transaction(ops)
            except TableTransactionError as exc:
                if is_status(exc, 404, 409, 412):
                    continue
                raise translate(exc, what) from exc
            except AzureError as exc:
                raise translate(exc, what) from exc
            with self._lock:
                self._claimed.pop(message_id, None)
                self._handed.pop(message_id, None)
            return True
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    # -- reads and claims ------------------------------------------------------

    def next_due(self) -> datetime | None:
        """Earliest ``AvailableAt`` over the owned shards (reads from the head until the answer is certain)."""
        best: str | None = None
        with self._lock:
            handed = {self._claimed[mid] for mid in self._handed if mid in self._claimed}
        for shard in self.fetch_shards:
            pk = rows.partition_key(shard)
            for entity in self._query(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                {"pk": pk, "lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
                select=["RowKey", "AvailableAt"],
                page_size=100,
            ):
                due = str(entity["RowKey"])[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]
                if best is not None and due >= best:
                    break  # every later row is due (hence available) no earlier than `best`
                if (pk, str(entity["RowKey"])) in handed:
                    continue  # fetched by this exclusive view and not settled yet
                available = entity.get("AvailableAt")
                if not isinstance(available, str) or len(available) != 20 or not available.isdigit():
                    continue  # garbage: fetch_due replaces the row once it is due
                if best is None or available < best:
                    best = available
        return None if best is None else rows.from_due_key(best)

    def fetch_due(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """Claim up to ``limit`` unclaimed rows due at ``at``, earliest first, across the owned shards."""
        if limit < 1:
            return []
        at = utc(at)
        if self.exclusive:
            return self._fetch_exclusive(at, limit)
        claim_until = rows.due_key(at + self.claim_timeout)
        claimed: list[rows.DueRow] = []
        for _ in range(_CONFLICT_RETRIES * 4):
            need = limit - len(claimed)
            candidates = heapq.merge(*(self._due_rows(shard, at, need) for shard in self.fetch_shards))
            wanted: list[rows.DueRow] = []
            for _, row in candidates:
                wanted.append(row)
                if len(wanted) >= need:
                    break
            if not wanted:
                break
            won = self._claim(wanted, claim_until)
            claimed.extend(won)
            if len(won) == len(wanted):
                break
            # lost some races: rows claimed by others no longer match the query, so look again
        claimed.sort(key=lambda r: (r.row_key[: len(rows.DUE_PREFIX) + 20], r.message.message_id))
        with self._lock:
            for row in claimed:
                self._claimed[row.message.message_id] = (row.partition_key, row.row_key)
        return [row.message for row in claimed]

    def _fetch_exclusive(self, at: datetime, limit: int) -> Sequence[DelayedMessage]:
        """``fetch_due`` for the lease holder: unclaimed due rows it has not handed out already, no writes.

        Rows handed out and not yet settled (e.g. while their removal runs beside the next fetch) are claimed
        in memory for ``claim_timeout``; each shard's query starts after the last of them, so they are not
        read again. A crash loses nothing: the rows stay in the table, unclaimed, for the next lease holder.
        """
        with self._lock:
            expired = [mid for mid, when in self._handed.items() if when + self.claim_timeout <= at]
            for mid in expired:
                self._handed.pop(mid, None)
                self._claimed.pop(mid, None)
            handed = {mid: self._claimed[mid] for mid in self._handed if mid in self._claimed}
        after: dict[str, str] = {}
        for pk, rk in handed.values():
            after[pk] = max(after.get(pk, rk), rk)
        candidates = heapq.merge(
            *(self._due_rows(s, at, limit, after.get(rows.partition_key(s))) for s in self.fetch_shards)
        )
        taken: list[rows.DueRow] = []
        for _, row in candidates:
            if row.message.message_id in handed:
                continue
            taken.append(row)
            if len(taken) >= limit:
                break
        with self._lock:
            for row in taken:
                self._claimed[row.message.message_id] = (row.partition_key, row.row_key)
                self._handed[row.message.message_id] = at
        return [row.message for row in taken]

    def _due_rows(
        self, shard: int, at: datetime, limit: int, after: str | None = None
    ) -> Iterator[tuple[str, rows.DueRow]]:
        pk = rows.partition_key(shard)
        lo, hi = rows.due_range(at)
        now = rows.due_key(at)
        for entity in self._query(
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
            )
            yield row.row_key, row

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
            self.store(message)
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

    def _claim(self, wanted: list[rows.DueRow], claim_until: str) -> list[rows.DueRow]:
        claimed: list[rows.DueRow] = []
        by_partition: dict[str, list[rows.DueRow]] = {}
        for row in wanted:
            by_partition.setdefault(row.partition_key, []).append(row)
        for pk, group in by_partition.items():
            for start in range(0, len(group), MAX_TRANSACTION_OPERATIONS):
                chunk = group[start : start + MAX_TRANSACTION_OPERATIONS]
                ops: list[Operation] = [
                    (
                        "update",
                        {"PartitionKey": pk, "RowKey": r.row_key, "AvailableAt": claim_until},
                        _if_match(r.etag, UpdateMode.MERGE),
                    )
                    for r in chunk
                ]
                try:
                    if len(ops) > 1:
                        transactions.submit(self.table, ops)
                        claimed.extend(chunk)
                        continue
                except TableTransactionError:
                    pass  # another dispatcher claimed one of them: claim the rest one by one
                except AzureError as exc:
                    raise translate(exc, "claiming due messages") from exc
                for r, (_, patch, kwargs) in zip(chunk, ops, strict=True):
                    try:
                        self.table.update_entity(patch, **kwargs)
                    except (ResourceModifiedError, ResourceNotFoundError):
                        continue
                    except AzureError as exc:
                        if is_status(exc, 409, 412):
                            continue
                        raise translate(exc, "claiming a due message") from exc
                    claimed.append(r)
        claimed.sort(key=lambda r: (r.row_key[: len(rows.DUE_PREFIX) + 20], r.message.message_id))
        return claimed

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

    # -- internals ----------------------------------------------------------------

    def _query(
        self, query: str, parameters: dict[str, Any], *, select: list[str] | None = None, page_size: int = 1000
    ) -> Iterator[Any]:
        """Entities matching ``query``, following continuation tokens across pages (empty pages included)."""
        what = f"querying table {self.table.table_name}"
        try:
            pages = self.table.query_entities(
                query, parameters=parameters, select=select, results_per_page=page_size
            ).by_page()
            for page in pages:
                yield from page
        except AzureError as exc:
            raise translate(exc, what) from exc

    def _locate(self, message_id: str) -> tuple[str, str] | None:
        pk = rows.partition_key(rows.shard_of(message_id, self.shards))
        try:
            index = self.table.get_entity(pk, rows.index_row_key(message_id))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, f"looking up {message_id!r}") from exc
        return pk, str(index["DueRowKey"])

    def _delete_stale_index(self, pk: str, due_rk: str) -> None:
        """Delete the index row still pointing at a replaced garbage row (found by the id hash in its RowKey)."""
        index_rk = rows.INDEX_PREFIX + due_rk.rpartition("_")[2]
        try:
            index = self.table.get_entity(pk, index_rk)
            if index.get("DueRowKey") == due_rk:
                self.table.delete_entity(
                    pk, index_rk, etag=index.metadata["etag"], match_condition=MatchConditions.IfNotModified
                )
        except (ResourceNotFoundError, ResourceModifiedError):
            pass

    def _restore_index(self, message_id: str) -> tuple[str, str] | None:
        """Write the missing index row of a claimed due row (a garbage row), so it can be settled by id."""
        with self._lock:
            cached = self._claimed.get(message_id)
        if cached is None or cached[0] != rows.partition_key(rows.shard_of(message_id, self.shards)):
            return None
        index = {"PartitionKey": cached[0], "RowKey": rows.index_row_key(message_id), "DueRowKey": cached[1]}
        try:
            self.table.get_entity(cached[0], cached[1], select=["RowKey"])
            self.table.create_entity(index)
        except (ResourceNotFoundError, ResourceExistsError):
            return self._locate(message_id)
        except AzureError as exc:
            raise translate(exc, f"restoring the index row of {message_id!r}") from exc
        return cached

    def _delete_pair(self, message_id: str, pk: str, due_rk: str) -> bool:
        ops: list[Operation] = [
            ("delete", {"PartitionKey": pk, "RowKey": due_rk}, {}),
            ("delete", {"PartitionKey": pk, "RowKey": rows.index_row_key(message_id)}, {}),
        ]
        try:
            transactions.submit(self.table, ops)
            return True
        except TableTransactionError as exc:
            if is_status(exc, 404):
                return self._delete_orphan(message_id, pk, due_rk)
            raise translate(exc, f"removing {message_id!r}") from exc
        except AzureError as exc:
            raise translate(exc, f"removing {message_id!r}") from exc

    def _delete_orphan(self, message_id: str, pk: str, due_rk: str) -> bool:
        """Delete a due row whose index row is missing (a garbage row); False when the due row is gone too."""
        try:
            row = self.table.get_entity(pk, due_rk, select=["RowKey"])
            self.table.delete_entity(
                pk, due_rk, etag=row.metadata["etag"], match_condition=MatchConditions.IfNotModified
            )
            self._delete_stale_index(pk, due_rk)  # the row's own index, if its MessageId was rewritten
            return True
        except (ResourceNotFoundError, ResourceModifiedError):
            return False
        except AzureError as exc:
            raise translate(exc, f"removing {message_id!r}") from exc


def _if_match(etag: str | None, mode: UpdateMode | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
    if mode is not None:
        kwargs["mode"] = mode
    return kwargs


def _with(message: DelayedMessage, *, due_at: datetime) -> DelayedMessage:
    return DelayedMessage(
        message.message_id, message.destination, message.body, due_at, message.headers, message.failure_count
    )


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
