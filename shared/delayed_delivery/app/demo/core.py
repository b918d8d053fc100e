"""The local demo: delayed messages through the SQLite store and two racing dispatchers, time compressed."""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from delayed_delivery.clock import SystemClock
from delayed_delivery.dispatcher import Dispatcher, DispatchReport
from delayed_delivery.memory import InMemoryTransport
from delayed_delivery.model import DelayedMessage
from delayed_delivery.release import ReleaseRates
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore

__all__ = ["CAPPED", "CAPPED_RATE", "DEMO_DELAYS", "DemoProgress", "DemoResult", "run_core_demo"]

#: The destination the demo caps with ``release_rates``, and its cap (messages per second, real time): most of
#: its messages fall due in the first second, so the cap spreads them over a few seconds.
CAPPED, CAPPED_RATE = "billing", 20.0

#: (label, logical delay in seconds) of the messages the demo sends.
DEMO_DELAYS: tuple[tuple[str, float], ...] = (
    ("now", 0),
    ("30 s", 30),
    ("15 min", 900),
    ("3 h", 3 * 3600),
    ("1 day", 86_400),
    ("40 days", 40 * 86_400),
    ("1 year", 365 * 86_400),
    ("2 years", 730 * 86_400),
)


@dataclass(slots=True)
class DemoProgress:
    """Live counts while the demo runs."""

    sent: int = 0
    pending: int = 0
    delivered: int = 0
    error_queue: int = 0


@dataclass(slots=True)
class DemoResult:
    """The demo's summary."""

    sent: int
    delivered: int
    lost: int
    duplicates: int
    error_queue: int
    expected_error_queue: int
    lateness_p50: float
    lateness_p99: float
    lateness_max: float
    compression: float
    seconds: float
    by_dispatcher: dict[str, int] = field(default_factory=dict)
    by_delay: dict[str, int] = field(default_factory=dict)
    #: Release control: the capped destination, its cap (messages/s) and what the cap added (release lag, real s).
    release_destination: str = CAPPED
    release_rate: float = CAPPED_RATE
    release_lag_p50: float = 0.0
    release_lag_p99: float = 0.0
    release_lag_max: float = 0.0
    #: The most messages the capped destination received in any one second (at most the cap).
    release_busiest_second: int = 0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


class _TaggingTransport(InMemoryTransport):
    """Records which dispatcher sent each message."""

    def __init__(self, destinations: set[str]) -> None:
        super().__init__(SystemClock(), destinations)
        self.senders: Counter[str] = Counter()

    def send(self, message: DelayedMessage) -> None:
        super().send(message)
        self.senders[threading.current_thread().name] += 1


def run_core_demo(
    *,
    messages: int = 240,
    span_seconds: float = 12.0,
    poison: int = 4,
    dispatchers: int = 2,
    seed: int = 1,
    workdir: Path | None = None,
    on_progress: Callable[[DemoProgress], None] | None = None,
) -> DemoResult:
    """Send ``messages`` delayed messages (2 years compressed into ``span_seconds``) and dispatch them."""
    compression = max(d for _, d in DEMO_DELAYS) / span_seconds
    clock = SystemClock()
    tmp = tempfile.TemporaryDirectory(prefix="delayed-delivery-demo-") if workdir is None else None
    store = SqliteDelayedMessageStore(Path(tmp.name if tmp else workdir or ".") / "demo.db", claim_timeout=30)
    store.setup_infrastructure()
    transport = _TaggingTransport({"orders", "billing", "error"})
    settings = DelayedDeliverySettings(
        max_idle_sleep=0.25, batch_size=25, retry_backoff=0.05, release_rates=ReleaseRates.of({CAPPED: CAPPED_RATE})
    )
    share = 1 / dispatchers  # each dispatcher releases its share of the cap
    dispatcher_objs = [
        Dispatcher(store, transport, settings, clock=clock, release_share=share) for _ in range(dispatchers)
    ]
    stop = threading.Event()
    reports: list[DispatchReport] = []

    def run(d: Dispatcher) -> None:
        reports.append(d.run(stop))

    threads = [
        threading.Thread(target=run, args=(d,), name=f"dispatcher-{i + 1}", daemon=True)
        for i, d in enumerate(dispatcher_objs)
    ]
    for t in threads:
        t.start()
    started = time.monotonic()
    progress = DemoProgress()
    expected, labels = _send_mix(store, dispatcher_objs, messages, poison, compression, random.Random(seed), progress)
    _wait_until_drained(store, transport, progress, started + span_seconds * 1.1 + 10, on_progress)
    stop.set()
    for d in dispatcher_objs:
        d.notify(clock.now() - timedelta(days=1))
    for t in threads:
        t.join(5)
    store.close()
    if tmp:
        tmp.cleanup()
    lags = [lag for r in reports for lag in r.release_lag_seconds.get(CAPPED, [])]
    return _summarise(transport, expected, labels, poison, compression, time.monotonic() - started, lags)


