"""PostgreSQL-specific store behaviour: database clock, NOTIFY, names, errors, operator helpers."""

from __future__ import annotations

import pickle
import select
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from delayed_delivery import Dispatcher, InMemoryTransport, ManualClock, PostgresDelayedMessageStore
from delayed_delivery.app.stores import open_store
from delayed_delivery.errors import ConfigurationError, InvalidMessageError, TransientError
from delayed_delivery.headers import FAILURE_REASON, UNREADABLE
from delayed_delivery.model import DelayedMessage
from delayed_delivery.postgres.notify import DueListener, parse_due_payload
from delayed_delivery.settings import DelayedDeliverySettings

pytestmark = pytest.mark.postgres

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _msg(i: int, due: datetime) -> DelayedMessage:
    return DelayedMessage(f"m-{i}", "orders", f"body {i}".encode(), due)


# -- the database clock ---------------------------------------------------------


def test_a_sender_whose_clock_is_behind_cannot_make_a_message_early(pg_store: PostgresDelayedMessageStore) -> None:
    db_now = pg_store.database_now()
    sender = ManualClock(db_now - timedelta(minutes=10))  # the sender's clock is 10 minutes slow

    # The hazard: a due time computed on the sender's clock is already in the past.
    naive = DelayedMessage.create("orders", b"x", delay=60, clock=sender, message_id="naive")
    assert naive.due_at < db_now
    # The fix: the relative delay is turned into a due time by the database.
    before = pg_store.database_now()
    stored = pg_store.store_after(60, "orders", b"y", message_id="safe")
    after = pg_store.database_now()
    assert before + timedelta(seconds=60) <= stored.due_at <= after + timedelta(seconds=60)
    assert pg_store.get("safe") == stored

    # A dispatcher claiming by the database clock gets nothing early...
    _, batch = pg_store.claim_due(10)
    assert [m.message_id for m in batch] == []  # "naive" was never stored; "safe" is not due
    # ...and the wait until it is due is measured on the database clock too.
    until = pg_store.seconds_until_next_due()
    assert until is not None and 55 < until <= 60


def test_store_after_message_is_claimed_by_the_database_clock_once_due(
    pg_store: PostgresDelayedMessageStore,
) -> None:
    stored = pg_store.store_after(timedelta(milliseconds=300), "orders", b"soon", headers={"k": "v"})
    now, batch = pg_store.claim_due(10)
    assert batch == [] and now < stored.due_at
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    while not batch and datetime.now(UTC) < deadline:
        now, batch = pg_store.claim_due(10)
    assert [m.message_id for m in batch] == [stored.message_id]
    assert batch[0].headers == {"k": "v"} and now >= stored.due_at


def test_store_after_rejects_a_negative_delay(pg_store: PostgresDelayedMessageStore) -> None:
    with pytest.raises(InvalidMessageError):
        pg_store.store_after(-1, "orders", b"x")


def test_claim_due_with_look_ahead_returns_the_database_now(pg_store: PostgresDelayedMessageStore) -> None:
    pg_store.store_after(120, "orders", b"later", message_id="later")
    pg_store.store_after(2000, "orders", b"far", message_id="far")
    now, batch = pg_store.claim_due(10, look_ahead=900)
    assert [m.message_id for m in batch] == ["later"]
    assert 100 <= (batch[0].due_at - now).total_seconds() <= 120
    with pytest.raises(ConfigurationError):
        pg_store.claim_due(10, look_ahead=-1)


# -- NOTIFY ---------------------------------------------------------------------------


def _notifications(conn: psycopg.Connection[object], timeout: float = 5.0) -> list[str]:
    select.select([conn.fileno()], [], [], timeout)
    return [n.payload for n in conn.notifies(timeout=0.2)]


