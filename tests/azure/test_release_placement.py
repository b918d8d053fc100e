"""Release caps under placement (#34), on Azurite: with ``place_ahead`` on, four shards and a late put, a capped
burst is placed by the dispatchers (not the placer), each message once and never early, within the cap over 10 s;
but a put made later than planned shows that much after its slot, on top of slots other shards booked, so the
busiest second goes over the cap and a shard's due order breaks (a known fault: the second test is a strict xfail).

The placer leaves capped rows to the dispatchers (``placement.Placer._placeable``); each shard's dispatcher books its
slots in the table's one schedule (``release_state.SharedBlobReleaseState``) and puts each message hidden until its
slot. Everything runs on one manual clock (the four dispatchers' waits advance it for all of them, as load would);
a message becomes visible at its put's time on that clock plus the visibility timeout the put asked for (recorded
by a wrapper, as ``test_release.py`` does). A late send is a put that takes ``STALL`` seconds (a reset and its retry,
a breaker's back-off) before the queue takes it.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.placement import PlacementReport, Placer
from delayed_delivery.azure.rows import shard_of
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.clock import ManualClock
from delayed_delivery.model import DelayedMessage
from delayed_delivery.release import busiest_window
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import new_name
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite

SHARDS = 4
RATE = 20.0
CAPPED = 160
UNCAPPED = 40
LEAD = 120.0
#: Seconds a late put takes before the queue takes it, and which capped put it is.
STALL = 3.0
STALL_AT = 40


class Visible:
    """The host's transport, noting when each message becomes visible (put time on the manual clock + its delay);
    with ``stall_at``, the put of that capped message takes ``STALL`` seconds first."""

    def __init__(self, inner: StorageQueueTransport, clock: ManualClock, capped: str, stall_at: int | None) -> None:
        self.inner, self.clock, self.capped, self.stall_at = inner, clock, capped, stall_at
        self.seen: list[tuple[str, str, float, str]] = []  # id, destination, visible at, how
        self._puts = 0
        self._lock = threading.Lock()

    @property
    def max_delay_seconds(self) -> int:
        return self.inner.max_delay_seconds

    @property
    def send_timeout(self) -> float:
        return self.inner.send_timeout

    def _note(self, message: DelayedMessage, delay: int, how: str) -> None:
        with self._lock:
            self.seen.append((message.message_id, message.destination, self.clock.now().timestamp() + delay, how))

    def _maybe_stall(self, message: DelayedMessage) -> None:
        if message.destination != self.capped:
            return
        with self._lock:
            self._puts += 1
            stall = self._puts == self.stall_at
        if stall:
            self.clock.advance(STALL)

    def send(self, message: DelayedMessage, *, visibility_timeout: int = 0) -> None:
        self.send_delayed(message, visibility_timeout)

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self._maybe_stall(message)
        self.inner.send_delayed(message, delay_seconds)
        self._note(message, delay_seconds, "dispatched")

    def place(self, message: DelayedMessage, hidden: int, *, sent_at: datetime) -> tuple[str, str]:
        placed = self.inner.place(message, hidden, sent_at=sent_at)
        self._note(message, hidden, "placed")
        return placed

    def revoke(self, destination: str, message_id: str, pop_receipt: str) -> bool:
        return self.inner.revoke(destination, message_id, pop_receipt)


def _host(azurite: Azurite, clock: ManualClock, capped: str, stall_at: int | None) -> AzureDispatcherHost:
    table = new_name()
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=azurite.connection_string,
        lease_seconds=15,
        run_seconds=60,
        claim_timeout=120.0,
        shards=SHARDS,
        place_ahead=LEAD,
        settings=DelayedDeliverySettings(  # type: ignore[arg-type]
            max_concurrency=8, error_queue=new_name("e"), release_rates={capped: RATE}
        ),
    )
    host = AzureDispatcherHost(config, clock=clock, monotonic=lambda: clock.now().timestamp())
    host.setup_infrastructure()
    host.transport = Visible(host.transport, clock, capped, stall_at)  # type: ignore[assignment]
    return host


def _place_ahead(host: AzureDispatcherHost, clock: ManualClock) -> PlacementReport:
    """Every shard's placer, one pass each until nothing of the lead is left (deterministic: the clock stands)."""
    report = PlacementReport()
    with ThreadPoolExecutor(8) as pool:
        for shard in range(SHARDS):
            placer = Placer(
                host.store.table,
                SHARDS,
                shard,
                host.transport,  # type: ignore[arg-type]
                host.config.destination_policy,
                lead=LEAD,
                clock=clock,
                claim_timeout=host.config.claim_timeout,
                release_rates=host.settings.release_rates,
            )
            while placer.place_batch(pool, lambda: True, report):
                pass
    return report


