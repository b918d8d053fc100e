"""Row design: keys, due ranges that never read far-future rows, pagination, chunked bodies up to the limit."""

from __future__ import annotations

import locale
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest
from azure.data.tables import TableClient
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.azure import rows
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.errors import InvalidMessageError, MessageIdConflictError
from delayed_delivery.model import DelayedMessage
from tests.azure.conftest import make_store, new_name
from tests.fixtures.azurite import Azurite

T0 = datetime(2030, 1, 1, tzinfo=UTC)
moments = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))


def test_due_key_is_zero_padded_utc_digits() -> None:
    assert rows.due_key(datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC)) == "20300102030405000006"
    plus_two = datetime(2030, 1, 2, 5, 4, 5, 6, tzinfo=timezone(timedelta(hours=2)))
    assert rows.due_key(plus_two) == "20300102030405000006", "converted to UTC"
    assert rows.due_key(datetime(999, 1, 1, tzinfo=UTC)).startswith("0999")


def test_due_key_ignores_the_locale() -> None:
    before = locale.setlocale(locale.LC_TIME)
    try:
        for name in ("de_DE.UTF-8", "ar_SA.UTF-8", "th_TH.UTF-8", "C.UTF-8"):
            try:
                locale.setlocale(locale.LC_TIME, name)
            except locale.Error:
                continue
            assert rows.due_key(T0) == "20300101000000000000"
    finally:
        locale.setlocale(locale.LC_TIME, before)


@given(moments, moments)
def test_key_order_is_time_order(a: datetime, b: datetime) -> None:
    assert (rows.due_key(a) < rows.due_key(b)) == (a < b)
    assert rows.from_due_key(rows.due_key(a)) == a


@given(moments, moments)
def test_due_range_selects_exactly_what_is_due(due: datetime, at: datetime) -> None:
    lo, hi = rows.due_range(at)
    rk = rows.due_row_key(due, "some-id")
    assert (lo <= rk < hi) == (due <= at)
    assert not (lo <= rows.index_row_key("some-id") < hi), "index rows are never in a due range"


def test_keys_hold_any_message_id_safely() -> None:
    for mid in ("a/b", "a#b?c\\d", "ключ-⏰", "x" * 128):
        for key in (rows.due_row_key(T0, mid), rows.index_row_key(mid)):
            assert not set(key) & set("/\\#?") and key.isascii() and len(key) < 100
    assert rows.shard_of("m-1", 7) == rows.shard_of("m-1", 7)
    assert {rows.shard_of(f"m-{i}", 4) for i in range(100)} == {0, 1, 2, 3}


class CountingTable:
    """A TableClient wrapper counting the entities its queries return (and pages seen)."""

    def __init__(self, inner: TableClient) -> None:
        self.inner = inner
        self.entities = 0
        self.filters: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def query_entities(self, query_filter: str, **kwargs: Any) -> Any:
        self.filters.append(query_filter)
        pager = self.inner.query_entities(query_filter, **kwargs)
        outer = self

        class Pages:
            def by_page(self) -> Iterator[Iterator[Any]]:
                for page in pager.by_page():
                    items = list(page)
                    outer.entities += len(items)
                    yield iter(items)

        return Pages()


@pytest.mark.azurite
def test_finding_due_rows_never_reads_far_future_rows(azurite: Azurite) -> None:
    store = make_store(azurite.connection_string, new_name())
    far = [DelayedMessage(f"f-{i}", "q", b"", T0 + timedelta(days=30 + i)) for i in range(1500)]
    store.store_many(far)
    store.store_many([DelayedMessage(f"d-{i}", "q", b"", T0 + timedelta(seconds=i)) for i in range(5)])
    counting = CountingTable(store.table)
    view = TableDelayedMessageStore(counting, claim_timeout=60)  # type: ignore[arg-type]
    got = view.fetch_due(T0 + timedelta(hours=1), 100)
    assert [m.message_id for m in got] == [f"d-{i}" for i in range(5)]
    assert counting.entities == 5, "only due rows cross the wire"
    assert "RowKey lt @hi" in counting.filters[0]
    counting.entities = 0
    assert view.next_due() == T0 + timedelta(hours=1, seconds=60), "the claimed rows come back first"
    assert counting.entities <= 100
    store.drop()


@pytest.mark.azurite
def test_fetch_follows_continuation_tokens_across_small_pages(azurite: Azurite) -> None:
    store = make_store(azurite.connection_string, new_name(), page_size=3)
    store.store_many([DelayedMessage(f"m-{i:02d}", "q", b"", T0 + timedelta(seconds=i)) for i in range(20)])
    got = store.fetch_due(T0 + timedelta(minutes=1), 11)
    assert [m.message_id for m in got] == [f"m-{i:02d}" for i in range(11)]
    rest = store.fetch_due(T0 + timedelta(minutes=1), 100)
    assert [m.message_id for m in rest] == [f"m-{i:02d}" for i in range(11, 20)]
    store.drop()


class FakePager:
    def __init__(self, pages: list[list[Any]]) -> None:
        self.pages = pages

    def by_page(self) -> Iterator[Iterator[Any]]:
        return iter([iter(p) for p in self.pages])