def test_store_notifies_only_when_the_message_is_the_earliest(
    pg_store: PostgresDelayedMessageStore, postgres_conninfo: str
) -> None:
    with psycopg.connect(postgres_conninfo, autocommit=True) as listener:
        listener.execute(f'LISTEN "{pg_store.notify_channel}"')
        pg_store.store(_msg(1, T0 + timedelta(seconds=10)))
        first = _notifications(listener)
        assert [parse_due_payload(p) for p in first] == [T0 + timedelta(seconds=10)]
        pg_store.store(_msg(2, T0 + timedelta(seconds=20)))  # later: nobody needs waking
        pg_store.store(_msg(3, T0 + timedelta(seconds=5)))  # earlier: wake
        later = _notifications(listener)
        assert [parse_due_payload(p) for p in later] == [T0 + timedelta(seconds=5)]


def test_due_listener_calls_subscribers(pg_store: PostgresDelayedMessageStore, postgres_conninfo: str) -> None:
    seen: list[datetime | None] = []
    got = threading.Event()

    def on_due(due: datetime | None) -> None:
        seen.append(due)
        got.set()

    with DueListener(postgres_conninfo, pg_store.notify_channel, poll_interval=0.2) as listener:
        listener.subscribe(on_due)
        assert listener.listening
        pg_store.store(_msg(1, T0))
        assert got.wait(10)
    assert seen == [T0]


def test_parse_due_payload_ignores_garbage() -> None:
    assert parse_due_payload("nope") is None
    assert parse_due_payload("0") == datetime(1970, 1, 1, tzinfo=UTC)


# -- names, configuration and errors ----------------------------------------------------


@pytest.mark.parametrize("name", ["", "1abc", 'a"b', "a;drop table x", "a b", "x" * 64])
def test_unsafe_table_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid PostgreSQL table name"):
        PostgresDelayedMessageStore("host=127.0.0.1", table=name)


def test_endpoint_names_the_table_and_long_names_stay_distinct() -> None:
    s = PostgresDelayedMessageStore("host=127.0.0.1", endpoint="Sales.Orders-v2")
    assert s.table == "Sales.Orders-v2_delayed"
    assert s.qualified_name == '"public"."Sales.Orders-v2_delayed"'
    a = PostgresDelayedMessageStore("host=127.0.0.1", endpoint="e" * 60 + "a")
    b = PostgresDelayedMessageStore("host=127.0.0.1", endpoint="e" * 60 + "b")
    assert a.table != b.table and len(a.table) <= 63 and a.table.endswith("_delayed")
    assert PostgresDelayedMessageStore("host=127.0.0.1").table == "delayed_messages"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        PostgresDelayedMessageStore("host=127.0.0.1", table="t", claim_timeout=0)
    with pytest.raises(ConfigurationError):
        PostgresDelayedMessageStore("", table="t")
    with pytest.raises(ConfigurationError):
        PostgresDelayedMessageStore("not a = valid = conninfo", table="t")


def test_quoted_names_with_mixed_case_and_a_schema_work(postgres_conninfo: str) -> None:
    s = PostgresDelayedMessageStore(postgres_conninfo, endpoint="Mixed.Case-Endpoint", schema="Delays")
    s.setup_infrastructure()
    s.setup_infrastructure()  # idempotent
    try:
        s.store(_msg(1, T0))
        assert s.fetch_next_due(T0) == _msg(1, T0)
    finally:
        s.drop_infrastructure()
        s.close()


def test_missing_table_is_a_configuration_error(postgres_conninfo: str) -> None:
    s = PostgresDelayedMessageStore(postgres_conninfo, table="never_set_up")
    with pytest.raises(ConfigurationError, match="setup_infrastructure"):
        s.store(_msg(1, T0))
    s.close()


def test_unreachable_database_is_transient() -> None:
    from tests.fixtures.services import free_port

    s = PostgresDelayedMessageStore(f"host=127.0.0.1 port={free_port()} user=x", table="t", connect_timeout=2)
    with pytest.raises(TransientError) as info:
        s.next_due()
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


