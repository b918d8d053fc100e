"""Plan: cancellations, the requeue-or-forward choice per message, and the results the batch reports."""

from __future__ import annotations

import math
from dataclasses import replace

from ...cancellations import Cancellation, CancellationCache, CancellationKind
from ...errors import TransientError
from ...planning import HopAction, decide_hop
from .records import HopOutcome, RecordResult, Work, messages_of

__all__ = ["annotate", "applied_records", "apply_cancellations", "route", "unpacked"]


def apply_cancellations(cache: CancellationCache, items: list[Work], now_ms: int) -> None:
    """Drop cancelled messages and re-plan rescheduled ones (one cached lookup per endpoint)."""
    live = [w for w in items if w.reason is None and w.remaining is not None]
    records = {endpoint: cache.lookup(endpoint) for endpoint in {w.source.destination for w in live}}
    for w in live:
        record = records[w.source.destination].get(w.message_id)
        if record is None:
            continue
        w.applied = record
        if record.kind is CancellationKind.CANCEL:
            w.result = RecordResult(
                w.record_id, w.message_id, HopOutcome.CANCELLED, w.hop, w.source.destination, w.remaining
            )
            continue
        assert record.due_at is not None
        due_ms = int(record.due_at.timestamp() * 1000)
        # On a park return ``received_ms`` is the broker's time now (case 3), for the decision and the remainder.
        w.remaining_ms = max(0, due_ms - (w.received_ms if w.park_return else now_ms))
        w.decision_ms = max(0, due_ms - w.received_ms)
        w.remaining = math.ceil(w.remaining_ms / 1000)


def route(items: list[Work], max_native_delay: int) -> tuple[dict[str, list[Work]], dict[str, list[Work]]]:
    """The messages still to hop, by queue: (back to their ``-delay.fifo`` queue, on to their destination)."""
    requeue: dict[str, list[Work]] = {}
    forward: dict[str, list[Work]] = {}
    for w in items:
        if w.reason is not None or w.remaining is None or w.result is not None or w.park_s:
            continue
        decision = decide_hop(math.ceil(w.decision_ms / 1000), max_native_delay)
        # A park return is requeued, never forwarded (docs/requeue.md, case 3).
        back = w.park_return and w.applied is None
        target = requeue if back or decision.action is HopAction.REQUEUE else forward
        target.setdefault(w.source.delay_queue if target is requeue else w.source.destination, []).append(w)
    return requeue, forward


def annotate(items: list[Work]) -> None:
    """Add the applied cancellation record, and why a park was refused, to each message's result."""
    for w in items:
        if w.applied is not None and w.result is not None:
            w.result = replace(w.result, cancellation=w.applied)
        if w.park_failure is not None and w.result is not None and w.result.reason is None:
            w.result = replace(w.result, reason=f"hopped instead of parking: {w.park_failure}")


def unpacked(w: Work) -> RecordResult:
    """One result for an envelope record: ``FAILED`` (retry it all) when any inner message failed."""
    assert w.children is not None
    inner = tuple(c.result for c in w.children if c.result is not None)
    if inner and len(inner) == len(w.children) and all(r.outcome is HopOutcome.PARKED for r in inner):
        return RecordResult(
            w.record_id,
            w.message_id,
            HopOutcome.PARKED,
            w.hop,
            w.source.destination,
            inner=inner,
            park_s=inner[0].park_s,
        )
    failed = [r for r in inner if r.outcome is HopOutcome.FAILED]
    if failed or len(inner) != len(w.children):
        error = failed[0].error if failed and failed[0].error else TransientError("an inner message has no outcome")
        reason = f"{len(failed)} of {len(w.children)} inner messages failed: {error}"
        return RecordResult(
            w.record_id, w.message_id, HopOutcome.FAILED, w.hop, w.source.destination, None, reason, error, inner
        )
    return RecordResult(w.record_id, w.message_id, HopOutcome.UNPACKED, w.hop, w.source.destination, inner=inner)


def applied_records(work: list[Work]) -> list[Cancellation]:
    """The cancellation records applied to messages whose hop (and whose record's) did not fail: these can go."""
    return [
        c.applied
        for w in work
        if w.result is not None and w.result.outcome is not HopOutcome.FAILED
        for c in messages_of(w)
        if c.applied is not None and c.result is not None and c.result.outcome is not HopOutcome.FAILED
    ]
