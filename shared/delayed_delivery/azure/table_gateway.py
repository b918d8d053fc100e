"""The Azure table store's state and row plumbing: locating, querying and deleting a message's rows."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from ..errors import ConfigurationError
from ..naming import validate_azure_table_name
from ..validation import is_whole
from . import rows, transactions
from .sdk_errors import is_status, translate

__all__ = ["CLAIM", "Operation", "TableBase", "if_match"]

Operation = tuple[str, dict[str, Any], dict[str, Any]]
#: The due row's property holding the token of the claim that fetched it ("" or missing: none).
CLAIM = "ClaimToken"


class TableBase:
    """What every part of ``TableDelayedMessageStore`` shares: the table, its shards and the in-memory claims."""

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
        if not is_whole(shards, 1, rows.MAX_SHARDS):
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
        #: Where each fetched, unsettled message's due row is (partition, row key).
        self._claimed: dict[str, tuple[str, str]] = {}
        #: The claim token of each fetched, unsettled message (exclusive mode: the only record of the claim).
        self._tokens: dict[str, str] = {}
        #: Exclusive mode: when each handed-out, unsettled row was fetched (an in-memory claim).
        self._handed: dict[str, datetime] = {}
        self._lock = threading.Lock()

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

    def _delete_pair(self, message_id: str, pk: str, due_rk: str, etag: str | None = None) -> bool:
        """Delete the due row (with ``etag``: only unchanged) and its index row; False when gone or changed."""
        ops: list[Operation] = [
            ("delete", {"PartitionKey": pk, "RowKey": due_rk}, {} if etag is None else if_match(etag, None)),
            ("delete", {"PartitionKey": pk, "RowKey": rows.index_row_key(message_id)}, {}),
        ]
        try:
            transactions.submit(self.table, ops)
            return True
        except TableTransactionError as exc:
            if is_status(exc, 412):
                return False
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


def if_match(etag: str | None, mode: UpdateMode | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
    if mode is not None:
        kwargs["mode"] = mode
    return kwargs
