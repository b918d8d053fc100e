"""Place rows on their queues ahead of their due time, hidden until then by the Storage Queue visibility timeout.

A burst due in one second then needs no puts in that second: its puts are spread over the lead before it
(``DELAYED_DELIVERY_PLACE_AHEAD``), and the queue service makes every message visible at its due time.

Per row (all ETag-conditional, in transactions of ≤ 100 per partition): claim it as the dispatcher does
(``ClaimToken``, ``AvailableAt = now + claim_timeout``) and mark it ``Placing`` (before any put: from then on a copy
may wait on the queue that the row does not name, so operators are refused, never told "cancelled"), put it with
``visibility_timeout = ⌈due − now⌉``, then record the placement (``QueueMessageId``, ``PopReceipt``, ``AvailableAt =
PLACED_KEY``: never fetched again; operators cancel it by its pop receipt, ``placed_ops.py``). A row whose due time
has passed is deleted by ``sweep`` (its message is
visible on its queue). A put that fails gives the row back; a record that cannot be written (the claim was lost)
deletes the placed message again with its pop receipt. Only a crash between a put and its record repeats a
message: the claim expires and the row is placed (or sent) again. The ``Placing`` mark is cleared only by the record
(or give-back of a put certainly not made) of the placement that wrote it; a row whose earlier placement was never
recorded keeps it (that copy may still arrive) until the row is delivered and removed.

Rows are left to the dispatcher when due within ``MIN_AHEAD`` seconds, capped by release control, bound for a
destination the policy refuses, unreadable, or too large for a queue message.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import TableClient, UpdateMode

from .. import logfields as lf
from ..clock import Clock
from ..errors import DelayedDeliveryError, TransientError
from ..release import ReleaseRates
from . import rows
from .destinations import DestinationPolicy
from .sdk_errors import is_status
from .storage_queue import MAX_NATIVE_DELAY_SECONDS, StorageQueueTransport
from .table_gateway import Operation, TableGateway

__all__ = ["MIN_AHEAD", "PlacementReport", "Placer"]

#: Rows due sooner than this are left to the dispatcher (a placement must not land after its due time).
MIN_AHEAD = 2.0
#: Seconds between placement passes of one shard (each pass reads the rows that entered the lead since).
PLACE_EVERY = 5.0
#: A placed row is deleted this long after its due time (its message is visible by then).
SWEEP_AFTER = 2.0
#: Rows read per pass and shard beyond the batch, looking past rows left to the dispatcher.
_SCAN = 1000
#: Attempts to record placements before the placed messages are deleted again.
_RECORD_ATTEMPTS = 4

_log = logging.getLogger("delayed_delivery.azure.placement")


@dataclass(slots=True)
class PlacementReport:
    """What placement did in one run of one shard."""

    placed: int = 0
    given_back: int = 0
    revoked: int = 0
    swept: int = 0
    #: How far inside the lead (seconds) the earliest row still unplaced was due when the run ended (0: caught up).
    behind_s: float = 0.0

    def merge(self, other: PlacementReport) -> None:
        """Add ``other``'s counts (the larger lag)."""
        self.placed += other.placed
        self.given_back += other.given_back
        self.revoked += other.revoked
        self.swept += other.swept
        self.behind_s = max(self.behind_s, other.behind_s)


@dataclass(frozen=True, slots=True)
class _Put:
    row: rows.DueRow
    placed: tuple[str, str] | None
    #: Whether this placement's record (or give-back) clears the ``Placing`` mark: it wrote the mark, and no copy
    #: of it can be on the queue unnamed (recorded, or the put certainly not made).
    clears: bool = False