def _send_mix(
    store: SqliteDelayedMessageStore,
    dispatchers: list[Dispatcher],
    messages: int,
    poison: int,
    compression: float,
    rng: random.Random,
    progress: DemoProgress,
) -> tuple[dict[str, tuple[str, float]], Counter[str]]:
    """Store the demo's messages (the last ``poison`` for a queue that does not exist): id → (destination, due)."""
    expected: dict[str, tuple[str, float]] = {}
    labels: Counter[str] = Counter()
    for i in range(messages + poison):
        label, logical = DEMO_DELAYS[i % len(DEMO_DELAYS)]
        logical *= 1 + rng.random() * 0.1 if logical else 1
        destination = "orders" if i < messages and i % 2 == 0 else "billing"
        if i >= messages:
            destination = "no-such-queue"
        m = DelayedMessage.create(
            destination,
            f"demo message {i} ({label})".encode(),
            delay=logical / compression,
            headers={"demo.delay": label},
            clock=SystemClock(),
        )
        expected[m.message_id] = (destination, m.due_at.timestamp())
        labels[label] += 1
        for d in dispatchers:
            d.notify(m.due_at)
        store.store(m)
        progress.sent += 1
    return expected, labels


def _wait_until_drained(
    store: SqliteDelayedMessageStore,
    transport: _TaggingTransport,
    progress: DemoProgress,
    deadline: float,
    on_progress: Callable[[DemoProgress], None] | None,
) -> None:
    """Report progress every 0.1 s until nothing is pending or ``deadline`` (monotonic) passes."""
    while time.monotonic() < deadline:
        delivered = sum(1 for s in transport.sent if s.message.destination != "error")
        errors = len(transport.to("error"))
        progress.delivered, progress.error_queue, progress.pending = delivered, errors, len(store)
        if on_progress:
            on_progress(progress)
        if progress.pending == 0:
            break
        time.sleep(0.1)


def _summarise(
    transport: _TaggingTransport,
    expected: dict[str, tuple[str, float]],
    labels: Counter[str],
    poison: int,
    compression: float,
    seconds: float,
    release_lags: list[float],
) -> DemoResult:
    """The demo's summary from what the transport saw (lateness: of the uncapped destination's messages; what the
    cap added to the capped one's is their release lag, from the dispatchers' reports)."""
    arrivals = Counter(s.message.message_id for s in transport.sent)
    lateness = [
        max(0.0, s.sent_at.timestamp() - expected[s.message.message_id][1])
        for s in transport.sent
        if s.message.destination not in ("error", CAPPED)
    ]
    capped_seconds = Counter(int(s.sent_at.timestamp()) for s in transport.sent if s.message.destination == CAPPED)
    delivered_ids = {s.message.message_id for s in transport.sent}
    return DemoResult(
        sent=len(expected),
        delivered=sum(1 for s in transport.sent if s.message.destination != "error"),
        lost=sum(1 for mid in expected if mid not in delivered_ids),
        duplicates=sum(c - 1 for c in arrivals.values()),
        error_queue=len(transport.to("error")),
        expected_error_queue=poison,
        lateness_p50=_percentile(lateness, 50),
        lateness_p99=_percentile(lateness, 99),
        lateness_max=max(lateness, default=0.0),
        compression=compression,
        seconds=seconds,
        by_dispatcher=dict(transport.senders),
        by_delay=dict(labels),
        release_lag_p50=_percentile(release_lags, 50),
        release_lag_p99=_percentile(release_lags, 99),
        release_lag_max=max(release_lags, default=0.0),
        release_busiest_second=max(capped_seconds.values(), default=0),
    )
