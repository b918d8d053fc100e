"""The effectively-once contract over ``once`` and the in-memory processed log."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pytest

from delayed_delivery import logfields as lf
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError, InvalidMessageError, PermanentError, TransientError
from delayed_delivery.idempotency import (
    AlreadyDone,
    Claim,
    EffectNotRecordedError,
    InMemoryProcessedLog,
    InProgress,
    ProcessingInProgressError,
    RecordRetry,
    once,
)
from delayed_delivery.testing.idempotency_contract import (
    Fault,
    FaultyLog,
    OnceContract,
    ProcessedLogContract,
)


class TestInMemoryOnce(OnceContract):
    oversized_result_chars = 2_000

    @pytest.fixture
    def processed_log(self) -> FaultyLog:
        self.memory = InMemoryProcessedLog(max_result_chars=1_000)
        self.log = FaultyLog(self.memory)
        return self.log

    def fail_completions(self, times: int, fault: Fault) -> None:
        self.log.fail(times, fault)

    def forget(self, key: str) -> None:
        self.memory._records.pop(key)


class TestInMemoryProcessedLog(ProcessedLogContract):
    @pytest.fixture
    def log(self) -> InMemoryProcessedLog:
        return InMemoryProcessedLog()


def test_a_crashed_attempt_holds_the_id_until_its_hold_ends() -> None:
    log, clock, effects = InMemoryProcessedLog(), ManualClock(), []
    crashed = once_claim(log, clock, hold=10)  # the attempt died without completing or releasing
    assert crashed
    clock.advance(5)
    with pytest.raises(ProcessingInProgressError):
        once(log, "m-1", lambda: effects.append(1), clock=clock)
    clock.advance(6)
    assert once(log, "m-1", lambda: effects.append(1), clock=clock) is None
    assert effects == [1]


def once_claim(log: InMemoryProcessedLog, clock: ManualClock, hold: float) -> bool:
    """Begin ``m-1`` and walk away, as a consumer that crashed mid-effect."""
    return isinstance(log.begin("m-1", now=clock.now(), in_progress_until=clock.now() + timedelta(seconds=hold)), Claim)


def test_a_result_that_is_not_json_is_recorded_done_without_it_and_never_repeated() -> None:
    log, effects, marker = InMemoryProcessedLog(), [], object()

    def effect() -> Any:
        effects.append(1)
        return marker

    assert once(log, "m-1", effect) is marker  # before #23: ConfigurationError after the effect
    assert once(log, "m-1", effect) is None
    assert effects == [1]


class _Scripted:
    """A ``ProcessedLog`` whose ``complete`` answers and later ``begin`` states are scripted."""

    max_result_chars = None

    def __init__(self, completes: list[bool | Exception], begins: list[Claim | AlreadyDone | InProgress]) -> None:
        self.completes, self.begins = completes, begins
        self.completed: list[str | None] = []

    def begin(self, key: str, *, now: datetime, in_progress_until: datetime) -> Claim | AlreadyDone | InProgress:
        return self.begins.pop(0) if self.begins else Claim(key, "t0")

    def complete(self, claim: Claim, result: str | None, *, expires_at: datetime) -> bool:
        self.completed.append(result)
        answer = self.completes.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def release(self, claim: Claim) -> None:
        raise AssertionError("the effect succeeded: nothing to release")


def test_complete_returning_false_is_not_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """Before #23 ``once`` returned as if recorded; now it looks again and claims the free id to record it."""
    log = _Scripted([False, True], [Claim("m-1", "t0"), Claim("m-1", "t1")])
    assert once(log, "m-1", lambda: "r", clock=ManualClock()) == "r"
    assert log.completed == ['"r"', '"r"']
    taken = _Scripted([False], [Claim("m-1", "t0"), InProgress("m-1", None)])
    with caplog.at_level(logging.WARNING, logger="delayed_delivery.consumer"):
        assert once(taken, "m-1", lambda: "r", clock=ManualClock()) == "r"
    assert [getattr(r, lf.EVENT) for r in caplog.records] == [lf.EVENT_HOLD_ENDED]


def test_a_claim_lost_every_time_ends_in_a_clear_error() -> None:
    log = _Scripted([False] * 3, [Claim("m-1", "t0")])
    with pytest.raises(EffectNotRecordedError, match="3 times") as caught:
        once(log, "m-1", lambda: "r", clock=ManualClock(), retry=RecordRetry(attempts=3))
    assert not caught.value.retryable


def test_a_failing_record_backs_off_on_the_injected_clock() -> None:
    clock = ManualClock()
    log = _Scripted([TransientError("down"), TransientError("down"), TransientError("down"), True], [])
    assert once(log, "m-1", lambda: 1, clock=clock, retry=RecordRetry(attempts=4, first_delay=0.5)) == 1
    assert clock.slept == [0.5, 1.0, 2.0]
    capped = _Scripted([TransientError("down")] * 4, [])
    with pytest.raises(EffectNotRecordedError, match="down"):
        once(capped, "m-2", lambda: 1, clock=clock, retry=RecordRetry(attempts=4, first_delay=2, max_delay=3))
    assert clock.slept[3:] == [2.0, 3.0, 3.0, 3.0]


def test_a_record_refused_with_and_without_its_result_is_a_clear_error() -> None:
    log = _Scripted([PermanentError("too big"), PermanentError("table gone")], [])
    with pytest.raises(EffectNotRecordedError, match="table gone"):
        once(log, "m-1", lambda: {"n": 1}, clock=ManualClock())
    assert log.completed == ['{"n": 1}', None]


def test_an_unreadable_stored_result_reads_as_none() -> None:
    log = _Scripted([], [AlreadyDone("m-1", "{not json")])
    assert once(log, "m-1", lambda: 1 / 0) is None


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"attempts": True}, {"first_delay": -1}, {"max_delay": "1"}])
def test_record_retry_is_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="RecordRetry"):
        RecordRetry(**bad)


@pytest.mark.parametrize("bad", ["", "x" * 513])
def test_an_empty_or_too_long_id_is_refused(bad: str) -> None:
    with pytest.raises(InvalidMessageError):
        once(InMemoryProcessedLog(), bad, lambda: None)


def test_expiry_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="expiry"):
        once(InMemoryProcessedLog(), "m-1", lambda: None, expiry=0)
