"""``DynamoDbScheduleStore``: the ``ScheduleStore`` port on the schedules table (``layout.py``), and the timer's reads.

Rows hold what a schedule is; due pages hold where each schedule's cursor is (its *entry*), packed by the minute its
next occurrence fires in. A write of a schedule through the port (``create``, ``replace``, ``delete``) is one
transaction: the row with a new ``rev``, a fresh entry in a page of its own when the schedule is active, and every
page that held an older entry of it rewritten without that entry. So outside an unfinished timer pass the due pages
hold live entries only, one per active schedule, and the timer can read rows with eventually consistent reads
(checking the ``rev``). ``replace`` and ``delete`` hold the shard's lease, so they never interleave with a timer
pass (which advances entries without touching rows). ``delete`` removes the entries with the row, so a schedule
created again under a deleted one's id (``rev`` 1 again) finds none of the old one's.

``get`` reads the row and the shard's due pages (the entry may be in any of them): about ``schedules / 16 × 90``
bytes a call. ``due`` finds schedules by the minute their next occurrence *fires* in (jitter included), so a
jittered schedule is listed once its fire time, not its nominal time, is within the horizon.
"""

from __future__ import annotations

import contextlib
import heapq
import uuid
from collections.abc import Collection, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import Clock, SystemClock, utc
from ...errors import InvalidScheduleError, TransientError
from ...schedules.materializer import fire_time
from ...schedules.model import Schedule, ScheduleState
from ...schedules.ports import ScheduleExistsError, ScheduleStore
from .layout import (
    DEFAULT_TABLE,
    SHARDS,
    DuePage,
    Entry,
    Row,
    due_pk,
    entry_of,
    merged,
    minute_key,
    page_item,
    page_of_item,
    row_item,
    row_of_item,
    row_pk,
    shard_of,
)
from .lease import Held, ShardLeases
from .table import ensure_schedule_table, translate

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

__all__ = ["DynamoDbScheduleStore", "op_page_key"]

#: Due pages one query returns at most (each up to ~300 KB: DynamoDB returns 1 MB a call anyway).
PAGES_PER_QUERY = 8
#: Keys one BatchGetItem reads (DynamoDB's limit).
_BATCH_GET = 100
_BATCH_WRITE = 25
_RETRIES = 8
#: Actions one DynamoDB transaction takes.
_TRANSACTION = 100


def op_page_key(schedule: Schedule, rev: int) -> str | None:
    """The due page of the entry a row write ``rev`` makes: the minute its next occurrence fires in (None: none)."""
    if schedule.state is not ScheduleState.ACTIVE or schedule.next_at is None:
        return None
    return f"{minute_key(fire_time(schedule, schedule.next_at))}#o.{schedule.schedule_id}.{rev}"


