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
while another attempt runs raises ``ProcessingInProgressError``. Override ``pass_expiry`` when your fixture can move
its clock instead of sleeping. Add ``ProcessedLogContract`` (and a ``log`` fixture) for a ``ProcessedLog``.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ..errors import TransientError
from ..idempotency import AlreadyDone, Claim, InProgress, ProcessedLog, ProcessingInProgressError

__all__ = ["IdempotencyContract", "Process", "ProcessedLogContract"]

#: ``process(message, fn)``: the subject under test.
Process = Callable[[Any, Callable[[], Any]], Any]


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


class IdempotencyContract:
    """Behaviour every effectively-once processor must show."""

    #: The record expiry the ``process`` fixture configures, in seconds.
    expiry_seconds: float = 1.0

    @pytest.fixture
    def process(self) -> Process:
        """The subject; override."""
        raise NotImplementedError

    def pass_expiry(self) -> None:
        """Let every completed record expire (sleeps; override to move a fake clock)."""
        time.sleep(self.expiry_seconds + 1.1)

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
