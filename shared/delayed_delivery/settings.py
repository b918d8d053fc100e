"""Settings for the dispatcher and the planners, with the NServiceBus defaults and env parsing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import ConfigurationError
from .naming import validate_sqs_queue_name
from .planning import MAX_PARK_SECONDS
from .timebuckets.wheel import BucketLevel
from .validation import is_number

__all__ = ["ENV_PREFIX", "LONG_DELAY_ROUTES", "DelayedDeliverySettings"]

#: Environment variables are ``ENV_PREFIX`` + the upper-cased field name.
ENV_PREFIX = "DELAYED_DELIVERY_"

_DOCS = {
    "enabled": "Master switch; when off, delays beyond the native cap are refused and dispatchers do nothing.",
    "error_queue": "Queue that receives messages that could not be delivered.",
    "number_of_retries": "Retries after the first failed delivery before a message goes to the error queue.",
    "time_to_trigger_store_circuit_breaker": "Seconds of continuous store failures before a critical error.",
    "time_to_trigger_fetch_circuit_breaker": "Seconds of continuous fetch failures before a critical error.",
    "time_to_trigger_dispatch_circuit_breaker": "Seconds of continuous send failures before a critical error.",
    "maximum_recovery_failures_per_second": "Failed deliveries per second (averaged over the dispatch window) "
    "that trip the recovery breaker.",
    "batch_size": "Messages claimed per fetch.",
    "max_concurrency": "Parallel sends within one batch.",
    "max_idle_sleep": "Longest sleep between polls when nothing is known to be due (seconds).",
    "failure_delay": "Pause after a failed fetch while a breaker is armed (seconds).",
    "tripped_failure_delay": "Pause after a failed fetch once a breaker has tripped (seconds).",
    "retry_backoff": "First retry delay after a failed delivery; doubles per failure (seconds).",
    "max_retry_backoff": "Cap on the retry delay (seconds).",
    "max_native_delay": "Longest delay the queue holds natively (SQS: 900 s).",
    "fifo_queue_delay": "Queue-level delay of each -delay.fifo hop (SQS: 900 s).",
    "max_park_seconds": "Longest time the SQS requeue function hides a long-delayed -delay.fifo record with "
    "ChangeMessageVisibility instead of hopping it (at most 42,600 s: SQS's 12 h from the receive less 10 min; "
    "0 turns parking off).",
    "park_max_in_flight": "The SQS requeue function parks no new records while its -delay.fifo queue has more "
    "messages in flight than this (SQS FIFO queues stop at 120,000).",
    "long_delay_route": "How SQS delays beyond max_native_delay travel: fifo (the -delay.fifo queue), buckets (the "
    "S3 time-bucket tier) or auto (the cheaper of the two for each delay, from the measured cost model).",
    "bucket_ingest_queue": "The standard SQS queue the sender hands bucket-routed messages to (the tier's ingest).",
    "bucket_fine_seconds": "Length of a fine (near) time bucket (seconds).",
    "bucket_coarse_seconds": "Length of a coarse (far) time bucket; a multiple of bucket_fine_seconds (seconds).",
    "bucket_dispatch_lead_seconds": "How long before a fine bucket starts it is dispatched, the rest waiting as "
    "DelaySeconds; plus bucket_fine_seconds at most 900 (seconds).",
    "bucket_send_phase_ms": "The bucket timer sends each message when its due time is a whole number of seconds "
    "away, within this step, so SQS's whole-second DelaySeconds add at most this much lateness; it costs up to 1 s "
    "of timer time per bucket sent ahead of its due time and splits a destination's batches into up to 1000 / step "
    "sends; 0 sends at once, up to 1 s late (1 to 1000 milliseconds, or 0).",
}

#: The values of ``long_delay_route``.
LONG_DELAY_ROUTES = ("auto", "fifo", "buckets")


@dataclass(frozen=True, slots=True)
class DelayedDeliverySettings:
    """Tunable behaviour; defaults follow NServiceBus (retries 0, breakers 30 s, 1 recovery failure/s)."""

    enabled: bool = True
    error_queue: str = "error"
    number_of_retries: int = 0
    time_to_trigger_store_circuit_breaker: float = 30.0
    time_to_trigger_fetch_circuit_breaker: float = 30.0
    time_to_trigger_dispatch_circuit_breaker: float = 30.0
    maximum_recovery_failures_per_second: float = 1.0
    batch_size: int = 100
    max_concurrency: int = 1
    max_idle_sleep: float = 60.0
    failure_delay: float = 1.0
    tripped_failure_delay: float = 10.0
    retry_backoff: float = 1.0
    max_retry_backoff: float = 60.0
    max_native_delay: int = 900
    fifo_queue_delay: int = 900
    max_park_seconds: int = MAX_PARK_SECONDS
    park_max_in_flight: int = 100_000
    long_delay_route: str = "fifo"
    bucket_ingest_queue: str = "delayed-delivery-ingest"
    bucket_fine_seconds: int = 60
    bucket_coarse_seconds: int = 86_400
    bucket_dispatch_lead_seconds: int = 600
    bucket_send_phase_ms: int = 250

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and not is_number(value):
                raise ConfigurationError(f"setting {f.name} must be a non-negative number, got {value!r}")
        if not self.error_queue.strip():
            raise ConfigurationError("setting error_queue must name a queue")
        if self.batch_size < 1 or self.max_concurrency < 1:
            raise ConfigurationError("batch_size and max_concurrency must be at least 1")
        if self.max_native_delay < 1 or self.fifo_queue_delay < 1:
            raise ConfigurationError("max_native_delay and fifo_queue_delay must be at least 1 second")
        if self.max_idle_sleep <= 0:
            raise ConfigurationError("max_idle_sleep must be positive")
        if self.max_park_seconds > MAX_PARK_SECONDS:
            raise ConfigurationError(
                f"max_park_seconds must be at most {MAX_PARK_SECONDS} (SQS's 12-hour visibility limit counts from the "
                f"receive, and 10 minutes are kept for the function to act), got {self.max_park_seconds}"
            )
        if self.long_delay_route not in LONG_DELAY_ROUTES:
            raise ConfigurationError(
                f"long_delay_route must be one of {', '.join(LONG_DELAY_ROUTES)}, got {self.long_delay_route!r}"
            )
        validate_sqs_queue_name(self.bucket_ingest_queue)
        if self.bucket_send_phase_ms > 1000:
            raise ConfigurationError(f"bucket_send_phase_ms must be from 0 to 1000, got {self.bucket_send_phase_ms}")
        BucketLevel.from_settings(self)  # validates the bucket_* settings together

    def with_(self, **changes: Any) -> DelayedDeliverySettings:
        """A copy with ``changes`` applied (validated)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> DelayedDeliverySettings:
        """Build settings from ``env`` (e.g. ``os.environ``), reading ``<prefix><FIELD>`` names."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = prefix + f.name.upper()
            if name not in env:
                continue
            raw = env[name].strip()
            try:
                if f.type == "bool":
                    if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                        raise ValueError(raw)
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif f.type == "int":
                    values[f.name] = int(raw)
                elif f.type == "float":
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                raise ConfigurationError(f"{name}={raw!r} is not a valid {f.type}") from None
        return cls(**values)

    @classmethod
    def markdown_reference(cls) -> str:
        """The configuration reference as a Markdown table (embedded in the README; a test checks it)."""
        lines = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
        lines += [f"| {name} | `{env}` | `{default}` | {doc} |" for name, env, default, doc in cls.reference()]
        return "\n".join(lines)

    @classmethod
    def reference(cls) -> Iterator[tuple[str, str, str, str]]:
        """Rows of (field, environment variable, default, description) for documentation."""
        defaults = cls()
        for f in fields(cls):
            yield f.name, ENV_PREFIX + f.name.upper(), repr(getattr(defaults, f.name)), _DOCS[f.name]


if __name__ == "__main__":
    print(DelayedDeliverySettings.markdown_reference())