class DynamoDbScheduleStore(ScheduleStore):
    """Schedules in a DynamoDB table (``layout.py``); ``client`` is a boto3 DynamoDB client."""

    def __init__(
        self,
        client: DynamoDBClient,
        table: str = DEFAULT_TABLE,
        *,
        clock: Clock | None = None,
        lease_seconds: float = 60.0,
        wait_seconds: float = 90.0,
    ) -> None:
        self.client = client
        self.table = table
        self.clock = clock or SystemClock()
        self.leases = ShardLeases(client, table, self.clock, seconds=lease_seconds)
        #: How long an operator's write waits for a timer pass holding the shard.
        self.wait_seconds = wait_seconds

    def setup_infrastructure(self) -> None:
        """Create the table if missing (emulators and scripts; the CDK stack creates it in the cloud)."""
        ensure_schedule_table(self.client, self.table)

    # -- the port --------------------------------------------------------------------------------------------

    def create(self, schedule: Schedule) -> None:
        """Write the row and its first entry; ``ScheduleExistsError`` when the id is taken."""
        if not self._commit(schedule.schedule_id, schedule, None):
            raise ScheduleExistsError(f"schedule {schedule.schedule_id!r} exists already")

    def get(self, schedule_id: str) -> Schedule | None:
        """The row with its live entry, or None."""
        row = self.row(schedule_id)
        if row is None:
            return None
        return merged(row, self.entries(shard_of(schedule_id), {schedule_id}).get(schedule_id))

    def replace(self, schedule: Schedule, expected_version: int) -> bool:
        """Under the shard's lease: write ``schedule`` if the schedule is still at ``expected_version``."""
        if schedule.version != expected_version + 1:
            raise ValueError(f"a write after version {expected_version} stores version {expected_version + 1}")
        with self._holding(schedule.schedule_id):
            row = self.row(schedule.schedule_id)
            if row is None:
                return False
            entry = self.entries(shard_of(schedule.schedule_id), {schedule.schedule_id}).get(schedule.schedule_id)
            current = merged(row, entry)
            if current.version != expected_version:
                return False
            skipped = max(0, schedule.skipped_paused - current.skipped_paused)
            return self._commit(schedule.schedule_id, schedule, row.rev, skipped_report=skipped)

    def due(self, horizon: datetime, limit: int) -> Sequence[Schedule]:
        """Active schedules whose next occurrence is at or before ``horizon`` and fires in its minute or before."""
        horizon = utc(horizon)
        before = minute_key(horizon + timedelta(minutes=1))
        best: dict[str, Entry] = {}
        for shard in range(SHARDS):
            for page in self.pages(shard, before):
                for sid, entry in page.entries.items():
                    if entry.next_at is not None and entry.next_at <= horizon:
                        _keep_newest(best, sid, entry)
        found = []
        for sid, row in self.rows(best).items():
            if isinstance(row, Row) and best[sid].rev == row.rev and row.schedule.state is ScheduleState.ACTIVE:
                found.append(merged(row, best[sid]))
        found.sort(key=lambda s: (s.next_at, s.schedule_id))
        return found[: max(0, limit)]

    def delete(self, schedule_id: str) -> bool:
        """Delete the row and its entries; False when it was gone."""
        with self._holding(schedule_id):
            row = self.row(schedule_id)
            return row is not None and self._commit(schedule_id, None, row.rev)

    # -- reads the timer and the routes share ---------------------------------------------------------------

    def row(self, schedule_id: str) -> Row | None:
        """A schedule's row (strongly consistent), or None."""
        try:
            reply = self.client.get_item(
                TableName=self.table,
                Key={"pk": {"S": row_pk(shard_of(schedule_id))}, "sk": {"S": schedule_id}},
                ConsistentRead=True,
            )
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, f"reading schedule {schedule_id!r}", self.table) from exc
        item = reply.get("Item")
        return None if item is None else row_of_item(item)

    def rows(self, ids: Collection[str], *, consistent: bool = True) -> dict[str, Row | InvalidScheduleError]:
        """The rows of ``ids`` that exist (100 a request); an unreadable row is its error."""
        out: dict[str, Row | InvalidScheduleError] = {}
        ordered = sorted(ids)
        for start in range(0, len(ordered), _BATCH_GET):
            keys: list[Any] = [
                {"pk": {"S": row_pk(shard_of(sid))}, "sk": {"S": sid}} for sid in ordered[start : start + _BATCH_GET]
            ]
            for item in self._batch_get(keys, consistent):
                sid = item.get("sk", {}).get("S", "")
                try:
                    out[sid] = row_of_item(item)
                except InvalidScheduleError as exc:
                    out[sid] = exc
        return out

    def _batch_get(self, keys: list[Any], consistent: bool) -> Iterator[dict[str, Any]]:
        request: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": consistent}}
        for attempt in range(_RETRIES):
            try:
                reply = self.client.batch_get_item(RequestItems=request)
            except (ClientError, BotoCoreError) as exc:
                raise translate(exc, "reading schedule rows", self.table) from exc
            yield from reply.get("Responses", {}).get(self.table, [])
            request = reply.get("UnprocessedKeys") or {}
            if not request:
                return
            self.clock.sleep(min(1.0, 0.05 * 2**attempt))
        raise TransientError("reading schedule rows: DynamoDB kept keys unprocessed (throttled)")

    def pages(self, shard: int, before: str | None = None) -> Iterator[DuePage]:
        """The shard's due pages in key order (strongly consistent), those with a key before ``before`` when given."""
        condition = "pk = :p AND sk < :b" if before is not None else "pk = :p"
        values: dict[str, Any] = {":p": {"S": due_pk(shard)}}
        if before is not None:
            values[":b"] = {"S": before}
        kwargs: dict[str, Any] = {}
        while True:
            try:
                reply = self.client.query(
                    TableName=self.table,
                    KeyConditionExpression=condition,
                    ExpressionAttributeValues=values,
                    ConsistentRead=True,
                    Limit=PAGES_PER_QUERY,
                    **kwargs,
                )
            except (ClientError, BotoCoreError) as exc:
                raise translate(exc, f"reading the due pages of schedule shard {shard}", self.table) from exc
            for item in reply.get("Items", []):
                yield page_of_item(shard, item)
            last = reply.get("LastEvaluatedKey")
            if not last:
                return
            kwargs = {"ExclusiveStartKey": last}

    def any_page(self, shard: int, before: str) -> bool:
        """Whether the shard has a due page with a key before ``before`` (one strongly consistent query, 1 item)."""
        try:
            reply = self.client.query(
                TableName=self.table,
                KeyConditionExpression="pk = :p AND sk < :b",
                ExpressionAttributeValues={":p": {"S": due_pk(shard)}, ":b": {"S": before}},
                ProjectionExpression="pk",
                ConsistentRead=True,
                Limit=1,
            )
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, f"reading the due pages of schedule shard {shard}", self.table) from exc
        return bool(reply.get("Items"))

    def entries(self, shard: int, ids: Collection[str]) -> dict[str, Entry]:
        """The newest entry of each of ``ids`` (by row write, then version) in the shard's due pages."""
        wanted = set(ids)
        best: dict[str, Entry] = {}
        for page in self.pages(shard):
            for sid in wanted.intersection(page.entries):
                _keep_newest(best, sid, page.entries[sid])
        return best

    # -- writes the timer shares ----------------------------------------------------------------------------

    def put_pages(self, items: Sequence[dict[str, Any]]) -> None:
        """Write due pages (whole items; the same page again is the same item), 25 a request."""
        for start in range(0, len(items), _BATCH_WRITE):
            request: dict[str, Any] = {
                self.table: [{"PutRequest": {"Item": i}} for i in items[start : start + _BATCH_WRITE]]
            }
            for attempt in range(_RETRIES):
                try:
                    reply = self.client.batch_write_item(RequestItems=request)
                except (ClientError, BotoCoreError) as exc:
                    raise translate(exc, "writing due pages", self.table) from exc
                request = reply.get("UnprocessedItems") or {}
                if not request:
                    break
                self.clock.sleep(min(1.0, 0.05 * 2**attempt))
            else:
                raise TransientError("writing due pages: DynamoDB kept items unprocessed (throttled)")

    def delete_page(self, shard: int, sk: str) -> None:
        """Delete a consumed due page (gone already: nothing to do)."""
        try:
            self.client.delete_item(TableName=self.table, Key={"pk": {"S": due_pk(shard)}, "sk": {"S": sk}})
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, f"deleting due page {sk!r} of shard {shard}", self.table) from exc

    def write_row(self, schedule: Schedule, expected_rev: int) -> bool:
        """The timer's write of a row it settles (the caller holds the shard's lease and deletes the page of the
        entry it read): ``expected_rev + 1`` with a fresh entry, if the row is still at ``expected_rev``."""
        return self._commit(schedule.schedule_id, schedule, expected_rev, copies=False)

    def _commit(
        self,
        schedule_id: str,
        schedule: Schedule | None,
        expected_rev: int | None,
        *,
        skipped_report: int = 0,
        copies: bool = True,
    ) -> bool:
        """One transaction: the row (``schedule``, or deleted when None) if still at ``expected_rev`` (None: new),
        a fresh entry when active, and (``copies``) every page holding an older entry rewritten without it."""
        shard = shard_of(schedule_id)
        if expected_rev is None:  # a deleted schedule's entries went with it: a new one starts at 1
            rev = 1
            condition, values = "attribute_not_exists(pk)", None
        else:
            rev, condition = expected_rev + 1, "rev = :r"
            values = {":r": {"N": str(expected_rev)}}
        actions: list[TransactWriteItemTypeDef] = []
        if schedule is None:
            key = {"pk": {"S": row_pk(shard)}, "sk": {"S": schedule_id}}
            actions.append({"Delete": {"TableName": self.table, "Key": key, "ConditionExpression": condition,
                                       "ExpressionAttributeValues": values or {}}})  # fmt: skip
        else:
            put: Any = {"TableName": self.table, "Item": row_item(schedule, rev), "ConditionExpression": condition}
            if values:
                put["ExpressionAttributeValues"] = values
            actions.append({"Put": put})
            where = op_page_key(schedule, rev)
            if where is not None:
                entry = {schedule_id: entry_of(schedule, rev, skipped_report=skipped_report)}
                actions.append({"Put": {"TableName": self.table, "Item": page_item(shard, where, 0, entry)}})
        if copies and expected_rev is not None:
            actions.extend(self._without(shard, schedule_id))
        if len(actions) > _TRANSACTION:
            raise TransientError(f"schedule {schedule_id!r} has entries in {len(actions) - 2} due pages: try again")
        try:
            self.client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            codes = [str(r.get("Code", "")) for r in exc.response.get("CancellationReasons") or []]
            if codes and codes[0] == "ConditionalCheckFailed":
                return False
            raise translate(exc, f"writing schedule {schedule_id!r}", self.table) from exc
        except BotoCoreError as exc:
            raise translate(exc, f"writing schedule {schedule_id!r}", self.table) from exc
        return True

    def _without(self, shard: int, schedule_id: str) -> list[TransactWriteItemTypeDef]:
        """The pages holding an entry of ``schedule_id``, rewritten without it (deleted when left empty)."""
        actions: list[TransactWriteItemTypeDef] = []
        for page in self.pages(shard):
            if schedule_id not in page.entries:
                continue
            kept = {sid: e for sid, e in page.entries.items() if sid != schedule_id}
            if kept or page.unreadable:
                item = page_item(shard, page.sk, page.generation + 1, kept, dict(page.unreadable))
                actions.append({"Put": {"TableName": self.table, "Item": item}})
            else:
                key = {"pk": {"S": due_pk(shard)}, "sk": {"S": page.sk}}
                actions.append({"Delete": {"TableName": self.table, "Key": key}})
        return actions

    def _row_ids(self, shard: int, after: str | None, limit: int) -> list[Row]:
        """Up to ``limit`` rows of a shard after ``after``, in id order."""
        values: dict[str, Any] = {":p": {"S": row_pk(shard)}}
        condition = "pk = :p"
        if after is not None:
            condition += " AND sk > :a"
            values[":a"] = {"S": after}
        rows: list[Row] = []
        kwargs: dict[str, Any] = {}
        while len(rows) < limit:
            try:
                reply = self.client.query(
                    TableName=self.table,
                    KeyConditionExpression=condition,
                    ExpressionAttributeValues=values,
                    ConsistentRead=True,
                    Limit=limit - len(rows),
                    **kwargs,
                )
            except (ClientError, BotoCoreError) as exc:
                raise translate(exc, "listing schedules", self.table) from exc
            for item in reply.get("Items", []):
                try:
                    rows.append(row_of_item(item))
                except InvalidScheduleError:
                    continue  # an unreadable row is listed by nobody; `describe` names it
            if not reply.get("LastEvaluatedKey"):
                break
            kwargs = {"ExclusiveStartKey": reply["LastEvaluatedKey"]}
        return rows

    def list(self, after: str | None = None, limit: int = 100) -> Sequence[Schedule]:
        """Schedules in id order after ``after``: the shards' rows merged, then their live entries."""
        limit = max(0, limit)
        if limit == 0:
            return []
        per_shard = [self._row_ids(shard, after, limit) for shard in range(SHARDS)]
        rows = list(heapq.merge(*per_shard, key=lambda r: r.schedule.schedule_id))[:limit]
        by_shard: dict[int, set[str]] = {}
        for r in rows:
            by_shard.setdefault(shard_of(r.schedule.schedule_id), set()).add(r.schedule.schedule_id)
        entries: dict[str, Entry] = {}
        for shard, ids in by_shard.items():
            entries.update(self.entries(shard, ids))
        return [merged(r, entries.get(r.schedule.schedule_id)) for r in rows]

    def _holding(self, schedule_id: str) -> _Holding:
        """The shard's lease, for an operator's write (waits for a timer pass)."""
        return _Holding(self, shard_of(schedule_id))


class _Holding:
    """An operator's hold of a shard's lease (a context manager)."""

    def __init__(self, store: DynamoDbScheduleStore, shard: int) -> None:
        self.store, self.shard = store, shard
        self.held: Held | None = None

    def __enter__(self) -> Held:
        self.held = self.store.leases.wait(self.shard, f"op-{uuid.uuid4().hex}", self.store.wait_seconds)
        return self.held

    def __exit__(self, *exc: object) -> None:
        if self.held is not None:
            with contextlib.suppress(TransientError):  # expired meanwhile: nothing to free
                self.store.leases.release(self.held)


def _keep_newest(best: dict[str, Entry], sid: str, entry: Entry) -> None:
    current = best.get(sid)
    if current is None or (entry.rev, entry.version) > (current.rev, current.version):
        best[sid] = entry
