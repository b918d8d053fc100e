"""The time-bucket tier's configuration from the environment: one object for its two functions and the CLI.

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_*`` core settings | see ``DelayedDeliverySettings`` | error queue, on/off |
| ``DELAYED_DELIVERY_*`` SQS settings | see ``SqsSettings`` | ingest queue, ``long_delay_route`` |
| ``DELAYED_DELIVERY_BUCKET_*`` | see ``TierSettings`` | bucket sizes, dispatch lead, send phase, big buckets |
| ``DELAYED_DELIVERY_BUCKET_NAME`` | none (required by both functions) | the S3 bucket holding the bucket objects |
| ``DELAYED_DELIVERY_BUCKET_PREFIX`` | ``delayed-delivery/buckets`` | key prefix of the objects inside it |
| ``DELAYED_DELIVERY_CANCELLATION_TABLE`` | none (no lookups) | DynamoDB table of cancel / reschedule records |
| ``DELAYED_DELIVERY_BUCKET_DESTINATIONS`` | none (any) | the queues it delivers to, comma-separated (CDK sets it) |
| ``POWERTOOLS_SERVICE_NAME`` | ``delayed-delivery-buckets`` | service name on logs, metrics and traces |
| ``POWERTOOLS_METRICS_NAMESPACE`` | ``DelayedDelivery`` | CloudWatch namespace of the EMF metrics |

``python -m delayed_delivery.aws.tier.config`` prints the ``TierSettings`` table the README embeds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ...envsettings import EnvSettings, check_numbers, env_name, setting_label
from ...errors import ConfigurationError
from ...naming import FIFO_SUFFIX, validate_sqs_queue_name
from ...settings import DelayedDeliverySettings
from ...timebuckets.plans import MAX_PARTITIONS
from ...timebuckets.wheel import DEFAULT_DISPATCH_LEAD_SECONDS, BucketLevel
from ...validation import is_whole
from ..config import NAMESPACE_ENV, RELEASE_TABLE_ENV, SERVICE_ENV, TABLE_ENV
from ..settings import SqsSettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from ..release_calendar import ReleaseCalendar

__all__ = [
    "BUCKET_NAME_ENV",
    "BUCKET_PREFIX_ENV",
    "DEFAULT_PREFIX",
    "DEFAULT_REFUSED_RETRY_SECONDS",
    "DEFAULT_SEND_PHASE_MS",
    "DEFAULT_SERVICE",
    "DESTINATIONS_ENV",
    "INGEST_TIMEOUT_SECONDS",
    "INGEST_WAIT_MARGIN_SECONDS",
    "INGEST_WINDOW_SECONDS",
    "MAX_INGEST_WINDOW_SECONDS",
    "BucketTierConfig",
    "TierSettings",
    "check_ingest_wait",
    "destinations_from_env",
    "ingest_wait_seconds",
    "outside_reason",
]

#: Environment variable naming the S3 bucket of the tier.
BUCKET_NAME_ENV = "DELAYED_DELIVERY_BUCKET_NAME"
#: Environment variable: the key prefix of the bucket objects (S3-safe segments joined by slashes).
BUCKET_PREFIX_ENV = "DELAYED_DELIVERY_BUCKET_PREFIX"
DEFAULT_PREFIX = "delayed-delivery/buckets"
DEFAULT_SERVICE = "delayed-delivery-buckets"
DEFAULT_NAMESPACE = "DelayedDelivery"
#: Environment variable: the queues the tier may deliver to, comma-separated (unset: any queue).
DESTINATIONS_ENV = "DELAYED_DELIVERY_BUCKET_DESTINATIONS"
#: The timer's send phase when none is set (``bucket_send_phase_ms``).
DEFAULT_SEND_PHASE_MS = 250
#: The ingest function's batching window by default (its SQS event source's ``MaximumBatchingWindowInSeconds``): at
#: low traffic an invocation gathers this long, so its objects hold more messages; Lambda allows 0 to 300.
INGEST_WINDOW_SECONDS = 300
MAX_INGEST_WINDOW_SECONDS = 300
#: The ingest function's timeout: a successful invocation has written its objects by then.
INGEST_TIMEOUT_SECONDS = 60
#: Room for what else delays a record on its way to S3: the event source's poll, a cold start, clock skew.
INGEST_WAIT_MARGIN_SECONDS = 60
#: How long past its due time a message its destination refuses is retried (``bucket_refused_retry_seconds``).
DEFAULT_REFUSED_RETRY_SECONDS = 3600
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

_DOCS = {
    "bucket_fine_seconds": "Length of a fine (near) time bucket (seconds).",
    "bucket_coarse_seconds": "Length of a coarse (far) time bucket; a multiple of bucket_fine_seconds (seconds).",
    "bucket_dispatch_lead_seconds": "How long before a fine bucket starts it is dispatched, the rest waiting as "
    "DelaySeconds; plus bucket_fine_seconds at most 900, and max_native_delay less both must cover the ingest's wait "
    "(batching window + timeout + 60 s: 420 s as deployed) (seconds).",
    "bucket_send_phase_ms": "The bucket timer sends each message when its due time is a whole number of seconds "
    "away, within this step, so SQS's whole-second DelaySeconds add at most this much lateness; it costs up to 1 s "
    "of timer time per bucket sent ahead of its due time and splits a destination's batches into up to 1000 / step "
    "sends; 0 sends at once, up to 1 s late (1 to 1000 milliseconds, or 0).",
    "bucket_refused_retry_seconds": "How long past its due time the bucket timer keeps retrying a message whose "
    "destination refuses it (access denied, a KMS key it may not use: an operator's fix), written back every run; "
    "then the message goes to the error queue with the reason (seconds).",
    "bucket_cascade_group_bytes": "Decompressed bytes of lines the timer reads into one cascade group before writing "
    "it into fine buckets (memory is about twice that; 1 MiB to 64 MiB).",
    "bucket_inline_max_messages": "The most messages a bucket the timer sends itself may hold once read (past it, "
    "the bucket is planned and sent in pieces instead).",
    "bucket_inline_max_bytes": "A ready fine bucket whose objects are listed at most this many bytes, and hold at "
    "most this many once read decompressed, is sent by the timer itself, at once; a bigger one is planned.",
    "bucket_piece_bytes": "Decompressed bytes of one partition's lines sent between two progress records: what a "
    "killed worker sends again at most (16 KiB to 64 MiB).",
    "bucket_partition_messages": "A planned bucket gets one partition per this many messages, up to "
    "bucket_dispatch_concurrency partitions.",
    "bucket_partition_max_messages": "The most messages a partition is planned with (more partitions than "
    "bucket_dispatch_concurrency when needed): bounds what a worker remembers.",
    "bucket_dispatch_concurrency": "Dispatch workers running at once (the dispatch function's event source "
    "MaximumConcurrency; 1 to 1,000).",
    "bucket_dispatch_queue": "The SQS queue of dispatch tasks the dispatch function reads; empty: the timer sends "
    "its plans' pieces itself.",
    "bucket_send_threads": "SendMessageBatch calls one timer or worker keeps in flight at once (1 to 64).",
}
_MIB = 1024 * 1024
#: Bounds of the settings for big buckets (inclusive).
_BOUNDS = {
    "bucket_cascade_group_bytes": (_MIB, 64 * _MIB),
    "bucket_inline_max_messages": (0, 100_000),
    "bucket_inline_max_bytes": (0, 64 * _MIB),
    "bucket_piece_bytes": (16 * 1024, 64 * _MIB),
    "bucket_partition_messages": (1, 10_000_000),
    "bucket_partition_max_messages": (1_000, 1_000_000),
    "bucket_dispatch_concurrency": (1, 1_000),
    "bucket_send_threads": (1, 64),
}


@dataclass(frozen=True, slots=True)
class TierSettings(EnvSettings):
    """The tier's timing (the wheel's bucket sizes and dispatch lead, the timer's send phase) and how it reads,
    plans and sends big buckets (docs/buckets.md, "Bursts")."""

    DOCS: ClassVar[Mapping[str, str]] = _DOCS

    bucket_fine_seconds: int = 60
    bucket_coarse_seconds: int = 86_400
    bucket_dispatch_lead_seconds: int = DEFAULT_DISPATCH_LEAD_SECONDS
    bucket_send_phase_ms: int = DEFAULT_SEND_PHASE_MS
    bucket_refused_retry_seconds: int = DEFAULT_REFUSED_RETRY_SECONDS
    bucket_cascade_group_bytes: int = 24 * _MIB
    bucket_inline_max_messages: int = 4_000
    bucket_inline_max_bytes: int = 4 * _MIB
    bucket_piece_bytes: int = 4 * _MIB
    bucket_partition_messages: int = 25_000
    bucket_partition_max_messages: int = 100_000
    bucket_dispatch_concurrency: int = 32
    bucket_dispatch_queue: str = ""
    bucket_send_threads: int = 16

    def __post_init__(self) -> None:
        check_numbers(self)
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            if not is_whole(value, low, high):
                raise ConfigurationError(f"{setting_label(name)} must be from {low:,} to {high:,}, got {value!r}")
        if self.bucket_dispatch_queue:
            validate_sqs_queue_name(self.bucket_dispatch_queue)
            if self.bucket_dispatch_queue.endswith(FIFO_SUFFIX):
                raise ConfigurationError(
                    f"{setting_label('bucket_dispatch_queue')} {self.bucket_dispatch_queue!r}: a standard queue"
                )
        if self.bucket_send_phase_ms > 1000:
            raise ConfigurationError(
                f"{setting_label('bucket_send_phase_ms')} must be from 0 to 1000, got {self.bucket_send_phase_ms}"
            )
        try:
            _ = self.levels  # BucketLevel checks the three sizes together
        except ConfigurationError as exc:
            names = ", ".join(
                env_name(f) for f in ("bucket_fine_seconds", "bucket_coarse_seconds", "bucket_dispatch_lead_seconds")
            )
            raise ConfigurationError(f"{exc} ({names})") from None

    @property
    def levels(self) -> BucketLevel:
        """The timing wheel's levels."""
        return BucketLevel(self.bucket_fine_seconds, self.bucket_coarse_seconds, self.bucket_dispatch_lead_seconds)

    def partitions(self, messages: int) -> int:
        """How many partitions a bucket of about ``messages`` messages is planned with."""
        wide = min(self.bucket_dispatch_concurrency, -(-messages // self.bucket_partition_messages))
        needed = -(-messages // self.bucket_partition_max_messages)
        return max(1, min(MAX_PARTITIONS, max(wide, needed)))


def ingest_wait_seconds(
    window_seconds: int = INGEST_WINDOW_SECONDS, timeout_seconds: int = INGEST_TIMEOUT_SECONDS
) -> int:
    """The longest a record waits between its send and its objects in S3: the batching window, the timeout, a margin."""
    return window_seconds + timeout_seconds + INGEST_WAIT_MARGIN_SECONDS


def check_ingest_wait(
    levels: BucketLevel,
    route_threshold: int,
    window_seconds: int = INGEST_WINDOW_SECONDS,
    timeout_seconds: int = INGEST_TIMEOUT_SECONDS,
) -> None:
    """``ConfigurationError`` when a message routed to the tier could reach S3 after its bucket's first dispatch.

    A delay over ``route_threshold`` is due after ``sent + route_threshold``; its bucket is first dispatched no earlier
    than ``route_threshold - fine - lead`` after the send (``BucketLevel.ingest_slack``). The ingest's longest wait
    (``ingest_wait_seconds``) must fit in that, or such a message misses its bucket's dispatch and goes out a timer
    run later, possibly late.
    """
    if not 0 <= window_seconds <= MAX_INGEST_WINDOW_SECONDS:
        raise ConfigurationError(
            f"the ingest batching window must be from 0 to {MAX_INGEST_WINDOW_SECONDS} seconds (Lambda's limit for an "
            f"SQS event source), got {window_seconds}"
        )
    wait = ingest_wait_seconds(window_seconds, timeout_seconds)
    slack = levels.ingest_slack(route_threshold)
    if wait > slack:
        raise ConfigurationError(
            f"a message delayed just over max_native_delay ({route_threshold} s) must reach S3 within "
            f"{route_threshold} - bucket_fine_seconds ({levels.fine_seconds}) - bucket_dispatch_lead_seconds "
            f"({levels.dispatch_lead_seconds}) = {slack} s to be in its bucket's first dispatch, but the ingest may "
            f"take {wait} s (batching window {window_seconds} s + timeout {timeout_seconds} s + "
            f"{INGEST_WAIT_MARGIN_SECONDS} s margin): lower the dispatch lead or the batching window"
        )


@dataclass(frozen=True, slots=True)
class BucketTierConfig:
    """Everything the ingest and timer functions (and the ``aws`` commands) read for the tier."""

    bucket_name: str
    prefix: str = DEFAULT_PREFIX
    settings: DelayedDeliverySettings = field(default_factory=DelayedDeliverySettings)
    #: The SQS route's settings: the ingest queue, ``long_delay_route``, the native cap.
    sqs_settings: SqsSettings = field(default_factory=SqsSettings)
    tier_settings: TierSettings = field(default_factory=TierSettings)
    #: DynamoDB table of cancel and reschedule records; ``None`` = no lookups.
    cancellation_table: str | None = None
    service: str = DEFAULT_SERVICE
    metrics_namespace: str = DEFAULT_NAMESPACE
    #: The queues the tier may deliver to (``None``: any; the CDK construct always names them): a message for another
    #: is refused at ingest and at dispatch, with its reason, to the error queue.
    destinations: frozenset[str] | None = None
    #: Release control (``release_rates``): the DynamoDB table of release slots the FIFO route shares
    #: (``aws.release_calendar``); required when ``release_rates`` caps anything.
    release_table: str | None = None

    def __post_init__(self) -> None:
        if not _BUCKET_NAME.fullmatch(self.bucket_name or ""):
            raise ConfigurationError(
                f"{BUCKET_NAME_ENV}={str(self.bucket_name)[:70]!r} is not an S3 bucket name (3-63 lower-case "
                "letters, digits, dots and hyphens)"
            )
        if not self.prefix or self.prefix.startswith("/") or self.prefix.endswith("/") or len(self.prefix) > 512:
            raise ConfigurationError(
                f"{BUCKET_PREFIX_ENV}={self.prefix[:60]!r} must be path segments without a slash at either end"
            )

    @property
    def levels(self) -> BucketLevel:
        """The timing wheel's levels from the tier's settings."""
        return self.tier_settings.levels

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BucketTierConfig:
        """Read the table above from ``env``; ``ConfigurationError`` names a missing or bad variable."""
        name = env.get(BUCKET_NAME_ENV, "").strip()
        if not name:
            raise ConfigurationError(f"{BUCKET_NAME_ENV} is not set: the time-bucket tier needs its S3 bucket")
        return cls(
            bucket_name=name,
            prefix=env.get(BUCKET_PREFIX_ENV, "").strip() or DEFAULT_PREFIX,
            settings=DelayedDeliverySettings.from_env(env),
            sqs_settings=SqsSettings.from_env(env),
            tier_settings=TierSettings.from_env(env),
            cancellation_table=env.get(TABLE_ENV, "").strip() or None,
            service=env.get(SERVICE_ENV, "").strip() or DEFAULT_SERVICE,
            metrics_namespace=env.get(NAMESPACE_ENV, "").strip() or DEFAULT_NAMESPACE,
            destinations=destinations_from_env(env),
            release_table=env.get(RELEASE_TABLE_ENV, "").strip() or None,
        )

    def release_calendar(self, dynamodb: DynamoDBClient | None) -> ReleaseCalendar | None:
        """The shared release calendar when ``release_rates`` caps anything (None otherwise); its table is then
        required (``ConfigurationError``). Slots up to SQS's 900 s: what has none stays in its bucket."""
        rates = self.settings.release_rates
        if not rates:
            return None
        if self.release_table is None:
            raise ConfigurationError(
                f"release_rates ({rates}) caps destinations, and the time-bucket tier takes their release slots from "
                f"a DynamoDB table: set {RELEASE_TABLE_ENV}"
            )
        from ..release_calendar import ReleaseCalendar

        if dynamodb is None:
            import boto3

            dynamodb = boto3.client("dynamodb")
        return ReleaseCalendar(dynamodb, self.release_table, rates)


def destinations_from_env(env: Mapping[str, str]) -> frozenset[str] | None:
    """``DELAYED_DELIVERY_BUCKET_DESTINATIONS``: standard queue names, comma-separated; ``None`` when unset."""
    raw = env.get(DESTINATIONS_ENV)
    if raw is None:
        return None
    names = frozenset(name.strip() for name in raw.split(",") if name.strip())
    problems = [name for name in sorted(names) if name.endswith(FIFO_SUFFIX) or not _queue_name(name)]
    if not names or problems:
        raise ConfigurationError(
            f"{DESTINATIONS_ENV}={raw[:200]!r}: give the standard queues the tier may deliver to, comma-separated"
            + (f" ({', '.join(problems[:5])} is not one)" if problems else "")
        )
    return names


def outside_reason(destination: str) -> str:
    """Why a message for ``destination`` is not delivered: the tier was not given that queue."""
    return (
        f"destination {destination!r} is not one of the tier's destinations ({DESTINATIONS_ENV}, set by the CDK "
        "construct from its destinations): the tier may not deliver there"
    )


def _queue_name(name: str) -> bool:
    try:
        validate_sqs_queue_name(name)
    except ConfigurationError:
        return False
    return True


if __name__ == "__main__":
    print(TierSettings.markdown_reference())
