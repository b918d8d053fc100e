"""The batch mover: exactly-once into the queue table, at-least-once elsewhere, look-ahead, polling."""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery import Dispatcher, InMemoryTransport
from delayed_delivery.errors import ConfigurationError, DelayedDeliveryError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.postgres.mover import (
    MoveReport,
    PollSchedule,
    PostgresBatchMover,
    native_delay_seconds,
)
from delayed_delivery.postgres.notify import DueListener, waking
from delayed_delivery.postgres.queue import PostgresQueueTransport
from delayed_delivery.postgres.store import PostgresDelayedMessageStore
from delayed_delivery.settings import DelayedDeliverySettings

PAST = datetime(2020, 1, 1, tzinfo=UTC)
FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def _msg(i: int, due: datetime, destination: str = "orders") -> DelayedMessage:
    return DelayedMessage(f"m-{i:04d}", destination, f"body {i}".encode(), due, {"n": str(i)})


# -- polling schedule (pure) -------------------------------------------------------------------


def test_poll_schedule_backs_off_from_half_a_second_to_the_cap_and_resets_when_busy() -> None:
    s = PollSchedule(initial=0.5, cap=4.0)
    intervals: list[float] = []
    interval: float | None = None
    for moved in (0, 0, 0, 0, 0, 3, 0):
        interval = s.next_interval(interval, moved)
        intervals.append(interval)
    assert intervals == [0.5, 1.0, 2.0, 4.0, 4.0, 0.5, 1.0]


def test_poll_schedule_never_sleeps_past_the_next_due_time() -> None:
    s = PollSchedule(initial=0.5, cap=60.0)
    assert s.sleep_for(60.0, None) == 60.0
    assert s.sleep_for(60.0, 2.5) == 2.5
    assert s.sleep_for(1.0, 2.5) == 1.0
    assert s.sleep_for(60.0, -3.0) == 0.0
    with pytest.raises(ConfigurationError):
        PollSchedule(initial=0, cap=1)


def test_native_delay_rounds_up_so_nothing_is_early_and_clamps() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert native_delay_seconds(now + timedelta(seconds=10.001), now, 900) == 11
    assert native_delay_seconds(now + timedelta(seconds=10), now, 900) == 10
    assert native_delay_seconds(now - timedelta(seconds=5), now, 900) == 0
    assert native_delay_seconds(now + timedelta(seconds=5000), now, 900) == 900


def test_reports_add_up() -> None:
    total = MoveReport(moved=2, batches=1, lateness_seconds=(1.0,)) + MoveReport(moved=3, batches=1, full_batch=True)
    assert (total.moved, total.batches, total.full_batch, total.lateness_seconds) == (5, 2, True, (1.0,))


# -- exactly once into the queue table -----------------------------------------------------------


