"""Header and attribute names the product writes; fixed so operators can search for them."""

from __future__ import annotations

__all__ = [
    "BODY_ENCODING",
    "DELAY_SECONDS_ATTRIBUTE",
    "FAILED_AT",
    "FAILURE_COUNT",
    "FAILURE_REASON",
    "HEADER_PREFIX",
    "ORIGINAL_DESTINATION",
    "UNREADABLE",
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