class Entity(dict[str, Any]):
    metadata: ClassVar[dict[str, str]] = {"etag": 'W/"1"'}


def test_empty_pages_with_continuation_tokens_do_not_end_the_query() -> None:
    def entity(i: int) -> Entity:
        m = DelayedMessage(f"m-{i}", "q", b"b", T0 + timedelta(seconds=i))
        return Entity(rows.to_entities(m, 0)[0])

    class Table:
        table_name = "delays"
        claimed: ClassVar[list[list[Any]]] = []

        def query_entities(self, *args: Any, **kwargs: Any) -> FakePager:
            return FakePager([[], [], [entity(0)], [], [entity(1), entity(2)], []])

        def submit_transaction(self, ops: list[Any]) -> list[Any]:
            self.claimed.append(ops)
            return []

    store = TableDelayedMessageStore(Table(), claim_timeout=60)  # type: ignore[arg-type]
    assert [m.message_id for m in store.fetch_due(T0 + timedelta(seconds=10), 10)] == ["m-0", "m-1", "m-2"]
    assert len(Table.claimed) == 1 and len(Table.claimed[0]) == 3


@pytest.mark.azurite
def test_bodies_up_to_the_entity_limit_round_trip_and_beyond_it_fail_clearly(azurite: Azurite) -> None:
    store = make_store(azurite.connection_string, new_name())
    probe = DelayedMessage("big", "orders", b"", T0, {"type": "Blob"})
    limit = rows.body_capacity(probe)
    assert limit > 11 * rows.CHUNK_BYTES, "the body spans many 64 KiB chunks"
    body = bytes(range(256)) * (limit // 256) + b"\x07" * (limit % 256)
    store.store(DelayedMessage("big", "orders", body, T0, {"type": "Blob"}))
    fetched = store.fetch_next_due(T0)
    assert fetched is not None and fetched.body == body
    with pytest.raises(InvalidMessageError, match=f"within {limit} bytes"):
        store.store(DelayedMessage("bad", "orders", body + b"!", T0, {"type": "Blob"}))
    with pytest.raises(InvalidMessageError):
        store.store_many(
            [
                DelayedMessage("ok", "orders", b"", T0),
                DelayedMessage("bad", "orders", body + b"!", T0, {"type": "Blob"}),
            ]
        )
    assert store.get("bad") is None and store.get("ok") is None and store.count() == 1
    store.drop()


def test_chunks_are_64_kib_binary_properties() -> None:
    m = DelayedMessage("m", "q", b"a" * (2 * rows.CHUNK_BYTES + 1), T0)
    due, index = rows.to_entities(m, 5)
    assert due["PartitionKey"] == index["PartitionKey"] == "s005"
    assert due["BodyChunks"] == 3 and [len(due[f"Body{i:02d}"]) for i in range(3)] == [65536, 65536, 1]
    assert rows.message_from_entity(due) == m
    assert index["DueRowKey"] == due["RowKey"]


@pytest.mark.azurite
def test_reschedule_and_restore_move_rows_without_leaving_orphans(azurite: Azurite) -> None:
    store = make_store(azurite.connection_string, new_name())
    store.store(DelayedMessage("m", "q", b"1", T0))
    assert store.reschedule("m", T0 + timedelta(days=400))
    with pytest.raises(MessageIdConflictError):  # another message under a pending id (docs/identity.md)
        store.store(DelayedMessage("m", "q", b"2", T0 + timedelta(days=2)))
    store.store(DelayedMessage("m", "q", b"1", T0 + timedelta(days=400)))  # the same message again: a no-op
    entities = list(store.table.list_entities())
    assert sorted(e["RowKey"][:2] for e in entities) == ["d_", "i_"], "one due row and one index row"
    assert store.get("m") == DelayedMessage("m", "q", b"1", T0 + timedelta(days=400))
    store.drop()


NESTED = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    ("headers", "needle"),
    [(NESTED, "nested"), ('{"a": ' + NESTED + "}", "nested"), ("[]", "not an object"), ('{"a": 1}', "not a string")],
    ids=["nested-5000", "nested-value", "array", "number-value"],
)
def test_headers_that_are_no_flat_string_object_are_invalid_not_recursion_error(headers: str, needle: str) -> None:
    entity = rows.to_entities(DelayedMessage("m", "q", b"x", T0), 0)[0]
    with pytest.raises(InvalidMessageError, match=needle):
        rows.message_from_entity({**entity, "Headers": headers})


@pytest.mark.azurite
def test_a_row_with_deeply_nested_headers_becomes_the_unreadable_stand_in(azurite: Azurite) -> None:
    from delayed_delivery.headers import UNREADABLE

    store = make_store(azurite.connection_string, new_name())
    store.store(DelayedMessage("deep", "q", b"body", T0))
    entity = next(iter(store.table.query_entities("RowKey ge 'd_' and RowKey lt 'd`'")))
    store.table.update_entity({**entity, "Headers": NESTED})
    got = store.fetch_due(T0 + timedelta(seconds=1), 10)
    assert [m.message_id for m in got] == ["deep"]
    assert "nested" in got[0].headers[UNREADABLE] and got[0].body == b"body"
    store.drop()
