"""Release control in the core dispatcher, under a manual clock: the cap, due order, neighbours, holding, placing,
deferring to the store and a crash in the middle of a paced release."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delayed_delivery import (
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    InMemoryDelayedMessageStore,
    InMemoryTransport,
    ManualClock,
)
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.ports import DelayedMessageStore
from delayed_delivery.release import busiest_window
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Arrivals(InMemoryTransport):
    """Records when each message becomes visible on its queue (send time plus any delay)."""

    def __init__(self, clock: ManualClock, *, max_delay: int | None = None) -> None:
        super().__init__(clock)
        self.arrivals: list[tuple[str, str, float]] = []
        self._max_delay = max_delay

    def send(self, message: DelayedMessage) -> None:
        super().send(message)
        self.arrivals.append((message.message_id, message.destination, self.clock.now().timestamp()))

    def at(self, destination: str) -> list[float]:
        return [t for _, d, t in self.arrivals if d == destination]

    def ids(self, destination: str) -> list[str]:
        return [i for i, d, _ in sorted(self.arrivals, key=lambda a: a[2]) if d == destination]


class PlacingArrivals(Arrivals):
    """A queue that can hide a message for whole seconds (as SQS and Azure queues can)."""

    @property
    def max_delay_seconds(self) -> int:
        return self._max_delay or 900

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        assert 0 <= delay_seconds <= self.max_delay_seconds
        InMemoryTransport.send(self, message)
        self.arrivals.append((message.message_id, message.destination, self.clock.now().timestamp() + delay_seconds))


def burst(store: DelayedMessageStore, n: int, destination: str = "orders", due_s: float = 0.0) -> None:
    messages = [
        DelayedMessage(f"{destination}-{i:05d}", destination, b"x", T0 + timedelta(seconds=due_s)) for i in range(n)
    ]
    if isinstance(store, SqliteDelayedMessageStore):
        store.store_many(messages)
    else:
        for m in messages:
            store.store(m)


def paced(store: DelayedMessageStore, transport: Arrivals, clock: ManualClock, **rates: float) -> Dispatcher:
    settings = DelayedDeliverySettings(release_rates=rates, batch_size=100)  # type: ignore[arg-type]
    return Dispatcher(store, transport, settings, clock=clock)


def check_cap(times: Sequence[float], rate: float, batch: int = 100) -> None:
    assert busiest_window(times, 10.0) <= 1.05 * rate * 10 + batch


@pytest.mark.parametrize("placing", [False, True], ids=["held-and-deferred", "placed"])
def test_a_burst_leaves_at_the_cap_in_due_order_and_finishes_on_time(placing: bool) -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = PlacingArrivals(clock) if placing else Arrivals(clock)
    burst(store, 2000)
    dispatcher = paced(store, transport, clock, orders=100)
    report = dispatcher.dispatch_due(60, wait_for_due=True)
    times = transport.at("orders")
    assert len(times) == 2000 and len(store) == 0
    check_cap(times, 100)
    finish = max(times) - T0.timestamp()
    assert 2000 / 100 * 0.95 <= finish + 0.01 <= 2000 / 100 * 1.05
    assert min(times) >= T0.timestamp()
    lags = report.release_lag_seconds["orders"]
    assert len(lags) == 2000 and max(lags) == pytest.approx(19.99, abs=0.02)
    assert max(report.lateness_seconds) < 0.5  # what release control adds is not counted as transport lateness
    if not placing:
        assert report.deferred > 0  # the far slots waited in the store, not in memory


def test_due_order_is_kept_within_a_destination() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = Arrivals(clock)
    for i in range(300):  # due times shuffled, all within a second
        store.store(DelayedMessage(f"m-{i:03d}", "orders", b"x", T0 + timedelta(milliseconds=(i * 37) % 1000)))
    paced(store, transport, clock, orders=50).dispatch_due(30, wait_for_due=True)
    sent = [store_due for store_due in transport.ids("orders")]
    dues = {f"m-{i:03d}": (i * 37) % 1000 for i in range(300)}
    assert [dues[m] for m in sent] == sorted(dues[m] for m in sent)


def test_uncapped_destinations_beside_a_capped_one_are_not_slowed() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = Arrivals(clock)
    burst(store, 1500, "orders")
    for second in range(20):
        burst(store, 10, f"audit{second}", due_s=second + 0.5)
    report = paced(store, transport, clock, orders=100).dispatch_due(30, wait_for_due=True)
    lateness = [transport.at(f"audit{s}")[i] - (T0.timestamp() + s + 0.5) for s in range(20) for i in range(10)]
    assert max(lateness) < 0.05
    assert set(report.release_lag_seconds) == set(report.release_slots) == {"orders"}  # only the capped one


def test_a_default_rate_caps_every_destination_and_null_lifts_it() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = Arrivals(clock)
    for name in ("a", "b", "free"):
        burst(store, 200, name)
    settings = DelayedDeliverySettings(release_rates={"*": 50, "free": None})  # type: ignore[arg-type]
    Dispatcher(store, transport, settings, clock=clock).dispatch_due(30, wait_for_due=True)
    for name in ("a", "b"):
        assert max(transport.at(name)) - T0.timestamp() == pytest.approx(199 / 50, abs=0.02)
    assert max(transport.at("free")) == T0.timestamp()


def test_one_shot_dispatch_defers_what_is_not_due_yet_and_the_next_run_sends_it_at_its_slot(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = SqliteDelayedMessageStore(tmp_path / "d.db")
    store.setup_infrastructure()
    transport = Arrivals(clock)
    burst(store, 300)
    dispatcher = paced(store, transport, clock, orders=100)
    first = dispatcher.dispatch_due()  # nothing waited for: what is over the cap goes back to the store
    assert first.dispatched == 1 and first.deferred == 299
    backlog = store.release_backlog()
    assert backlog["orders"][0] == 299
    assert backlog["orders"][1] == T0 + timedelta(seconds=2.99)
    clock.advance(1.0)
    dispatcher.dispatch_due()
    assert len(transport.at("orders")) == 101
    dispatcher.dispatch_due(5, wait_for_due=True)
    times = transport.at("orders")
    assert len(times) == 300 and len(store) == 0
    assert times[-1] == pytest.approx(T0.timestamp() + 2.99)


def test_a_crash_in_the_middle_of_a_paced_release_loses_nothing(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = SqliteDelayedMessageStore(tmp_path / "d.db", claim_timeout=30)
    store.setup_infrastructure()
    transport = Arrivals(clock)
    burst(store, 1000)
    first = paced(store, transport, clock, orders=100)
    first.dispatch_due(4.0, wait_for_due=True)  # the run's end is the crash: its held messages go back, the rest...
    sent_before = len(transport.at("orders"))
    assert 300 < sent_before < 500
    # ...and a dispatcher that dies without ending its run leaves claims, which expire
    crashed = paced(store, transport, clock, orders=100)
    assert crashed.pacer is not None
    crashed.store_port.fetch_due(clock.now() + timedelta(seconds=1), 100)  # claimed, never sent
    store.close()
    clock.advance(31)
    successor = paced(SqliteDelayedMessageStore(tmp_path / "d.db"), transport, clock, orders=100)
    successor.dispatch_due(120, wait_for_due=True)
    ids = [i for i, _, _ in transport.arrivals]
    assert sorted(set(ids)) == [f"orders-{i:05d}" for i in range(1000)]
    assert len(ids) == 1000  # nothing twice either: held rows were given back, not left claimed
    check_cap(transport.at("orders"), 100)


def test_placed_messages_arrive_at_their_slots_without_a_store_write() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = PlacingArrivals(clock)
    burst(store, 1000)
    report = paced(store, transport, clock, orders=10).dispatch_due(10, wait_for_due=True)
    times = sorted(transport.at("orders"))
    assert report.deferred == 0 and len(times) == 1000
    assert times == pytest.approx([T0.timestamp() + i / 10 for i in range(1000)], abs=0.011)
    assert clock.now() - T0 <= timedelta(seconds=11)  # placed within the run, not released over 100 s
    # each message's slot is reported with it: whole-second visibility lands it there, 10 to any second
    slots = sorted(report.release_slots["orders"])
    assert slots == pytest.approx([T0.timestamp() + i / 10 for i in range(1000)], abs=1e-6)
    assert max(Counter(int(s) for s in slots).values()) == 10


def test_placing_beyond_what_the_queue_hides_defers_to_the_store() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = PlacingArrivals(clock, max_delay=5)
    burst(store, 100)
    report = paced(store, transport, clock, orders=10).dispatch_due(3, wait_for_due=True)
    assert report.deferred > 0
    paced(store, transport, clock, orders=10).dispatch_due(20, wait_for_due=True)
    times = sorted(transport.at("orders"))
    assert len(times) == 100 and times == pytest.approx([T0.timestamp() + i / 10 for i in range(100)], abs=0.011)


def test_no_release_rates_is_todays_behaviour() -> None:
    clock = ManualClock(T0)
    store = InMemoryDelayedMessageStore()
    transport = Arrivals(clock)
    burst(store, 500)
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(), clock=clock)
    assert dispatcher.pacer is None
    dispatcher.dispatch_due()
    assert transport.at("orders") == [T0.timestamp()] * 500


def test_release_rates_come_from_the_environment_and_a_bad_value_is_one_clear_error() -> None:
    env = {"DELAYED_DELIVERY_RELEASE_RATES": '{"orders": 200, "*": 1000}'}
    settings = DelayedDeliverySettings.from_env(env)
    assert settings.release_rates.rate_for("orders") == 200
    assert settings.release_rates.rate_for("other") == 1000
    with pytest.raises(ConfigurationError, match=r"DELAYED_DELIVERY_RELEASE_RATES.*more than 0"):
        DelayedDeliverySettings.from_env({"DELAYED_DELIVERY_RELEASE_RATES": '{"orders": -1}'})
    with pytest.raises(ConfigurationError, match=r"DELAYED_DELIVERY_RELEASE_RATES.*JSON object"):
        DelayedDeliverySettings.from_env({"DELAYED_DELIVERY_RELEASE_RATES": "200"})
    with pytest.raises(ConfigurationError, match="release_rates"):
        DelayedDeliverySettings(release_rates={"orders": "fast"})  # type: ignore[dict-item]


class SharedSchedule:
    """An in-memory ``SharedReleaseState``; the first ``conflicts`` writes find that another dispatcher wrote first."""

    def __init__(self, conflicts: int = 0) -> None:
        self.state: dict[str, float] = {}
        self.conflicts = conflicts
        self.plans = 0

    def load(self) -> dict[str, float]:
        return dict(self.state)

    def save(self, state: Mapping[str, float]) -> None:
        self.book(lambda latest: {**latest, **{d: max(t, latest.get(d, t)) for d, t in state.items()}})

    def book(self, plan: Callable[[Mapping[str, float]], Mapping[str, float]]) -> None:
        while True:
            new = plan(dict(self.state))
            self.plans += 1
            if self.conflicts:
                self.conflicts -= 1
                self.state["orders"] = max(self.state.get("orders", 0.0), T0.timestamp()) + 1.0  # another booked 1 s
                continue
            self.state = dict(new)
            return


def test_dispatchers_sharing_a_schedule_share_the_cap_by_what_each_has_due() -> None:
    shared = SharedSchedule(conflicts=1)
    clock = ManualClock(T0)
    busy, idle = InMemoryDelayedMessageStore(), InMemoryDelayedMessageStore()
    burst(busy, 50)
    transport = PlacingArrivals(clock)
    settings = DelayedDeliverySettings(release_rates={"orders": 10}, batch_size=100)  # type: ignore[arg-type]
    for store in (busy, idle):
        Dispatcher(store, transport, settings, clock=clock, release_state=shared).dispatch_due(6, wait_for_due=True)
    times = sorted(transport.at("orders"))
    assert shared.conflicts == 0, "the booking that lost the race was made again on the schedule that won"
    # another dispatcher booked 1 s while the first attempt was made: the whole cap from there, not half of it
    assert times == pytest.approx([T0.timestamp() + 1.0 + k / 10 for k in range(50)])
