"""The effectively-once contract: every way of processing a message at most once must pass these tests.

Use it from your own test module::

    from delayed_delivery.testing.idempotency_contract import IdempotencyContract

    class TestMyConsumerLog(IdempotencyContract):
        expiry_seconds = 1.0             # the expiry your fixture configures

        @pytest.fixture
        def process(self):
            log = MyLog(...)
            return lambda message, fn: once(log, message, fn, expiry=self.expiry_seconds)

``process(message, fn)`` runs ``fn()`` for ``message`` (a message id, or anything with a ``message_id``) at
most once while its record lives and returns the result (the stored one for a duplicate); a duplicate arriving
while another attempt runs raises ``ProcessingInProgressError``. Override ``pass_expiry`` and ``pass_hold`` when your
fixture can move its clock (or the records' times) instead of sleeping, and implement the fault hooks
``fail_completions`` (the store fails or refuses the record of an effect) and ``forget`` (a record vanishes behind
its holder's back). For a ``ProcessedLog`` under ``once``, ``OnceContract`` does the clock part (a manual clock) and
``FaultyLog`` wraps the log to implement ``fail_completions``; add ``ProcessedLogContract`` (and a ``log`` fixture)
for the primitive itself.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from .. import logfields as lf
from ..clock import ManualClock
from ..errors import PermanentError, TransientError
from ..idempotency import (
    AlreadyDone,
    Claim,
    EffectNotRecordedError,
    InProgress,
    ProcessedLog,
    ProcessingInProgressError,
    once,
)

__all__ = ["Fault", "FaultyLog", "IdempotencyContract", "OnceContract", "Process", "ProcessedLogContract"]

#: ``process(message, fn)``: the subject under test.
Process = Callable[[Any, Callable[[], Any]], Any]
#: How ``fail_completions`` makes recording an effect fail: the store is unavailable, or refuses the record.
Fault = Literal["transient", "refused"]


@dataclass(frozen=True, slots=True)
class _Delivered:
    message_id: str


def _key() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


class Effects:
    """Counts effects per key, thread-safe."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def effect(self, key: str, result: Any = None, *, hold: float = 0.0) -> Callable[[], Any]:
        """An effect for ``key`` that counts itself, waits ``hold`` seconds and returns ``result``."""

        def run() -> Any:
            with self._lock:
                self.counts[key] += 1
            if hold:
                time.sleep(hold)
            return result

        return run


class FaultyLog:
    """A ``ProcessedLog`` whose next completions fail as told (``fail``), for ``fail_completions``."""

    def __init__(self, log: ProcessedLog) -> None:
        self.log = log
        self.failures = 0
        self.fault: Fault = "transient"
        self._lock = threading.Lock()

    @property
    def max_result_chars(self) -> int | None:
        """The wrapped log's limit."""
        return self.log.max_result_chars

    def fail(self, times: int, fault: Fault) -> None:
        """Make the next ``times`` calls of ``complete`` raise as ``fault`` says."""
        with self._lock:
            self.failures, self.fault = times, fault

    def begin(self, key: str, *, now: datetime, in_progress_until: datetime) -> Claim | AlreadyDone | InProgress:
        """The wrapped log's ``begin``."""
        return self.log.begin(key, now=now, in_progress_until=in_progress_until)

    def complete(self, claim: Claim, result: str | None, *, expires_at: datetime) -> bool:
        """Fail while failures are due, else the wrapped log's ``complete``."""
        with self._lock:
            failing, self.failures = self.failures > 0, max(0, self.failures - 1)
        if failing and self.fault == "transient":
            raise TransientError("the store is unavailable (injected)")
        if failing:
            raise PermanentError("the store refused the record (injected)")
        return self.log.complete(claim, result, expires_at=expires_at)

    def release(self, claim: Claim) -> None:
        """The wrapped log's ``release``."""
        self.log.release(claim)


def _logged(caplog: pytest.LogCaptureFixture, event: str, key: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, lf.EVENT, None) == event and getattr(r, lf.MESSAGE_ID, "") == key]


