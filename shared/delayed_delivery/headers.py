"""Header and attribute names the product writes; fixed so operators can search for them."""

from __future__ import annotations

from collections.abc import Iterable

from .errors import InvalidMessageError

__all__ = [
    "BODY_ENCODING",
    "DELAY_SECONDS_ATTRIBUTE",
    "FAILED_AT",
    "FAILURE_COUNT",
    "FAILURE_REASON",
    "HEADER_PREFIX",
    "OCCURRENCE",
    "ORIGINAL_DESTINATION",
    "SCHEDULE_ID",
    "UNREADABLE",
    "is_reserved",
    "refuse_reserved",
]

#: Prefix reserved for the product's own headers and attributes.
HEADER_PREFIX = "DelayedDelivery."
#: Why a message went to the error queue.
FAILURE_REASON = "DelayedDelivery.FailureReason"
#: Where the message was meant to go before it went to the error queue.
ORIGINAL_DESTINATION = "DelayedDelivery.OriginalDestination"
#: ISO-8601 UTC time the message was moved to the error queue.
FAILED_AT = "DelayedDelivery.FailedAt"
#: How many delivery attempts failed.
FAILURE_COUNT = "DelayedDelivery.FailureCount"
#: SQS message attribute on ``-delay.fifo`` messages: total delay in whole seconds.
DELAY_SECONDS_ATTRIBUTE = "DelayedDelivery.DelaySeconds"
#: Set to ``base64`` on an error-queue copy whose body was not UTF-8 text (SQS bodies are text).
BODY_ENCODING = "DelayedDelivery.BodyEncoding"
#: On a message rebuilt from a store row that could not be read: why. It goes straight to the error queue.
UNREADABLE = "DelayedDelivery.Unreadable"
#: On an occurrence of a recurring schedule: the schedule's id, and the occurrence's nominal instant (UTC, ``Z``).
SCHEDULE_ID = "DelayedDelivery.ScheduleId"
OCCURRENCE = "DelayedDelivery.Occurrence"


def is_reserved(name: str) -> bool:
    """True when ``name`` starts with the reserved ``DelayedDelivery.`` prefix (in any letter case)."""
    return name[: len(HEADER_PREFIX)].casefold() == HEADER_PREFIX.casefold()


def refuse_reserved(names: Iterable[object], what: str = "header") -> None:
    """Raise ``InvalidMessageError`` naming the first name in ``names`` that uses the reserved prefix."""
    for name in names:
        if isinstance(name, str) and is_reserved(name):
            raise InvalidMessageError(
                f"{what} {name!r}: the {HEADER_PREFIX!r} prefix is reserved for delayed delivery's own "
                f"{what}s (failure reason, delay, unreadable rows, envelopes); choose another name"
            )
