"""The effectively-once contract over ``once`` and the in-memory processed log."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError, InvalidMessageError
from delayed_delivery.idempotency import Claim, InMemoryProcessedLog, ProcessingInProgressError, once
from delayed_delivery.testing.idempotency_contract import IdempotencyContract, Process, ProcessedLogContract


class TestInMemoryOnce(IdempotencyContract):
    expiry_seconds = 30.0

    @pytest.fixture
    def process(self) -> Process:
        log, self.clock = InMemoryProcessedLog(), ManualClock()
        return lambda message, fn: once(log, message, fn, expiry=self.expiry_seconds, clock=self.clock)

    def pass_expiry(self) -> None:
        self.clock.advance(self.expiry_seconds + 1)


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


def test_a_result_that_is_not_json_is_refused_but_never_repeated() -> None:
    log, effects = InMemoryProcessedLog(), []

    def effect() -> Any:
        effects.append(1)
        return object()

    with pytest.raises(ConfigurationError, match="not JSON-serialisable"):
        once(log, "m-1", effect)
    assert once(log, "m-1", effect) is None
    assert effects == [1]


@pytest.mark.parametrize("bad", ["", "x" * 513])
def test_an_empty_or_too_long_id_is_refused(bad: str) -> None:
    with pytest.raises(InvalidMessageError):
        once(InMemoryProcessedLog(), bad, lambda: None)


def test_expiry_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="expiry"):
        once(InMemoryProcessedLog(), "m-1", lambda: None, expiry=0)