@dataclass(frozen=True)
class Figures:
    """What one capped burst did on its queue."""

    busiest_1s: int
    busiest_10s: int
    span: float
    early: list[str]
    inversions: int


def _burst(azurite: Azurite, queues: QueueServiceClient, stall_at: int | None) -> Figures:
    """A capped burst and an uncapped one inside the lead: placed ahead, then dispatched from the due time."""
    capped, free = new_name("q"), new_name("q")
    for name in (capped, free):
        queues.create_queue(name)
    start = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(start)
    host = _host(azurite, clock, capped, stall_at)
    due = start + timedelta(seconds=30)
    # the capped burst in due order (10 ms apart), the uncapped one at one instant, all inside the lead
    burst = [DelayedMessage(f"c-{i:04d}", capped, b"x", due + timedelta(milliseconds=10 * i)) for i in range(CAPPED)]
    burst += [DelayedMessage(f"u-{i:04d}", free, b"x", due) for i in range(UNCAPPED)]
    host.store.store_many(burst)

    placement = _place_ahead(host, clock)
    seen: Visible = host.transport  # type: ignore[assignment]
    assert placement.placed == UNCAPPED, "the placer places the uncapped rows and leaves the capped ones"
    assert {d for _, d, _, how in seen.seen if how == "placed"} == {free}

    clock.set(due)
    summary = host.run(30)  # the four dispatchers pace the capped rows from the table's one schedule

    capped_seen = [(mid, at) for mid, d, at, _ in seen.seen if d == capped]
    times = [at for _, at in capped_seen]
    assert summary.dispatched == CAPPED, summary
    assert sorted(mid for mid, _ in capped_seen) == [m.message_id for m in burst[:CAPPED]], "each once"
    by_shard: dict[int, list[tuple[str, float]]] = {}
    for mid, at in sorted(capped_seen):
        by_shard.setdefault(shard_of(mid, SHARDS), []).append((mid, at))
    figures = Figures(
        busiest_1s=busiest_window(times, 1.0),
        busiest_10s=busiest_window(times, 10.0),
        span=max(times) - due.timestamp(),
        early=[mid for mid, at in capped_seen if at < due.timestamp() + 0.01 * int(mid[2:]) - 1e-6],
        inversions=sum(1 for s in by_shard.values() for (_, a), (_, b) in itertools.pairwise(s) if b < a - 1e-6),
    )
    print(f"\nstall_at={stall_at}: {figures} (cap {RATE}/s: 1 s allows {int(RATE) + 1}, 10 s {int(RATE * 10) + 1}; "
          f"ideal span {CAPPED / RATE:.2f} s)")  # fmt: skip
    return figures


def test_a_capped_burst_under_placement_is_put_by_the_dispatchers_once_never_early_within_10_s_of_cap(
    azurite: Azurite, queues: QueueServiceClient
) -> None:
    figures = _burst(azurite, queues, STALL_AT)
    assert not figures.early, f"visible before due: {figures.early[:5]}"
    assert figures.busiest_10s <= RATE * 10 + 1, figures
    assert figures.span <= CAPPED / RATE + 2 * STALL, figures


@pytest.mark.xfail(
    strict=True,
    reason="#34, open: the dispatcher's delay is fixed when it holds a message, so a late put shows late, on top of "
    "slots other shards booked (busiest second 34-35 against a cap of 20/s here); a fix books the slot at the put",
)
def test_a_late_put_keeps_the_busiest_second_within_the_cap_and_each_shards_due_order(
    azurite: Azurite, queues: QueueServiceClient
) -> None:
    figures = _burst(azurite, queues, STALL_AT)
    assert figures.busiest_1s <= RATE + 1, figures
    assert figures.inversions == 0, figures
