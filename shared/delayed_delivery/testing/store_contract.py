"""The store contract: every ``DelayedMessageStore`` must pass these tests.

Use it from your own test module::

    from delayed_delivery.testing import StoreContract

    class TestMyStore(StoreContract):
        claim_timeout = 60.0            # the claim timeout your fixture configures

        @pytest.fixture
        def store(self):
            s = MyStore(..., claim_timeout=self.claim_timeout)
            s.setup_infrastructure()
            yield s
            s.drop_everything()

Fetched messages carry the fetch's claim token (``ports.claim_of``); ``remove``, ``increment_failure_count``
and ``reschedule`` given that token act only while the row still holds it.

A store that refuses operators (``MessagePlacedError``) on a row whose dispatcher's claim ran out unsettled, since
its send may have been made (the Azure table), sets ``unsettled_claims_refuse_operators``: the cases that cancel or
reschedule after a claim expired then expect the refusal, or supersede the claim through a later dispatcher's.

When your dispatcher fetches through something other than the store an operator uses (the Azure lease holder's
exclusive view of its shard, say), override ``dispatcher_view``: the cases about a dispatcher sending while an
operator cancels or reschedules then fetch and settle through it, and operate through the store.

Add ``MultiProcessStoreContract`` (and a picklable ``store_factory`` fixture) when several
processes share the store, ``ReschedulableStoreContract`` when it implements ``reschedule`` and
``DeferringStoreContract`` when it implements ``defer`` (release control).
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ..errors import MessageIdConflictError, MessageInFlightError, MessagePlacedError
from ..model import DelayedMessage
from ..ports import BatchRemovingStore, DeferringStore, DelayedMessageStore, ReschedulableStore, claim_of, slot_of

__all__ = ["DeferringStoreContract", "MultiProcessStoreContract", "ReschedulableStoreContract", "StoreContract"]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _msg(i: int | str, due: datetime, **kw: Any) -> DelayedMessage:
    return DelayedMessage(
        message_id=f"m-{i}",
        destination=kw.pop("destination", "orders"),
        body=kw.pop("body", f"body {i}".encode()),
        due_at=due,
        **kw,
    )


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _claim(message: DelayedMessage | None) -> str:
    """The claim token a fetch attached; every store of this package attaches one."""
    assert message is not None, "nothing was fetched"
    claim = claim_of(message)
    assert claim, f"{message.message_id!r} was fetched without a claim token"
    return claim


def _operator_sees_in_flight(store: DelayedMessageStore, message_id: str) -> None:
    """An operator's cancel and reschedule of ``message_id`` are both refused as in flight."""
    with pytest.raises(MessageInFlightError, match=message_id):
        store.remove(message_id)
    if isinstance(store, ReschedulableStore):
        with pytest.raises(MessageInFlightError, match=message_id):
            store.reschedule(message_id, _now() + _s(3600))


