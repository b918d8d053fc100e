"""The cloud demo's capped destination: a burst due at one instant to a queue the Azure function releases at a cap.

``release_rates`` caps ``invoices`` at ``CAPPED_RATE`` messages per second (the two shards book from one schedule). The
burst goes through the delays table (cancellable messages always do; a native send is not paced), and the timer
function places each message at its release slot with the queue's visibility timeout. The summary's figures: the
release lag (what the cap added, from the shards' dispatch reports), the busiest second (the most slots the cap booked
in one whole second: when the messages became visible on the queue) and the span from the first arrival to the last,
as the demo's collector saw them.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from delayed_delivery.app.demo.cloud_tracking import Tracker, message_body, percentile
from delayed_delivery.azure.telemetry import DispatchMetrics
from delayed_delivery.dispatcher import DispatchReport

if TYPE_CHECKING:
    from delayed_delivery.azure.sender import AzureDelayedSender

__all__ = [
    "CAPPED_BURST",
    "CAPPED_QUEUE",
    "CAPPED_RATE",
    "CAPPED_TRACKER",
    "CappedBurst",
    "ReleaseReports",
    "release_summary_rows",
]

#: The capped queue, its cap (messages per real second) and how many messages fall due on it at one instant.
CAPPED_QUEUE, CAPPED_RATE, CAPPED_BURST = "invoices", 4.0, 16
#: The burst's tracker name (its row in the live progress).
CAPPED_TRACKER = "azure-capped"
#: Seconds from sending the burst to its due time: the rows are in the table well before they fall due.
_LEAD_SECONDS = 2.0


class ReleaseReports(DispatchMetrics):
    """The host's metrics, also keeping every shard run's report (release lags and slots) for the summary."""

    def __init__(self) -> None:
        super().__init__()
        self.report = DispatchReport()
        self._lock = threading.Lock()

    def record(self, report: DispatchReport, shard: int, *, lease_lost: int = 0) -> None:
        super().record(report, shard, lease_lost=lease_lost)
        with self._lock:
            self.report.merge(report)


class CappedBurst:
    """Sends the burst and summarises what the cap did to it."""

    def __init__(self) -> None:
        self.tracker = Tracker(CAPPED_TRACKER)

    def send(self, sender: AzureDelayedSender) -> None:
        """``CAPPED_BURST`` messages due at one instant, ``_LEAD_SECONDS`` from now, in one call."""
        from delayed_delivery.azure.sender import DelayRequest

        at = datetime.now(UTC) + timedelta(seconds=_LEAD_SECONDS)
        ids = [f"{CAPPED_TRACKER}-{i:03d}-{uuid.uuid4().hex[:8]}" for i in range(CAPPED_BURST)]
        requests = [
            DelayRequest(CAPPED_QUEUE, message_body(m, "capped burst").encode(), at=at, message_id=m, cancellable=True)
            for m in ids
        ]
        for result in sender.send_many(requests):
            self.tracker.expect(result.message_id, "capped burst", result.due_at.timestamp(), result.route)

    def summary(self, reports: ReleaseReports) -> dict[str, Any]:
        """The cap, what it added (real seconds), the busiest second it booked and what arrived."""
        outcome = self.tracker.summary({})
        lags = reports.report.release_lag_seconds.get(CAPPED_QUEUE, [])
        slots = reports.report.release_slots.get(CAPPED_QUEUE, [])
        arrivals = [times[0] for times in self.tracker.arrivals.values()]
        return {
            "destination": CAPPED_QUEUE,
            "rate": CAPPED_RATE,
            "messages": outcome.sent,
            "delivered": outcome.delivered,
            "lost": outcome.lost,
            "duplicates": outcome.duplicates,
            "early": outcome.early,
            "routes": outcome.routes,
            "release_lag_p50": round(percentile(lags, 50), 3),
            "release_lag_p99": round(percentile(lags, 99), 3),
            "release_lag_max": round(max(lags, default=0.0), 3),
            "busiest_second": max(Counter(int(s) for s in slots).values(), default=0),
            "slots": len(slots),
            "arrival_span": round(max(arrivals) - min(arrivals), 3) if arrivals else 0.0,
        }


def release_summary_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The capped destination's rows of the demo's summary table (label, Azure value) from ``CloudSummary.release``."""
    return [
        (
            f"release control: {r['destination']} capped at {r['rate']:g}/s ({r['messages']} due at once)",
            f"busiest second {r['busiest_second']}",
        ),
        (
            f"  release lag p50 / p99 / max (real s, {r['destination']})",
            f"{r['release_lag_p50']:.2f} / {r['release_lag_p99']:.2f} / {r['release_lag_max']:.2f}",
        ),
        (
            "  delivered / lost (must be 0), arrived over",
            f"{r['delivered']} / {r['lost']}, {r['arrival_span']:.1f} s",
        ),
    ]
