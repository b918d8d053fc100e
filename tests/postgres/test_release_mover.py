"""Release control in the PostgreSQL batch mover: slots from a schedule every mover shares, deferred rows moved at
their slots, exactly once, in due order; placed through a delaying transport otherwise."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest

from delayed_delivery import InMemoryTransport
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.postgres.mover import PostgresBatchMover
from delayed_delivery.postgres.queue import PostgresQueueTransport
from delayed_delivery.postgres.store import PostgresDelayedMessageStore
from delayed_delivery.settings import DelayedDeliverySettings

pytestmark = pytest.mark.postgres

PAST = datetime(2020, 1, 1, tzinfo=UTC)


def _msgs(n: int, destination: str = "orders", due: datetime = PAST) -> list[DelayedMessage]:
    return [
        DelayedMessage(f"{destination}-{i:04d}", destination, b"x", due + timedelta(milliseconds=i)) for i in range(n)
    ]


def _settings(**rates: float) -> DelayedDeliverySettings:
    return DelayedDeliverySettings(release_rates=rates)  # type: ignore[arg-type]


def _deferred(store: PostgresDelayedMessageStore) -> list[tuple[str, datetime]]:
    with store.cursor() as cur:
        cur.execute(
            f"SELECT message_id, available_at FROM {store.qualified_name}"
            " WHERE claim_token IS NULL AND available_at > due_at ORDER BY available_at"
        )
        return [(str(m), a) for m, a in cur.fetchall()]


def test_the_exactly_once_move_defers_what_is_over_the_cap_at_slots_one_interval_apart(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    pg_store.store_many(_msgs(50) + _msgs(5, "audit"))
    mover = PostgresBatchMover(pg_store, pg_queue, settings=_settings(orders=10))
    report = mover.move_once()
    assert report.exactly_once and report.moved == 6 and report.deferred == 49
    assert sorted(m.message.destination for m in pg_queue.receive("audit", 10)) == ["audit"] * 5
    deferred = _deferred(pg_store)
    assert [m for m, _ in deferred] == [f"orders-{i:04d}" for i in range(1, 50)], "slots follow due order"
    gaps = {round((b - a).total_seconds(), 6) for (_, a), (_, b) in itertools.pairwise(deferred)}
    assert gaps == {0.1}
    lags = mover.release.lags(deferred[0][1]) if mover.release else {}
    assert lags["orders"] == pytest.approx(4.9, abs=0.01)


def test_movers_share_one_schedule_per_destination(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    pg_store.store_many(_msgs(40))
    first = PostgresBatchMover(pg_store, pg_queue, settings=_settings(orders=10), batch_size=20)
    second = PostgresBatchMover(pg_store, pg_queue, settings=_settings(orders=10), batch_size=20)
    assert first.move_once().deferred == 19
    assert second.move_once().deferred == 20, "the second mover continues the first one's schedule"
    slots = [a for _, a in _deferred(pg_store)]
    assert len(slots) == len(set(slots)) == 39
    assert (slots[-1] - slots[0]).total_seconds() == pytest.approx(3.8)


def test_deferred_rows_are_moved_at_their_slots_exactly_once_in_due_order(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    pg_store.store_many(_msgs(30))
    mover = PostgresBatchMover(pg_store, pg_queue, settings=_settings(orders=100))
    first = mover.move_once()
    lags = list(first.release_lag)
    slots = dict(_deferred(pg_store))
    deadline = time.monotonic() + 30
    moved = 1
    while moved < 30 and time.monotonic() < deadline:
        part = mover.move_once()
        moved += part.moved
        lags += part.release_lag
        assert all(late < 5 for late in part.lateness_seconds), "late after its slot, not since 2020"
        time.sleep(0.02)
    got = pg_queue.receive("orders", 100)
    assert [q.message.message_id for q in got] == [f"orders-{i:04d}" for i in range(30)]
    for q in got[1:]:
        assert q.enqueued_at >= slots[q.message.message_id], "never before its slot"
    assert len(pg_store) == 0
    assert [d for d, _ in lags] == ["orders"] * 30, "each message's lag reported once, when its slot was booked"
    assert max(lag for _, lag in lags) == pytest.approx(0.29, abs=0.01)


class _Delaying(InMemoryTransport):
    """A transport that can delay (as SQS can), recording each delay."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[tuple[str, int]] = []

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self.send(message)
        self.delays.append((message.message_id, delay_seconds))


def test_over_a_delaying_transport_capped_messages_are_placed_at_their_slots(
    pg_store: PostgresDelayedMessageStore,
) -> None:
    pg_store.store_many(_msgs(30) + _msgs(3, "audit"))
    transport = _Delaying()
    mover = PostgresBatchMover(pg_store, transport, settings=_settings(orders=2))
    report = mover.drain()
    assert report.moved == 33 and report.deferred == 0 and len(pg_store) == 0
    delays = dict(transport.delays)
    assert [delays[f"audit-{i:04d}"] for i in range(3)] == [0, 0, 0]
    orders = [delays[f"orders-{i:04d}"] for i in range(30)]
    assert orders == sorted(orders) and orders[0] == 0 and orders[-1] in (14, 15)
    assert max(orders.count(d) for d in set(orders)) <= 3, "about two a second"


def test_a_delay_beyond_the_native_cap_is_deferred_instead(pg_store: PostgresDelayedMessageStore) -> None:
    pg_store.store_many(_msgs(5))
    transport = _Delaying()
    report = PostgresBatchMover(pg_store, transport, settings=_settings(orders=0.001)).drain()
    assert report.moved == 1 and report.deferred == 4, "slots 1000 s apart: SQS places at most 900 s ahead"
    assert len(_deferred(pg_store)) == 4


def test_look_ahead_and_release_rates_are_refused_together(pg_store: PostgresDelayedMessageStore) -> None:
    with pytest.raises(ConfigurationError, match="look_ahead=0"):
        PostgresBatchMover(pg_store, _Delaying(), settings=_settings(orders=1), look_ahead=60)
