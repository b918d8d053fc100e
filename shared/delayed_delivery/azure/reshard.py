"""``azure reshard``: change a delays table's shard count, moving every message to the partition of its new shard.

An offline migration, in four steps, each safe to repeat (running it again finishes an interrupted run):

1. Mark the table as being resharded (``ReshardTo`` in its layout entity, ``layout.py``). From then on every process
   that starts, and every timer run, refuses with one line; senders already running keep the old count, so stop them
   first (docs/azure.md, "Changing the shard count").
2. Take the blob lease of every shard of both counts, waiting for running timer runs to end and give theirs back,
   and keep renewing them: no dispatcher sends while rows move.
3. Move every message of every partition in use whose partition changes (``--to`` the current count repairs rows a
   process with another count wrote): its due row (claim cleared) and index row are written in the new
   partition in one transaction, then the old pair is deleted in one transaction, conditional on what was read. A
   message found in both partitions (an interrupted run) keeps the new pair. A message that stays loses any claim a
   dead dispatcher left on it. Rows that are not a message's (no ``MessageId``) are left where they are, and counted.
4. Record the new count (clearing the mark) and give the leases back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from ..errors import ConfigurationError, TransientError
from . import rows
from .blob_lease import BlobLease
from .layout import Layout, layout_entity, partitions_in_use, read_layout, record_layout
from .sdk_errors import is_status, translate
from .table_gateway import CLAIM

__all__ = ["ReshardResult", "reshard"]

_RETRIES = 5


@dataclass(frozen=True, slots=True)
class ReshardResult:
    """What a reshard did."""

    table: str
    before: int
    after: int
    moved: int
    kept: int
    left: int


def reshard(
    table: Any,
    container: Any,
    to: int,
    *,
    configured: int,
    lease_seconds: int = 30,
    wait_seconds: float = 120.0,
    progress: Callable[[str], None] = lambda _: None,
) -> ReshardResult:
    """Move ``table``'s messages to ``to`` shards (module docstring); ``configured``: the count an unrecorded table's
    rows are taken to be written with (checked, then recorded first)."""
    if not 1 <= to <= rows.MAX_SHARDS:
        raise ConfigurationError(f"--to must be from 1 to {rows.MAX_SHARDS}, got {to}")
    layout = read_layout(table) or record_layout(table, configured)
    if layout.resharding_to not in (None, to):
        raise ConfigurationError(
            f"the delays table {table.table_name!r} is being resharded to {layout.resharding_to} shard(s): finish that "
            f"first (--to {layout.resharding_to}), then reshard again"
        )
    before = layout.shards
    layout = _mark(table, layout, to)
    progress(f"marked {table.table_name} as being resharded from {before} to {to} shard(s)")
    leases = _take_leases(container, max(before, to), lease_seconds, wait_seconds, progress)
    try:
        moved = kept = left = 0
        sources = sorted({*(rows.partition_key(s) for s in range(before)), *partitions_in_use(table, before)})
        for source in sources:  # every partition in use: rows written with another count are moved too
            for entity in _due_rows(table, source):
                mid = entity.get("MessageId")
                if not isinstance(mid, str):
                    left += 1
                    continue
                target = rows.partition_key(rows.shard_of(mid, to))
                if target == source:
                    kept += 1
                    _unclaim(table, entity)
                    continue
                _check(leases)
                _move(table, entity, mid, target)
                moved += 1
            progress(f"partition {source}: {moved} moved, {kept} kept so far")
        _check(leases)
        _record(table, layout, to)
    finally:
        for lease in leases:
            lease.release()
    progress(f"{table.table_name} now has {to} shard(s)")
    return ReshardResult(table.table_name, before, to, moved, kept, left)


def _mark(table: Any, layout: Layout, to: int) -> Layout:
    """Write ``ReshardTo`` into the layout entity (conditional on the layout read); the marked layout."""
    entity = layout_entity(layout.shards, datetime.now(UTC), to)
    try:
        if layout.etag:
            table.update_entity(
                entity, mode=UpdateMode.REPLACE, etag=layout.etag, match_condition=MatchConditions.IfNotModified
            )
        else:
            table.upsert_entity(entity, mode=UpdateMode.REPLACE)
    except AzureError as exc:
        if is_status(exc, 412):
            raise TransientError("the shard count changed while resharding started: run it again") from exc
        raise translate(exc, f"marking table {table.table_name} as being resharded") from exc
    marked = read_layout(table)
    assert marked is not None
    return marked


def _record(table: Any, layout: Layout, to: int) -> None:
    """Record ``to`` as the table's count and clear the mark (conditional on the marked layout)."""
    try:
        table.update_entity(
            layout_entity(to, datetime.now(UTC)),
            mode=UpdateMode.REPLACE,
            etag=layout.etag,
            match_condition=MatchConditions.IfNotModified,
        )
    except AzureError as exc:
        raise translate(exc, f"recording {to} shard(s) in table {table.table_name}") from exc