class Placer:
    """Places one shard's rows due within ``lead`` seconds on their queues, hidden until due."""

    def __init__(
        self,
        table: TableClient,
        shards: int,
        shard: int,
        transport: StorageQueueTransport,
        policy: DestinationPolicy,
        *,
        lead: float,
        clock: Clock,
        claim_timeout: float,
        concurrency: int = 16,
        release_rates: ReleaseRates | None = None,
        batch: int = 100,
    ) -> None:
        self.rows = TableGateway(table, shards)
        self.shard = shard
        self.pk = rows.partition_key(shard)
        self.transport = transport
        self.policy = policy
        self.lead = timedelta(seconds=min(lead, MAX_NATIVE_DELAY_SECONDS - 60))
        self.clock = clock
        self.claim_timeout = timedelta(seconds=claim_timeout)
        self.concurrency = max(1, concurrency)
        self.release_rates = release_rates or ReleaseRates()
        self.batch = max(1, min(100, batch))

    def run(self, keep_going: Callable[[], bool], every: float = PLACE_EVERY) -> PlacementReport:
        """Sweep, then place and sweep every ``every`` seconds while ``keep_going()``."""
        report = PlacementReport()
        caught_up = True
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="place") as pool:
            while keep_going():
                report.swept += self.sweep()
                try:
                    while keep_going() and self.place_batch(pool, keep_going, report):
                        pass
                    caught_up = keep_going()  # the last batch was not full: nothing of the lead was left
                except DelayedDeliveryError as exc:  # storage trouble: the next pass tries again
                    caught_up = False
                    _log.warning("placement pass failed", extra={lf.EVENT: "place_failed", lf.REASON: repr(exc)})
                wake = time.monotonic() + every
                while keep_going() and time.monotonic() < wake:
                    time.sleep(min(0.2, max(0.0, wake - time.monotonic())))
        report.behind_s = 0.0 if caught_up else self.behind()
        _log.info(
            "placement run finished",
            extra={lf.EVENT: lf.EVENT_PLACEMENT_LAG, lf.SHARD: self.shard, lf.BEHIND_S: round(report.behind_s, 1)},
        )
        return report

    def behind(self) -> float:
        """How far inside the lead the earliest row placement may take is due (seconds; 0 when there is none): a
        placer that ends its run with a backlog is that far behind. Rows sent less than the lead ahead count too,
        so this is read only when a run ends before its placer caught up."""
        now = self.clock.now()
        try:
            first = self._candidates(now, limit=1)
        except DelayedDeliveryError:
            return 0.0
        if not first:
            return 0.0
        ahead = (first[0][0].message.due_at - now).total_seconds()
        return max(0.0, self.lead.total_seconds() - ahead)

    def place_batch(self, pool: ThreadPoolExecutor, keep_going: Callable[[], bool], report: PlacementReport) -> bool:
        """Place up to one batch of the rows due within the lead; whether a full batch was found (look again)."""
        now = self.clock.now()
        candidates = self._candidates(now)
        if not candidates:
            return False
        token = uuid.uuid4().hex
        # the mark goes on with the claim, before any put; an earlier placement's mark stays (its copy may arrive)
        earlier = {row.row_key: marked for row, marked in candidates}
        marks = {rk: {} if marked else rows.placing_mark(token) for rk, marked in earlier.items()}
        claimed = self.rows.claim([row for row, _ in candidates], rows.due_key(now + self.claim_timeout), token, marks)
        puts = list(pool.map(lambda row: self._put(row, keep_going, not earlier[row.row_key]), claimed))
        self._give_back([p for p in puts if p.placed is None], report)
        self._record([p for p in puts if p.placed is not None], report)
        return len(candidates) >= self.batch and keep_going()

    def _candidates(self, now: datetime, limit: int | None = None) -> list[tuple[rows.DueRow, bool]]:
        """Unclaimed rows due between ``MIN_AHEAD`` and the lead from ``now`` that placement may take (at most
        ``limit``, default a batch), each with whether it carries an earlier placement's ``Placing`` mark."""
        limit = limit or self.batch
        lo = rows.DUE_PREFIX + rows.due_key(now + timedelta(seconds=MIN_AHEAD))
        hi = rows.DUE_PREFIX + rows.due_key(now + self.lead)
        found: list[tuple[rows.DueRow, bool]] = []
        now_key = rows.due_key(now)
        for n, entity in enumerate(
            self.rows.query(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi and AvailableAt lt @placed",
                {"pk": self.pk, "lo": lo, "hi": hi, "placed": rows.PLACED_KEY},
                page_size=limit,
            )
        ):
            # unclaimed: available at its own due time (never claimed, given back, or after a failure), or a claim
            # that has expired
            available, own = str(entity.get("AvailableAt")), str(entity["RowKey"])[len(rows.DUE_PREFIX) :][:20]
            row = self._placeable(entity) if available in (own, min(available, now_key)) else None
            if row is not None:
                found.append((row, bool(entity.get(rows.PLACING))))
            if len(found) >= limit or n >= _SCAN:
                break
        return found

    def _placeable(self, entity: Any) -> rows.DueRow | None:
        """The row as a ``DueRow`` when placement may take it, else None (the dispatcher sends it when due)."""
        try:
            message = rows.message_from_entity(entity)
        except (KeyError, ValueError, TypeError):
            return None
        if self.policy.refusal(message.destination) or self.release_rates.rate_for(message.destination) is not None:
            return None
        rk = str(entity["RowKey"])
        if rows.deferred_slot(entity) is not None:
            return None  # kept back by release control: its slot is its row key, the dispatcher books it
        return rows.DueRow(self.pk, rk, str(entity.metadata["etag"]), str(entity["AvailableAt"]), message)

    def _put(self, row: rows.DueRow, keep_going: Callable[[], bool], marked: bool) -> _Put:
        """Put ``row``'s message hidden until its due time; ``placed`` None when it was not put. ``marked``: this
        placement wrote the row's ``Placing`` mark."""
        if not keep_going():
            return _Put(row, None, marked)
        now = self.clock.now()
        hidden = math.ceil((row.message.due_at - now).total_seconds())
        if hidden < 1:
            return _Put(row, None, marked)  # due by now: the dispatcher sends it
        try:
            return _Put(row, self.transport.place(row.message, hidden, sent_at=now), marked)
        except DelayedDeliveryError as exc:
            _log.info(
                "placement failed; the dispatcher sends it when due",
                extra={lf.EVENT: "place_failed", lf.MESSAGE_ID: row.message.message_id, lf.REASON: repr(exc)},
            )
            # a timeout or reset may have put it all the same: then the mark stays (a copy may arrive)
            return _Put(row, None, marked and _certainly_not_put(exc))

    def _give_back(self, back: Sequence[_Put], report: PlacementReport) -> None:
        """Release the claims of rows not placed (fetchable again at once); a failure leaves them to expire."""
        if not back:
            return
        try:
            report.given_back += sum(self.rows.commit_each(self.pk, [_give_back_ops(self.rows, p) for p in back]))
        except DelayedDeliveryError as exc:
            _log.warning("could not give back unplaced rows; their claims expire", extra={lf.REASON: repr(exc)})

    def _record(self, puts: Sequence[_Put], report: PlacementReport) -> None:
        """Write each placement on its row (conditional on the claim); a row lost meanwhile has its message deleted."""
        pending = list(puts)
        for attempt in range(_RECORD_ATTEMPTS):
            if not pending:
                return
            try:
                done = self.rows.commit_each(self.pk, [_record_ops(p) for p in pending])
            except TransientError as exc:
                _log.warning("recording placements failed; retrying", extra={lf.REASON: repr(exc)})
                time.sleep(0.5 * 2**attempt)
                continue
            # after a failed attempt the first write may have taken effect (its answer lost): such a row fails the
            # retry's condition but names this placement, so it is recorded, not lost
            done = [ok or (attempt > 0 and self._recorded(p)) for p, ok in zip(pending, done, strict=True)]
            report.placed += sum(done)
            lost = [p for p, ok in zip(pending, done, strict=True) if not ok]
            self._revoke(lost, report)
            return
        self._revoke([p for p in pending if not self._recorded(p)], report)

    def _recorded(self, put: _Put) -> bool:
        """Whether ``put``'s row names its placement (a record whose answer was lost took effect); a row that cannot
        be read counts as recorded (its message stays on the queue: a duplicate at worst, never a loss)."""
        assert put.placed is not None
        try:
            row = self.rows.read(put.row.partition_key, put.row.row_key, "reading a placed row")
        except DelayedDeliveryError:
            return True
        return row is not None and row.get(rows.QUEUE_MESSAGE_ID) == put.placed[0]

    def _revoke(self, puts: Sequence[_Put], report: PlacementReport) -> None:
        """Delete placed messages whose rows were not marked (another dispatcher owns them now)."""
        for p in puts:
            assert p.placed is not None
            try:
                if self.transport.revoke(p.row.message.destination, *p.placed):
                    report.revoked += 1
                    continue
            except DelayedDeliveryError:
                pass
            _log.warning(
                "a placed message could not be withdrawn: it may be delivered twice",
                extra={lf.EVENT: lf.EVENT_PLACE_NOT_WITHDRAWN, lf.MESSAGE_ID: p.row.message.message_id},
            )

    def sweep(self) -> int:
        """Delete the placed rows due more than ``SWEEP_AFTER`` seconds ago (their messages are visible)."""
        hi = rows.DUE_PREFIX + rows.due_key(self.clock.now() - timedelta(seconds=SWEEP_AFTER))
        swept = 0
        try:
            done = [
                (str(e["MessageId"]), str(e["RowKey"]), str(e.metadata["etag"]))
                for e in self.rows.query(
                    "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi and AvailableAt eq @placed",
                    {"pk": self.pk, "lo": rows.DUE_PREFIX, "hi": hi, "placed": rows.PLACED_KEY},
                    select=["RowKey", "MessageId"],
                )
            ]
            for start in range(0, len(done), 50):
                chunk = done[start : start + 50]
                if self.rows.delete_pairs(self.pk, chunk):
                    swept += len(chunk)
                else:
                    swept += sum(self.rows.delete_pair(mid, self.pk, rk, etag) for mid, rk, etag in chunk)
        except DelayedDeliveryError as exc:
            _log.warning("sweeping placed rows failed; the next pass retries", extra={lf.REASON: repr(exc)})
        return swept


def _certainly_not_put(exc: DelayedDeliveryError) -> bool:
    """Whether a failed put certainly left nothing on the queue: refused outright, or throttled (429/503)."""
    return not isinstance(exc, TransientError) or is_status(exc.__cause__ or exc, 429, 503)


def _give_back_ops(gateway: TableGateway, put: _Put) -> list[Operation]:
    """Release ``put``'s claim; clear its ``Placing`` mark when it wrote it and certainly put nothing."""
    ops = gateway.release_ops(put.row)
    if put.clears:
        ops[0][1].update(rows.placing_mark(""))
    return ops


def _record_ops(put: _Put) -> list[Operation]:
    """The merge marking ``put.row`` placed, applying only while the row is as its claim left it."""
    assert put.placed is not None
    patch = rows.placed_patch(put.row.partition_key, put.row.row_key, *put.placed)
    if put.clears:  # this placement wrote the mark and its copy is the one now named: nothing unnamed is left
        patch.update(rows.placing_mark(""))
    # the claim token stays on the row: operators see it held (``MessagePlacedError``)
    condition = {"etag": put.row.etag, "match_condition": MatchConditions.IfNotModified, "mode": UpdateMode.MERGE}
    return [("update", patch, condition)]
