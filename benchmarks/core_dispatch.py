"""Core dispatcher on the embedded SQLite store: batched claims vs the NServiceBus-style one-row-per-round-trip poller.

Also: dispatcher memory with many far-future rows pending (pages streamed, nothing loaded whole).
Run: ``python -m benchmarks.core_dispatch [--smoke] [--runs 5] [--messages 20000] [--pending 1000000]``
"""

from __future__ import annotations

import argparse
import tempfile
import tracemalloc
from datetime import timedelta
from pathlib import Path

from benchmarks.common import Row, Timer, print_table, rss_mib, write_json
from delayed_delivery import (
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    InMemoryTransport,
    ManualClock,
    SqliteDelayedMessageStore,
)
from delayed_delivery.ports import claim_of


def _fill(
    store: SqliteDelayedMessageStore, n: int, clock: ManualClock, *, future: bool = False, prefix: str = "m"
) -> None:
    now = clock.now()
    batch: list[DelayedMessage] = []
    for i in range(n):
        due = now + timedelta(days=365 + i % 1000) if future else now - timedelta(seconds=i % 60)
        batch.append(DelayedMessage(f"{prefix}-{i}", "orders", b"x" * 256, due))
        if len(batch) == 10_000:
            store.store_many(batch)
            batch.clear()
    if batch:
        store.store_many(batch)


def _one_row_style(store: SqliteDelayedMessageStore, transport: InMemoryTransport, clock: ManualClock) -> int:
    """The NServiceBus MSMQ store's poller: fetch one due row, send it, remove it, repeat."""
    sent = 0
    while (m := store.fetch_next_due(clock.now())) is not None:
        transport.send(m)
        store.remove(m.message_id, claim_of(m))
        sent += 1
    return sent


def run(smoke: bool = False, runs: int = 5, messages: int = 20_000, pending: int = 1_000_000) -> list[Row]:
    """Measure and return the rows."""
    if smoke:
        runs, messages, pending = 1, 300, 2_000
    ours, seed = Timer(), Timer()
    for _ in range(runs):
        for timer, batched in ((ours, True), (seed, False)):
            with tempfile.TemporaryDirectory() as tmp:
                clock = ManualClock()
                store = SqliteDelayedMessageStore(Path(tmp) / "b.db")
                store.setup_infrastructure()
                _fill(store, messages, clock)
                transport = InMemoryTransport(clock)
                if batched:
                    d = Dispatcher(store, transport, DelayedDeliverySettings(batch_size=100), clock=clock)
                    timer.measure(d.dispatch_due)
                else:
                    timer.measure(lambda s=store, t=transport, c=clock: _one_row_style(s, t, c))
                assert len(transport.sent) == messages and len(store) == 0
                store.close()
    ours_rate = tuple(messages / s for s in ours.seconds)
    seed_rate = tuple(messages / s for s in seed.seconds)
    rows = [
        Row(
            "sqlite dispatch",
            "batched claims (ours)",
            "msg/s",
            ours_rate,
            "NServiceBus one-row poller",
            sorted(ours_rate)[len(ours_rate) // 2] / sorted(seed_rate)[len(seed_rate) // 2],
        ),
        Row("sqlite dispatch", "seed one-row poller (baseline)", "msg/s", seed_rate),
    ]

    # Memory: the dispatcher's footprint must not grow with far-future rows.
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock()
        store = SqliteDelayedMessageStore(Path(tmp) / "m.db")
        store.setup_infrastructure()
        _fill(store, pending, clock, future=True, prefix="far")
        _fill(store, 1_000, clock, prefix="due")
        transport = InMemoryTransport(clock)
        d = Dispatcher(store, transport, DelayedDeliverySettings(batch_size=100), clock=clock)
        rss_before = rss_mib()
        tracemalloc.start()
        d.dispatch_due()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(transport.sent) == 1_000
        rows.append(
            Row(
                "sqlite dispatch",
                f"peak Python heap dispatching 1,000 due with {pending:,} far-future pending",
                "MiB",
                (peak / 2**20,),
                notes=f"RSS grew {rss_mib() - rss_before:.1f} MiB",
            )
        )
        store.close()
    return rows


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one run (CI)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--pending", type=int, default=1_000_000)
    a = p.parse_args()
    rows = run(a.smoke, a.runs, a.messages, a.pending)
    print_table(rows, "core dispatch (SQLite)")
    print(f"wrote {write_json('core_dispatch' + ('-smoke' if a.smoke else ''), rows)}")


if __name__ == "__main__":
    main()