def test_nul_in_ids_is_an_invalid_message(pg_store: PostgresDelayedMessageStore) -> None:
    with pytest.raises(InvalidMessageError):
        pg_store.store(DelayedMessage("a\x00b", "orders", b"", T0))


def test_header_values_with_nul_survive(pg_store: PostgresDelayedMessageStore) -> None:
    m = DelayedMessage("m", "orders", b"", T0, {"h": "a\x00b"})
    pg_store.store(m)
    assert pg_store.get("m") == m


def test_a_killed_connection_is_replaced(pg_store: PostgresDelayedMessageStore, postgres_conninfo: str) -> None:
    pg_store.store(_msg(1, T0))
    with psycopg.connect(postgres_conninfo, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND datname = current_database() AND application_name = ''"
            " AND backend_type = 'client backend' AND query NOT ILIKE '%%LISTEN%%'"
        )
    with pytest.raises(TransientError):
        pg_store.next_due()
    assert pg_store.next_due() == T0  # reconnected


# -- pickling, operator helpers, store URL ----------------------------------------------------------


def test_pickled_store_reconnects_with_the_same_settings(pg_store: PostgresDelayedMessageStore) -> None:
    pg_store.store(_msg(1, T0))
    copy = pickle.loads(pickle.dumps(pg_store))
    try:
        assert copy.table == pg_store.table and copy.claim_timeout == pg_store.claim_timeout
        assert copy.get("m-1") == _msg(1, T0)
    finally:
        copy.close()


def test_backlog_earliest_due_and_len(pg_store: PostgresDelayedMessageStore) -> None:
    for i, seconds in enumerate((0, 30, 59, 60, 3600)):
        pg_store.store(_msg(i, T0 + timedelta(seconds=seconds)))
    pg_store.fetch_due(T0, 10)  # claiming does not hide a message from operators
    assert len(pg_store) == 5
    assert pg_store.earliest_due() == T0
    assert list(pg_store.backlog(60)) == [
        (T0, 3),
        (T0 + timedelta(seconds=60), 1),
        (T0 + timedelta(seconds=3600), 1),
    ]


def test_store_many_and_remove_many(pg_store: PostgresDelayedMessageStore) -> None:
    pg_store.store_many([_msg(i, T0 + timedelta(seconds=i)) for i in range(5)])
    assert len(pg_store) == 5
    assert list(pg_store.remove_many(["m-0", "m-0", "nope", "m-3"])) == [True, False, False, True]
    assert list(pg_store.remove_many([])) == []
    assert len(pg_store) == 3


def test_open_store_accepts_a_postgresql_url(pg_store: PostgresDelayedMessageStore) -> None:
    params = psycopg.conninfo.conninfo_to_dict(pg_store.conninfo)
    url = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    s = open_store(url)
    try:
        assert isinstance(s, PostgresDelayedMessageStore) and s.table == "delayed_messages"
        s.store(_msg(1, T0))
        assert s.next_due() == T0
    finally:
        assert isinstance(s, PostgresDelayedMessageStore)
        s.drop_infrastructure()
        s.close()


