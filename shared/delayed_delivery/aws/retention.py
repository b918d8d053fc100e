"""How long the queues where messages wait for a retry or for an operator must keep them: one rule for ``aws check``,
``aws verify`` and what ``aws create`` and the CDK stack make.

The tier's ingest queue, its dead-letter queue and the error queues keep messages 14 days, the SQS maximum. Shorter
loses messages: below the ingest's longest wait (its batching window, its timeout and a margin: 420 s as deployed)
every record expires before the ingest function takes it; below 14 days a record held up by an outage (S3 refusing,
the function failing) or a message nobody has looked at yet expires. A record moved to the dead-letter queue keeps
its first enqueue time, so it expires there counting from its first send.
"""

from __future__ import annotations

from enum import StrEnum

from ..durations import format_duration
from .tier.config import ingest_wait_seconds

__all__ = ["HOLD_RETENTION_SECONDS", "Holding", "retention_fix", "retention_problem"]

#: Retention of every queue where messages wait for a retry or an operator: 14 days, the SQS maximum.
HOLD_RETENTION_SECONDS = 14 * 24 * 3600


class Holding(StrEnum):
    """What a queue holds, for the words of its problem."""

    INGEST = "ingest queue"
    INGEST_DLQ = "ingest dead-letter queue"
    ERROR = "error queue"


def _consequence(kind: Holding, retention: int) -> str:
    kept = format_duration(retention)
    if kind is Holding.INGEST and retention < ingest_wait_seconds():
        return (
            f"records expire before the ingest function takes them (it may wait {ingest_wait_seconds()} s: batching "
            "window, timeout and margin), so every message sent through the tier is lost"
        )
    if kind is Holding.INGEST:
        return f"a record held up longer than {kept} (S3 refusing, the ingest function failing) expires, messages lost"
    if kind is Holding.INGEST_DLQ:
        return f"a record set aside here expires {kept} after its first send (SQS keeps that time), maybe unseen"
    return f"a message moved here expires after {kept}, maybe before anyone can look at it or send it again"


def retention_problem(kind: Holding, name: str, retention: int) -> str | None:
    """Why ``name``'s ``MessageRetentionPeriod`` of ``retention`` seconds loses messages, or None when it does not."""
    if retention >= HOLD_RETENTION_SECONDS:
        return None
    return (
        f"{kind.value} {name!r}: MessageRetentionPeriod below {HOLD_RETENTION_SECONDS} s (14 days): {retention:,} s; "
        f"{_consequence(kind, retention)}"
    )


def retention_fix(url: str) -> str:
    """The command that gives the queue at ``url`` its 14 days back."""
    return (
        f"aws sqs set-queue-attributes --queue-url {url} --attributes MessageRetentionPeriod={HOLD_RETENTION_SECONDS}"
    )
