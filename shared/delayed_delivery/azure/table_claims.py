"""The Azure table store's reads and claims: finding due rows and claiming them (see ``table_store``)."""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from ..clock import utc
from ..model import DelayedMessage
from ..ports import ClaimedMessage
from . import rows, transactions
from .sdk_errors import is_status, translate
from .table_gateway import CLAIM, Operation, TableBase, if_match

__all__ = ["MAX_TRANSACTION_OPERATIONS", "TableClaims"]

#: The Table service's limit (and Azurite garbles 101-operation batches instead of refusing them).
MAX_TRANSACTION_OPERATIONS = 100
_CONFLICT_RETRIES = 5


class TableClaims(TableBase):
    """``next_due`` and ``fetch_due`` over the owned shards."""

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
        token = uuid.uuid4().hex
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
            won = self._claim(wanted, claim_until, token)
            claimed.extend(won)
            if len(won) == len(wanted):
                break
            # lost some races: rows claimed by others no longer match the query, so look again
        claimed.sort(key=lambda r: (r.row_key[: len(rows.DUE_PREFIX) + 20], r.message.message_id))
        with self._lock:
            for row in claimed:
                self._claimed[row.message.message_id] = (row.partition_key, row.row_key)
                self._tokens[row.message.message_id] = token
        return [ClaimedMessage.of(row.message, token) for row in claimed]

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
        token = uuid.uuid4().hex
        with self._lock:
            for row in taken:
                self._claimed[row.message.message_id] = (row.partition_key, row.row_key)
                self._handed[row.message.message_id] = at
                self._tokens[row.message.message_id] = token
        return [ClaimedMessage.of(row.message, token) for row in taken]

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

    def _claim(self, wanted: list[rows.DueRow], claim_until: str, token: str) -> list[rows.DueRow]:
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
                        {"PartitionKey": pk, "RowKey": r.row_key, "AvailableAt": claim_until, CLAIM: token},
                        if_match(r.etag, UpdateMode.MERGE),
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

    def _replace_unreadable(self, entity: Any, error: Exception, at: datetime) -> Any | None:
        """Swap an unreadable due row for a well-formed one bound for the error queue (in ``table_store``)."""
        raise NotImplementedError
