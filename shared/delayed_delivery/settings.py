"""The core dispatcher's settings, read by every route, with the NServiceBus defaults and env parsing.

The SQS route adds its own (``delayed_delivery.aws.settings.SqsSettings``: the native cap, hops, parking, packing,
``long_delay_route``), the time-bucket tier its timing (``delayed_delivery.aws.tier.config.TierSettings``) and
Azure its storage and lease (``delayed_delivery.azure.config.AzureDelayedDeliveryConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .envsettings import ENV_PREFIX, EnvSettings, check_numbers, setting_label
from .errors import ConfigurationError
from .release import RELEASE_RATES_ENV, ReleaseRates

__all__ = ["ENV_PREFIX", "DelayedDeliverySettings"]

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
    "release_rates": "Release control: a JSON object of destination queue name to the most messages per second "
    'released to it, "*" the default for queues not named, null for no cap (e.g. {"orders": 200, "*": 1000}); '
    "messages over a cap are released later in due order, never dropped; {} (the default): no cap "
    "(docs/operations.md, Bursts and release control).",
}


def _release_rates(raw: str) -> ReleaseRates:
    """``DELAYED_DELIVERY_RELEASE_RATES`` read: one error naming the variable and what is wrong with it."""
    try:
        return ReleaseRates.parse(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{RELEASE_RATES_ENV}={raw[:80]!r}: {exc}") from None


#: ``release_rates`` unset: no destination is capped.
_NO_CAPS = ReleaseRates()


@dataclass(frozen=True, slots=True)
class DelayedDeliverySettings(EnvSettings):
    """What every route reads; defaults follow NServiceBus (retries 0, breakers 30 s, 1 recovery failure/s)."""

    DOCS: ClassVar[Mapping[str, str]] = _DOCS

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
    release_rates: ReleaseRates = field(default=_NO_CAPS, metadata={"parse": _release_rates})

    def __post_init__(self) -> None:
        check_numbers(self)
        try:  # a mapping such as {"orders": 200} is taken too
            object.__setattr__(self, "release_rates", ReleaseRates.of(self.release_rates))
        except ValueError as exc:
            raise ConfigurationError(f"{setting_label('release_rates')}: {exc}") from None
        if not self.error_queue.strip():
            raise ConfigurationError(f"{setting_label('error_queue')} must name a queue, got {self.error_queue!r}")
        for name in ("batch_size", "max_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{setting_label(name)} must be at least 1, got {getattr(self, name)!r}")
        if self.max_idle_sleep <= 0:
            raise ConfigurationError(f"{setting_label('max_idle_sleep')} must be positive, got {self.max_idle_sleep!r}")


if __name__ == "__main__":
    print(DelayedDeliverySettings.markdown_reference())
