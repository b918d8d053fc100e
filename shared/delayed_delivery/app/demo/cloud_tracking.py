"""What each cloud of the demo was asked to do and what arrived where: the planned mix and the tracker."""

from __future__ import annotations

import json
import random
import statistics
import threading
import uuid
from collections import Counter
from dataclasses import dataclass

from delayed_delivery.app.demo.cloud_model import (
    CLOUD_DEMO_DELAYS,
    DESTINATIONS,
    CloudDemoConfig,
    CloudProgress,
    CloudSummary,
)

__all__ = ["Planned", "Tracker", "message_body", "message_id_of", "percentile", "plan_messages"]


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (inclusive method; 0 for none)."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class Tracker:
    """What one cloud was asked to do and what arrived where (thread-safe)."""

    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        self.due: dict[str, float] = {}
        self.labels: dict[str, str] = {}
        self.poison: set[str] = set()
        self.cancelled: set[str] = set()
        self.rescheduled: set[str] = set()
        self.routes: Counter[str] = Counter()
        self.arrivals: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.notes: list[str] = []
        self._lock = threading.Lock()

    def expect(self, message_id: str, label: str, due: float, route: str) -> None:
        """Record a message sent: its delay label, due time (epoch seconds) and route."""
        with self._lock:
            self.due[message_id] = due
            self.labels[message_id] = label
            self.routes[route] += 1

    def arrived(self, message_id: str, when: float) -> None:
        """Record an arrival at a destination queue."""
        with self._lock:
            self.arrivals.setdefault(message_id, []).append(when)

    def errored(self, message_id: str) -> None:
        """Record an arrival at the error queue."""
        with self._lock:
            self.errors[message_id] = self.errors.get(message_id, 0) + 1

    def wanted(self) -> set[str]:
        """Ids that should reach their destination."""
        return set(self.due) - self.poison - self.cancelled

    def done(self) -> bool:
        """Every wanted message arrived and every poison message reached the error queue."""
        with self._lock:
            return self.wanted() <= set(self.arrivals) and self.poison <= set(self.errors)

    def progress(self, now: float) -> CloudProgress:
        """The live counts at ``now`` (epoch seconds)."""
        with self._lock:
            wanted = self.wanted()
            arrived = wanted & set(self.arrivals)
            waiting = wanted - arrived
            return CloudProgress(
                cloud=self.cloud,
                sent=len(self.due),
                pending=sum(1 for m in waiting if self.due[m] > now),
                in_flight=sum(1 for m in waiting if self.due[m] <= now),
                delivered=len(arrived),
                error_queue=sum(self.errors.values()),
            )

    def summary(self, requests: dict[str, float]) -> CloudSummary:
        """The cloud's outcome, with its request counts."""
        with self._lock:
            wanted = self.wanted()
            lateness = [self.arrivals[m][0] - self.due[m] for m in wanted if m in self.arrivals]
            return CloudSummary(
                cloud=self.cloud,
                sent=len(self.due),
                expected_deliveries=len(wanted),
                delivered=sum(1 for m in wanted if m in self.arrivals),
                lost=sum(1 for m in wanted if m not in self.arrivals)
                + sum(1 for m in self.poison if m not in self.errors),
                duplicates=sum(len(v) - 1 for v in self.arrivals.values()) + sum(n - 1 for n in self.errors.values()),
                early=sum(1 for x in lateness if x < -0.001),
                error_queue=sum(self.errors.values()),
                expected_error_queue=len(self.poison),
                cancelled=len(self.cancelled),
                cancelled_but_delivered=sum(1 for m in self.cancelled if m in self.arrivals),
                rescheduled=len(self.rescheduled),
                rescheduled_lateness=[
                    round(self.arrivals[m][0] - self.due[m], 3) if m in self.arrivals else None
                    for m in sorted(self.rescheduled)
                ],
                lateness_p50=round(percentile(lateness, 50), 3),
                lateness_p99=round(percentile(lateness, 99), 3),
                lateness_max=round(max(lateness, default=0.0), 3),
                routes=dict(self.routes),
                requests=requests,
                by_delay=self._by_delay(wanted),
                notes=list(self.notes),
            )

    def _by_delay(self, wanted: set[str]) -> dict[str, dict[str, float]]:
        """Per delay label: messages, delivered, worst lateness (call with the lock held)."""
        out: dict[str, dict[str, float]] = {}
        for m in sorted(wanted, key=lambda m: self.due[m]):
            row = out.setdefault(self.labels[m], {"messages": 0, "delivered": 0, "lateness_max": 0.0})
            row["messages"] += 1
            if m in self.arrivals:
                row["delivered"] += 1
                row["lateness_max"] = round(max(row["lateness_max"], self.arrivals[m][0] - self.due[m]), 3)
        return out


@dataclass(frozen=True, slots=True)
class Planned:
    """One message of the mix: its id, delay label, destination and compressed delay (s)."""

    message_id: str
    label: str
    destination: str
    delay: float


def plan_messages(config: CloudDemoConfig, cloud: str) -> list[Planned]:
    """The mix one cloud gets: the delays in turn, jittered by up to 5 %, alternating destinations."""
    rng = random.Random(f"{config.seed}:{cloud}")
    out = []
    for i in range(config.messages_per_cloud):
        label, logical = CLOUD_DEMO_DELAYS[i % len(CLOUD_DEMO_DELAYS)]
        logical *= 1 + rng.random() * 0.05 if logical else 1
        destination = DESTINATIONS[i % len(DESTINATIONS)]
        out.append(Planned(f"{cloud}-{i:03d}-{uuid.uuid4().hex[:8]}", label, destination, logical / config.compression))
    return out


def message_body(message_id: str, label: str) -> str:
    """The body the demo sends: its id and delay label as JSON."""
    return json.dumps({"id": message_id, "delay": label})


def message_id_of(body: str | bytes) -> str:
    """The id in a demo body (a stand-in naming the body when it is unreadable)."""
    try:
        return str(json.loads(body)["id"])
    except (ValueError, KeyError, TypeError):
        return f"unreadable:{body[:40]!r}"
