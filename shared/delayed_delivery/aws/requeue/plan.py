"""Plan: cancellations, the action per message (forward, requeue, park, error queue, drop), and the results."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ...cancellations import Cancellation, CancellationCache, CancellationKind, StoredRecord, UnreadableRecord
from ...errors import DelayedDeliveryError, TransientError
from ...planning import HopAction, decide_hop
from .records import HopOutcome, ParsedMessage, ParsedRecord, RecordResult

__all__ = [
    "Ledger",
    "MessagePlan",
    "annotate",
    "applied_records",
    "hop_action",
    "lookup_cancellations",
    "plan_message",
    "record_result",
    "rescheduled",
    "result_of",
]


@dataclass(frozen=True, slots=True)
class MessagePlan:
    """The plan for one message: its action, the hop it takes when not parked, the park and the record applied."""

    index: int
    message: ParsedMessage
    action: HopAction
    hop: HopAction
    park_s: int = 0
    applied: StoredRecord | None = None
    park_failure: str | None = None
    #: Release control: the seconds its slot adds (forwarded to a capped destination).
    release_lag: float | None = None
    #: Release control: requeued because no slot was free within the native cap.
    release_wait: bool = False

    @property
    def queue(self) -> str:
        """The queue a hop goes to: back to the ``-delay.fifo`` queue, or on to the destination."""
        source = self.message.source
        return source.delay_queue if self.action is HopAction.REQUEUE else source.destination


@dataclass(slots=True)
class Ledger:
    """The outcomes of one batch so far, by message index: results, and poison reasons met while sending."""

    results: dict[int, RecordResult] = field(default_factory=dict)
    poison: dict[int, str] = field(default_factory=dict)

    def settle(self, plan: MessagePlan, result: RecordResult) -> None:
        """Record ``plan``'s result."""
        self.results[plan.index] = result

    def refuse(self, plan: MessagePlan, reason: str) -> None:
        """Record that ``plan``'s message goes to the error queue for ``reason``."""
        self.poison[plan.index] = reason

    def fail(self, plan: MessagePlan, error: DelayedDeliveryError) -> None:
        """Report ``plan``'s message ``FAILED`` (the event source makes its record visible again)."""
        m = plan.message
        self.results[plan.index] = result_of(m, HopOutcome.FAILED, m.hop, reason=str(error), error=error)


def result_of(m: ParsedMessage, outcome: HopOutcome, hop: int, **extra: Any) -> RecordResult:
    """The result of one message (its remaining delay in whole seconds, when it has one)."""
    return RecordResult(m.record_id, m.message_id, outcome, hop, m.source.destination, m.remaining, **extra)


def lookup_cancellations(cache: CancellationCache, messages: Sequence[ParsedMessage]) -> list[StoredRecord | None]:
    """The live cancellation record bound to each message, if any (one cached lookup per endpoint).

    A record binds to a message first sent before it was requested (``Cancellation.binds``), or of unknown send
    time; a message sent later under the same id is left alone.
    """
    live = [m.live for m in messages]
    endpoints = {m.source.destination for m, ok in zip(messages, live, strict=True) if ok}
    records = {endpoint: cache.lookup(endpoint) for endpoint in endpoints}
    found = [
        records[m.source.destination].get(m.message_id) if ok else None for m, ok in zip(messages, live, strict=True)
    ]
    return [r if r is not None and r.binds(_sent_at(m)) else None for r, m in zip(found, messages, strict=True)]


def _sent_at(m: ParsedMessage) -> datetime | None:
    """When ``m`` was first sent, if known."""
    return None if m.sent_ms is None else datetime.fromtimestamp(m.sent_ms / 1000, UTC)


def rescheduled(m: ParsedMessage, record: Cancellation, now_ms: int) -> ParsedMessage:
    """``m`` with the remaining delay to the rescheduled due time (decided from the broker's first receive)."""
    assert record.due_at is not None
    due_ms = int(record.due_at.timestamp() * 1000)
    # On a park return ``received_ms`` is the broker's time now (case 3), for the decision and the remainder.
    remaining_ms = max(0, due_ms - (m.received_ms if m.park_return else now_ms))
    return replace(
        m,
        remaining_ms=remaining_ms,
        decision_ms=max(0, due_ms - m.received_ms),
        remaining=math.ceil(remaining_ms / 1000),
    )


