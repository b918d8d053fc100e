"""``TableScheduleStore``: the ``ScheduleStore`` port on an Azure table (row design in ``rows.py``).

Every write is one entity-group transaction in the schedule's partition: its row (conditional on the ETag of the row
read, whose ``Version`` was checked) and its due row (the old one deleted, the new one written). So a conditional
write on ``version`` either moves both or neither, and two writers that read one version cannot both win.
``due`` reads the due rows' key ranges (only what is due), then each schedule's row; a due row whose schedule moved on
meanwhile is passed over (the row read is what counts). A row that cannot be read is logged and passed over by
``due`` and ``list`` (never a crash of a pass), and refused in one line by ``get``.

A resume counts its paused span in ``SkippedPaused``; the timer's view (``reports_skipped``) reports it once: its
cursor write sets ``SkippedReported`` to ``SkippedPaused`` and, once the write landed, adds the difference to
``skipped_reported`` (the run's ``skipped_paused`` metric, as the AWS timer's). Every other write keeps the value.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from ... import logfields as lf
from ...clock import utc
from ...errors import ConfigurationError, InvalidScheduleError, TransientError
from ...naming import validate_azure_table_name
from ...schedules.model import Schedule, ScheduleState
from ...schedules.ports import ScheduleExistsError, ScheduleStore
from .. import transactions
from ..sdk_errors import is_status, translate
from ..table_gateway import TableGateway
from . import rows
from .groups import chunks, entity_size

__all__ = ["TableScheduleStore"]

_log = logging.getLogger("delayed_delivery.azure.schedules")
_TRIES = 5
#: Schedules whose last read a store remembers (then it forgets them all and reads again).
_REMEMBERED = 100_000
#: Due schedules of one partition read by a range read (fewer: point reads).
_RANGE_MIN = 8
_Op = tuple[str, dict[str, Any], dict[str, Any]]


class TableScheduleStore(ScheduleStore):
    """Schedules in one Azure table; ``shards`` restricts ``due`` to some partitions (one timer's leased shard)."""

    def __init__(
        self, table: TableClient, *, shards: Iterable[int] | None = None, reports_skipped: bool = False
    ) -> None:
        validate_azure_table_name(table.table_name)
        self.table = table
        owned = tuple(range(rows.SHARDS)) if shards is None else tuple(sorted(set(shards)))
        if not owned or any(not 0 <= s < rows.SHARDS for s in owned):
            raise ConfigurationError(f"schedule shards must be a non-empty subset of 0..{rows.SHARDS - 1}")
        self.shards = owned
        #: What this store last read of each schedule, by id: ``(version, ETag, due row key, SkippedReported)``. A
        #: conditional write after a read of that version uses it instead of reading the row again (a pass's second).
        self._etags: dict[str, tuple[int, str, str | None, int]] = {}
        self.reports_skipped = reports_skipped
        #: Occurrences skipped while paused that this view's writes reported (``reports_skipped`` only).
        self.skipped_reported = 0

    def for_shards(self, shards: Iterable[int], *, reports_skipped: bool = False) -> TableScheduleStore:
        """A view whose ``due`` reads only ``shards`` (what a timer holding their leases materializes)."""
        return TableScheduleStore(self.table, shards=shards, reports_skipped=reports_skipped)

    def setup_infrastructure(self) -> None:
        """Create the table if missing (a 403: provisioned by infrastructure code, fine)."""
        TableGateway(self.table, 1).create_table()

    def drop(self) -> None:
        """Delete the table."""
        TableGateway(self.table, 1).delete_table()

    # -- the port -----------------------------------------------------------------

    def create(self, schedule: Schedule) -> None:
        """Insert the schedule's row and its due row together; ``ScheduleExistsError`` when the id is taken."""
        ops: list[_Op] = [("create", rows.schedule_entity(schedule), {})]
        due = rows.due_entity(schedule)
        if due is not None:
            ops.append(("create", due, {}))
        try:
            self.table.submit_transaction(ops)
        except TableTransactionError as exc:
            if is_status(exc, 409):
                raise ScheduleExistsError(f"schedule {schedule.schedule_id!r} exists already") from None
            raise translate(exc, f"creating schedule {schedule.schedule_id!r}") from exc
        except AzureError as exc:
            raise translate(exc, f"creating schedule {schedule.schedule_id!r}") from exc

    def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or None; ``InvalidScheduleError`` for a row this cannot read."""
        found = self._read(schedule_id)
        return None if found is None else self._remember(schedule_id, found)

    def _remember(self, schedule_id: str, found: Any) -> Schedule:
        """The schedule a row read holds, its ETag remembered for a conditional write after it."""
        schedule = rows.schedule_of(found)
        etag = found.metadata.get("etag")
        if len(self._etags) >= _REMEMBERED:
            self._etags.clear()
        if isinstance(etag, str) and etag:
            self._etags[schedule_id] = (schedule.version, etag, rows.due_row_key(schedule), rows.reported_of(found))
        return schedule

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        """Store ``schedule`` if the stored one has ``expected_version``: its row (If-Match the ETag read) and due
        row in one transaction; False when another writer got there first or the schedule is gone."""
        what = f"writing schedule {schedule.schedule_id!r}"
        write = self._write_of(schedule, expected_version)
        if write is None:
            return False
        try:
            transactions.submit(self.table, write.ops)
        except TableTransactionError as exc:
            if is_status(exc, 404, 409, 412):
                return False  # changed or gone since it was read
            raise translate(exc, what) from exc
        except AzureError as exc:
            raise translate(exc, what) from exc
        self._landed(write)
        return True

    def replace_many(self, writes: Sequence[tuple[Schedule, int]]) -> list[bool | Exception]:
        """``replace`` for each ``(schedule, expected_version)``, in few transactions: the writes of one partition
        together (``MAX_GROUP_OPS`` operations, ``MAX_GROUP_BYTES`` at most each). A transaction that fails changes
        nothing; its schedules are then written one by one (so one lost race costs only its own write). Per write:
        True, False (another writer got there first) or the error."""
        out: list[bool | Exception] = [False] * len(writes)
        groups: dict[str, list[tuple[int, _Write]]] = {}
        for n, (schedule, expected) in enumerate(writes):
            try:
                write = self._write_of(schedule, expected)
            except Exception as exc:  # reading the row failed: this one only
                out[n] = exc
                continue
            if write is not None:
                groups.setdefault(rows.partition_of(schedule.schedule_id), []).append((n, write))
        for group in groups.values():
            for chunk in chunks(group, lambda item: (len(item[1].ops), item[1].size)):
                try:
                    self._submit([op for _, w in chunk for op in w.ops])
                except Exception:  # a conflict or a fault: one by one, each judged alone
                    for n, w in chunk:
                        out[n] = self._replace_alone(w)
                    continue
                for n, w in chunk:
                    self._landed(w)
                    out[n] = True
        return out

    def _submit(self, ops: list[_Op]) -> None:
        """Commit one group's writes as one transaction."""
        transactions.submit(self.table, ops)

    def _replace_alone(self, write: _Write) -> bool | Exception:
        """One write of a failed group again, on its own (conditional on the same ETag)."""
        try:
            transactions.submit(self.table, write.ops)
        except TableTransactionError as exc:
            if is_status(exc, 404, 409, 412):
                return False
            return translate(exc, f"writing schedule {write.schedule.schedule_id!r}")
        except AzureError as exc:
            return translate(exc, f"writing schedule {write.schedule.schedule_id!r}")
        self._landed(write)
        return True

    def _write_of(self, schedule: Schedule, expected_version: int) -> _Write | None:
        """The operations that store ``schedule`` over ``expected_version`` (its row If-Match the ETag read, its due
        row moved); None when the stored row is not at that version (or is gone)."""
        if schedule.version != expected_version + 1:
            raise ValueError(f"a write after version {expected_version} stores version {expected_version + 1}")
        sid = schedule.schedule_id
        known = self._etags.pop(sid, None)
        if known is not None and known[0] == expected_version:
            # read at this version by this store: its row's ETag and due row key follow from what was read
            etag, old, reported = known[1], known[2], known[3]
        else:
            entity = self._read(sid)
            if entity is None or rows.number(entity.get("Version")) != expected_version:
                return None
            etag, old, reported = str(entity.metadata["etag"]), _stored_due_key(entity), rows.reported_of(entity)
        now_reported = schedule.skipped_paused if self.reports_skipped else reported
        row = rows.schedule_entity(schedule, now_reported)
        ops: list[_Op] = [("update", row, _if_match(etag, UpdateMode.REPLACE))]
        new = rows.due_entity(schedule)
        if old is not None and (new is None or new["RowKey"] != old):
            ops.append(("delete", {"PartitionKey": rows.partition_of(sid), "RowKey": old}, {}))
        if new is not None:
            ops.append(("upsert", new, {"mode": UpdateMode.REPLACE}))
        return _Write(schedule, ops, reported, entity_size(row) + 512 * len(ops))

    def _landed(self, write: _Write) -> None:
        if self.reports_skipped:
            self.skipped_reported += max(0, write.schedule.skipped_paused - write.reported)

    def due(self, horizon: datetime, limit: int) -> Sequence[Schedule]:
        """Up to ``limit`` active schedules of this view's shards with ``next_at`` at or before ``horizon``."""
        if limit < 1:
            return []
        bound = rows.due_bound(utc(horizon))
        keys = heapq.merge(*[self._due_keys(s, bound, limit) for s in self.shards])
        found: list[Schedule] = []
        while len(found) < limit:
            batch = list(itertools.islice(keys, limit - len(found)))
            if not batch:
                break
            read = self._read_many([schedule_id for _, schedule_id in batch])
            for key, schedule_id in batch:
                entity = read.get(schedule_id)
                if entity is None:
                    continue  # deleted since its due row was read
                try:
                    schedule = self._remember(schedule_id, entity)
                except InvalidScheduleError as exc:
                    _log.warning("a schedule row cannot be read; it is passed over",
                                 extra={lf.SCHEDULE_ID: schedule_id, lf.REASON: str(exc)})  # fmt: skip
                    continue
                if rows.due_row_key(schedule) == key:  # else moved on since its due row was read
                    found.append(schedule)
        return found

    def delete(self, schedule_id: str) -> bool:
        """Forget a schedule (its row and due row together); False when it was gone."""
        what = f"deleting schedule {schedule_id!r}"
        for _ in range(_TRIES):
            entity = self._read(schedule_id)
            if entity is None:
                return False
            ops: list[_Op] = [("delete", {"PartitionKey": entity["PartitionKey"], "RowKey": entity["RowKey"]},
                               _if_match(entity.metadata["etag"], None))]  # fmt: skip
            old = _stored_due_key(entity)
            if old is not None:
                ops.append(("delete", {"PartitionKey": entity["PartitionKey"], "RowKey": old}, {}))
            try:
                self.table.submit_transaction(ops)
                return True
            except TableTransactionError as exc:
                if not is_status(exc, 404, 412):
                    raise translate(exc, what) from exc
            except AzureError as exc:
                raise translate(exc, what) from exc
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    def list(self, after: str | None = None, limit: int = 100) -> Sequence[Schedule]:
        """Schedules in id order after ``after`` (every shard's rows merged), at most ``limit``."""
        if limit < 1:
            return []
        lo = rows.row_key(after) + "\x00" if after else rows.ROW_PREFIX
        heads = [self._rows_from(s, lo, limit) for s in range(rows.SHARDS)]
        found: list[Schedule] = []
        for _, entity in heapq.merge(*heads, key=lambda pair: pair[0]):
            try:
                found.append(rows.schedule_of(entity))
            except InvalidScheduleError as exc:
                _log.warning("a schedule row cannot be read; it is passed over",
                             extra={lf.REASON: str(exc)})  # fmt: skip
                continue
            if len(found) >= limit:
                break
        return found

    # -- reads --------------------------------------------------------------------

    def _read(self, schedule_id: str) -> Any | None:
        try:
            return self.table.get_entity(rows.partition_of(schedule_id), rows.row_key(schedule_id))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise translate(exc, f"reading schedule {schedule_id!r}") from exc

    def _read_many(self, schedule_ids: Sequence[str]) -> dict[str, Any]:
        """The rows of ``schedule_ids`` that exist, by id. Per partition, a range read over their row keys (a page of
        up to 1,000 rows a request: a burst's due schedules are most of their range); when the range turns out
        sparse (fewer than half of the rows read are wanted), the rest by point reads."""
        out: dict[str, Any] = {}
        by_partition: dict[str, dict[str, str]] = {}
        for sid in schedule_ids:
            by_partition.setdefault(rows.partition_of(sid), {})[rows.row_key(sid)] = sid
        for pk, wanted in by_partition.items():
            keys, i = sorted(wanted), 0  # keys[:i]: read or passed (absent from the range: gone)
            if len(keys) >= _RANGE_MIN:
                page = min(1000, 2 * len(keys))
                scanned = hits = 0
                for entity in self._query(pk, keys[0], keys[-1] + "\x00", page, None):
                    key, scanned = str(entity["RowKey"]), scanned + 1
                    while i < len(keys) and keys[i] < key:
                        i += 1
                    if i < len(keys) and keys[i] == key:
                        out[wanted[key]], hits, i = entity, hits + 1, i + 1
                    if i >= len(keys) or (scanned >= page and 2 * hits < scanned):
                        break  # all read, or sparse: the rest one by one
            for key in keys[i:]:
                entity = self._read(wanted[key])
                if entity is not None:
                    out[wanted[key]] = entity
        return out

    def _query(self, pk: str, lo: str, hi: str, page: int, select: Sequence[str] | None) -> Iterator[Any]:
        try:
            pages = self.table.query_entities(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                parameters={"pk": pk, "lo": lo, "hi": hi},
                select=None if select is None else [*select],
                results_per_page=max(1, min(page, 1000)),
            ).by_page()
            for entries in pages:
                yield from entries
        except AzureError as exc:
            raise translate(exc, f"querying table {self.table.table_name}") from exc

    def _due_keys(self, shard: int, bound: str, limit: int) -> Iterator[tuple[str, str]]:
        """``(due row key, schedule id)`` of the shard's due rows before ``bound``, in key order."""
        pk = rows.partition_key(shard)
        entries = self._query(pk, rows.DUE_PREFIX, bound, limit, ["RowKey", "ScheduleId"])
        for entity in itertools.islice(entries, limit):
            sid = entity.get("ScheduleId")
            if isinstance(sid, str):
                yield str(entity["RowKey"]), sid

    def _rows_from(self, shard: int, lo: str, limit: int) -> Iterator[tuple[str, Any]]:
        entries = self._query(rows.partition_key(shard), lo, rows.ROW_END, limit, None)
        for entity in itertools.islice(entries, limit):
            yield str(entity["RowKey"]), entity


@dataclass(frozen=True, slots=True)
class _Write:
    """One schedule's conditional write: its operations, the skipped count its row had, its size (bytes, bound)."""

    schedule: Schedule
    ops: list[_Op]
    reported: int
    size: int


def _stored_due_key(entity: Any) -> str | None:
    """The due row key the stored row implies (what its last write created), or None."""
    if entity.get("State") != str(ScheduleState.ACTIVE) or not entity.get("NextAt"):
        return None
    return f"{rows.DUE_PREFIX}{entity['NextAt']}_{str(entity['RowKey'])[len(rows.ROW_PREFIX) :]}"


def _if_match(etag: str, mode: UpdateMode | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
    if mode is not None:
        kwargs["mode"] = mode
    return kwargs
