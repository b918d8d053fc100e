"""The release schedule contract: every ``ports.ReleaseSchedule`` must pass these tests.

Use it from your own test module::

    from delayed_delivery.testing.release_contract import ReleaseScheduleContract

    class TestMySchedule(ReleaseScheduleContract):
        granularity = 1.0  # a whole-second calendar; 0.0 for one that spaces slots exactly

        @pytest.fixture
        def open_schedule(self):
            backend = make_backend()
            return lambda rates: MySchedule(backend, rates)

``open_schedule(rates)`` opens a schedule over one backend per test; every call is a new handle on the same backend,
as a restarted (or a second) dispatcher would open it. The promises: at most ``rate * (w + granularity) + 1`` slots
of a destination in any window of ``w`` seconds, across handles and threads; slots follow due order within a
booking; no slot before its message is due; and a booking never used (its caller crashed) delays later bookings by at
most the slots it took.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Sequence

import pytest

from ..ports import ReleaseSchedule
from ..release import ReleaseRates

__all__ = ["NOW", "OpenSchedule", "Race", "ReleaseScheduleContract", "most_in_a_window"]

#: A whole epoch second (2030-01-01T00:00:00Z) plus a fraction, so whole-second calendars see a phase.
NOW = 1_893_456_000.25
#: Float and storage rounding allowed (timestamps kept to the microsecond).
EPS = 1e-5

OpenSchedule = Callable[[ReleaseRates], ReleaseSchedule]
#: Runs each caller with a schedule handle of its own (opened with the rates given), all at once.
Race = Callable[[ReleaseRates, Sequence[Callable[[ReleaseSchedule], None]]], None]


def most_in_a_window(slots: Sequence[float], seconds: float) -> int:
    """The most of ``slots`` inside any half-open window ``[t, t + seconds)`` (shrunk by ``EPS`` for rounding)."""
    ordered = sorted(slots)
    return max(
        (bisect.bisect_left(ordered, start + seconds - EPS, lo=i) - i for i, start in enumerate(ordered)), default=0
    )


def _placed(slots: Sequence[float | None]) -> list[float]:
    assert all(s is not None for s in slots), f"a slot within reach was refused: {slots}"
    return [s for s in slots if s is not None]


class ReleaseScheduleContract:
    """Behaviour every release schedule shares; subclasses provide ``open_schedule`` (module docstring)."""

    #: How far a slot may sit from its exact place at the rate (seconds): 0.0 exact, 1.0 a whole-second calendar.
    granularity: float = 0.0

    @pytest.fixture
    def open_schedule(self) -> OpenSchedule:
        raise NotImplementedError("define an `open_schedule` fixture: rates -> a new handle on one fresh backend")

    @pytest.fixture
    def race(self, open_schedule: OpenSchedule) -> Race:
        """Each caller in a thread of its own. Override where an emulator does not apply each request atomically as
        the service does (moto's DynamoDB ``UpdateItem ADD``): run whole requests interleaved there instead."""

        def run(rates: ReleaseRates, callers: Sequence[Callable[[ReleaseSchedule], None]]) -> None:
            errors: list[BaseException] = []

            def call(caller: Callable[[ReleaseSchedule], None], schedule: ReleaseSchedule) -> None:
                try:
                    caller(schedule)
                except BaseException as exc:  # reported below, not lost in the thread
                    errors.append(exc)

            threads = [threading.Thread(target=call, args=(c, open_schedule(rates))) for c in callers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors, errors

        return run

    def _check_cap(self, slots: Sequence[float], rate: float) -> None:
        for seconds in (1.0, 2.5, 5.0):
            most = most_in_a_window(slots, seconds)
            assert most <= rate * (seconds + self.granularity) + 1, f"{most} slots within {seconds} s at {rate}/s"

    # -- the promises ----------------------------------------------------------

    def test_a_burst_is_spread_at_the_cap(self, open_schedule: OpenSchedule) -> None:
        schedule = open_schedule(ReleaseRates.of({"orders": 20}))
        slots = _placed(schedule.reserve("orders", [NOW] * 100, NOW))
        self._check_cap(slots, 20)
        assert max(slots) <= NOW + 100 / 20 + self.granularity + EPS, "no slot later than the cap makes it"

    def test_the_cap_holds_across_bookings_and_handles(self, open_schedule: OpenSchedule) -> None:
        rates = ReleaseRates.of({"orders": 10})
        first, second = open_schedule(rates), open_schedule(rates)
        slots: list[float] = []
        for n in range(6):
            schedule = first if n % 2 else second
            slots += _placed(schedule.reserve("orders", [NOW + n * 0.5] * 15, NOW + n * 0.5))
        self._check_cap(slots, 10)

    def test_the_cap_holds_when_bookings_race(self, race: Race) -> None:
        slots: list[float] = []
        lock = threading.Lock()

        def book(schedule: ReleaseSchedule) -> None:
            for _ in range(4):
                got = _placed(schedule.reserve("orders", [NOW] * 10, NOW))
                with lock:
                    slots.extend(got)

        race(ReleaseRates.of({"orders": 25}), [book] * 3)
        assert len(slots) == 120
        self._check_cap(slots, 25)

    def test_due_order_is_kept_within_a_booking(self, open_schedule: OpenSchedule) -> None:
        schedule = open_schedule(ReleaseRates.of({"orders": 4}))
        dues = [NOW + (7 * i % 13) * 0.3 for i in range(40)]  # shuffled, with ties
        slots = _placed(schedule.reserve("orders", dues, NOW))
        by_due = [slot for _, slot in sorted(zip(dues, slots, strict=True), key=lambda p: p[0])]
        assert all(a <= b + EPS for a, b in itertools.pairwise(by_due)), "an earlier due left later"

    def test_never_before_due(self, open_schedule: OpenSchedule) -> None:
        schedule = open_schedule(ReleaseRates.of({"orders": 5, "free": None}))
        dues = [NOW - 3.0, NOW, NOW + 0.4, NOW + 2.7, NOW + 2.7, NOW + 9.9] * 3
        for destination in ("orders", "free"):
            slots = _placed(schedule.reserve(destination, dues, NOW))
            for due, slot in zip(dues, slots, strict=True):
                assert slot >= due - EPS, f"{destination}: slot {slot - NOW:+.3f} s before due {due - NOW:+.3f} s"

    def test_an_uncapped_destination_goes_when_due(self, open_schedule: OpenSchedule) -> None:
        schedule = open_schedule(ReleaseRates.of({"orders": 1, "free": None}))
        schedule.reserve("orders", [NOW] * 30, NOW)  # a capped neighbour's backlog is not its business
        dues = [NOW + i * 0.1 for i in range(50)]
        slots = _placed(schedule.reserve("free", dues, NOW))
        assert all(slot <= due + self.granularity + EPS for due, slot in zip(dues, slots, strict=True))

    def test_destinations_do_not_share_a_cap(self, open_schedule: OpenSchedule) -> None:
        schedule = open_schedule(ReleaseRates.of({"*": 10}))
        schedule.reserve("orders", [NOW] * 50, NOW)
        slots = _placed(schedule.reserve("billing", [NOW] * 10, NOW))
        assert max(slots) <= NOW + 1 + self.granularity + EPS

    def test_a_crash_leaks_at_most_the_slots_it_took(self, open_schedule: OpenSchedule) -> None:
        rates = ReleaseRates.of({"orders": 10})
        crashed = open_schedule(rates)
        taken = _placed(crashed.reserve("orders", [NOW] * 30, NOW))  # booked, never sent: the caller died
        del crashed
        successor = open_schedule(rates)  # a restart, or the next holder
        slots = _placed(successor.reserve("orders", [NOW + 0.5] * 20, NOW + 0.5))
        self._check_cap(taken + slots, 10)  # the dead booking's slots are not handed out again...
        # ...and cost no more than themselves: the 20 go right after the 30
        assert max(slots) <= NOW + (30 + 20) / 10 + self.granularity + EPS
