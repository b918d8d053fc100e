"""Delayed messages in an Azure Storage table: the store (``TableView``, ``table_view.py``, fetches and claims).

Guarantees (the fetch's in ``table_view.py``):

* A message's due row and index row change together in one entity-group transaction; ``reschedule``
  inserts the new due row and deletes the old one in the same transaction.
* Settling (remove, count a failure, reschedule, defer) under the fetch's claim token applies only while the due
  row still holds that claim (its ``ClaimToken``); otherwise it does nothing and reports False (superseded), so it
  never touches a row that replaced the one it fetched. Without one (an operator) a row a dispatcher's claim still
  holds is refused with ``MessageInFlightError``. Deletes and merges are ETag-conditional on the row that was
  checked, or on the ETag the claim itself wrote.
* ``defer`` (release control) re-keys a claimed row by its release slot, so it is read again only then.
* Every azure.core exception is re-raised as a core error (``TransientError`` for throttling and
  timeouts, ``ConfigurationError`` for a missing table, ``PermanentError`` otherwise).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, TableTransactionError

from .. import logfields as lf
from ..clock import utc
from ..errors import InvalidMessageError, TransientError
from ..naming import validate_azure_table_name
from ..ports import DelayedMessageStore, ReleaseBacklog, in_flight
from . import rows
from .placed_ops import is_placed, unrecorded_placement, unrecorded_send
from .sdk_errors import is_status, translate
from .table_gateway import CLAIM, MAX_TRANSACTION_OPERATIONS, Operation
from .table_view import CONFLICT_RETRIES as _CONFLICT_RETRIES
from .table_view import TableView
from .table_view import available_of as _available_of

__all__ = ["MAX_TRANSACTION_OPERATIONS", "TableDelayedMessageStore"]

#: Backoff of a removal transaction that failed transiently (doubling up to the maximum, for half the claim).
_REMOVAL_FIRST_PAUSE = 0.2
_REMOVAL_MAX_PAUSE = 5.0
#: Settled removals per transaction: a due row and an index row each.
_PAIRS = MAX_TRANSACTION_OPERATIONS // 2

_log = logging.getLogger("delayed_delivery.azure.table_store")

#: A transaction of settled removals: ``(partition, [(id, due row key, etag or None)])``.
_Removal = tuple[str, list[tuple[str, str, str | None]]]


class TableDelayedMessageStore(TableView, DelayedMessageStore):
    """The ``DelayedMessageStore`` on one Azure table (reschedulable, batch-removing, with infrastructure)."""

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