def test_due_listener_reconnects_and_says_look_again(
    pg_store: PostgresDelayedMessageStore, postgres_conninfo: str
) -> None:
    seen: list[datetime | None] = []
    changed = threading.Condition()

    def on_due(due: datetime | None) -> None:
        with changed:
            seen.append(due)
            changed.notify_all()

    with DueListener(postgres_conninfo, pg_store.notify_channel, poll_interval=0.2) as listener:
        listener.subscribe(on_due)
        with psycopg.connect(postgres_conninfo, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%'"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
        assert killed is not None and killed[0] == 1
        with changed:
            assert changed.wait_for(lambda: None in seen, 30), "a reconnect wakes subscribers"
        pg_store.store(_msg(1, T0))
        with changed:
            assert changed.wait_for(lambda: T0 in seen, 30), "and later notifications still arrive"


def test_a_dispatcher_whose_clock_is_fast_cannot_claim_early_when_capped(
    pg_store: PostgresDelayedMessageStore,
) -> None:
    from delayed_delivery import Dispatcher, InMemoryTransport

    capped = PostgresDelayedMessageStore(pg_store.conninfo, table=pg_store.table, never_before_database_time=True)
    try:
        pg_store.store_after(60, "orders", b"x", message_id="in-a-minute")
        fast = ManualClock(pg_store.database_now() + timedelta(minutes=10))  # the dispatcher's clock is 10 min fast
        transport = InMemoryTransport(fast)
        assert Dispatcher(capped, transport, clock=fast).dispatch_due().dispatched == 0
        assert transport.sent == [] and capped.get("in-a-minute") is not None
        # Without the cap the caller's clock is trusted (the contract's explicit-time semantics).
        assert [m.message_id for m in pg_store.fetch_due(fast.now(), 10)] == ["in-a-minute"]
        assert pickle.loads(pickle.dumps(capped)).never_before_database_time
    finally:
        capped.close()


def test_prepare_false_never_prepares_statements(pg_store: PostgresDelayedMessageStore) -> None:
    plain = PostgresDelayedMessageStore(pg_store.conninfo, table=pg_store.table, prepare=False)
    try:
        for i in range(10):
            plain.store(_msg(i, T0))
            plain.next_due()
        with plain.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_statements")
            row = cur.fetchone()
        assert row is not None and row[0] == 0
        assert not pickle.loads(pickle.dumps(plain))._db.prepare
        for _ in range(10):
            pg_store.next_due()
        with pg_store.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_statements")
            row = cur.fetchone()
        assert row is not None and row[0] > 0, "the default prepares repeated statements"
    finally:
        plain.close()


# -- rows written by hand that the store cannot read (found by tests/reliability/test_sql_store_fuzz.py) ----------


@pytest.mark.parametrize(
    "columns",
    [
        {"headers": "[]"},
        {"headers": '{"k": 1}'},
        {"message_id": ""},
        {"due_at": "-infinity"},
        {"due_at": "infinity", "available_at": "infinity"},
        {"headers": "null", "failure_count": 2_147_483_647},
    ],
    ids=["headers-array", "header-not-str", "blank-id", "due-minus-infinity", "due-infinity", "max-failure-count"],
)
def test_unreadable_row_goes_to_the_error_queue_and_the_rows_claimed_with_it_are_delivered(
    pg_store: PostgresDelayedMessageStore, columns: dict[str, object]
) -> None:
    # before: fetch_due raised after claiming the batch (or never fetched an infinite due time), so the good rows
    # claimed with the bad one were never delivered; a failure count at the integer maximum could not be counted
    now = datetime(2030, 1, 1, tzinfo=UTC)
    pg_store.store_many([_msg(1, now - timedelta(seconds=3)), _msg(2, now - timedelta(seconds=1))])
    row: dict[str, object] = {"message_id": "bad", "destination": "orders", "body": b"bad", "headers": "{}"}
    row |= {"due_at": (now - timedelta(seconds=2)).isoformat(), "failure_count": 0, **columns}
    row.setdefault("available_at", row["due_at"])
    casts = {"headers": "::json", "due_at": "::timestamptz", "available_at": "::timestamptz"}
    marks = ", ".join(f"%s{casts.get(c, '')}" for c in row)
    with pg_store.cursor() as cur:
        cur.execute(f"INSERT INTO {pg_store.qualified_name} ({', '.join(row)}) VALUES ({marks})", list(row.values()))
    clock = ManualClock(now)
    transport = InMemoryTransport(clock)
    Dispatcher(pg_store, transport, DelayedDeliverySettings(batch_size=3), clock=clock).dispatch_due(budget=30)
    assert [m.message_id for m in transport.to("orders")] == ["m-1", "m-2"]
    [error] = transport.to("error")
    assert error.body == b"bad" and error.headers[UNREADABLE] and "unreadable" in error.headers[FAILURE_REASON]
    assert len(pg_store) == 0
    assert pg_store.next_due() is None