def _take_leases(
    container: Any, shards: int, seconds: int, wait: float, progress: Callable[[str], None]
) -> list[BlobLease]:
    """Every shard's blob lease, held and renewed; ``TransientError`` naming the shards still held after ``wait``."""
    leases = [BlobLease(container, s, duration=seconds) for s in range(shards)]
    deadline = time.monotonic() + wait
    waiting = list(leases)
    told = False
    while waiting:
        waiting = [lease for lease in waiting if not lease.try_acquire()]
        if not waiting:
            break
        if time.monotonic() >= deadline:
            for lease in leases:
                lease.release()
            names = ", ".join(str(lease.shard) for lease in waiting[:5])
            raise TransientError(
                f"the leases of shard(s) {names} are still held after {wait:g} s: stop the function app "
                "(az functionapp stop) or wait for its run to end, then run `azure reshard` again (it goes on)"
            )
        if not told:
            progress(f"waiting for dispatchers to give back {len(waiting)} shard lease(s)")
            told = True
        time.sleep(1.0)
    return leases


def _check(leases: list[BlobLease]) -> None:
    """Stop when any lease was lost (someone broke it): rows must not move under a dispatcher."""
    lost = [lease.shard for lease in leases if not lease.keep_going()]
    if lost:
        raise TransientError(f"lost the lease of shard(s) {lost[:5]} while resharding: run `azure reshard` again")


def _due_rows(table: Any, pk: str) -> Iterator[Any]:
    """The due rows of partition ``pk`` (whole entities)."""
    try:
        yield from table.query_entities(
            "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
            parameters={"pk": pk, "lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
            results_per_page=100,
        )
    except ResourceNotFoundError:
        raise ConfigurationError(f"table {table.table_name} does not exist") from None
    except AzureError as exc:
        raise translate(exc, f"reading partition {pk} of table {table.table_name}") from exc


def _move(table: Any, due: Any, message_id: str, target: str) -> None:
    """Write the message's pair in ``target``, then delete the old pair, conditional on the due row as copied.

    A due row that changed meanwhile is copied again; one that went meanwhile (cancelled) takes its copy with it.
    """
    source, rk = str(due["PartitionKey"]), str(due["RowKey"])
    index_rk = rows.index_row_key(message_id)
    what = f"moving {message_id!r} from {source} to {target}"
    for _ in range(_RETRIES):
        copy = {k: v for k, v in due.items() if k not in ("PartitionKey", "RowKey")}
        if due.get("AvailableAt") != rows.PLACED_KEY:  # a placed row stays placed: its message is on its queue
            copy.update(AvailableAt=rk[len(rows.DUE_PREFIX) :][:20], **{CLAIM: ""}, **rows.legacy_mark(due))
        copy.update(PartitionKey=target, RowKey=rk)
        index = {"PartitionKey": target, "RowKey": index_rk, "DueRowKey": rk}
        same = {"etag": due.metadata["etag"], "match_condition": MatchConditions.IfNotModified}
        try:
            table.submit_transaction(
                [("upsert", copy, {"mode": UpdateMode.REPLACE}), ("upsert", index, {"mode": UpdateMode.REPLACE})]
            )
            table.submit_transaction(
                [
                    ("delete", {"PartitionKey": source, "RowKey": rk}, same),
                    ("delete", {"PartitionKey": source, "RowKey": index_rk}, {}),
                ]
            )
            return
        except TableTransactionError as exc:
            if not is_status(exc, 404, 412):
                raise translate(exc, what) from exc
        except AzureError as exc:
            raise translate(exc, what) from exc
        try:  # the old index row was missing (a garbage row), or the due row changed or went meanwhile
            current = table.get_entity(source, rk)
        except ResourceNotFoundError:
            _drop_copy(table, target, rk, index_rk, what)
            return
        except AzureError as exc:
            raise translate(exc, what) from exc
        if current.metadata["etag"] != due.metadata["etag"]:
            due = current  # changed: copy it again
            continue
        try:
            table.delete_entity(source, rk, **same)
            return
        except AzureError as exc:
            if not is_status(exc, 412):
                raise translate(exc, what) from exc
    raise TransientError(f"{what}: kept conflicting with another writer (stop the senders, then run it again)")


def _unclaim(table: Any, due: Any) -> None:
    """Clear a claim left on a row that stays (its dispatcher is gone: every lease is held here)."""
    own = str(due["RowKey"])[len(rows.DUE_PREFIX) :][:20]
    if due.get("AvailableAt") == rows.PLACED_KEY:
        return  # placed on its queue ahead of its due time: clearing it would send it again
    if not due.get(CLAIM) and str(due.get("AvailableAt", own)) <= own:
        return
    patch = {"PartitionKey": due["PartitionKey"], "RowKey": due["RowKey"], "AvailableAt": own, CLAIM: ""}
    patch.update(rows.legacy_mark(due))  # a claim from before the Sending mark: its send may have been made
    try:
        table.update_entity(
            patch, mode=UpdateMode.MERGE, etag=due.metadata["etag"], match_condition=MatchConditions.IfNotModified
        )
    except AzureError as exc:
        if not is_status(exc, 404, 412):  # gone or changed meanwhile: nothing to clear
            raise translate(exc, f"clearing the claim of {due.get('MessageId')!r}") from exc


def _drop_copy(table: Any, pk: str, rk: str, index_rk: str, what: str) -> None:
    """Delete the copy of a message that went from its old partition while it was being moved."""
    try:
        table.submit_transaction(
            [
                ("delete", {"PartitionKey": pk, "RowKey": rk}, {}),
                ("delete", {"PartitionKey": pk, "RowKey": index_rk}, {}),
            ]
        )
    except TableTransactionError as exc:
        if not is_status(exc, 404):
            raise translate(exc, what) from exc
    except AzureError as exc:
        raise translate(exc, what) from exc
