"""Delayed messages in an Azure Storage table (row design in ``rows.py``, storage primitives in ``table_gateway.py``).

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
* Every fetch writes its claim (``ClaimToken`` and ``AvailableAt``) on the rows it returns, the lease holder's
  exclusive view too: that is the in-flight mark operators see. Settling (remove, count a failure, reschedule,
  defer) under the fetch's claim token applies only while the due row still holds that claim (its
  ``ClaimToken``); otherwise it does nothing and reports False (superseded), so it never touches a row that
  replaced the one it fetched. Without one (an operator) a row a dispatcher's claim still holds is refused with
  ``MessageInFlightError``. Deletes and merges are ETag-conditional on the row that was checked, or on the
  ETag the claim itself wrote.
* ``defer`` (release control) re-keys a claimed row by its release slot, so it is read again only then.
* Every azure.core exception is re-raised as a core error (``TransientError`` for throttling and
  timeouts, ``ConfigurationError`` for a missing table, ``PermanentError`` otherwise).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableServiceClient, TableTransactionError

from .. import logfields as lf
from ..clock import utc
from ..errors import (
    ConfigurationError,
    DelayedDeliveryError,
    InvalidMessageError,
    TransientError,
)
from ..model import DelayedMessage
from ..naming import validate_azure_table_name
from ..ports import ClaimedMessage, DelayedMessageStore, ReleaseBacklog, in_flight
from . import rows
from .placed_ops import PlacedMessages, is_placed, unrecorded_placement, unrecorded_send
from .sdk_errors import is_status, translate
from .storage_queue import StorageQueueTransport
from .table_gateway import CLAIM, MAX_TRANSACTION_OPERATIONS, Operation, Pair, TableGateway

__all__ = ["MAX_TRANSACTION_OPERATIONS", "TableDelayedMessageStore"]

_CONFLICT_RETRIES = 5
#: Backoff of a removal transaction that failed transiently (doubling up to the maximum, for half the claim).
_REMOVAL_FIRST_PAUSE = 0.2
_REMOVAL_MAX_PAUSE = 5.0
#: Settled removals per transaction: a due row and an index row each.
_PAIRS = MAX_TRANSACTION_OPERATIONS // 2

_log = logging.getLogger("delayed_delivery.azure.table_store")

#: A transaction of settled removals: ``(partition, [(id, due row key, etag or None)])``.
_Removal = tuple[str, list[tuple[str, str, str | None]]]


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

    @classmethod
    def from_connection_string(cls, connection_string: str, table_name: str, **kwargs: Any) -> TableDelayedMessageStore:
        """A store on ``table_name`` in the account of ``connection_string`` (e.g. Azurite)."""
        validate_azure_table_name(table_name)
        service = TableServiceClient.from_connection_string(connection_string)
        return cls(service.get_table_client(table_name), **kwargs)

    def for_shards(self, shards: Iterable[int], *, exclusive: bool = False) -> TableDelayedMessageStore:
        """A view of the same table that fetches only from ``shards`` (one dispatcher per leased shard).

        ``exclusive=True`` is for a caller holding the shards' blob leases: ``fetch_due`` then starts each shard's
        query after the rows it has handed out and not yet settled (they are not read again). It still claims what
        it returns in the table (one transaction per batch), so operators see those rows in flight.
        """
        return TableDelayedMessageStore(
            self.table,
            shards=self.shards,
            fetch_shards=shards,
            claim_timeout=self.claim_timeout.total_seconds(),
            page_size=self.page_size,
            exclusive=exclusive,
            queues=self.placed_queues,
        )

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
                due = _available_of(str(entity["RowKey"]))
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
        for _ in range(_CONFLICT_RETRIES * 4):
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

    # -- settling ----------------------------------------------------------------

    def remove(self, message_id: str, claim: str | None = None) -> bool:
        """Delete the message (due and index rows together); False when gone, or superseded under ``claim``."""
        try:
            for _ in range(_CONFLICT_RETRIES):
                found = self._due_row(message_id, claim)
                if found is None:
                    return False
                pk, rk, row = found
                if claim is not None and not self._holds(row, claim):
                    return False
                if claim is None:
                    self._refuse_unrecorded(message_id, row)
                if claim is None and is_placed(row):
                    cancelled = self._placed.cancel(message_id, pk, row, datetime.now(UTC))
                    if cancelled is None:
                        continue  # its row changed meanwhile (another operator): look again
                    return cancelled
                if claim is None:
                    self._refuse_in_flight(message_id, row)
                if self._rows.delete_pair(message_id, pk, rk, row.metadata["etag"]):
                    return True
            raise TransientError(f"removing {message_id!r}: kept conflicting with concurrent writers")
        finally:
            self._settled([message_id], claim)

    def remove_many(self, message_ids: Sequence[str], claims: Sequence[str | None] | None = None) -> Sequence[bool]:
        """Delete many messages in transactions of at most 100 operations per partition; one flag per id."""
        held = list(claims) if claims is not None else [None] * len(message_ids)
        result = dict.fromkeys(message_ids, False)
        wanted = dict(zip(message_ids, held, strict=True))
        jobs, unknown = self._removal_jobs(wanted)
        if len(jobs) > 1:  # independent transactions: run them side by side
            with ThreadPoolExecutor(min(4, len(jobs))) as pool:
                outcomes = list(pool.map(self._delete_chunk, jobs))
        else:
            outcomes = [self._delete_chunk(job) for job in jobs]
        for mids, ok in outcomes:
            if ok:
                result.update(dict.fromkeys(mids, True))
                self._settled(mids)
            else:
                unknown.extend(mids)
        for mid in unknown:
            result[mid] = self.remove(mid, wanted[mid])
        return [result[mid] for mid in message_ids]

    def _removal_jobs(self, wanted: dict[str, str | None]) -> tuple[list[_Removal], list[str]]:
        """Transactions for claimed rows, each conditional on the ETag its claim wrote; the rest (ids) one by one."""
        known: dict[str, list[tuple[str, str, str | None]]] = {}
        unknown: list[str] = []
        with self._lock:
            for mid, claim in wanted.items():
                row = self._held.get(mid)
                if row is None or claim is None or self._tokens.get(mid) != claim or not row.etag:
                    unknown.append(mid)
                else:
                    known.setdefault(row.partition_key, []).append((mid, row.row_key, row.etag))
        jobs: list[_Removal] = []
        for pk, still in known.items():
            jobs.extend((pk, still[i : i + _PAIRS]) for i in range(0, len(still), _PAIRS))
        return jobs, unknown

    def _delete_chunk(self, job: _Removal) -> tuple[list[str], bool]:
        """One removal transaction; False when a row changed or went meanwhile (then settle one by one).

        A transient failure (a reset connection: ``$batch`` is a POST the SDK does not retry, a 503) is retried with
        backoff for up to half the claim, the rows' claims kept meanwhile: a sent row is not sent again for want of
        its removal. Retrying is safe: each delete is conditional on the claim's ETag, and a transaction that did
        succeed the first time fails the second (404), which ``remove`` then settles as already removed.
        """
        pk, chunk = job
        mids = [mid for mid, _, _ in chunk]
        give_up = time.monotonic() + self.claim_timeout.total_seconds() / 2
        pause = _REMOVAL_FIRST_PAUSE
        while True:
            try:
                return mids, self._rows.delete_pairs(pk, chunk)
            except TransientError as exc:
                if time.monotonic() + pause > give_up:
                    _log.error(  # its rows keep their claims: when they expire the messages are sent again
                        "removing sent messages failed for good; they will be sent again",
                        extra={
                            lf.EVENT: lf.EVENT_REMOVAL_FAILED,
                            lf.SHARD: pk,
                            lf.REASON: repr(exc),
                            "messages": len(mids),
                        },
                    )
                    raise
                _log.warning(
                    "removing sent messages failed; retrying",
                    extra={lf.EVENT: "removal_retry", lf.SHARD: pk, lf.REASON: repr(exc), "messages": len(mids)},
                )
                time.sleep(pause)
                pause = min(2 * pause, _REMOVAL_MAX_PAUSE)

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        """Count one failed delivery and make the row fetchable again at its due time (the claim token stays, and so
        does the ``Sending`` mark: the put may have been made)."""
        return self._count_failure(message_id, claim, unsent=False)

    def count_unsent_failure(self, message_id: str, claim: str) -> bool:
        """``increment_failure_count`` of a send the destination refused: nothing was put, so the ``Sending`` mark this
        claim wrote is cleared (an earlier claim's stays) and operators may cancel the row exactly again."""
        return self._count_failure(message_id, claim, unsent=True)

    def _count_failure(self, message_id: str, claim: str | None, *, unsent: bool) -> bool:
        what = f"counting a failure of {message_id!r}"
        for _ in range(_CONFLICT_RETRIES):
            located = self._rows.locate(message_id) or self._restore_index(message_id)
            if located is None:
                return False
            pk, rk = located
            try:
                row = self._rows.get(pk, rk, select=["FailureCount", CLAIM, rows.SENDING])
                if claim is not None and not self._holds(row, claim):
                    return False
                patch = {
                    "PartitionKey": pk,
                    "RowKey": rk,
                    "FailureCount": int(row.get("FailureCount", 0)) + 1,
                    "AvailableAt": _available_of(rk),
                }
                if unsent and claim is not None and row.get(rows.SENDING) == claim:
                    patch.update(rows.sending_mark(""))
                self._rows.merge(patch, row.metadata["etag"])
                with self._lock:
                    self._handed.pop(message_id, None)  # the claim is released; its token stays for the settling
                    if message_id in self._held:  # ... and its row has changed since the claim: no ETag to rely on
                        self._held[message_id] = replace(self._held[message_id], etag="")
                return True
            except (ResourceNotFoundError, ResourceModifiedError):
                continue
            except AzureError as exc:
                raise translate(exc, what) from exc
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    def reschedule(self, message_id: str, due_at: datetime, claim: str | None = None) -> bool:
        """Move the message to ``due_at`` and release its claim: new row in, old row out, one transaction."""
        due_at = utc(due_at)
        what = f"rescheduling {message_id!r}"
        for _ in range(_CONFLICT_RETRIES):
            pk = self._rows.partition_of(message_id)
            try:
                index = self._rows.get(pk, rows.index_row_key(message_id))
                old = self._rows.get(pk, str(index["DueRowKey"]))
            except ResourceNotFoundError:
                if self._rows.locate(message_id) is None:
                    return False
                continue
            except AzureError as exc:
                raise translate(exc, what) from exc
            if claim is not None and not self._holds(old, claim):
                return False
            if claim is None:
                self._refuse_unrecorded(message_id, old)
            if claim is None and is_placed(old):
                if self._placed.reschedule(message_id, pk, old, due_at, datetime.now(UTC)) is None:
                    continue  # its row changed meanwhile (another operator): look again
                return True
            if claim is None:
                self._refuse_in_flight(message_id, old)
            try:
                self._rows.commit(self._rows.move_ops(pk, index, old, due_at))
            except TableTransactionError as exc:
                if is_status(exc, 404, 409, 412):
                    continue
                raise translate(exc, what) from exc
            except AzureError as exc:
                raise translate(exc, what) from exc
            self._settled([message_id])
            return True
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    def defer(self, deferrals: Sequence[tuple[str, datetime, str]]) -> Sequence[bool]:
        """For each ``(id, slot, claim)``: keep the claimed row back until its release slot, unclaimed (one flag each).

        The row is re-keyed by its slot (``rows.deferred_entities``: nothing reads it before then, and ``pending``
        counts it at the slot), its due time kept; the fetch that takes it again names the slot. Rows of one
        partition move in shared transactions, each conditional on the ETag its claim wrote; a row that changed
        since is looked at again and moved only while it still holds the claim. False when it is gone, holds
        another claim, or cannot carry the extra property.
        """
        flags = [False] * len(deferrals)
        changes: dict[str, list[tuple[int, list[Operation]]]] = {}
        again: list[int] = []
        with self._lock:
            held = [(self._held.get(mid), self._tokens.get(mid)) for mid, _, _ in deferrals]
        for n, ((_, slot, claim), (row, token)) in enumerate(zip(deferrals, held, strict=True)):
            if row is None or token != claim or not row.etag:
                again.append(n)
                continue
            try:
                changes.setdefault(row.partition_key, []).append((n, self._rows.defer_ops(row, utc(slot))))
            except InvalidMessageError:
                continue  # cannot carry its slot: its claim expires and it is planned again
        for pk, items in changes.items():
            done = self._rows.commit_each(pk, [ops for _, ops in items])
            for (n, _), ok in zip(items, done, strict=True):
                flags[n] = ok
                if not ok:
                    again.append(n)
        for n in again:
            mid, slot, claim = deferrals[n]
            flags[n] = self._defer_one(mid, utc(slot), claim)
        self._settled([mid for (mid, _, _), ok in zip(deferrals, flags, strict=True) if ok])
        return flags

    def _defer_one(self, message_id: str, slot: datetime, claim: str) -> bool:
        """``defer`` of one row read afresh: only while it holds ``claim``."""
        for _ in range(_CONFLICT_RETRIES):
            found = self._due_row(message_id, claim)
            if found is None or not self._holds(found[2], claim):
                return False
            pk, rk, entity = found
            try:
                message = rows.message_from_entity(entity)
            except (KeyError, ValueError, TypeError):
                return False
            earlier = str(entity.get(rows.SENDING) or "")  # the mark as the claim found it (its own is its token)
            row = rows.DueRow(
                pk, rk, str(entity.metadata["etag"]), str(entity.get("AvailableAt")), message,
                sending="" if earlier == claim else earlier,
            )  # fmt: skip
            try:
                if self._rows.commit_each(pk, [self._rows.defer_ops(row, slot)])[0]:
                    return True
            except InvalidMessageError:
                return False
        raise TransientError(f"deferring {message_id!r}: kept conflicting with concurrent writers")

    def release_backlog(self) -> ReleaseBacklog:
        """Deferred, unclaimed rows per destination: how many, and the latest slot (reads every deferred row)."""
        backlog: dict[str, tuple[int, datetime]] = {}
        for entity in self._rows.query(
            f"RowKey ge @lo and RowKey lt @hi and {rows.DUE_AT} ne ''",
            {"lo": rows.DUE_PREFIX, "hi": rows.DUE_END},
            select=["RowKey", "Destination", rows.DUE_AT, CLAIM],
        ):
            slot = rows.deferred_slot(entity)
            if slot is None or entity.get(CLAIM):
                continue
            destination = str(entity.get("Destination"))
            count, latest = backlog.get(destination, (0, slot))
            backlog[destination] = (count + 1, max(latest, slot))
        return backlog

    def _due_row(self, message_id: str, claim: str | None) -> tuple[str, str, Any] | None:
        """``(partition, row key, row)`` of the message's due row, or None when it is gone."""
        with self._lock:
            held = self._held.get(message_id) if claim is not None else None
        cached = None if held is None else (held.partition_key, held.row_key)
        for located in (cached, self._rows.locate(message_id)):
            if located is None:
                continue
            row = self._rows.read(*located, f"reading {message_id!r}")
            if row is not None:
                return located[0], located[1], row
        return None

    def _restore_index(self, message_id: str) -> tuple[str, str] | None:
        """Write the missing index row of a claimed due row (a garbage row), so it can be settled by id."""
        with self._lock:
            held = self._held.get(message_id)
        if held is None or held.partition_key != self._rows.partition_of(message_id):
            return None
        return self._rows.restore_index(message_id, held.partition_key, held.row_key)

    @staticmethod
    def _holds(row: Any, claim: str) -> bool:
        """Whether ``row`` (the message's due row, as the table has it now) still holds ``claim``."""
        return str(row.get(CLAIM) or "") == claim

    def _refuse_unrecorded(self, message_id: str, row: Any) -> None:
        """Refuse an operator while ``row`` carries a ``Placing`` or ``Sending`` mark: a copy may wait on its queue
        that no record names (in flight while the claim lasts, then refused for good: it is delivered)."""
        if row.get(rows.PLACING):
            if not is_placed(row):
                self._refuse_in_flight(message_id, row)  # its placer's claim lasts: under way, try again
            raise unrecorded_placement(message_id, row)
        if rows.maybe_sent(row):
            self._refuse_in_flight(message_id, row)  # its dispatcher's claim lasts: under way, try again
            raise unrecorded_send(message_id, row)

    def _refuse_in_flight(self, message_id: str, row: Any) -> None:
        """Raise ``MessageInFlightError`` while a dispatcher's claim on ``row`` lasts (this host's clock)."""
        available = row.get("AvailableAt")
        if not row.get(CLAIM) or not isinstance(available, str) or not available.isdigit():
            return
        if available > _available_of(str(row["RowKey"])) and available > rows.due_key(datetime.now(UTC)):
            raise in_flight(message_id)

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


def _available_of(rk: str) -> str:
    """The due-time key inside a due row's RowKey."""
    return rk[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]
