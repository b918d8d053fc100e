"""The Azure table store's settling: remove, count a failure, reschedule, each under the fetch's claim token.

With a claim token (the dispatcher) a change applies only while the due row still holds that claim (its
``ClaimToken`` property, or, for an exclusive view, the token kept in memory); otherwise it does nothing and
reports False (superseded). Without one (an operator) a row a dispatcher's claim still holds is refused with
``MessageInFlightError``. Deletes and merges are ETag-conditional on the row that was checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from ..clock import utc
from ..errors import TransientError
from ..model import DelayedMessage
from ..ports import in_flight
from . import rows, transactions
from .sdk_errors import is_status, translate
from .table_gateway import CLAIM, Operation, if_match
from .table_claims import MAX_TRANSACTION_OPERATIONS, TableClaims

__all__ = ["TableSettling"]

_CONFLICT_RETRIES = 5
#: Settled removals per transaction: a due row and an index row each.
_PAIRS = MAX_TRANSACTION_OPERATIONS // 2


def _available_of(rk: str) -> str:
    """The due-time key inside a due row's RowKey."""
    return rk[len(rows.DUE_PREFIX) : len(rows.DUE_PREFIX) + 20]


class TableSettling(TableClaims):
    """``remove``, ``remove_many``, ``increment_failure_count`` and ``reschedule``."""

    def _holds(self, message_id: str, claim: str, row: Any) -> bool:
        """Whether ``row`` (the message's due row) still holds ``claim``."""
        if self.exclusive:
            with self._lock:
                return self._tokens.get(message_id) == claim
        return str(row.get(CLAIM) or "") == claim

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
                self._claimed.pop(mid, None)
                self._handed.pop(mid, None)
                self._tokens.pop(mid, None)

    def _due_row(self, message_id: str, claim: str | None) -> tuple[str, str, Any] | None:
        """``(partition, row key, row)`` of the message's due row, or None when it is gone."""
        with self._lock:
            cached = self._claimed.get(message_id) if claim is not None else None
        for located in (cached, self._locate(message_id)):
            if located is None:
                continue
            try:
                return located[0], located[1], self.table.get_entity(*located)
            except ResourceNotFoundError:
                continue
            except AzureError as exc:
                raise translate(exc, f"reading {message_id!r}") from exc
        return None

    def remove(self, message_id: str, claim: str | None = None) -> bool:
        """Delete the message (due and index rows together); False when gone, or superseded under ``claim``."""
        try:
            for _ in range(_CONFLICT_RETRIES):
                found = self._due_row(message_id, claim)
                if found is None:
                    return False
                pk, rk, row = found
                if claim is not None and not self._holds(message_id, claim, row):
                    return False
                if claim is None:
                    self._refuse_in_flight(message_id, row)
                if self._delete_pair(message_id, pk, rk, row.metadata["etag"]):
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

    def _removal_jobs(
        self, wanted: dict[str, str | None]
    ) -> tuple[list[tuple[str, list[tuple[str, str, str | None]]]], list[str]]:
        """Transactions ``(partition, [(id, row key, etag)])`` for claimed rows still held; the rest one by one."""
        known: dict[tuple[str, str], list[tuple[str, str]]] = {}
        unknown: list[str] = []
        with self._lock:
            for mid, claim in wanted.items():
                cached = self._claimed.get(mid)
                if cached is None or claim is None or self._tokens.get(mid) != claim:
                    unknown.append(mid)
                else:
                    known.setdefault((cached[0], claim), []).append((mid, cached[1]))
        jobs: list[tuple[str, list[tuple[str, str, str | None]]]] = []
        for (pk, claim), pairs in known.items():
            etags = {} if self.exclusive else self._held_etags(pk, claim, [rk for _, rk in pairs])
            still = [(mid, rk, etags.get(rk)) for mid, rk in pairs if self.exclusive or rk in etags]
            unknown.extend(mid for mid, rk in pairs if not (self.exclusive or rk in etags))
            jobs.extend((pk, still[i : i + _PAIRS]) for i in range(0, len(still), _PAIRS))
        return jobs, unknown

    def _held_etags(self, pk: str, claim: str, row_keys: list[str]) -> dict[str, str]:
        """ETags of the due rows among ``row_keys`` that still hold ``claim`` (one query over their key range)."""
        found = self._query(
            f"PartitionKey eq @pk and RowKey ge @lo and RowKey le @hi and {CLAIM} eq @claim",
            {"pk": pk, "lo": min(row_keys), "hi": max(row_keys), "claim": claim},
            select=["RowKey"],
        )
        keys = set(row_keys)
        return {str(e["RowKey"]): str(e.metadata["etag"]) for e in found if str(e["RowKey"]) in keys}

    def _delete_chunk(self, job: tuple[str, list[tuple[str, str, str | None]]]) -> tuple[list[str], bool]:
        pk, chunk = job
        ops: list[Operation] = []
        for mid, rk, etag in chunk:
            ops.append(("delete", {"PartitionKey": pk, "RowKey": rk}, {} if etag is None else if_match(etag, None)))
            ops.append(("delete", {"PartitionKey": pk, "RowKey": rows.index_row_key(mid)}, {}))
        try:
            transactions.submit(self.table, ops)
        except TableTransactionError:  # a row changed or went meanwhile: settle one by one
            return [mid for mid, _, _ in chunk], False
        except AzureError as exc:
            raise translate(exc, "removing dispatched messages") from exc
        return [mid for mid, _, _ in chunk], True

    def increment_failure_count(self, message_id: str, claim: str | None = None) -> bool:
        """Count one failed delivery and make the row fetchable again at its due time (the claim token stays)."""
        what = f"counting a failure of {message_id!r}"
        for _ in range(_CONFLICT_RETRIES):
            located = self._locate(message_id) or self._restore_index(message_id)
            if located is None:
                return False
            pk, rk = located
            try:
                row = self.table.get_entity(pk, rk, select=["FailureCount", CLAIM])
                if claim is not None and not self._holds(message_id, claim, row):
                    return False
                patch = {
                    "PartitionKey": pk,
                    "RowKey": rk,
                    "FailureCount": int(row.get("FailureCount", 0)) + 1,
                    "AvailableAt": _available_of(rk),
                }
                self.table.update_entity(patch, **if_match(row.metadata["etag"], UpdateMode.MERGE))
                with self._lock:
                    self._handed.pop(message_id, None)  # the claim is released; its token stays for the settling
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
            pk = rows.partition_key(rows.shard_of(message_id, self.shards))
            try:
                index = self.table.get_entity(pk, rows.index_row_key(message_id))
                old = self.table.get_entity(pk, str(index["DueRowKey"]))
            except ResourceNotFoundError:
                if self._locate(message_id) is None:
                    return False
                continue
            except AzureError as exc:
                raise translate(exc, what) from exc
            if claim is not None and not self._holds(message_id, claim, old):
                return False
            if claim is None:
                self._refuse_in_flight(message_id, old)
            try:
                self.table.submit_transaction(self._move_ops(pk, index, old, due_at))
            except TableTransactionError as exc:
                if is_status(exc, 404, 409, 412):
                    continue
                raise translate(exc, what) from exc
            except AzureError as exc:
                raise translate(exc, what) from exc
            self._settled([message_id])
            return True
        raise TransientError(f"{what}: kept conflicting with concurrent writers")

    def _move_ops(self, pk: str, index: Any, old: Any, due_at: datetime) -> list[Operation]:
        """The transaction moving the due row ``old`` to ``due_at``, unclaimed."""
        message = rows.message_from_entity(old)
        moved = DelayedMessage(
            message.message_id, message.destination, message.body, due_at, message.headers, message.failure_count
        )
        new_due, new_index = rows.to_entities(moved, rows.shard_of(message.message_id, self.shards))
        if new_due["RowKey"] == old["RowKey"]:
            patch = {"PartitionKey": pk, "RowKey": old["RowKey"], "AvailableAt": rows.due_key(due_at), CLAIM: ""}
            return [("update", patch, if_match(old.metadata["etag"], UpdateMode.MERGE))]
        return [
            ("create", new_due, {}),
            ("update", new_index, if_match(index.metadata["etag"], UpdateMode.REPLACE)),
            ("delete", dict(old), if_match(old.metadata["etag"], None)),
        ]
