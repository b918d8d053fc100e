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
``DeferringStoreContract`` when it implements ``defer`` (release control). This module holds the port's own rules
and imports the others from theirs: the capabilities from ``store_capability_contracts.py``, the processes from
``store_process_contract.py`` (their shared messages and checks: ``store_contract_tools.py``).
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from ..errors import MessageIdConflictError, MessageInFlightError, MessagePlacedError
from ..model import DelayedMessage
from ..ports import BatchRemovingStore, DelayedMessageStore, claim_of
from .store_capability_contracts import DeferringStoreContract, ReschedulableStoreContract
from .store_contract_tools import T0, fetched_claim, msg, operator_sees_in_flight, secs, wall_now
from .store_process_contract import MultiProcessStoreContract

__all__ = ["DeferringStoreContract", "MultiProcessStoreContract", "ReschedulableStoreContract", "StoreContract"]


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
        assert list(store.fetch_due(T0 + secs(10**6), 10)) == []

    def test_message_is_not_fetched_before_it_is_due(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0 + secs(10)))
        assert store.fetch_next_due(T0 + secs(9.999)) is None
        assert store.next_due() == T0 + secs(10)

    def test_due_message_round_trips_every_field(self, store: DelayedMessageStore) -> None:
        original = msg(1, T0 + secs(10.123456), headers={"a": "1", "content-type": "application/json"}, failure_count=2)
        store.store(original)
        fetched = store.fetch_next_due(T0 + secs(10.123456))
        assert fetched == original

    def test_fetch_returns_earliest_first(self, store: DelayedMessageStore) -> None:
        dues = list(range(30))
        random.Random(7).shuffle(dues)
        for d in dues:
            store.store(msg(d, T0 + secs(d)))
        fetched = store.fetch_due(T0 + secs(100), 100)
        assert [m.message_id for m in fetched] == [f"m-{d}" for d in range(30)]

    def test_fetch_respects_limit_and_claims(self, store: DelayedMessageStore) -> None:
        for d in range(10):
            store.store(msg(d, T0 + secs(d)))
        first = store.fetch_due(T0 + secs(100), 4)
        second = store.fetch_due(T0 + secs(100), 4)
        third = store.fetch_due(T0 + secs(100), 4)
        assert [m.message_id for m in first] == ["m-0", "m-1", "m-2", "m-3"]
        assert [m.message_id for m in second] == ["m-4", "m-5", "m-6", "m-7"]
        assert [m.message_id for m in third] == ["m-8", "m-9"]
        assert list(store.fetch_due(T0 + secs(100), 4)) == []

    def test_only_due_messages_are_fetched(self, store: DelayedMessageStore) -> None:
        for d in (1, 2, 50, 60):
            store.store(msg(d, T0 + secs(d)))
        assert [m.message_id for m in store.fetch_due(T0 + secs(10), 10)] == ["m-1", "m-2"]

    def test_remove_reports_whether_it_removed(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0))
        assert store.remove("m-1") is True
        assert store.remove("m-1") is False
        assert store.remove("never-stored") is False
        assert store.fetch_next_due(T0 + secs(10**6)) is None

    def test_increment_failure_count_counts_and_releases_the_claim(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0))
        assert store.fetch_next_due(T0) is not None
        assert store.increment_failure_count("m-1") is True
        again = store.fetch_next_due(T0)
        assert again is not None and again.failure_count == 1
        assert store.increment_failure_count("m-1") is True
        if self.unsettled_claims_refuse_operators:  # a failed send may have been made: only a dispatcher removes it
            assert store.remove("m-1", fetched_claim(store.fetch_next_due(T0))) is True
        else:
            assert store.remove("m-1") is True
        assert store.increment_failure_count("m-1") is False

    def test_claim_expires_so_a_crashed_dispatcher_loses_nothing(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0))
        assert store.fetch_next_due(T0) is not None
        assert store.fetch_next_due(T0 + secs(self.claim_timeout / 2)) is None
        later = store.fetch_next_due(T0 + secs(self.claim_timeout + 1))
        assert later is not None and later.message_id == "m-1"

    def test_next_due_is_the_earliest_and_follows_removals(self, store: DelayedMessageStore) -> None:
        store.store(msg(2, T0 + secs(20)))
        store.store(msg(1, T0 + secs(10)))
        store.store(msg(3, T0 + secs(30)))
        assert store.next_due() == T0 + secs(10)
        store.remove("m-1")
        assert store.next_due() == T0 + secs(20)

    def test_next_due_skips_past_claimed_messages(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0))
        store.fetch_due(T0, 10)
        nxt = store.next_due()
        assert nxt is not None and nxt > T0

    # -- identity: an id means one message (docs/identity.md) ---------------

    def test_storing_the_same_message_again_is_a_no_op(self, store: DelayedMessageStore) -> None:
        original = msg(1, T0 + secs(10), headers={"a": "1"})
        store.store(original)
        store.store(msg(1, T0 + secs(10), headers={"a": "1"}))
        fetched = store.fetch_due(T0 + secs(10), 10)
        assert fetched == [original]
        store.store(original)  # while claimed: still a no-op, and the claim stands
        assert store.fetch_due(T0 + secs(11), 10) == []
        assert store.remove("m-1", fetched_claim(fetched[0])) is True
        assert store.fetch_due(T0 + secs(10**6), 10) == []

    @pytest.mark.parametrize(
        "change",
        [
            {"body": b"other"},
            {"destination": "elsewhere"},
            {"headers": {"a": "2"}},
            {"due": T0 + secs(11)},
        ],
        ids=["body", "destination", "headers", "due"],
    )
    def test_storing_another_message_under_a_pending_id_is_refused(
        self, store: DelayedMessageStore, change: dict[str, Any]
    ) -> None:
        store.store(msg(1, T0 + secs(10), headers={"a": "1"}))
        kw: dict[str, Any] = {"headers": {"a": "1"}, **change}
        with pytest.raises(MessageIdConflictError, match="m-1"):
            store.store(msg(1, kw.pop("due", T0 + secs(10)), **kw))
        fetched = store.fetch_due(T0 + secs(100), 10)
        assert fetched == [msg(1, T0 + secs(10), headers={"a": "1"})], "the pending message is unchanged"

    def test_an_id_is_free_again_once_its_message_is_gone(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0 + secs(10), body=b"old"))
        assert store.remove("m-1") is True
        store.store(msg(1, T0 + secs(20), body=b"new"))
        assert [m.body for m in store.fetch_due(T0 + secs(20), 10)] == [b"new"]

    # -- claims: settling only acts while the row holds the claim ------------

    def test_remove_with_a_claim_that_expired_and_was_taken_again_does_nothing(
        self, store: DelayedMessageStore
    ) -> None:
        store.store(msg(1, T0))
        first = fetched_claim(store.fetch_next_due(T0))
        second = fetched_claim(store.fetch_next_due(T0 + secs(self.claim_timeout + 1)))
        assert first != second
        assert store.remove("m-1", first) is False, "the first dispatcher's claim is superseded"
        assert store.increment_failure_count("m-1", first) is False
        assert store.remove("m-1", second) is True

    def test_remove_with_a_stale_claim_leaves_the_message_stored_since(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0, body=b"old"))
        stale = fetched_claim(store.fetch_next_due(T0))
        assert store.remove("m-1", fetched_claim(store.fetch_next_due(T0 + secs(self.claim_timeout + 1)))) is True
        store.store(msg(1, T0 + secs(5), body=b"new"))
        assert store.remove("m-1", stale) is False
        assert store.increment_failure_count("m-1", stale) is False
        fetched = store.fetch_due(T0 + secs(10**6), 10)
        assert [(m.body, m.failure_count) for m in fetched] == [(b"new", 0)], "the new message is untouched"

    def test_a_failure_keeps_the_claim_token_for_the_settling_that_follows(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0))
        claim = fetched_claim(store.fetch_next_due(T0))
        assert store.increment_failure_count("m-1", claim) is True
        assert store.remove("m-1", claim) is True  # e.g. moved to the error queue

    def test_remove_many_with_claims_removes_only_rows_still_claimed(self, store: DelayedMessageStore) -> None:
        if not isinstance(store, BatchRemovingStore):
            return  # the store has no batch removal: remove() above covers it
        for i in range(3):
            store.store(msg(i, T0 + secs(i)))
        batch = store.fetch_due(T0 + secs(10), 10)
        again = store.fetch_next_due(T0 + secs(self.claim_timeout + 20))  # m-0's claim expired: taken again
        assert again is not None and again.message_id == "m-0"
        flags = store.remove_many([m.message_id for m in batch], [fetched_claim(m) for m in batch])
        assert list(flags) == [False, True, True]
        assert store.remove("m-0", fetched_claim(again)) is True

    def test_cancel_while_a_dispatcher_holds_the_claim_is_refused_as_in_flight(
        self, store: DelayedMessageStore
    ) -> None:
        now = wall_now()
        store.store(msg(1, now - secs(1)))
        claim = fetched_claim(store.fetch_next_due(now))
        with pytest.raises(MessageInFlightError, match="m-1"):
            store.remove("m-1")
        assert store.remove("m-1", claim) is True, "the message was still there, claimed"

    def test_an_operator_cannot_cancel_or_move_what_the_dispatcher_is_sending(self, store: DelayedMessageStore) -> None:
        now = wall_now()
        store.store(msg(1, now - secs(1)))
        view = self.dispatcher_view(store)
        claim = fetched_claim(view.fetch_next_due(now))
        operator_sees_in_flight(store, "m-1")
        assert view.remove("m-1", claim) is True, "the dispatcher settles what it sent"
        assert store.remove("m-1") is False, "and then there is nothing left to cancel"

    def test_a_message_fetched_ahead_of_its_due_time_is_in_flight_too(self, store: DelayedMessageStore) -> None:
        now = wall_now()  # release control fetches up to a second ahead and holds what it fetched until it is due
        store.store(msg(1, now + secs(0.5)))
        view = self.dispatcher_view(store)
        claim = fetched_claim(view.fetch_next_due(now + secs(1)))
        operator_sees_in_flight(store, "m-1")
        assert view.remove("m-1", claim) is True

    def test_settling_never_removes_a_message_stored_again_after_its_claim_expired(
        self, store: DelayedMessageStore
    ) -> None:
        now = wall_now()
        late = now - secs(self.claim_timeout + 10)  # fetched long ago: its claim has run out on the operator's clock
        store.store(msg(1, late))
        view = self.dispatcher_view(store)
        stale = fetched_claim(view.fetch_next_due(late + secs(1)))
        if self.unsettled_claims_refuse_operators:  # a later dispatcher's claim removes it (operators are refused)
            assert store.remove("m-1", fetched_claim(store.fetch_next_due(now))) is True
        else:
            assert store.remove("m-1") is True, "an expired claim is no longer in flight"
        store.store(msg(1, late))  # the same message again: the same due time, the same row key where keys exist
        if isinstance(view, BatchRemovingStore):
            assert list(view.remove_many(["m-1"], [stale])) == [False]
        assert view.remove("m-1", stale) is False
        assert view.increment_failure_count("m-1", stale) is False
        fetched = store.fetch_due(now, 10)
        assert [(m.message_id, m.failure_count) for m in fetched] == [("m-1", 0)], "the new message is untouched"

    def test_cancel_after_the_claim_expired_removes(self, store: DelayedMessageStore) -> None:
        now = wall_now()
        store.store(msg(1, now - secs(self.claim_timeout + 10)))
        assert store.fetch_next_due(now - secs(self.claim_timeout + 5)) is not None
        if self.unsettled_claims_refuse_operators:  # its send may have been made: never "cancelled"
            with pytest.raises(MessagePlacedError, match="m-1"):
                store.remove("m-1")
            return
        assert store.remove("m-1") is True

    def test_large_binary_body(self, store: DelayedMessageStore) -> None:
        body = bytes(range(256)) * (self.max_body_bytes // 256)
        store.store(msg(1, T0, body=body))
        fetched = store.fetch_next_due(T0)
        assert fetched is not None and fetched.body == body

    def test_empty_body(self, store: DelayedMessageStore) -> None:
        store.store(msg(1, T0, body=b""))
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
            store.store(msg(i, T0 + secs(i % 17)))
        seen: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def worker() -> None:
            start.wait()
            while True:
                batch = store.fetch_due(T0 + secs(100), 5)
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