@pytest.mark.postgres
def test_same_database_move_is_one_transaction_in_batches_of_100(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    pg_store.store_many([_msg(i, PAST + timedelta(seconds=i)) for i in range(250)])
    pg_store.store_many([_msg(1000 + i, FUTURE) for i in range(5)])
    mover = PostgresBatchMover(pg_store, pg_queue)
    assert mover.exactly_once and mover.batch_size == 100

    first = mover.move_once()
    assert (first.moved, first.full_batch, first.exactly_once) == (100, True, True)
    assert len(pg_store) == 155 and pg_queue.count() == 100
    rest = mover.drain()
    assert rest.moved == 150 and not rest.full_batch
    assert len(pg_store) == 5
    assert list(pg_queue.message_ids()) == [f"m-{i:04d}" for i in range(250)], "due order, each once"
    got = pg_queue.receive("orders", 3)
    assert [q.message for q in got] == [_msg(i, PAST + timedelta(seconds=i)) for i in range(3)]
    assert all(lateness > 0 for lateness in first.lateness_seconds)


@pytest.mark.postgres
def test_a_failed_insert_leaves_every_row_in_the_store(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport, postgres_conninfo: str
) -> None:
    import psycopg

    with psycopg.connect(postgres_conninfo, autocommit=True) as admin:
        admin.execute(f"ALTER TABLE {pg_queue.qualified_name} ADD CHECK (destination <> 'poison')")
    pg_store.store_many([_msg(i, PAST, "orders" if i != 7 else "poison") for i in range(10)])
    mover = PostgresBatchMover(pg_store, pg_queue)
    with pytest.raises(DelayedDeliveryError):
        mover.move_once()
    assert len(pg_store) == 10 and pg_queue.count() == 0
    _, claimable = pg_store.claim_due(100)
    assert len(claimable) == 10, "a failed move claims nothing"


def _drain_worker(store: PostgresDelayedMessageStore, queue: PostgresQueueTransport, start: Any, out: Any) -> None:
    mover = PostgresBatchMover(store, queue, batch_size=20)
    start.wait(60)
    out.put(mover.drain().moved)


@pytest.mark.postgres
def test_four_movers_share_the_table_and_deliver_each_message_exactly_once(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    total = 1000
    pg_store.store_many([_msg(i, PAST + timedelta(milliseconds=i)) for i in range(total)])
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_drain_worker, args=(pg_store, pg_queue, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    counts = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    ids = list(pg_queue.message_ids())
    assert sum(counts) == total and len(ids) == total and len(set(ids)) == total
    assert len(pg_store) == 0


# -- at-least-once through any transport ----------------------------------------------------------------


@pytest.mark.postgres
def test_other_transports_get_claim_send_then_remove(pg_store: PostgresDelayedMessageStore) -> None:
    transport = InMemoryTransport()
    pg_store.store_many([_msg(i, PAST + timedelta(seconds=i)) for i in range(5)])
    pg_store.store(_msg(99, FUTURE))
    mover = PostgresBatchMover(pg_store, transport, batch_size=3)
    assert not mover.exactly_once
    report = mover.drain()
    assert report.moved == 5 and report.batches == 2
    assert [m.message_id for m in transport.to("orders")] == [f"m-{i:04d}" for i in range(5)]
    assert len(pg_store) == 1


@pytest.mark.postgres
def test_a_failed_send_is_counted_backed_off_and_retried(pg_store: PostgresDelayedMessageStore) -> None:
    transport = InMemoryTransport()
    transport.fail("orders", times=1)
    pg_store.store(_msg(1, PAST))
    settings = DelayedDeliverySettings(number_of_retries=3, retry_backoff=0.2)
    mover = PostgresBatchMover(pg_store, transport, settings=settings)
    first = mover.move_once()
    assert (first.moved, first.failed_attempts) == (0, 1)
    kept = pg_store.get("m-0001")
    assert kept is not None and kept.failure_count == 1 and kept.due_at > PAST
    deadline = time.monotonic() + 30
    report = MoveReport()
    while not report.moved and time.monotonic() < deadline:
        report = mover.move_once()
        time.sleep(0.05)
    assert report.moved == 1 and [m.message_id for m in transport.to("orders")] == ["m-0001"]


# -- look-ahead (SQS DelaySeconds) ------------------------------------------------------------------------


class _RecordingDelayer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    def send_delayed(self, message: DelayedMessage, delay_seconds: int) -> None:
        self.sent.append((message.message_id, delay_seconds))


@pytest.mark.postgres
def test_look_ahead_hands_the_last_900_seconds_to_the_queue_with_exact_delays(
    pg_store: PostgresDelayedMessageStore,
) -> None:
    overdue = pg_store.store_after(0, "orders", b"", message_id="overdue")
    soon = pg_store.store_after(100.25, "orders", b"", message_id="soon")
    edge = pg_store.store_after(899.5, "orders", b"", message_id="edge")
    pg_store.store_after(1000, "orders", b"", message_id="later")
    delayer = _RecordingDelayer()
    mover = PostgresBatchMover(pg_store, delayer, look_ahead=900)  # type: ignore[arg-type]
    before = pg_store.database_now()
    report = mover.move_once()
    after = pg_store.database_now()
    assert report.moved == 3
    delays = dict(delayer.sent)
    assert set(delays) == {"overdue", "soon", "edge"}
    for message in (overdue, soon, edge):
        # never early: sent after `after`, the queue releases it no sooner than its due time
        assert after + timedelta(seconds=delays[message.message_id]) >= message.due_at
        assert delays[message.message_id] <= max(0, (message.due_at - before).total_seconds()) + 2
    assert delays["overdue"] == 0 and 890 <= delays["edge"] <= 900
    assert [m.message_id for m in pg_store.fetch_due(FUTURE, 10)] == ["later"]


@pytest.mark.postgres
def test_mover_configuration_is_checked(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    with pytest.raises(ConfigurationError):
        PostgresBatchMover(pg_store, InMemoryTransport(), exactly_once=True)
    with pytest.raises(ConfigurationError):
        PostgresBatchMover(pg_store, InMemoryTransport(), look_ahead=60)
    with pytest.raises(ConfigurationError):
        PostgresBatchMover(pg_store, _RecordingDelayer(), look_ahead=901)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"max_native_delay \(60 s\)"):  # a transport with a shorter cap
        PostgresBatchMover(pg_store, _RecordingDelayer(), look_ahead=61, max_native_delay=60)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        PostgresBatchMover(pg_store, pg_queue, look_ahead=60)
    with pytest.raises(ConfigurationError):
        PostgresBatchMover(pg_store, pg_queue, batch_size=0)
    assert not PostgresBatchMover(pg_store, pg_queue, exactly_once=False).exactly_once


# -- the polling loop ------------------------------------------------------------------------------------------


def _run_in_thread(mover: PostgresBatchMover, **kw: Any) -> tuple[threading.Event, threading.Thread, list[MoveReport]]:
    stop = threading.Event()
    out: list[MoveReport] = []
    thread = threading.Thread(target=lambda: out.append(mover.run(stop, **kw)), daemon=True)
    thread.start()
    return stop, thread, out


def _wait_for(predicate: Any, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    return None


@pytest.mark.postgres
def test_run_wakes_at_once_on_notify_instead_of_sleeping_out_its_backoff(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    mover = PostgresBatchMover(pg_store, pg_queue, schedule=PollSchedule(initial=60, cap=60))
    stop, thread, out = _run_in_thread(mover)
    try:
        time.sleep(1.0)  # the mover has polled once, found nothing and sleeps 60 s
        pg_store.store_after(0, "orders", b"now", message_id="now")
        took = _wait_for(lambda: pg_queue.count() == 1, 30)
        assert took is not None and took < 30, "woken by NOTIFY, not by the 60 s poll"
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and out and out[0].moved == 1


@pytest.mark.postgres
def test_run_never_sleeps_past_the_next_due_time(
    pg_store: PostgresDelayedMessageStore, pg_queue: PostgresQueueTransport
) -> None:
    stored = pg_store.store_after(1.0, "orders", b"soon", message_id="soon")
    mover = PostgresBatchMover(pg_store, pg_queue, schedule=PollSchedule(initial=60, cap=60))
    stop, thread, _ = _run_in_thread(mover, listen=False)
    try:
        took = _wait_for(lambda: pg_queue.count() == 1, 40)
        assert took is not None, "moved long before the 60 s poll interval"
        assert pg_store.database_now() >= stored.due_at
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.postgres
def test_a_core_dispatcher_is_woken_by_notify_from_another_connection(
    pg_store: PostgresDelayedMessageStore, postgres_conninfo: str
) -> None:
    transport = InMemoryTransport()
    dispatcher = Dispatcher(pg_store, transport, DelayedDeliverySettings(max_idle_sleep=60))
    stop = threading.Event()
    with DueListener(postgres_conninfo, pg_store.notify_channel, poll_interval=0.2) as listener:
        listener.subscribe(waking(dispatcher))
        thread = threading.Thread(target=dispatcher.run, args=(stop,), daemon=True)
        thread.start()
        try:
            time.sleep(0.5)  # idle: sleeping up to 60 s
            other = PostgresDelayedMessageStore(postgres_conninfo, table=pg_store.table)
            other.store_after(0, "orders", b"x", message_id="from-elsewhere")
            other.close()
            took = _wait_for(lambda: len(transport.to("orders")) == 1, 30)
            assert took is not None and took < 30
        finally:
            stop.set()
            dispatcher.notify(PAST)
            thread.join(10)
    assert not thread.is_alive()


@pytest.mark.postgres
def test_run_keeps_going_through_failures_and_raises_a_critical_error(
    postgres_conninfo: str, pg_queue: PostgresQueueTransport
) -> None:
    missing = PostgresDelayedMessageStore(postgres_conninfo, table="not_set_up_delayed")
    critical: list[Exception] = []
    settings = DelayedDeliverySettings(
        time_to_trigger_fetch_circuit_breaker=0.5, failure_delay=0.1, tripped_failure_delay=0.2
    )
    mover = PostgresBatchMover(missing, pg_queue, settings=settings, on_critical_error=critical.append)
    stop, thread, out = _run_in_thread(mover, listen=False)
    try:
        assert _wait_for(lambda: bool(critical), 30) is not None
        assert thread.is_alive(), "the loop survives failed polls"
        missing.setup_infrastructure()  # the database recovers
        missing.store_after(0, "orders", b"x", message_id="after-recovery")
        assert _wait_for(lambda: pg_queue.count() == 1, 30) is not None
    finally:
        stop.set()
        thread.join(10)
        missing.drop_infrastructure()
        missing.close()
    assert out and out[0].moved == 1