def _now() -> datetime:
    """Wall-clock now, whole milliseconds (operators' in-flight checks compare claims with the real clock)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class StoreContract:
    """Behaviour shared by all stores; subclasses provide a ``store`` fixture yielding an empty store."""

    #: The claim timeout (seconds) the ``store`` fixture configures.
    claim_timeout: float = 60.0
    #: Largest body the store promises to keep.
    max_body_bytes: int = 1024 * 1024
    #: Operators are refused on a row whose dispatcher's claim ran out unsettled (its send may have been made).
    unsettled_claims_refuse_operators: bool = False

    @pytest.fixture
    def store(self) -> DelayedMessageStore:
        raise NotImplementedError("define a `store` fixture that yields a fresh, empty store")

    def dispatcher_view(self, store: Any) -> Any:
        """What the dispatcher fetches and settles through (default: the store itself)."""
        return store

    def test_empty_store_has_nothing_due(self, store: DelayedMessageStore) -> None:
        assert store.next_due() is None
        assert store.fetch_next_due(T0) is None
        assert list(store.fetch_due(T0 + _s(10**6), 10)) == []

    def test_message_is_not_fetched_before_it_is_due(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0 + _s(10)))
        assert store.fetch_next_due(T0 + _s(9.999)) is None
        assert store.next_due() == T0 + _s(10)

    def test_due_message_round_trips_every_field(self, store: DelayedMessageStore) -> None:
        original = _msg(1, T0 + _s(10.123456), headers={"a": "1", "content-type": "application/json"}, failure_count=2)
        store.store(original)
        fetched = store.fetch_next_due(T0 + _s(10.123456))
        assert fetched == original

    def test_fetch_returns_earliest_first(self, store: DelayedMessageStore) -> None:
        dues = list(range(30))
        random.Random(7).shuffle(dues)
        for d in dues:
            store.store(_msg(d, T0 + _s(d)))
        fetched = store.fetch_due(T0 + _s(100), 100)
        assert [m.message_id for m in fetched] == [f"m-{d}" for d in range(30)]

    def test_fetch_respects_limit_and_claims(self, store: DelayedMessageStore) -> None:
        for d in range(10):
            store.store(_msg(d, T0 + _s(d)))
        first = store.fetch_due(T0 + _s(100), 4)
        second = store.fetch_due(T0 + _s(100), 4)
        third = store.fetch_due(T0 + _s(100), 4)
        assert [m.message_id for m in first] == ["m-0", "m-1", "m-2", "m-3"]
        assert [m.message_id for m in second] == ["m-4", "m-5", "m-6", "m-7"]
        assert [m.message_id for m in third] == ["m-8", "m-9"]
        assert list(store.fetch_due(T0 + _s(100), 4)) == []

    def test_only_due_messages_are_fetched(self, store: DelayedMessageStore) -> None:
        for d in (1, 2, 50, 60):
            store.store(_msg(d, T0 + _s(d)))
        assert [m.message_id for m in store.fetch_due(T0 + _s(10), 10)] == ["m-1", "m-2"]

    def test_remove_reports_whether_it_removed(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0))
        assert store.remove("m-1") is True
        assert store.remove("m-1") is False
        assert store.remove("never-stored") is False
        assert store.fetch_next_due(T0 + _s(10**6)) is None

    def test_increment_failure_count_counts_and_releases_the_claim(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0))
        assert store.fetch_next_due(T0) is not None
        assert store.increment_failure_count("m-1") is True
        again = store.fetch_next_due(T0)
        assert again is not None and again.failure_count == 1
        assert store.increment_failure_count("m-1") is True
        if self.unsettled_claims_refuse_operators:  # a failed send may have been made: only a dispatcher removes it
            assert store.remove("m-1", _claim(store.fetch_next_due(T0))) is True
        else:
            assert store.remove("m-1") is True
        assert store.increment_failure_count("m-1") is False

    def test_claim_expires_so_a_crashed_dispatcher_loses_nothing(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0))
        assert store.fetch_next_due(T0) is not None
        assert store.fetch_next_due(T0 + _s(self.claim_timeout / 2)) is None
        later = store.fetch_next_due(T0 + _s(self.claim_timeout + 1))
        assert later is not None and later.message_id == "m-1"

    def test_next_due_is_the_earliest_and_follows_removals(self, store: DelayedMessageStore) -> None:
        store.store(_msg(2, T0 + _s(20)))
        store.store(_msg(1, T0 + _s(10)))
        store.store(_msg(3, T0 + _s(30)))
        assert store.next_due() == T0 + _s(10)
        store.remove("m-1")
        assert store.next_due() == T0 + _s(20)

    def test_next_due_skips_past_claimed_messages(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0))
        store.fetch_due(T0, 10)
        nxt = store.next_due()
        assert nxt is not None and nxt > T0

    # -- identity: an id means one message (docs/identity.md) ---------------

    def test_storing_the_same_message_again_is_a_no_op(self, store: DelayedMessageStore) -> None:
        original = _msg(1, T0 + _s(10), headers={"a": "1"})
        store.store(original)
        store.store(_msg(1, T0 + _s(10), headers={"a": "1"}))
        fetched = store.fetch_due(T0 + _s(10), 10)
        assert fetched == [original]
        store.store(original)  # while claimed: still a no-op, and the claim stands
        assert store.fetch_due(T0 + _s(11), 10) == []
        assert store.remove("m-1", _claim(fetched[0])) is True
        assert store.fetch_due(T0 + _s(10**6), 10) == []

    @pytest.mark.parametrize(
        "change",
        [
            {"body": b"other"},
            {"destination": "elsewhere"},
            {"headers": {"a": "2"}},
            {"due": T0 + _s(11)},
        ],
        ids=["body", "destination", "headers", "due"],
    )
    def test_storing_another_message_under_a_pending_id_is_refused(
        self, store: DelayedMessageStore, change: dict[str, Any]
    ) -> None:
        store.store(_msg(1, T0 + _s(10), headers={"a": "1"}))
        kw: dict[str, Any] = {"headers": {"a": "1"}, **change}
        with pytest.raises(MessageIdConflictError, match="m-1"):
            store.store(_msg(1, kw.pop("due", T0 + _s(10)), **kw))
        fetched = store.fetch_due(T0 + _s(100), 10)
        assert fetched == [_msg(1, T0 + _s(10), headers={"a": "1"})], "the pending message is unchanged"

    def test_an_id_is_free_again_once_its_message_is_gone(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0 + _s(10), body=b"old"))
        assert store.remove("m-1") is True
        store.store(_msg(1, T0 + _s(20), body=b"new"))
        assert [m.body for m in store.fetch_due(T0 + _s(20), 10)] == [b"new"]

    # -- claims: settling only acts while the row holds the claim ------------

    def test_remove_with_a_claim_that_expired_and_was_taken_again_does_nothing(
        self, store: DelayedMessageStore
    ) -> None:
        store.store(_msg(1, T0))
        first = _claim(store.fetch_next_due(T0))
        second = _claim(store.fetch_next_due(T0 + _s(self.claim_timeout + 1)))
        assert first != second
        assert store.remove("m-1", first) is False, "the first dispatcher's claim is superseded"
        assert store.increment_failure_count("m-1", first) is False
        assert store.remove("m-1", second) is True

    def test_remove_with_a_stale_claim_leaves_the_message_stored_since(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0, body=b"old"))
        stale = _claim(store.fetch_next_due(T0))
        assert store.remove("m-1", _claim(store.fetch_next_due(T0 + _s(self.claim_timeout + 1)))) is True
        store.store(_msg(1, T0 + _s(5), body=b"new"))
        assert store.remove("m-1", stale) is False
        assert store.increment_failure_count("m-1", stale) is False
        fetched = store.fetch_due(T0 + _s(10**6), 10)
        assert [(m.body, m.failure_count) for m in fetched] == [(b"new", 0)], "the new message is untouched"

    def test_a_failure_keeps_the_claim_token_for_the_settling_that_follows(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0))
        claim = _claim(store.fetch_next_due(T0))
        assert store.increment_failure_count("m-1", claim) is True
        assert store.remove("m-1", claim) is True  # e.g. moved to the error queue

    def test_remove_many_with_claims_removes_only_rows_still_claimed(self, store: DelayedMessageStore) -> None:
        if not isinstance(store, BatchRemovingStore):
            return  # the store has no batch removal: remove() above covers it
        for i in range(3):
            store.store(_msg(i, T0 + _s(i)))
        batch = store.fetch_due(T0 + _s(10), 10)
        again = store.fetch_next_due(T0 + _s(self.claim_timeout + 20))  # m-0's claim expired: taken again
        assert again is not None and again.message_id == "m-0"
        flags = store.remove_many([m.message_id for m in batch], [_claim(m) for m in batch])
        assert list(flags) == [False, True, True]
        assert store.remove("m-0", _claim(again)) is True

    def test_cancel_while_a_dispatcher_holds_the_claim_is_refused_as_in_flight(
        self, store: DelayedMessageStore
    ) -> None:
        now = _now()
        store.store(_msg(1, now - _s(1)))
        claim = _claim(store.fetch_next_due(now))
        with pytest.raises(MessageInFlightError, match="m-1"):
            store.remove("m-1")
        assert store.remove("m-1", claim) is True, "the message was still there, claimed"

    def test_an_operator_cannot_cancel_or_move_what_the_dispatcher_is_sending(self, store: DelayedMessageStore) -> None:
        now = _now()
        store.store(_msg(1, now - _s(1)))
        view = self.dispatcher_view(store)
        claim = _claim(view.fetch_next_due(now))
        _operator_sees_in_flight(store, "m-1")
        assert view.remove("m-1", claim) is True, "the dispatcher settles what it sent"
        assert store.remove("m-1") is False, "and then there is nothing left to cancel"

    def test_a_message_fetched_ahead_of_its_due_time_is_in_flight_too(self, store: DelayedMessageStore) -> None:
        now = _now()  # release control fetches up to a second ahead and holds what it fetched until it is due
        store.store(_msg(1, now + _s(0.5)))
        view = self.dispatcher_view(store)
        claim = _claim(view.fetch_next_due(now + _s(1)))
        _operator_sees_in_flight(store, "m-1")
        assert view.remove("m-1", claim) is True

    def test_settling_never_removes_a_message_stored_again_after_its_claim_expired(
        self, store: DelayedMessageStore
    ) -> None:
        now = _now()
        late = now - _s(self.claim_timeout + 10)  # fetched long ago: its claim has run out on the operator's clock
        store.store(_msg(1, late))
        view = self.dispatcher_view(store)
        stale = _claim(view.fetch_next_due(late + _s(1)))
        if self.unsettled_claims_refuse_operators:  # a later dispatcher's claim removes it (operators are refused)
            assert store.remove("m-1", _claim(store.fetch_next_due(now))) is True
        else:
            assert store.remove("m-1") is True, "an expired claim is no longer in flight"
        store.store(_msg(1, late))  # the same message again: the same due time, the same row key where keys exist
        if isinstance(view, BatchRemovingStore):
            assert list(view.remove_many(["m-1"], [stale])) == [False]
        assert view.remove("m-1", stale) is False
        assert view.increment_failure_count("m-1", stale) is False
        fetched = store.fetch_due(now, 10)
        assert [(m.message_id, m.failure_count) for m in fetched] == [("m-1", 0)], "the new message is untouched"

    def test_cancel_after_the_claim_expired_removes(self, store: DelayedMessageStore) -> None:
        now = _now()
        store.store(_msg(1, now - _s(self.claim_timeout + 10)))
        assert store.fetch_next_due(now - _s(self.claim_timeout + 5)) is not None
        if self.unsettled_claims_refuse_operators:  # its send may have been made: never "cancelled"
            with pytest.raises(MessagePlacedError, match="m-1"):
                store.remove("m-1")
            return
        assert store.remove("m-1") is True

    def test_large_binary_body(self, store: DelayedMessageStore) -> None:
        body = bytes(range(256)) * (self.max_body_bytes // 256)
        store.store(_msg(1, T0, body=body))
        fetched = store.fetch_next_due(T0)
        assert fetched is not None and fetched.body == body

    def test_empty_body(self, store: DelayedMessageStore) -> None:
        store.store(_msg(1, T0, body=b""))
        fetched = store.fetch_next_due(T0)
        assert fetched is not None and fetched.body == b""

    def test_unicode_headers_and_ids(self, store: DelayedMessageStore) -> None:
        headers = {"ключ": "значение", "emoji": "⏰🚀", "quote": 'it\'s "x"', "nul-ish": "a\u0001b"}
        original = DelayedMessage("id-ü-⏰", "queue-é", b"\x00\xff", T0, headers)
        store.store(original)
        assert store.fetch_next_due(T0) == original

    def test_threads_never_claim_the_same_message(self, store: DelayedMessageStore) -> None:
        total = 200
        for i in range(total):
            store.store(_msg(i, T0 + _s(i % 17)))
        seen: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def worker() -> None:
            start.wait()
            while True:
                batch = store.fetch_due(T0 + _s(100), 5)
                if not batch:
                    return
                with lock:
                    seen.extend(m.message_id for m in batch)
                for m in batch:
                    store.remove(m.message_id, claim_of(m))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(seen) == total, "every message is claimed"
        assert len(set(seen)) == total, "no message is claimed twice"


class ReschedulableStoreContract:
    """Extra behaviour for stores implementing ``reschedule``."""

    #: The claim timeout (seconds) the ``store`` fixture configures.
    claim_timeout: float = 60.0
    #: As ``StoreContract.unsettled_claims_refuse_operators``.
    unsettled_claims_refuse_operators: bool = False

    @pytest.fixture
    def store(self) -> ReschedulableStore:
        raise NotImplementedError

    def test_reschedule_moves_the_due_time_and_releases_the_claim(self, store: Any) -> None:
        store.store(_msg(1, T0))
        claim = _claim(store.fetch_next_due(T0))
        assert store.reschedule("m-1", T0 + _s(30), claim) is True
        assert store.fetch_next_due(T0 + _s(29)) is None
        assert store.next_due() == T0 + _s(30)
        assert store.fetch_next_due(T0 + _s(30)) is not None
        assert store.reschedule("missing", T0) is False

    def test_reschedule_of_an_unclaimed_message_moves_it(self, store: Any) -> None:
        store.store(_msg(1, T0))
        assert store.reschedule("m-1", T0 + _s(30)) is True
        assert store.fetch_next_due(T0 + _s(29)) is None
        assert store.fetch_next_due(T0 + _s(30)) is not None

    def test_reschedule_while_a_dispatcher_holds_the_claim_is_refused_as_in_flight(self, store: Any) -> None:
        now = _now()
        store.store(_msg(1, now - _s(1)))
        claim = _claim(store.fetch_next_due(now))
        with pytest.raises(MessageInFlightError, match="m-1"):
            store.reschedule("m-1", now + _s(3600))
        assert store.remove("m-1", claim) is True, "the dispatcher's removal still works: nothing moved"

    def test_settling_never_removes_a_message_rescheduled_after_its_claim_expired(self, store: Any) -> None:
        now = _now()
        late = now - _s(self.claim_timeout + 10)
        store.store(_msg(1, late))
        view = self.dispatcher_view(store)
        stale = _claim(view.fetch_next_due(late + _s(1)))
        if self.unsettled_claims_refuse_operators:  # a later dispatcher's claim moves it (operators are refused)
            assert store.reschedule("m-1", now + _s(3600), _claim(store.fetch_next_due(now))) is True
        else:
            assert store.reschedule("m-1", now + _s(3600)) is True, "an expired claim is no longer in flight"
        if isinstance(view, BatchRemovingStore):
            assert list(view.remove_many(["m-1"], [stale])) == [False]
        assert view.remove("m-1", stale) is False
        assert view.reschedule("m-1", now + _s(5), stale) is False
        assert store.fetch_due(now + _s(3599), 10) == []
        moved = store.fetch_due(now + _s(3600), 10)
        assert [(m.message_id, m.due_at) for m in moved] == [("m-1", now + _s(3600))], "moved once, never removed"

    def dispatcher_view(self, store: Any) -> Any:
        """What the dispatcher fetches and settles through (default: the store itself)."""
        return store

    def test_reschedule_with_a_superseded_claim_does_nothing(self, store: Any) -> None:
        store.store(_msg(1, T0))
        first = _claim(store.fetch_next_due(T0))
        second = _claim(store.fetch_next_due(T0 + _s(self.claim_timeout + 1)))
        assert store.reschedule("m-1", T0 + _s(10**5), first) is False
        assert store.reschedule("m-1", T0 + _s(500), second) is True
        assert store.next_due() == T0 + _s(500)


class DeferringStoreContract:
    """Extra behaviour for stores implementing ``defer`` (release control keeps a row back until its slot)."""

    #: The claim timeout (seconds) the ``store`` fixture configures.
    claim_timeout: float = 60.0

    @pytest.fixture
    def store(self) -> DeferringStore:
        raise NotImplementedError

    def test_a_deferred_row_keeps_its_due_time_and_comes_back_at_its_slot_naming_it(self, store: Any) -> None:
        store.store(_msg(1, T0))
        claim = _claim(store.fetch_next_due(T0))
        assert list(store.defer([("m-1", T0 + _s(30), claim)])) == [True]
        assert store.fetch_next_due(T0 + _s(29)) is None
        assert store.next_due() == T0 + _s(30)
        back = store.fetch_next_due(T0 + _s(30))
        assert back is not None and back.due_at == T0, "the due time is unchanged"
        assert slot_of(back) == T0 + _s(30)
        assert store.remove("m-1", _claim(back)) is True

    def test_a_row_that_was_not_deferred_names_no_slot(self, store: Any) -> None:
        store.store(_msg(1, T0))
        first = store.fetch_next_due(T0)
        assert first is not None and slot_of(first) is None
        assert store.increment_failure_count("m-1", _claim(first)) is True
        again = store.fetch_next_due(T0 + _s(1))
        assert again is not None and slot_of(again) is None
        expired = store.fetch_next_due(T0 + _s(self.claim_timeout + 2))
        assert expired is not None and slot_of(expired) is None, "an expired claim is no slot"

    def test_defer_needs_the_claim(self, store: Any) -> None:
        store.store(_msg(1, T0))
        claim = _claim(store.fetch_next_due(T0))
        assert list(store.defer([("m-1", T0 + _s(30), "not-the-claim"), ("gone", T0, claim)])) == [False, False]
        assert store.remove("m-1", claim) is True, "the fetch's claim still holds the row"

    def test_deferred_rows_come_back_in_due_order_and_can_be_cancelled(self, store: Any) -> None:
        for i, due in ((1, T0 + _s(2)), (2, T0), (3, T0 + _s(1))):
            store.store(_msg(i, due))
        batch = store.fetch_due(T0 + _s(2), 10)
        assert [m.message_id for m in batch] == ["m-2", "m-3", "m-1"]
        store.defer([(m.message_id, T0 + _s(50 + n), _claim(m)) for n, m in enumerate(batch)])
        assert store.remove("m-1") is True, "a deferred row is not in flight: an operator may cancel it"
        back = store.fetch_due(T0 + _s(60), 10)
        assert [m.message_id for m in back] == ["m-2", "m-3"]
        assert [slot_of(m) for m in back] == [T0 + _s(50), T0 + _s(51)]

    def test_the_release_backlog_counts_deferred_rows_per_destination(self, store: Any) -> None:
        for i in range(3):
            store.store(_msg(i, T0))
        store.store(_msg("x", T0, destination="invoices"))
        batch = store.fetch_due(T0, 10)
        deferred = [m for m in batch if m.destination == "orders"]
        store.defer([(m.message_id, T0 + _s(10 + n), _claim(m)) for n, m in enumerate(deferred)])
        assert dict(store.release_backlog()) == {"orders": (3, T0 + _s(12))}
        store.fetch_due(T0 + _s(11), 10)
        assert dict(store.release_backlog()) == {"orders": (1, T0 + _s(12))}, "claimed again: no longer deferred"


def _claim_worker(
    factory: Callable[[], DelayedMessageStore], at: datetime, start: Any, results: Any, worker: int
) -> None:
    store = factory()
    start.wait(60)  # every process is up and connected before anyone claims
    claimed: list[str] = []
    while True:
        batch = store.fetch_due(at, 5)
        if not batch:
            break
        claimed.extend(m.message_id for m in batch)
        time.sleep(0.005)  # a real dispatcher sends between claim and remove; let the others in
        for m in batch:
            store.remove(m.message_id, claim_of(m))
    results.put((worker, claimed))


class MultiProcessStoreContract:
    """For stores shared across processes; provide ``store`` and a picklable ``store_factory`` fixture."""

    #: How many processes race for claims.
    processes: int = 4
    #: How many messages they share.
    messages: int = 400

    @pytest.fixture
    def store_factory(self) -> Callable[[], DelayedMessageStore]:
        raise NotImplementedError("define a `store_factory` fixture: a picklable callable returning the store")

    def test_processes_never_claim_the_same_message(
        self, store: DelayedMessageStore, store_factory: Callable[[], DelayedMessageStore]
    ) -> None:
        for i in range(self.messages):
            store.store(_msg(i, T0 + _s(i % 23)))
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Barrier(self.processes)
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_claim_worker, args=(store_factory, T0 + _s(100), start, queue, n))
            for n in range(self.processes)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=120)[1] for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        everything = [i for r in results for i in r]
        assert len(everything) == self.messages, "every message is claimed once"
        assert len(set(everything)) == self.messages, "no message is claimed by two processes"
        assert sum(1 for r in results if r) >= 2, f"the processes really competed: {[len(r) for r in results]}"
        assert store.next_due() is None
