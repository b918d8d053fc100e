"""The cloud demo's shape and results: its configuration, the message mix, live progress and the summary."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "AZURE_ENDPOINT",
    "CANCELLATION_TABLE",
    "CLOUD_DEMO_DELAYS",
    "DEMO_AZURE_CONCURRENCY",
    "DESTINATIONS",
    "ERROR_QUEUE",
    "FUNCTION_STDOUT_LOCK",
    "TIMER_DUTY",
    "YEAR",
    "CloudDemoConfig",
    "CloudDemoResult",
    "CloudProgress",
    "CloudSummary",
]

#: Held by every in-process function invocation that redirects stdout (``redirect_stdout`` swaps the process's
#: ``sys.stdout``: two invocations interleaving on different locks could leave a stale stream in place).
FUNCTION_STDOUT_LOCK = threading.Lock()

#: (label, logical delay in seconds) of the messages each cloud gets, in turn.
CLOUD_DEMO_DELAYS: tuple[tuple[str, float], ...] = (
    ("0 s", 0),
    ("90 s", 90),
    ("15 min", 900),
    ("3 h", 3 * 3600),
    ("1 day", 86_400),
    ("8 days", 8 * 86_400),
    ("30 days", 30 * 86_400),
    ("90 days", 90 * 86_400),
    ("1 year", 365 * 86_400),
)
YEAR = 365 * 86_400
DESTINATIONS = ("orders", "billing")
ERROR_QUEUE = "error"
AZURE_ENDPOINT = "demo"
CANCELLATION_TABLE = "delayed-delivery-cancellations"
#: The Functions timer runs every minute for ``run_seconds`` = 50 s: the demo keeps that ratio.
TIMER_DUTY = 50 / 60
#: Parallel queue puts of the Azure dispatcher in the demo.
DEMO_AZURE_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class CloudDemoConfig:
    """How big and how compressed the demo is."""

    messages_per_cloud: int = 45
    year_seconds: float = 45.0
    poison_per_cloud: int = 2
    timer_period: float = 6.0
    grace_seconds: float = 20.0
    azure_shards: int = 2
    seed: int = 1
    aws: bool = True
    azure: bool = True
    #: AWS: run the mix through the S3 time-bucket tier too (its own tracker and figures).
    buckets: bool = True

    @property
    def compression(self) -> float:
        """Logical seconds per real second."""
        return YEAR / self.year_seconds

    @classmethod
    def quick(cls) -> CloudDemoConfig:
        """The ``--quick`` size: under two minutes with the emulators' start on 2 cores."""
        return cls(messages_per_cloud=18, year_seconds=25.0, timer_period=5.0, grace_seconds=15.0)


@dataclass(slots=True)
class CloudProgress:
    """Live counts for one cloud."""

    cloud: str
    sent: int = 0
    pending: int = 0
    in_flight: int = 0
    delivered: int = 0
    error_queue: int = 0


@dataclass(slots=True)
class CloudSummary:
    """The demo's outcome on one cloud."""

    cloud: str
    sent: int
    expected_deliveries: int
    delivered: int
    lost: int
    duplicates: int
    early: int
    error_queue: int
    expected_error_queue: int
    cancelled: int
    cancelled_but_delivered: int
    rescheduled: int
    lateness_p50: float
    lateness_p99: float
    lateness_max: float
    routes: dict[str, int] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)
    #: Per rescheduled message: arrival minus its new due time (s; negative would be early, None = not arrived).
    rescheduled_lateness: list[float | None] = field(default_factory=list)
    by_delay: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: AWS: the S3 time-bucket tier's own figures (docs/demo.md); empty when it did not run.
    buckets: dict[str, Any] = field(default_factory=dict)
    #: Azure: the capped destination's burst under release control (cloud_release.py); empty when it did not run.
    release: dict[str, Any] = field(default_factory=dict)
    #: The cloud's recurring schedule (cloud_recurring.py): fired / expected / missed, lateness; empty: did not run.
    recurring: dict[str, Any] = field(default_factory=dict)

    @property
    def tier_ok(self) -> bool:
        """The tier (when it ran) lost nothing, delivered no cancelled message and sent nothing to the error queue."""
        b = self.buckets
        return not b or (b["lost"] == 0 and b["cancelled_but_delivered"] == 0 and not b["error_queue"])

    @property
    def recurring_ok(self) -> bool:
        """The recurring schedule (when it ran) lost no occurrence and sent none twice."""
        r = self.recurring
        return not r or (r["lost"] == 0 and r["duplicates"] == 0)

    @property
    def release_ok(self) -> bool:
        """The capped burst (when it ran) lost nothing and no second got more than the cap."""
        r = self.release
        return not r or (r["lost"] == 0 and r["busiest_second"] <= r["rate"])


@dataclass(slots=True)
class CloudDemoResult:
    """Both clouds' summaries and the run's shape."""

    clouds: list[CloudSummary]
    compression: float
    year_seconds: float
    native_caps: dict[str, int]
    seconds: float

    @property
    def lost(self) -> int:
        """Messages lost across clouds (must be 0)."""
        return sum(
            c.lost + int(c.buckets.get("lost", 0)) + int(c.release.get("lost", 0)) + int(c.recurring.get("lost", 0))
            for c in self.clouds
        )

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing cancelled delivered, every poison message in an error queue, the cap kept."""
        return all(
            c.lost == 0
            and c.cancelled_but_delivered == 0
            and c.error_queue == c.expected_error_queue
            and c.tier_ok
            and c.release_ok
            and c.recurring_ok
            for c in self.clouds
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        data = asdict(self)
        data["lost"] = self.lost
        data["ok"] = self.ok
        return data
