"""Property test: the PostgreSQL store behaves exactly like the in-memory reference store."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayed_delivery import DelayedDeliveryError, InMemoryDelayedMessageStore
from delayed_delivery.model import DelayedMessage
from delayed_delivery.postgres.store import PostgresDelayedMessageStore

pytestmark = pytest.mark.postgres

T0 = datetime(2030, 1, 1, tzinfo=UTC)
CLAIM = 30.0

IDS = ("a", "B", "b", "ü")
ids = st.sampled_from(IDS)
# few distinct times, so claims, expiries and ties between due times come up often
offsets = st.sampled_from([0, 5, 10, 20, 40, 80]).map(lambda s: T0 + timedelta(seconds=s))
operations = st.lists(
    st.one_of(
        st.tuples(st.just("store"), ids, offsets, st.integers(0, 3)),
        st.tuples(st.just("fetch"), offsets, st.integers(1, 4)),
        st.tuples(st.just("remove"), ids),
        st.tuples(st.just("fail"), ids),
        st.tuples(st.just("reschedule"), ids, offsets),
        st.tuples(st.just("next_due")),
    ),
    max_size=30,
)


@pytest.fixture(scope="module")
def shared_store(postgres_conninfo: str) -> Iterator[PostgresDelayedMessageStore]:
    s = PostgresDelayedMessageStore(postgres_conninfo, table="model_check_delayed", claim_timeout=CLAIM)
    s.setup_infrastructure()
    yield s
    s.drop_infrastructure()
    s.close()


def _apply(store: Any, op: tuple[Any, ...]) -> object:
    """The operation's result, or the name of the error it raised (an id conflict, a message in flight)."""
    try:
        return _run(store, op)
    except DelayedDeliveryError as exc:
        return type(exc).__name__


def _run(store: Any, op: tuple[Any, ...]) -> object:
    kind = op[0]
    if kind == "store":
        _, mid, due, failures = op
        return store.store(DelayedMessage(mid, "orders", mid.encode(), due, {"id": mid}, failures))
    if kind == "fetch":
        return list(store.fetch_due(op[1], op[2]))
    if kind == "remove":
        return store.remove(op[1])
    if kind == "fail":
        return store.increment_failure_count(op[1])
    if kind == "reschedule":
        return store.reschedule(op[1], op[2])
    return store.next_due()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_every_operation_matches_the_in_memory_store(
    shared_store: PostgresDelayedMessageStore, ops: list[tuple[Any, ...]]
) -> None:
    with shared_store.cursor() as cur:
        cur.execute(f"TRUNCATE {shared_store.qualified_name}")
    reference = InMemoryDelayedMessageStore(claim_timeout=CLAIM)
    for step, op in enumerate(ops):
        assert _apply(shared_store, op) == _apply(reference, op), f"step {step}: {op}"
    for mid in IDS:
        assert shared_store.get(mid) == reference.get(mid)