def hop_action(m: ParsedMessage, applied: StoredRecord | None, max_native_delay: int) -> HopAction:
    """Requeue or forward, from the broker-only decision; a park return is requeued, never forwarded (case 3)."""
    decision = decide_hop(math.ceil(m.decision_ms / 1000), max_native_delay)
    back = m.park_return and applied is None
    return HopAction.REQUEUE if back else decision.action


def plan_message(
    index: int, m: ParsedMessage, applied: StoredRecord | None, park_s: int, max_native_delay: int, now_ms: int
) -> MessagePlan:
    """The plan for one message: error queue (poison, or a record that cannot be read), drop (cancelled), park, or its
    hop."""
    if not m.live:
        return MessagePlan(index, m, HopAction.ERROR_QUEUE, HopAction.ERROR_QUEUE)
    if isinstance(applied, UnreadableRecord):  # deleted once the message is on the error queue
        held = replace(m, reason=applied.problem())
        return MessagePlan(index, held, HopAction.ERROR_QUEUE, HopAction.ERROR_QUEUE, applied=applied)
    if applied is not None and applied.kind is CancellationKind.CANCEL:
        return MessagePlan(index, m, HopAction.DROP, HopAction.DROP, applied=applied)
    if applied is not None:
        m = rescheduled(m, applied, now_ms)
    hop = hop_action(m, applied, max_native_delay)
    return MessagePlan(index, m, HopAction.PARK if park_s else hop, hop, park_s, applied)


def annotate(plan: MessagePlan, result: RecordResult) -> RecordResult:
    """Add the applied cancellation record, and why a park was refused, to a message's result."""
    if plan.applied is not None:
        result = replace(result, cancellation=plan.applied)
    if plan.park_failure is not None and result.reason is None:
        result = replace(result, reason=f"hopped instead of parking: {plan.park_failure}")
    if plan.release_lag is not None or plan.release_wait:
        result = replace(result, release_lag_s=plan.release_lag, release_wait=plan.release_wait)
    return result


def record_result(record: ParsedRecord, inner: tuple[RecordResult, ...]) -> RecordResult:
    """One result for an envelope record: ``FAILED`` (retry it all) when any inner message failed."""
    m, count = record.message, len(record.messages)
    if inner and len(inner) == count and all(r.outcome is HopOutcome.PARKED for r in inner):
        return RecordResult(
            m.record_id,
            m.message_id,
            HopOutcome.PARKED,
            m.hop,
            m.source.destination,
            inner=inner,
            park_s=inner[0].park_s,
        )
    failed = [r for r in inner if r.outcome is HopOutcome.FAILED]
    if failed or len(inner) != count:
        error = failed[0].error if failed and failed[0].error else TransientError("an inner message has no outcome")
        reason = f"{len(failed)} of {count} inner messages failed: {error}"
        return RecordResult(
            m.record_id, m.message_id, HopOutcome.FAILED, m.hop, m.source.destination, None, reason, error, inner
        )
    return RecordResult(m.record_id, m.message_id, HopOutcome.UNPACKED, m.hop, m.source.destination, inner=inner)


def applied_records(
    record_results: Sequence[RecordResult | None],
    plans: Sequence[Sequence[MessagePlan]],
    results: dict[int, RecordResult],
) -> list[StoredRecord]:
    """The cancellation records applied to messages whose hop (and whose record's) did not fail: these can go."""
    return [
        p.applied
        for record, record_plans in zip(record_results, plans, strict=True)
        if record is not None and record.outcome is not HopOutcome.FAILED
        for p in record_plans
        if p.applied is not None and p.index in results and results[p.index].outcome is not HopOutcome.FAILED
    ]