class IdempotencyContract:
    """Behaviour every effectively-once processor must show."""

    #: The record expiry the ``process`` fixture configures, in seconds.
    expiry_seconds: float = 1.0
    #: How long the ``process`` fixture's attempts hold an id, in seconds.
    in_progress_seconds: float = 60.0
    #: A result this many characters long (as JSON) is more than the store holds.
    oversized_result_chars: int = 40_000

    @pytest.fixture
    def process(self) -> Process:
        """The subject; override."""
        raise NotImplementedError

    def pass_expiry(self) -> None:
        """Let every completed record expire (sleeps; override to move a fake clock)."""
        time.sleep(self.expiry_seconds + 1.1)

    def pass_hold(self) -> None:
        """Let every in-progress hold end, completed records staying live (sleeps; override to move a fake clock)."""
        time.sleep(self.in_progress_seconds + 1.1)

    def fail_completions(self, times: int, fault: Fault) -> None:
        """Make the next ``times`` attempts to record an effect as done fail as ``fault`` says; override."""
        raise NotImplementedError(f"{type(self).__name__} must implement fail_completions to run this case")

    def forget(self, key: str) -> None:
        """Delete ``key``'s record behind its holder's back, as a clean-up job would; override."""
        raise NotImplementedError(f"{type(self).__name__} must implement forget to run this case")

    def test_first_delivery_performs_the_effect(self, process: Process) -> None:
        effects, key = Effects(), _key()
        assert process(key, effects.effect(key, {"charged": 17})) == {"charged": 17}
        assert effects.counts[key] == 1

    def test_duplicate_returns_the_stored_result_without_the_effect(self, process: Process) -> None:
        effects, key = Effects(), _key()
        process(key, effects.effect(key, {"charged": 17, "ids": ["a", "b"]}))
        assert process(key, effects.effect(key, {"charged": 99})) == {"charged": 17, "ids": ["a", "b"]}
        assert process(key, effects.effect(key)) == {"charged": 17, "ids": ["a", "b"]}
        assert effects.counts[key] == 1

    def test_duplicate_of_an_effect_without_result_returns_none(self, process: Process) -> None:
        effects, key = Effects(), _key()
        assert process(key, effects.effect(key)) is None
        assert process(key, effects.effect(key, "other")) is None
        assert effects.counts[key] == 1

    def test_a_delivered_message_is_keyed_by_its_message_id(self, process: Process) -> None:
        effects, key = Effects(), _key()
        process(_Delivered(key), effects.effect(key, 1))
        assert process(key, effects.effect(key, 2)) == 1
        assert effects.counts[key] == 1

    def test_a_failed_effect_releases_the_id_and_a_retry_performs_it(self, process: Process) -> None:
        effects, key = Effects(), _key()

        def failing() -> Any:
            effects.effect(key)()
            raise RuntimeError("downstream refused")

        with pytest.raises(RuntimeError, match="downstream refused"):
            process(key, failing)
        assert process(key, effects.effect(key, "second")) == "second"
        assert process(key, effects.effect(key, "third")) == "second"
        assert effects.counts[key] == 2

    def test_expiry_lets_the_message_be_processed_again(self, process: Process) -> None:
        effects, key = Effects(), _key()
        process(key, effects.effect(key, "first"))
        self.pass_expiry()
        assert process(key, effects.effect(key, "again")) == "again"
        assert effects.counts[key] == 2

    def test_a_duplicate_during_the_effect_is_told_to_retry_later(self, process: Process) -> None:
        effects, key = Effects(), _key()
        started, finish = threading.Event(), threading.Event()
        results: list[Any] = []

        def slow() -> Any:
            effects.effect(key)()
            started.set()
            assert finish.wait(30)
            return "done"

        first = threading.Thread(target=lambda: results.append(process(key, slow)))
        first.start()
        assert started.wait(30)
        with pytest.raises(ProcessingInProgressError) as caught:
            process(key, effects.effect(key, "duplicate"))
        assert isinstance(caught.value, TransientError) and caught.value.retryable
        finish.set()
        first.join(30)
        assert results == ["done"]
        assert process(key, effects.effect(key, "late duplicate")) == "done"
        assert effects.counts[key] == 1

    def test_two_threads_racing_on_one_id_perform_one_effect(self, process: Process) -> None:
        effects, key = Effects(), _key()
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def deliver() -> None:
            barrier.wait(30)
            try:
                outcomes.append(str(process(key, effects.effect(key, "done", hold=0.3))))
            except ProcessingInProgressError:
                outcomes.append("in progress")

        threads = [threading.Thread(target=deliver) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert effects.counts[key] == 1
        assert sorted(outcomes) in (["done", "done"], ["done", "in progress"])

    def test_different_ids_are_independent(self, process: Process) -> None:
        effects, a, b = Effects(), _key(), _key()
        assert process(a, effects.effect(a, "a")) == "a"
        assert process(b, effects.effect(b, "b")) == "b"
        assert process(a, effects.effect(a, "a2")) == "a"
        assert effects.counts == Counter({a: 1, b: 1})

    def test_many_consumers_fed_duplicates_perform_each_effect_once(self, process: Process) -> None:
        effects, keys = Effects(), [_key() for _ in range(12)]
        rng = random.Random(5)
        streams = [rng.sample(keys * 2, len(keys) * 2) for _ in range(4)]  # every id twice per consumer

        def consume(stream: list[str]) -> None:
            for key in stream:
                for _ in range(200):  # the queue redelivers what was in progress
                    try:
                        process(key, effects.effect(key, key, hold=0.01))
                        break
                    except ProcessingInProgressError:
                        time.sleep(0.02)

        threads = [threading.Thread(target=consume, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert effects.counts == Counter(dict.fromkeys(keys, 1))

    def test_a_result_that_cannot_be_stored_is_recorded_done_without_it(
        self, process: Process, caplog: pytest.LogCaptureFixture
    ) -> None:
        effects, key = Effects(), _key()
        unstorable = {"at": datetime(2030, 1, 1, tzinfo=UTC)}
        with caplog.at_level(logging.WARNING, logger="delayed_delivery.consumer"):
            assert process(key, effects.effect(key, unstorable)) == unstorable  # the effect's own result
        (why,) = _logged(caplog, lf.EVENT_RESULT_NOT_STORED, key)
        assert "not JSON-serialisable" in getattr(why, lf.REASON)
        assert process(key, effects.effect(key, "again")) is None
        assert process(key, effects.effect(key, "and again")) is None
        assert effects.counts[key] == 1

    def test_an_oversized_result_is_recorded_done_without_it(
        self, process: Process, caplog: pytest.LogCaptureFixture
    ) -> None:
        effects, key = Effects(), _key()
        big = "r" * self.oversized_result_chars
        with caplog.at_level(logging.WARNING, logger="delayed_delivery.consumer"):
            assert process(key, effects.effect(key, big)) == big
        assert _logged(caplog, lf.EVENT_RESULT_NOT_STORED, key)
        assert process(key, effects.effect(key, "again")) is None
        assert effects.counts[key] == 1

    def test_a_failing_record_is_tried_again_until_it_holds(self, process: Process) -> None:
        effects, key = Effects(), _key()
        self.fail_completions(2, "transient")
        assert process(key, effects.effect(key, {"charged": 3})) == {"charged": 3}
        assert process(key, effects.effect(key, "again")) == {"charged": 3}
        assert effects.counts[key] == 1

    def test_a_record_that_stays_impossible_is_a_clear_error_and_the_id_stays_held(self, process: Process) -> None:
        effects, key = Effects(), _key()
        self.fail_completions(1_000, "transient")
        with pytest.raises(EffectNotRecordedError) as caught:
            process(key, effects.effect(key, "done"))
        assert not caught.value.retryable and key in str(caught.value) and "effect ran" in str(caught.value)
        with pytest.raises(ProcessingInProgressError):
            process(key, effects.effect(key, "duplicate"))
        assert effects.counts[key] == 1

    def test_a_refused_record_is_written_without_the_result(
        self, process: Process, caplog: pytest.LogCaptureFixture
    ) -> None:
        effects, key = Effects(), _key()
        self.fail_completions(1, "refused")
        with caplog.at_level(logging.WARNING, logger="delayed_delivery.consumer"):
            assert process(key, effects.effect(key, {"n": 1})) == {"n": 1}
        assert _logged(caplog, lf.EVENT_RESULT_NOT_STORED, key)
        assert process(key, effects.effect(key, "again")) is None
        assert effects.counts[key] == 1

    def test_a_record_lost_during_the_effect_is_written_again(self, process: Process) -> None:
        effects, key = Effects(), _key()

        def effect() -> str:
            effects.effect(key)()
            self.forget(key)  # ``complete`` finds no record of its claim: it reports the claim lost
            return "done"

        assert process(key, effect) == "done"
        assert process(key, effects.effect(key, "again")) == "done"
        assert effects.counts[key] == 1

    def test_an_effect_that_outlasts_its_hold_is_still_recorded(self, process: Process) -> None:
        effects, key = Effects(), _key()

        def slow() -> str:
            effects.effect(key)()
            self.pass_hold()
            return "slow"

        assert process(key, slow) == "slow"
        assert process(key, effects.effect(key, "again")) == "slow"
        assert effects.counts[key] == 1

    def test_a_duplicate_taking_over_an_ended_hold_runs_the_effect_once_more_and_no_more(
        self, process: Process
    ) -> None:
        effects, key = Effects(), _key()
        inner: list[Any] = []

        def slow() -> str:
            effects.effect(key)()
            self.pass_hold()
            inner.append(process(key, effects.effect(key, "second")))  # a duplicate once the hold ended
            return "first"

        assert process(key, slow) == "first"  # its record was taken over: it says so in the log, never raises
        assert inner == ["second"]
        assert process(key, effects.effect(key, "third")) in ("first", "second")
        assert effects.counts[key] == 2  # a hold shorter than the effect lets one duplicate in (documented)


class OnceContract(IdempotencyContract):
    """The contract for ``once`` over a ``ProcessedLog`` on a manual clock: records expire and holds end when the test
    moves it, never because the machine was slow. Give a ``processed_log`` fixture, ``fail_completions`` and
    ``forget``."""

    expiry_seconds = 3600.0

    @pytest.fixture
    def processed_log(self) -> ProcessedLog:
        """The log under test; override."""
        raise NotImplementedError

    @pytest.fixture
    def process(self, processed_log: ProcessedLog) -> Process:
        """``once`` over ``processed_log`` with this contract's expiry, hold and manual clock."""
        self.clock = ManualClock()
        return lambda message, fn: once(
            processed_log,
            message,
            fn,
            expiry=self.expiry_seconds,
            in_progress_timeout=self.in_progress_seconds,
            clock=self.clock,
        )

    def pass_expiry(self) -> None:
        """Move the clock past every completed record's expiry."""
        self.clock.advance(self.expiry_seconds + 1)

    def pass_hold(self) -> None:
        """Move the clock past every hold (completed records live on: their expiry is longer)."""
        self.clock.advance(self.in_progress_seconds + 1)


T0 = datetime(2030, 1, 1, tzinfo=UTC)


class ProcessedLogContract:
    """Behaviour of the ``ProcessedLog`` primitive under ``once``: claims, holds, take-overs, stale claims."""

    @pytest.fixture
    def log(self) -> ProcessedLog:
        """The subject; override."""
        raise NotImplementedError

    def test_a_new_key_is_claimed_and_a_second_begin_sees_it_held(self, log: ProcessedLog) -> None:
        key = _key()
        claim = log.begin(key, now=T0, in_progress_until=T0 + timedelta(seconds=30))
        assert isinstance(claim, Claim) and claim.key == key
        held = log.begin(key, now=T0 + timedelta(seconds=1), in_progress_until=T0 + timedelta(seconds=31))
        assert isinstance(held, InProgress)
        assert held.until == T0 + timedelta(seconds=30)

    def test_a_completed_key_is_done_until_it_expires(self, log: ProcessedLog) -> None:
        key = _key()
        claim = log.begin(key, now=T0, in_progress_until=T0 + timedelta(seconds=30))
        assert isinstance(claim, Claim)
        assert log.complete(claim, '{"n": 1}', expires_at=T0 + timedelta(hours=1))
        done = log.begin(key, now=T0 + timedelta(minutes=59), in_progress_until=T0 + timedelta(hours=2))
        assert done == AlreadyDone(key, '{"n": 1}')
        again = log.begin(key, now=T0 + timedelta(hours=1, seconds=1), in_progress_until=T0 + timedelta(hours=2))
        assert isinstance(again, Claim)

    def test_a_hold_that_ended_is_taken_over_and_the_old_claim_is_stale(self, log: ProcessedLog) -> None:
        key = _key()
        crashed = log.begin(key, now=T0, in_progress_until=T0 + timedelta(seconds=30))
        taken = log.begin(key, now=T0 + timedelta(seconds=31), in_progress_until=T0 + timedelta(seconds=61))
        assert isinstance(crashed, Claim) and isinstance(taken, Claim) and taken != crashed
        assert not log.complete(crashed, '"old"', expires_at=T0 + timedelta(hours=1))
        log.release(crashed)  # a stale release leaves the new holder alone
        assert isinstance(log.begin(key, now=T0 + timedelta(seconds=32), in_progress_until=T0), InProgress)
        assert log.complete(taken, '"new"', expires_at=T0 + timedelta(hours=1))
        assert log.begin(key, now=T0 + timedelta(seconds=40), in_progress_until=T0) == AlreadyDone(key, '"new"')

    def test_a_released_key_is_claimed_again(self, log: ProcessedLog) -> None:
        key = _key()
        claim = log.begin(key, now=T0, in_progress_until=T0 + timedelta(seconds=30))
        assert isinstance(claim, Claim)
        log.release(claim)
        again = log.begin(key, now=T0 + timedelta(seconds=1), in_progress_until=T0 + timedelta(seconds=60))
        assert isinstance(again, Claim)

    def test_keys_with_reserved_characters_stay_distinct(self, log: ProcessedLog) -> None:
        keys = ["a/b", "a\\b", "a#b", "a?b", "a%2Fb", "a b", "ü\u00e9", "a\tb"]
        for k in keys:
            claim = log.begin(k, now=T0, in_progress_until=T0 + timedelta(seconds=30))
            assert isinstance(claim, Claim), k
            assert log.complete(claim, f'"{keys.index(k)}"', expires_at=T0 + timedelta(hours=1))
        for k in keys:
            assert log.begin(k, now=T0, in_progress_until=T0) == AlreadyDone(k, f'"{keys.index(k)}"')
