"""The store contract for the port's optional capabilities: ``reschedule`` and ``defer`` (release control).

Add ``ReschedulableStoreContract`` when your store implements ``reschedule`` and ``DeferringStoreContract`` when it
implements ``defer``, beside ``StoreContract`` (``store_contract.py``, which also exports both).
"""

from __future__ import annotations

from typing import Any

import pytest

from ..errors import MessageInFlightError
from ..ports import BatchRemovingStore, DeferringStore, ReschedulableStore, slot_of
from .store_contract_tools import T0, fetched_claim, msg, secs, wall_now

__all__ = ["DeferringStoreContract", "ReschedulableStoreContract"]


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
        store.store(msg(1, T0))
        claim = fetched_claim(store.fetch_next_due(T0))
        assert store.reschedule("m-1", T0 + secs(30), claim) is True
        assert store.fetch_next_due(T0 + secs(29)) is None
        assert store.next_due() == T0 + secs(30)
        assert store.fetch_next_due(T0 + secs(30)) is not None
        assert store.reschedule("missing", T0) is False

    def test_reschedule_of_an_unclaimed_message_moves_it(self, store: Any) -> None:
        store.store(msg(1, T0))
        assert store.reschedule("m-1", T0 + secs(30)) is True
        assert store.fetch_next_due(T0 + secs(29)) is None
        assert store.fetch_next_due(T0 + secs(30)) is not None

    def test_reschedule_while_a_dispatcher_holds_the_claim_is_refused_as_in_flight(self, store: Any) -> None:
        now = wall_now()
        store.store(msg(1, now - secs(1)))
        claim = fetched_claim(store.fetch_next_due(now))
        with pytest.raises(MessageInFlightError, match="m-1"):
            store.reschedule("m-1", now + secs(3600))
        assert store.remove("m-1", claim) is True, "the dispatcher's removal still works: nothing moved"

    def test_settling_never_removes_a_message_rescheduled_after_its_claim_expired(self, store: Any) -> None:
        now = wall_now()
        late = now - secs(self.claim_timeout + 10)
        store.store(msg(1, late))
        view = self.dispatcher_view(store)
        stale = fetched_claim(view.fetch_next_due(late + secs(1)))
        if self.unsettled_claims_refuse_operators:  # a later dispatcher's claim moves it (operators are refused)
            assert store.reschedule("m-1", now + secs(3600), fetched_claim(store.fetch_next_due(now))) is True
        else:
            assert store.reschedule("m-1", now + secs(3600)) is True, "an expired claim is no longer in flight"
        if isinstance(view, BatchRemovingStore):
            assert list(view.remove_many(["m-1"], [stale])) == [False]
        assert view.remove("m-1", stale) is False
        assert view.reschedule("m-1", now + secs(5), stale) is False
        assert store.fetch_due(now + secs(3599), 10) == []
        moved = store.fetch_due(now + secs(3600), 10)
        assert [(m.message_id, m.due_at) for m in moved] == [("m-1", now + secs(3600))], "moved once, never removed"

    def dispatcher_view(self, store: Any) -> Any:
        """What the dispatcher fetches and settles through (default: the store itself)."""
        return store

    def test_reschedule_with_a_superseded_claim_does_nothing(self, store: Any) -> None:
        store.store(msg(1, T0))
        first = fetched_claim(store.fetch_next_due(T0))
        second = fetched_claim(store.fetch_next_due(T0 + secs(self.claim_timeout + 1)))
        assert store.reschedule("m-1", T0 + secs(10**5), first) is False
        assert store.reschedule("m-1", T0 + secs(500), second) is True
        assert store.next_due() == T0 + secs(500)


class DeferringStoreContract:
    """Extra behaviour for stores implementing ``defer`` (release control keeps a row back until its slot)."""

    #: The claim timeout (seconds) the ``store`` fixture configures.
    claim_timeout: float = 60.0

    @pytest.fixture
    def store(self) -> DeferringStore:
        raise NotImplementedError

    def test_a_deferred_row_keeps_its_due_time_and_comes_back_at_its_slot_naming_it(self, store: Any) -> None:
        store.store(msg(1, T0))
        claim = fetched_claim(store.fetch_next_due(T0))
        assert list(store.defer([("m-1", T0 + secs(30), claim)])) == [True]
        assert store.fetch_next_due(T0 + secs(29)) is None
        assert store.next_due() == T0 + secs(30)
        back = store.fetch_next_due(T0 + secs(30))
        assert back is not None and back.due_at == T0, "the due time is unchanged"
        assert slot_of(back) == T0 + secs(30)
        assert store.remove("m-1", fetched_claim(back)) is True

    def test_a_row_that_was_not_deferred_names_no_slot(self, store: Any) -> None:
        store.store(msg(1, T0))
        first = store.fetch_next_due(T0)
        assert first is not None and slot_of(first) is None
        assert store.increment_failure_count("m-1", fetched_claim(first)) is True
        again = store.fetch_next_due(T0 + secs(1))
        assert again is not None and slot_of(again) is None
        expired = store.fetch_next_due(T0 + secs(self.claim_timeout + 2))
        assert expired is not None and slot_of(expired) is None, "an expired claim is no slot"

    def test_defer_needs_the_claim(self, store: Any) -> None:
        store.store(msg(1, T0))
        claim = fetched_claim(store.fetch_next_due(T0))
        assert list(store.defer([("m-1", T0 + secs(30), "not-the-claim"), ("gone", T0, claim)])) == [False, False]
        assert store.remove("m-1", claim) is True, "the fetch's claim still holds the row"

    def test_deferred_rows_come_back_in_due_order_and_can_be_cancelled(self, store: Any) -> None:
        for i, due in ((1, T0 + secs(2)), (2, T0), (3, T0 + secs(1))):
            store.store(msg(i, due))
        batch = store.fetch_due(T0 + secs(2), 10)
        assert [m.message_id for m in batch] == ["m-2", "m-3", "m-1"]
        store.defer([(m.message_id, T0 + secs(50 + n), fetched_claim(m)) for n, m in enumerate(batch)])
        assert store.remove("m-1") is True, "a deferred row is not in flight: an operator may cancel it"
        back = store.fetch_due(T0 + secs(60), 10)
        assert [m.message_id for m in back] == ["m-2", "m-3"]
        assert [slot_of(m) for m in back] == [T0 + secs(50), T0 + secs(51)]

    def test_the_release_backlog_counts_deferred_rows_per_destination(self, store: Any) -> None:
        for i in range(3):
            store.store(msg(i, T0))
        store.store(msg("x", T0, destination="invoices"))
        batch = store.fetch_due(T0, 10)
        deferred = [m for m in batch if m.destination == "orders"]
        store.defer([(m.message_id, T0 + secs(10 + n), fetched_claim(m)) for n, m in enumerate(deferred)])
        assert dict(store.release_backlog()) == {"orders": (3, T0 + secs(12))}
        store.fetch_due(T0 + secs(11), 10)
        assert dict(store.release_backlog()) == {"orders": (1, T0 + secs(12))}, "claimed again: no longer deferred"
