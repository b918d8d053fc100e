"""The Azure table store's storage primitives: rows, transactions, and a message's pair (write, locate, delete).

``TableGateway`` knows the row design (``rows.py``) and the Table service (ETag-conditional writes, entity-group
transactions, SDK errors turned into core errors) and keeps no state between calls. What to fetch and claim, and
the in-memory claims, belong to ``TableView`` (``table_view``); what to settle to ``TableDelayedMessageStore``
(``table_store``, built on the view).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from ..errors import ConfigurationError, TransientError
from ..model import DelayedMessage
from ..naming import validate_azure_table_name
from ..ports import id_conflict, same_message
from ..validation import is_whole
from . import rows, transactions
from .sdk_errors import is_status, sdk_errors, translate

__all__ = [
    "CLAIM",
    "MAX_TRANSACTION_BYTES",
    "MAX_TRANSACTION_OPERATIONS",
    "Operation",
    "Pair",
    "TableGateway",
]

Operation = transactions.Operation
#: A message and its two rows (``rows.to_entities``): the due row and the index row.
Pair = tuple[DelayedMessage, dict[str, Any], dict[str, Any]]
#: The due row's property holding the token of the claim that fetched it ("" or missing: none).
CLAIM = "ClaimToken"
#: The Table service's limit (and Azurite garbles 101-operation batches instead of refusing them).
MAX_TRANSACTION_OPERATIONS = 100
#: Keep transaction payloads well under the service's 4 MiB.
MAX_TRANSACTION_BYTES = 3 * 1024 * 1024
_CONFLICT_RETRIES = 5


class TableGateway:
    """One table's rows, spread over ``shards`` partitions (fixed for the table's lifetime)."""

    def __init__(self, table: TableClient, shards: int) -> None:
        if not is_whole(shards, 1, rows.MAX_SHARDS):
            raise ConfigurationError(f"shards must be an integer from 1 to {rows.MAX_SHARDS}, got {shards!r}")
        validate_azure_table_name(table.table_name)
        self.table = table
        self.shards = shards

    def partition_of(self, message_id: str) -> str:
        """The partition holding the message's rows."""
        return rows.partition_key(rows.shard_of(message_id, self.shards))

    # -- the table -------------------------------------------------------------

    def create_table(self) -> None:
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

    def delete_table(self) -> None:
        """Delete the table and everything in it."""
        with sdk_errors(f"deleting table {self.table.table_name}"):
            self.table.delete_table()

    # -- rows --------------------------------------------------------------------

    def query(
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

    def get(self, pk: str, rk: str, *, select: list[str] | None = None) -> Any:
        """The entity at ``(pk, rk)``; SDK errors as raised (``ResourceNotFoundError`` when missing)."""
        if select is None:
            return self.table.get_entity(pk, rk)
        return self.table.get_entity(pk, rk, select=select)

    def read(self, pk: str, rk: str, what: str) -> Any | None:
        """The entity at ``(pk, rk)``, or None when it is gone; other failures as core errors about ``what``."""
        try:
            return self.table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, what) from exc

    def merge(self, patch: dict[str, Any], etag: str) -> None:
        """Merge ``patch`` into its entity while that is unchanged since ``etag``; SDK errors as raised."""
        self.table.update_entity(patch, **_if_match(etag, UpdateMode.MERGE))

    def count_messages(self) -> int:
        """Number of index rows (one per stored message) over every shard."""
        total = 0
        for shard in range(self.shards):
            total += sum(
                1
                for _ in self.query(
                    "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                    {"pk": rows.partition_key(shard), "lo": rows.INDEX_PREFIX, "hi": "i`"},
                    select=["RowKey"],
                )
            )
        return total

    def held_etags(self, pk: str, claim: str, row_keys: list[str]) -> dict[str, str]:
        """ETags of the due rows among ``row_keys`` that still hold ``claim`` (one query over their key range)."""
        found = self.query(
            f"PartitionKey eq @pk and RowKey ge @lo and RowKey le @hi and {CLAIM} eq @claim",
            {"pk": pk, "lo": min(row_keys), "hi": max(row_keys), "claim": claim},
            select=["RowKey"],
        )
        keys = set(row_keys)
        return {str(e["RowKey"]): str(e.metadata["etag"]) for e in found if str(e["RowKey"]) in keys}

    # -- transactions ------------------------------------------------------------

    def commit(self, operations: Sequence[Operation]) -> None:
        """Commit ``operations`` as one transaction through the SDK; SDK errors as raised."""
        self.table.submit_transaction(list(operations))

    def claim(
        self,
        wanted: list[rows.DueRow],
        claim_until: str,
        token: str,
        marks: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[rows.DueRow]:
        """Claim the unchanged rows among ``wanted`` for ``token`` until ``claim_until``; the ones won, earliest first.

        Transactions of at most 100 rows per partition; one that loses a race falls back to one conditional
        merge per row, so a row changed meanwhile (claimed by another dispatcher) is skipped, not fatal. Each row
        won carries the ETag its claim wrote (None when the service named none), so settling it can be
        conditional on nothing having changed since. ``marks`` (by row key): more properties its claim writes.
        """
        claimed: list[rows.DueRow] = []
        marks = marks or {}
        by_partition: dict[str, list[rows.DueRow]] = {}
        for row in wanted:
            by_partition.setdefault(row.partition_key, []).append(row)
        for pk, group in by_partition.items():
            for start in range(0, len(group), MAX_TRANSACTION_OPERATIONS):
                chunk = group[start : start + MAX_TRANSACTION_OPERATIONS]
                ops: list[Operation] = [
                    (
                        "update",
                        {
                            "PartitionKey": pk,
                            "RowKey": r.row_key,
                            "AvailableAt": claim_until,
                            CLAIM: token,
                            **marks.get(r.row_key, {}),
                        },
                        _if_match(r.etag, UpdateMode.MERGE),
                    )
                    for r in chunk
                ]
                try:
                    if len(ops) > 1:
                        etags = transactions.submit(self.table, ops)
                        claimed.extend(_claimed(r, claim_until, e) for r, e in zip(chunk, etags, strict=True))
                        continue
                except TableTransactionError:
                    pass  # another dispatcher claimed one of them: claim the rest one by one
                except AzureError as exc:
                    raise translate(exc, "claiming due messages") from exc
                for r, (_, patch, kwargs) in zip(chunk, ops, strict=True):
                    try:
                        written = self.table.update_entity(patch, **kwargs)
                    except (ResourceModifiedError, ResourceNotFoundError):
                        continue
                    except AzureError as exc:
                        if is_status(exc, 409, 412):
                            continue
                        raise translate(exc, "claiming a due message") from exc
                    claimed.append(_claimed(r, claim_until, written.get("etag") if written else None))
        claimed.sort(key=lambda r: (r.row_key[: len(rows.DUE_PREFIX) + 20], r.message.message_id))
        return claimed

    def release_ops(self, row: rows.DueRow, *, unsent: bool = False) -> list[Operation]:
        """Give a claimed row back, fetchable at once (its RowKey's time), if unchanged since ``row.etag``.

        Its ``Sending`` mark stays (a copy may have been put), unless ``unsent``: nothing was put under this claim, so
        the row gets back the mark the claim found.
        """
        patch = {"PartitionKey": row.partition_key, "RowKey": row.row_key, "AvailableAt": _time_of(row.row_key)}
        if unsent:
            patch.update(rows.sending_mark(row.sending))
        return [("update", {**patch, CLAIM: ""}, _if_match(row.etag, UpdateMode.MERGE))]

    def defer_ops(self, row: rows.DueRow, slot: datetime) -> list[Operation]:
        """Keep a claimed row back until ``slot``, unclaimed: re-keyed by the slot (``rows.deferred_entities``).

        One transaction with the row's index row, applying only while the row is unchanged since ``row.etag``; a
        slot no later than the row's key only releases the claim. Nothing was put under the claim, so the row keeps only
        the ``Sending`` mark the claim found. ``InvalidMessageError`` when it cannot fit.
        """
        if rows.due_key(slot) <= _time_of(row.row_key):
            return self.release_ops(row, unsent=True)
        due, index = rows.deferred_entities(row.message, rows.shard_of(row.message.message_id, self.shards), slot)
        if row.sending:  # an earlier claim's copy may still arrive (this claim put nothing: it defers before sending)
            due.update(rows.sending_mark(row.sending))
        return [
            ("create", due, {}),
            ("upsert", index, {"mode": UpdateMode.REPLACE}),
            ("delete", {"PartitionKey": row.partition_key, "RowKey": row.row_key}, _if_match(row.etag, None)),
        ]

    def commit_each(self, pk: str, changes: Sequence[list[Operation]]) -> list[bool]:
        """Commit each change (a list of operations on partition ``pk``), several to a transaction; one flag each.

        A transaction that fails is retried change by change, so one change that no longer applies (a row changed
        meanwhile: 404, 409, 412) fails alone; other failures raise as core errors.
        """
        done: list[bool] = []
        for group in _transaction_groups(list(changes), 3, lambda ops: sum(rows.entity_size(o[1]) for o in ops)):
            try:
                transactions.submit(self.table, [op for ops in group for op in ops])
                done.extend([True] * len(group))
                continue
            except TableTransactionError:
                pass
            except AzureError as exc:
                raise translate(exc, f"updating rows of partition {pk}") from exc
            for ops in group:
                try:
                    transactions.submit(self.table, ops)
                    done.append(True)
                except TableTransactionError as exc:
                    if not is_status(exc, 404, 409, 412):
                        raise translate(exc, f"updating rows of partition {pk}") from exc
                    done.append(False)
                except AzureError as exc:
                    raise translate(exc, f"updating rows of partition {pk}") from exc
        return done

    def move_ops(self, pk: str, index: Any, old: Any, due_at: datetime) -> list[Operation]:
        """The transaction moving the due row ``old`` (whose index row is ``index``) to ``due_at``, unclaimed (its
        ``Sending`` mark kept: a dispatcher's back-off after a failed put that may have been made)."""
        message = rows.message_from_entity(old)
        moved = DelayedMessage(
            message.message_id, message.destination, message.body, due_at, message.headers, message.failure_count
        )
        new_due, new_index = rows.to_entities(moved, rows.shard_of(message.message_id, self.shards))
        if old.get(rows.SENDING):
            new_due.update(rows.sending_mark(str(old[rows.SENDING])))
        if new_due["RowKey"] == old["RowKey"]:
            patch = {"PartitionKey": pk, "RowKey": old["RowKey"], "AvailableAt": rows.due_key(due_at), CLAIM: ""}
            if rows.DUE_AT in old:  # a row kept back until this very time: it is now simply due then
                patch[rows.DUE_AT] = rows.due_key(due_at)
            return [("update", patch, _if_match(old.metadata["etag"], UpdateMode.MERGE))]
        return [
            ("create", new_due, {}),
            ("update", new_index, _if_match(index.metadata["etag"], UpdateMode.REPLACE)),
            ("delete", dict(old), _if_match(old.metadata["etag"], None)),
        ]

    # -- a message's pair of rows --------------------------------------------------

    def write(self, planned: Sequence[Pair], *, replace: bool) -> None:
        """Write each message's pair of rows: transactions per partition (≤ 100 operations, ≤ 3 MiB).

        An id already stored: the same message again is a no-op, another one raises ``MessageIdConflictError``;
        with ``replace`` it is replaced (unreadable rows). The partitions' transactions are separate.
        """
        by_partition: dict[str, list[Pair]] = {}
        for item in planned:
            by_partition.setdefault(item[1]["PartitionKey"], []).append(item)
        for items in by_partition.values():
            for group in _transaction_groups(items, 2, lambda it: rows.entity_size(it[1])):
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
                        self._write_one(m, due, index, replace)
                except AzureError as exc:
                    raise translate(exc, "storing delayed messages") from exc

    def _write_one(self, message: DelayedMessage, due: dict[str, Any], index: dict[str, Any], replace: bool) -> None:
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

    def locate(self, message_id: str) -> tuple[str, str] | None:
        """``(partition, due row key)`` of the message, from its index row; None when it is not stored."""
        pk = self.partition_of(message_id)
        try:
            index = self.table.get_entity(pk, rows.index_row_key(message_id))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, f"looking up {message_id!r}") from exc
        return pk, str(index["DueRowKey"])

    def restore_index(self, message_id: str, pk: str, due_rk: str) -> tuple[str, str] | None:
        """Write the missing index row of the due row ``(pk, due_rk)`` (a garbage row), so it can be settled by id."""
        index = {"PartitionKey": pk, "RowKey": rows.index_row_key(message_id), "DueRowKey": due_rk}
        try:
            self.table.get_entity(pk, due_rk, select=["RowKey"])
            self.table.create_entity(index)
        except (ResourceNotFoundError, ResourceExistsError):
            return self.locate(message_id)
        except AzureError as exc:
            raise translate(exc, f"restoring the index row of {message_id!r}") from exc
        return pk, due_rk

    def delete_pair(self, message_id: str, pk: str, due_rk: str, etag: str | None = None) -> bool:
        """Delete the due row (with ``etag``: only unchanged) and its index row; False when gone or changed."""
        ops: list[Operation] = [
            ("delete", {"PartitionKey": pk, "RowKey": due_rk}, {} if etag is None else _if_match(etag, None)),
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

    def delete_pairs(self, pk: str, pairs: Sequence[tuple[str, str, str | None]]) -> bool:
        """Delete ``(id, due row key, etag or None)`` pairs in one transaction; False when a row changed or went."""
        ops: list[Operation] = []
        for mid, rk, etag in pairs:
            ops.append(("delete", {"PartitionKey": pk, "RowKey": rk}, {} if etag is None else _if_match(etag, None)))
            ops.append(("delete", {"PartitionKey": pk, "RowKey": rows.index_row_key(mid)}, {}))
        try:
            transactions.submit(self.table, ops)
        except TableTransactionError:
            return False
        except AzureError as exc:
            raise translate(exc, "removing dispatched messages") from exc
        return True

    def delete_replaced(self, entity: Any) -> None:
        """Delete the unchanged due row ``entity`` and the index row still pointing at it (a replaced garbage row)."""
        pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
        self.table.delete_entity(pk, rk, etag=entity.metadata["etag"], match_condition=MatchConditions.IfNotModified)
        self._delete_stale_index(pk, rk)

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


def _claimed(row: rows.DueRow, claim_until: str, etag: str | None) -> rows.DueRow:
    """``row`` as its claim left it."""
    return replace(row, etag=etag or "", available_at=claim_until)


def _time_of(row_key: str) -> str:
    """The 20-digit time inside a due row's RowKey."""
    return row_key[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]


def _if_match(etag: str | None, mode: UpdateMode | None) -> dict[str, Any]:
    """Keyword arguments for a write that applies only while the entity is unchanged since ``etag``."""
    kwargs: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
    if mode is not None:
        kwargs["mode"] = mode
    return kwargs


def _transaction_groups(items: list[Any], ops_per_item: int, size: Any) -> Iterator[list[Any]]:
    """Split ``items`` into transaction-sized groups (≤ 100 operations, ≤ 3 MiB)."""
    group: list[Any] = []
    used = 0
    for item in items:
        n = size(item)
        too_many = (len(group) + 1) * ops_per_item > MAX_TRANSACTION_OPERATIONS
        if group and (too_many or used + n > MAX_TRANSACTION_BYTES):
            yield group
            group, used = [], 0
        group.append(item)
        used += n
    if group:
        yield group
