"""The SQS route's settings: the native cap, the ``-delay.fifo`` hop, parking, packing and where long delays go.

They come beside the core settings (``DelayedDeliverySettings``: on/off, error queue, retries), which every route
reads; the time-bucket tier's timing is ``aws.tier.config.TierSettings``. Environment variables and errors as in
``delayed_delivery.envsettings``; ``python -m delayed_delivery.aws.settings`` prints the table the README embeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from ..envsettings import EnvSettings, check_numbers, setting_label
from ..errors import ConfigurationError
from ..naming import validate_sqs_queue_name
from ..planning import MAX_PARK_SECONDS
from ..timebuckets.cost import DEFAULT_TRAFFIC_PER_MINUTE
from .packing import DEFAULT_PACK_BYTES

__all__ = ["LONG_DELAY_ROUTES", "LongDelayRoute", "SqsSettings"]


class LongDelayRoute(StrEnum):
    """How SQS delays beyond the native cap travel (``long_delay_route``); each equals its string."""

    AUTO = "auto"
    FIFO = "fifo"
    BUCKETS = "buckets"

    @classmethod
    def parse(cls, text: str) -> LongDelayRoute:
        """The route named ``text``, or a ConfigurationError naming the choices."""
        try:
            return cls(text)
        except ValueError:
            raise ConfigurationError(
                f"{setting_label('long_delay_route')} must be one of {', '.join(LONG_DELAY_ROUTES)}, got {text!r}"
            ) from None


#: The values of ``long_delay_route`` (the first is the default).
LONG_DELAY_ROUTES = tuple(route.value for route in LongDelayRoute)

_DOCS = {
    "max_native_delay": "Longest delay the queue holds natively (SQS: 900 s).",
    "fifo_queue_delay": "Queue-level delay of each -delay.fifo hop (SQS: 900 s).",
    "max_park_seconds": "Longest time the SQS requeue function hides a long-delayed -delay.fifo record with "
    "ChangeMessageVisibility instead of hopping it (at most 42,600 s: SQS's 12 h from the receive less 10 min; "
    "0 turns parking off).",
    "park_max_in_flight": "The SQS requeue function parks no new records while its -delay.fifo queue has more "
    "messages in flight than this (SQS FIFO queues stop at 120,000).",
    "pack_bytes": "Envelope size: the sender and the requeue function put two or more long-delay messages into one "
    "-delay.fifo message of up to this many bytes (and the queue's MaximumMessageSize); 0 turns packing off.",
    "long_delay_route": "How SQS delays beyond max_native_delay travel: auto (the cheaper of the two for each delay "
    "at auto_traffic_per_minute, from the measured cost model; the -delay.fifo queue while the tier's ingest queue "
    "is not there), fifo (the -delay.fifo queue: NServiceBus-style) or buckets (the S3 time-bucket tier).",
    "auto_traffic_per_minute": "The long-delayed messages (past max_native_delay) all your senders send a minute: "
    "auto prices the time-bucket tier at this traffic, since its objects hold more messages the more there are "
    "(measured at 100, 1,000 and 10,000; the ingest's BucketMessagesIngested metric shows yours).",
    "bucket_ingest_queue": "The standard SQS queue the sender hands bucket-routed messages to (the tier's ingest).",
}


@dataclass(frozen=True, slots=True)
class SqsSettings(EnvSettings):
    """What the SQS sender, the requeue function and the tier's route read beside the core settings."""

    DOCS: ClassVar[Mapping[str, str]] = _DOCS

    max_native_delay: int = 900
    fifo_queue_delay: int = 900
    max_park_seconds: int = MAX_PARK_SECONDS
    park_max_in_flight: int = 100_000
    pack_bytes: int = DEFAULT_PACK_BYTES
    long_delay_route: LongDelayRoute = field(default=LongDelayRoute.AUTO, metadata={"parse": LongDelayRoute.parse})
    auto_traffic_per_minute: int = DEFAULT_TRAFFIC_PER_MINUTE
    bucket_ingest_queue: str = "delayed-delivery-ingest"

    def __post_init__(self) -> None:
        check_numbers(self)
        for name in ("max_native_delay", "fifo_queue_delay"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"{setting_label(name)} must be at least 1 second, got {getattr(self, name)!r}"
                )
        if self.max_park_seconds > MAX_PARK_SECONDS:
            raise ConfigurationError(
                f"{setting_label('max_park_seconds')} must be at most {MAX_PARK_SECONDS} (SQS's 12-hour visibility "
                f"limit counts from the receive, and 10 minutes are kept for the function to act), "
                f"got {self.max_park_seconds}"
            )
        if self.auto_traffic_per_minute < 1:
            raise ConfigurationError(
                f"{setting_label('auto_traffic_per_minute')} must be at least 1 message a minute, "
                f"got {self.auto_traffic_per_minute!r}"
            )
        if not isinstance(self.long_delay_route, LongDelayRoute):  # a plain string, as callers and the env give it
            object.__setattr__(self, "long_delay_route", LongDelayRoute.parse(str(self.long_delay_route)))
        try:
            validate_sqs_queue_name(self.bucket_ingest_queue)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{setting_label('bucket_ingest_queue')}: {exc}") from None


if __name__ == "__main__":
    print(SqsSettings.markdown_reference())
